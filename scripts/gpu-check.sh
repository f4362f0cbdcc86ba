#!/usr/bin/env bash
# Build lltm with its CUDA kernels and check it on a GPU machine, in one go:
#   1. build and install with `pip install --no-build-isolation` (LLTM_CUDA=1),
#   2. run the whole test suite (CUDA cases included, LLTM_TEST_LARGE=1),
#   3. run compute-sanitizer memcheck over the CUDA tests with PyTorch's
#      caching allocator off,
#   4. run `python -m lltm.benchmark --device cuda` at the tutorial's size and
#      at batch 4096, features 1024, state 1024, in float32 and bfloat16.
# Logs and JSON go to $OUT (or the first argument); a summary is printed last.
# Build dependencies missing on the machine can travel as wheels in .whl/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:-${OUT:-/tmp/lltm-gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
summary=()

if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/lltm-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/lltm-site${PYTHONPATH:+:$PYTHONPATH}
fi

# step NAME LOG COMMAND...: run, log to $out/LOG, record pass/fail and time.
step() {
  local name=$1 log=$2
  shift 2
  local start=$SECONDS
  echo "=== $name"
  "$@" >"$out/$log" 2>&1
  local rc=$?
  tail -n 5 "$out/$log"
  summary+=("$(printf '%-24s %s (%ds, %s)' "$name" "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" $((SECONDS - start)) "$log")")
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/gpu.txt"
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" | tee -a "$out/gpu.txt"

LLTM_CUDA=1 step build build.log "$py" -m pip install --no-build-isolation --no-deps -v . || {
  printf '%s\n' "${summary[@]}"
  exit 1
}
"$py" -m lltm | tee "$out/lltm.json"

LLTM_TEST_LARGE=1 step tests tests.log timeout 300 "$py" -m pytest tests -p no:cacheprovider -q -rs --durations=10
# memcheck needs the caching allocator off (it hides out-of-bounds accesses
# inside its slabs) and runs without torch.compile, which is slow under it.
PYTORCH_NO_CUDA_MEMORY_CACHING=1 step memcheck memcheck.log timeout 240 \
  compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 20 \
  "$py" -m pytest tests -p no:cacheprovider -q -m cuda -k "not compile and not 64bit"

bench() {
  local name=$1
  shift
  step "$name" "$name.log" "$py" -m lltm.benchmark --device cuda --json "$out/$name.json" "$@"
}
bench bench-tutorial-fp32
bench bench-tutorial-bf16 --dtype bfloat16
bench bench-4096-fp32 -b 4096 -f 1024 -s 1024 --runs 200
bench bench-4096-bf16 -b 4096 -f 1024 -s 1024 --runs 200 --dtype bfloat16

echo
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
for name in bench-tutorial-fp32 bench-tutorial-bf16 bench-4096-fp32 bench-4096-bf16; do
  echo "--- $name"
  grep -A 8 '^variant' "$out/$name.log"
done
! grep -q FAILED "$out/summary.txt"
