#!/usr/bin/env bash
# Every GPU check of a release on a two-GPU machine (nvidia-h200-x2), in one
# call of under ten minutes, the checks side by side, one GPU each:
#   build  lltm with its CUDA kernels (scripts/gpu-check.sh build)
#   GPU 1  every CUDA test; compute-sanitizer over the sequence tests
#          (memcheck, racecheck, synccheck) and initcheck over the cell's
#   GPU 0  timed, while the host is otherwise quiet: the sequence benchmark
#          (fp32, bf16) and the cell benchmark at the tutorial's size; then
#          the DDP run of examples/train_digits.py on both GPUs beside the
#          one-GPU run, while the CUDA wheel is built, served, installed and
#          tested (scripts/gpu-wheel-check.sh)
# Usage: scripts/gpu-all.sh [OUT_DIR]   (default $OUT)
# Writes logs.tgz (every log, refreshed as the checks go, so that a run cut
# short still returns what it did), cell.json and sequence.json to OUT_DIR,
# and prints each check's summary.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${1:-${OUT:-/tmp/lltm-gpu-all}}
work=/tmp/lltm-gpu-all
rm -rf "$work"
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
py=${PYTHON:-python3}
pack() { tar czf "$out/logs.tmp" -C /tmp lltm-gpu-all && mv "$out/logs.tmp" "$out/logs.tgz"; }
(while sleep 30; do pack; done) &
packer=$!

bash scripts/gpu-check.sh "$work/build" build >/dev/null 2>&1
tail -n 2 "$work/build/summary.txt"

# Each group sees its own GPU: the exports are local to the subshells.
# shellcheck disable=SC2030,SC2031
(
  export CUDA_VISIBLE_DEVICES=1 LLTM_TEST_ARGS="-m cuda" LLTM_TEST_TIMEOUT=150
  bash scripts/gpu-check.sh "$work/tests" tests
  bash scripts/gpu-sequence-check.sh "$work/sanitize" sanitize
  # initcheck over the cell's kernels in float32 and float64, where no cuBLAS
  # kernel stores through the tensor memory accelerator; then a probe of
  # whether initcheck sees such stores at all: a bfloat16 GEMM on sm_90, read
  # by one of ATen's own kernels.
  LLTM_SANITIZER_TESTS="tests/test_cell.py tests/test_cuda.py" \
    LLTM_SANITIZER_K="not compile and not graph and not 64bit and not launches and not bfloat16 and not float16" \
    bash scripts/gpu-check.sh "$work/initcheck" initcheck
  compute-sanitizer --tool initcheck --print-limit 2 "$py" -c "
import torch
a = torch.randn(1000, 67, device='cuda', dtype=torch.bfloat16)
b = torch.randn(67, 192, device='cuda', dtype=torch.bfloat16)
print('bf16 GEMM read back:', float((a @ b).float().abs().sum()) > 0)
" >"$work/initcheck/probe.log" 2>&1
) >"$work/gpu1.log" 2>&1 &
gpu1=$!

# shellcheck disable=SC2031
(
  export CUDA_VISIBLE_DEVICES=0
  bash scripts/gpu-sequence-check.sh "$work/sequence" bench
  "$py" -m lltm.benchmark --device cuda --sizes 16x32x128 --launches --seconds 2 \
    --json "$out/cell.json" >"$work/cell.log" 2>&1
) >"$work/gpu0.log" 2>&1
timeout 230 bash scripts/gpu-wheel-check.sh "$work/wheel" >"$work/wheel.log" 2>&1 &
wheel=$!
timeout 200 bash scripts/gpu-sequence-check.sh "$work/ddp" ddp >"$work/ddp.log" 2>&1
wait "$wheel" "$gpu1"
kill "$packer"
pack

for s in build tests sanitize initcheck sequence ddp wheel; do
  echo "=== $s"
  grep -vE "^(name,|NVIDIA|torch |TORCH_CUDA)" "$work/$s/summary.txt" 2>/dev/null | tail -n 25
done
echo "=== initcheck probe"
grep -E "GEMM read back|ERROR SUMMARY" "$work/initcheck/probe.log"
echo "=== cell"
grep -E "^(cuda:|variant|-----|[a-z-]+ +[0-9])" "$work/cell.log"
