#!/usr/bin/env bash
# Every GPU check of a release on a two-GPU machine (nvidia-h200-x2), in one
# call of under ten minutes, the checks side by side:
#   wheel     GPU 1: the CUDA wheel built, served, installed into a fresh
#             venv and tested there (scripts/gpu-wheel-check.sh). It goes
#             first: its venv reuses this Python's packages, so lltm must not
#             be installed here yet when pip installs the wheel.
#   build     lltm with its CUDA kernels, into this Python
#   tests     GPU 1: every CUDA test
#   sanitize  GPU 1: compute-sanitizer over the sequence tests (memcheck,
#             racecheck, synccheck) and initcheck over the cell's
#   probe     GPU 1: whether initcheck sees stores that cuBLAS and ATen make
#             (what its reports on their kernels mean)
#   bench     GPU 0, timed: the sequence benchmark (fp32, bf16) and the cell
#             benchmark over the performance issue's sizes, with a sweep and
#             its plot, and the GPU time of a step at batch 4096
#   ddp       both GPUs, last: examples/train_digits.py under torchrun beside
#             the one-GPU run
# Usage: scripts/gpu-all.sh [OUT_DIR [STEP...]]   (default: every step)
# Writes logs.tgz (every log, refreshed as the checks go, so that a run cut
# short still returns what it did), bench.json and plot.png to OUT_DIR, and
# prints each check's summary.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/gpu-lib.sh
. scripts/gpu-lib.sh
gpu_setup /tmp/lltm-gpu-all "wheel build tests sanitize probe bench ddp" "$@"
work=/tmp/lltm-gpu-all
rm -rf "$work"
mkdir -p "$out" "$work"
export NCCL_NVLS_ENABLE=0
pack() { tar czf "$out/logs.tmp" -C /tmp lltm-gpu-all && mv "$out/logs.tmp" "$out/logs.tgz"; }
(while sleep 30; do pack; done) &
packer=$!

# Each group sees its own GPU: the exports are local to the subshells.
# shellcheck disable=SC2030,SC2031
(
  export CUDA_VISIBLE_DEVICES=1
  if wants wheel; then
    bash scripts/gpu-wheel-check.sh "$work/wheel" >"$work/wheel.log" 2>&1
  fi
) &
gpu1=$!
if wants wheel && wants build; then
  # The build may start once the wheel's venv holds lltm.
  until grep -qE "^=== tests|^=== summary" "$work/wheel.log" 2>/dev/null; do sleep 2; done
fi
if wants build; then
  bash scripts/gpu-check.sh "$work/build" build >/dev/null 2>&1
  tail -n 2 "$work/build/summary.txt"
fi
wait "$gpu1"

# shellcheck disable=SC2030,SC2031
(
  export CUDA_VISIBLE_DEVICES=1 LLTM_TEST_ARGS="-m cuda" LLTM_TEST_TIMEOUT=150
  if wants tests; then
    bash scripts/gpu-check.sh "$work/tests" tests
  fi
  if wants sanitize; then
    bash scripts/gpu-sequence-check.sh "$work/sanitize" sanitize
    LLTM_SANITIZER_TESTS="tests/cell" \
      LLTM_SANITIZER_K="not compile and not graph and not 64bit and not launches and not bfloat16 and not float16" \
      bash scripts/gpu-check.sh "$work/initcheck" initcheck
  fi
  if wants probe; then
    mkdir -p "$work/probe"
    # A bfloat16 GEMM whose sizes let cuBLAS use Hopper's bulk-copy stores,
    # read back by ATen; a large float64 sum, which takes ATen's two-pass
    # reduction: inputs every byte of which was written.
    for code in \
      "z = torch.randn(128, 160, device='cuda', dtype=torch.bfloat16) @ torch.randn(160, 384, device='cuda', dtype=torch.bfloat16); print('bf16 GEMM:', bool(torch.isfinite(z.float()).all()))" \
      "x = torch.randn(70000, 16, device='cuda', dtype=torch.float64); print('float64 sum:', bool(torch.isfinite(x.sum())))"; do
      echo "=== $code"
      compute-sanitizer --tool initcheck --print-limit 1 "$py" -c "import torch; $code" 2>&1
    done >"$work/probe/probe.log"
  fi
) >"$work/gpu1.log" 2>&1 &
gpu1=$!

# shellcheck disable=SC2031
(
  export CUDA_VISIBLE_DEVICES=0
  if wants bench; then
    bash scripts/gpu-sequence-check.sh "$work/sequence" bench
    LLTM_BENCH_TIMEOUT=150 LLTM_BENCH_CONFIGS="sweep --sizes 16x32x128,64x32x128,256x32x128,1024x32x128,4096x32x128 --variants python,lstmcell,floor,loss,lltm --plot $out/plot.png
tutorial-fp32 --sizes 16x32x128 --launches
4096-fp32 --sizes 4096x1024x1024 --launches --variants python,compile,lstmcell,floor,loss,kernels,lltm,lltm-compile
4096-fp32-all --sizes 4096x1024x1024 --grad all --variants python,compile,floor,loss,kernels,lltm,lltm-compile
4096-bf16 --sizes 4096x1024x1024 --dtype bfloat16 --variants python,compile,lstmcell,floor,loss,lltm,lltm-compile
32768-bf16 --sizes 32768x256x256 --dtype bfloat16 --variants python,compile,floor,loss,lltm,lltm-compile" \
      bash scripts/gpu-check.sh "$work/cell" bench
    cp "$work/cell/bench.json" "$out/bench.json"
    timeout 120 "$py" scripts/profile_step.py 4096 1024 1024 bfloat16 >"$work/cell/profile-4096-bf16.log" 2>&1
  fi
) >"$work/gpu0.log" 2>&1
wait "$gpu1"

if wants ddp; then
  timeout 200 bash scripts/gpu-sequence-check.sh "$work/ddp" ddp >"$work/ddp.log" 2>&1
fi
kill "$packer"
pack

for s in wheel build tests sanitize initcheck sequence cell ddp; do
  [[ -f $work/$s/summary.txt ]] || continue
  echo "=== $s"
  grep -vE "^(name,|NVIDIA|torch |TORCH_CUDA|python )" "$work/$s/summary.txt" | tail -n 30
done
if [[ -f $work/probe/probe.log ]]; then
  echo "=== probe"
  grep -E "^=== |GEMM:|sum:|ERROR SUMMARY|^=========     at" "$work/probe/probe.log"
fi
