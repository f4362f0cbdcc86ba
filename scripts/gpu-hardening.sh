#!/usr/bin/env bash
# The hardening checks of issue 14 on one GPU, in one call of about six
# minutes:
#   build      lltm with its CUDA kernels (pip install --no-build-isolation)
#   properties hypothesis with LLTM_HYPOTHESIS_PROFILE=gpu (3,000 cell and
#              2,000 layer examples on CUDA)
#   leaks      10,000 forward+backward steps of the cell and of the layer
#              (memory_allocated flat), and autocast (CUDA bf16 and fp16)
#   large      LLTM_TEST_LARGE=1: batch * 3 * state > 2**31 for the cell and
#              the per-step sequence path (tests/test_large.py, ~40 GB)
#   sanitizer  compute-sanitizer memcheck, racecheck, synccheck and
#              initcheck over the CUDA cell and sequence tests, with
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
    "$py" -m pytest -p no:cacheprovider -q -rs -m cuda --hypothesis-show-statistics tests/test_properties.py
fi
if wants leaks; then
  step "leaks+autocast" leaks.log timeout 120 "$py" -m pytest -p no:cacheprovider -q -rs -s -m cuda tests/test_leaks_autocast.py
fi
if wants large; then
  LLTM_TEST_LARGE=1 step large large.log timeout 120 "$py" -m pytest -p no:cacheprovider -q -rs -s tests/test_large.py tests/test_cuda.py -k "2_31 or 64bit"
fi
if wants sanitizer; then
  # The caching allocator hides out-of-bounds accesses inside its slabs; CUDA
  # graph capture needs it, and torch.compile is too slow under the tool.
  for tool in memcheck racecheck synccheck initcheck; do
    # shellcheck disable=SC2086 # LLTM_SANITIZER_TESTS holds words
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 step "$tool" "$tool.log" timeout "${LLTM_SANITIZER_TIMEOUT:-50}" \
      "${sanitizer[@]}" --tool "$tool" "$py" -m pytest -p no:cacheprovider -q -m cuda \
      -k "not compile and not graph and not 64bit and not 2_31 and not launches and not memory_stays_flat and not second_device and not gradcheck" \
      ${LLTM_SANITIZER_TESTS:-tests/test_ops.py tests/test_sequence.py tests/test_leaks_autocast.py}
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$out/$tool.log" | tail -n 3
  done
fi

print_summary
all_passed
