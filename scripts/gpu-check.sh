#!/usr/bin/env bash
# Build lltm with its CUDA kernels and check it on a GPU machine, in one go:
#   build     pip install --no-build-isolation, LLTM_CUDA=1
#   tests     the whole test suite, CUDA cases included (LLTM_TEST_LARGE=1)
#   memcheck  compute-sanitizer memcheck over the CUDA tests, with PyTorch's
#             caching allocator off
#   initcheck the same with initcheck: no kernel reads memory never written
#   jit       the JIT flavor: LLTM_BACKEND=jit builds the same sources, CUDA
#             included, with torch.utils.cpp_extension on import (verbose),
#             then the CUDA cases of the op, tutorial-API, error and CUDA tests
#             run against it
#   profile   scripts/profile_step.py: the GPU operations of one training step
#             per variant, with their times (the launch counts)
#   bench     python -m lltm.benchmark --device cuda over the sizes of the
#             performance issue ($LLTM_BENCH_CONFIGS, one config per line)
# Usage: scripts/gpu-check.sh [OUT_DIR [STEP...]]  (default: every step)
# Writes at most eight files to OUT_DIR (default $OUT): summary.txt,
# build.log, tests.log, memcheck.log, initcheck.log, jit.log, profile.log,
# bench.log and bench.json (select steps to stay within eight).
# Build dependencies missing on the machine can travel as wheels in .whl/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/gpu-lib.sh
. scripts/gpu-lib.sh
gpu_setup /tmp/lltm-gpu-check "build tests memcheck initcheck jit profile bench" "$@"
device_wheels /tmp/lltm-site
gpu_header

if wants build; then
  build_step
fi
if wants tests; then
  # shellcheck disable=SC2086 # LLTM_TEST_ARGS holds words, e.g. "-m cuda"
  LLTM_TEST_LARGE=1 step tests tests.log timeout "${LLTM_TEST_TIMEOUT:-450}" \
    "$py" -m pytest tests -p no:cacheprovider -q -rs --durations=10 ${LLTM_TEST_ARGS:-}
fi
# The caching allocator hides out-of-bounds accesses inside its slabs; CUDA
# graph capture needs it, and torch.compile is too slow under the sanitizer.
sanitize() {
  local tool=$1
  # shellcheck disable=SC2086 # LLTM_SANITIZER_TESTS holds words
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 step "$tool" "$tool.log" timeout "${LLTM_SANITIZER_TIMEOUT:-240}" \
    "${sanitizer[@]}" --tool "$tool" "$py" -m pytest -p no:cacheprovider -q -m cuda \
    -k "${LLTM_SANITIZER_K:-not compile and not graph and not 64bit and not launches}" \
    ${LLTM_SANITIZER_TESTS:-tests}
}
if wants memcheck; then
  sanitize memcheck
fi
if wants initcheck; then
  sanitize initcheck
fi
if wants jit; then
  export TORCH_EXTENSIONS_DIR=/tmp/lltm-jit
  rm -rf "$TORCH_EXTENSIONS_DIR"
  LLTM_BACKEND=jit LLTM_JIT_VERBOSE=1 step "jit build (first)" jit.log \
    "$py" -c "import time; t = time.perf_counter(); import lltm; print('import lltm:', round(time.perf_counter() - t, 1), 's;', lltm.build_info())"
  LLTM_BACKEND=jit step "jit load (cached)" jit.log \
    "$py" -c "import time; t = time.perf_counter(); import lltm; print('import lltm:', round(time.perf_counter() - t, 1), 's')"
  LLTM_BACKEND=jit step "jit tests" jit.log timeout 300 "$py" -m pytest -p no:cacheprovider -q -rs -m cuda \
    tests/ops tests/cell
fi
if wants profile; then
  step profile profile.log timeout 120 "$py" scripts/profile_step.py
fi
if wants bench; then
  mkdir -p "$out/json"
  # name, then the benchmark's arguments
  configs=${LLTM_BENCH_CONFIGS:-"tutorial-fp32 --sizes 16x32x128 --launches
tutorial-fp32-all --sizes 16x32x128 --grad all
4096-fp32 --sizes 4096x1024x1024 --launches
4096-fp32-all --sizes 4096x1024x1024 --grad all --variants python,floor,kernels,lltm,lltm-compile
4096-bf16 --sizes 4096x1024x1024 --dtype bfloat16
32768-bf16 --sizes 32768x256x256 --dtype bfloat16 --variants python,compile,floor,kernels,lltm,lltm-compile"}
  while read -r name args; do
    # shellcheck disable=SC2086 # the arguments are words
    step "bench-$name" bench.log timeout "${LLTM_BENCH_TIMEOUT:-200}" "$py" -m lltm.benchmark --device cuda \
      --seconds "${LLTM_BENCH_SECONDS:-1}" --json "$out/json/$name.json" $args
  done <<<"$configs"
  "$py" -c "import json, pathlib, sys; d = pathlib.Path(sys.argv[1]); \
json.dump({p.stem: json.loads(p.read_text()) for p in sorted(d.glob('*.json'))}, \
open(sys.argv[2], 'w'), indent=1)" "$out/json" "$out/bench.json" && rm -r "$out/json"
fi

print_summary
if wants bench; then
  grep -E '^(=== bench|cuda:|variant|-----|[a-z-]+ +[0-9.]+ +[0-9.]+ )' "$out/bench.log"
fi
all_passed
