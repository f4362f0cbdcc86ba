#!/usr/bin/env bash
# The hardening checks of issue 14 on one GPU, in one call of about ten
# minutes:
#   build      lltm with its CUDA kernels (pip install --no-build-isolation)
#   properties hypothesis with LLTM_HYPOTHESIS_PROFILE=gpu (3,000 cell and
#              2,000 layer examples on CUDA)
#   leaks      10,000 forward+backward steps of the cell and of the layer
#              (memory_allocated flat), and autocast (CUDA bf16 and fp16)
#   large      LLTM_TEST_LARGE=1: batch * 3 * state > 2**31 for the cell and
#              the per-step sequence path (tests/cell, LLTM_TEST_LARGE, ~40 GB)
#   sanitizer  compute-sanitizer memcheck, racecheck, synccheck and
#              initcheck side by side over the CUDA tests, in shards, with
#              PYTORCH_NO_CUDA_MEMORY_CACHING=1
# Usage: scripts/gpu-hardening.sh [OUT_DIR [STEP...]]   (default: every step)
# hypothesis and sortedcontainers travel as wheels in .whl/ (no network):
#   pip download --no-deps -d .whl hypothesis==6.151.4 sortedcontainers==2.4.0
# Writes summary.txt and one log per step to OUT_DIR (default $OUT).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/gpu-lib.sh
. scripts/gpu-lib.sh
gpu_setup /tmp/lltm-gpu-hardening "build properties leaks large sanitizer" "$@"
step_width=22 step_tail=3
device_wheels /tmp/lltm-site
gpu_header

if wants build; then
  build_step
fi
if wants properties; then
  LLTM_HYPOTHESIS_PROFILE=gpu step properties properties.log timeout 150 \
    "$py" -m pytest -p no:cacheprovider -q -rs -m cuda --hypothesis-show-statistics tests/ops -k properties
fi
if wants leaks; then
  step "leaks+autocast" leaks.log timeout 120 "$py" -m pytest -p no:cacheprovider -q -rs -s -m cuda tests/ops -k "memory_stays_flat or autocast"
fi
if wants large; then
  LLTM_TEST_LARGE=1 step large large.log timeout 120 "$py" -m pytest -p no:cacheprovider -q -rs -s tests/cell -k "2_31 or 64bit"
fi
if wants sanitizer; then
  # The caching allocator hides out-of-bounds accesses inside its slabs, so
  # it is off; CUDA graph capture needs it, and torch.compile is too slow
  # under the tool, so those tests are left out. initcheck leaves out the
  # 16-bit cases: it does not see the bulk-copy stores of cuBLAS's Hopper
  # GEMMs, so that it reports every read of a float16 or bfloat16 GEMM's
  # output as uninitialized, ATen's own copy kernel's too (a probe with
  # nothing of lltm's in it shows this). It leaves out one float32 case too,
  # fused_tiles' T2-B1200-F8-S510: ATen's own sum(0) of a [2400, 1530]
  # float32 tensor (its d_bias) reads what initcheck counts as uninitialized
  # (a probe of torch.randn(2400, 1530).sum(0) alone gives 114 reports, with
  # the kernels before the cooperative float32 steps and on the steps path
  # alike). The four tools run side by side, each over LLTM_SANITIZER_SHARDS
  # shards of the tests (racecheck, the slowest, over twice as many), a step
  # per shard.
  keep="not compile and not graph and not 64bit and not 2_31 and not launches and not memory_stays_flat and not second_device and not gradcheck"
  rm -f "$out"/*-shard-*
  # shellcheck disable=SC2086 # LLTM_SANITIZER_TESTS holds words
  "$py" -m pytest -p no:cacheprovider -q --collect-only -m cuda -k "$keep" \
    ${LLTM_SANITIZER_TESTS:-tests/ops tests/sequence tests/cell} |
    grep '::' >"$out/sanitizer-tests.txt"
  for tool in memcheck racecheck synccheck initcheck; do
    if [[ $tool == initcheck ]]; then
      grep -v -e float16 -e 'fused_tiles\[T2-B1200-F8-S510\]' "$out/sanitizer-tests.txt" >"$out/$tool-tests.txt"
    else
      cp "$out/sanitizer-tests.txt" "$out/$tool-tests.txt"
    fi
    shards=${LLTM_SANITIZER_SHARDS:-4}
    [[ $tool == racecheck ]] && shards=$((2 * shards))
    split -n "r/$shards" -d "$out/$tool-tests.txt" "$out/$tool-shard-"
    for shard in "$out/$tool"-shard-??; do
      (
        mapfile -t tests <"$shard"
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 step "$tool ${shard##*-}" "$(basename "$shard").log" \
          timeout "${LLTM_SANITIZER_TIMEOUT:-420}" "${sanitizer[@]}" --tool "$tool" \
          "$py" -m pytest -p no:cacheprovider -q "${tests[@]}" >/dev/null
        echo "${summary[-1]}" >"$shard.result"
      ) &
    done
  done
  wait
  for result in "$out"/*-shard-??.result; do
    summary+=("$(cat "$result")")
  done
  grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$out"/*-shard-??.log
fi

print_summary
all_passed
