#!/usr/bin/env bash
# Build lltm with its CUDA kernels and check it on a GPU machine, in one go:
#   build     pip install --no-build-isolation, LLTM_CUDA=1
#   tests     the whole test suite, CUDA cases included (LLTM_TEST_LARGE=1)
#   memcheck  compute-sanitizer memcheck over the CUDA tests, with PyTorch's
#             caching allocator off
#   jit       the JIT flavor: LLTM_BACKEND=jit builds the same sources, CUDA
#             included, with torch.utils.cpp_extension on import (verbose),
#             then the CUDA cases of the op, tutorial-API, error and CUDA tests
#             run against it
#   bench     python -m lltm.benchmark --device cuda at the tutorial's size and
#             at batch 4096, features 1024, state 1024, in float32 and bfloat16
# Usage: scripts/gpu-check.sh [OUT_DIR [STEP...]]  (default: every step)
# Writes at most seven files to OUT_DIR (default $OUT): summary.txt,
# build.log, tests.log, memcheck.log, jit.log, bench.log and bench.json.
# Build dependencies missing on the machine can travel as wheels in .whl/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:-${OUT:-/tmp/lltm-gpu-check}}
shift || true
steps=${*:-build tests memcheck jit bench}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
summary=()

if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/lltm-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/lltm-site${PYTHONPATH:+:$PYTHONPATH}
fi

# step NAME LOG COMMAND...: run, append to $out/LOG, record pass/fail and time.
step() {
  local name=$1 log=$2
  shift 2
  local start=$SECONDS
  echo "=== $name"
  echo "=== $name: $*" >>"$out/$log"
  "$@" >>"$out/$log" 2>&1
  local rc=$?
  tail -n 4 "$out/$log"
  summary+=("$(printf '%-24s %s (%ds, %s)' "$name" "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" $((SECONDS - start)) "$log")")
  return $rc
}
wants() { [[ " $steps " == *" $1 "* ]]; }

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-}"
} | tee "$out/summary.txt"

if wants build; then
  LLTM_CUDA=1 step build build.log "$py" -m pip install --no-build-isolation --no-deps -v . &&
    step "python -m lltm" build.log "$py" -m lltm
fi
if wants tests; then
  LLTM_TEST_LARGE=1 step tests tests.log timeout 450 \
    "$py" -m pytest tests -p no:cacheprovider -q -rs --durations=10
fi
if wants memcheck; then
  # The caching allocator hides out-of-bounds accesses inside its slabs;
  # CUDA graph capture needs it, and torch.compile is too slow under the
  # sanitizer.
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 step memcheck memcheck.log timeout 240 \
    compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
    "$py" -m pytest tests -p no:cacheprovider -q -m cuda -k "not compile and not graph and not 64bit"
fi
if wants jit; then
  export TORCH_EXTENSIONS_DIR=/tmp/lltm-jit
  rm -rf "$TORCH_EXTENSIONS_DIR"
  LLTM_BACKEND=jit LLTM_JIT_VERBOSE=1 step "jit build (first)" jit.log \
    "$py" -c "import time; t = time.perf_counter(); import lltm; print('import lltm:', round(time.perf_counter() - t, 1), 's;', lltm.build_info())"
  LLTM_BACKEND=jit step "jit load (cached)" jit.log \
    "$py" -c "import time; t = time.perf_counter(); import lltm; print('import lltm:', round(time.perf_counter() - t, 1), 's')"
  LLTM_BACKEND=jit step "jit tests" jit.log timeout 300 "$py" -m pytest -p no:cacheprovider -q -rs -m cuda \
    tests/test_ops.py tests/test_tutorial_api.py tests/test_errors.py tests/test_cuda.py
fi
if wants bench; then
  mkdir -p "$out/json"
  bench() {
    local name=$1
    shift
    step "$name" bench.log "$py" -m lltm.benchmark --device cuda --json "$out/json/$name.json" "$@"
  }
  bench bench-tutorial-fp32
  bench bench-tutorial-bf16 --dtype bfloat16
  bench bench-4096-fp32 -b 4096 -f 1024 -s 1024 --runs 200
  bench bench-4096-bf16 -b 4096 -f 1024 -s 1024 --runs 200 --dtype bfloat16
  "$py" -c "import json, pathlib, sys; d = pathlib.Path(sys.argv[1]); \
json.dump({p.stem: json.loads(p.read_text()) for p in sorted(d.glob('*.json'))}, \
open(sys.argv[2], 'w'), indent=1)" "$out/json" "$out/bench.json" && rm -r "$out/json"
fi

echo
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee -a "$out/summary.txt"
if wants bench; then
  grep -E '^(=== bench|variant|-----|[a-z]+ +cuda)' "$out/bench.log"
fi
! grep -q FAILED "$out/summary.txt"
