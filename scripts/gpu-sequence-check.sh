#!/usr/bin/env bash
# The sequence op (issue 9) on a GPU machine, in one go; run it on the
# two-GPU kind (nvidia-h200-x2) so that the DDP step has its two GPUs:
#   build     pip install --no-build-isolation, LLTM_CUDA=1 (skip it when
#             scripts/gpu-check.sh built this checkout in the same call)
#   tests     tests/sequence and tests/docs (the examples), CUDA cases
#             on every path (persistent kernel, fused steps, per-step loop)
#   sanitize  compute-sanitizer over the sequence CUDA tests: memcheck
#             (caching allocator off), then racecheck, synccheck and
#             initcheck over every path's kernels
#   bench     the sequence benchmark at the project's sizes (64,16,32,128;
#             64,256,256,256; 32,1024,512,512; 100,32,128,512; 512,1,32,128)
#             in float32 (TF32 off), float16 and bfloat16, one process each:
#             the layer (auto, persistent, steps, fused) against nn.LSTM
#             (cuDNN), wall and GPU time (CUDA-graph replay), host ratio and
#             kernels per call; sizes-PRECISION.json, sizes.md
#   sweep     issue 12's sweep, T in {16,64,128,512} x B in {1,...,4096} x
#             (F,S) in {(32,128),(128,256),(256,512)}, the layer against
#             cuDNN in float32 (TF32 off) and float16, one process each
#             (about 2 minutes each); then sweep.md (the Markdown of
#             docs/performance.md: speedup tables, worst and median, GPU time
#             per step, host ratio), sweep.json (both merged), heatmap.png
#             and heatmap-gpu.png (the speedup in GPU time)
#   ddp       examples/train_digits.py on one GPU, then under
#             torchrun --nproc_per_node=2 (NCCL) with the same seed and global
#             batch: both loss curves, their largest difference, the accuracy
# Usage: scripts/gpu-sequence-check.sh [OUT_DIR [STEP...]]  (default: every step)
# Writes to OUT_DIR (default $OUT): summary.txt and a log per step
# (build.log, tests.log, sanitize.log, bench.log, sweep.log, ddp.log), and the
# bench and sweep files above. About 6 minutes on an H200 with the build, 3
# without, plus 2 for bench and 4 to 5 for sweep.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/gpu-lib.sh
. scripts/gpu-lib.sh
gpu_setup /tmp/lltm-gpu-sequence-check "build tests sanitize bench sweep ddp" "$@"
step_width=28
# NVLink multicast (NVLS) stays off on the lent machines.
export NCCL_NVLS_ENABLE=0
# The H200's architecture only, unless told otherwise: a build for the
# default list of seven takes minutes longer.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
device_wheels /tmp/lltm-site
gpu_header

if wants build; then
  build_step
fi
if wants tests; then
  step tests tests.log timeout 300 "$py" -m pytest tests/sequence tests/docs \
    -p no:cacheprovider -q -rs --durations=10
fi
if wants sanitize; then
  # torch.compile and CUDA graphs are too slow under the sanitizer, or need
  # the caching allocator; opcheck repeats what the other tests run.
  cuda_tests=(tests/sequence -p no:cacheprovider -q -m cuda -k "${LLTM_MEMCHECK_K:-not compile and not graph and not opcheck and not options}")
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 step memcheck sanitize.log timeout 240 \
    "${sanitizer[@]}" --tool memcheck "$py" -m pytest "${cuda_tests[@]}"
  # Every path's kernels (paths_of_a_device_agree runs each) and the fused
  # kernel's tiles at the edges of their sizes.
  for tool in racecheck synccheck initcheck; do
    step "$tool" sanitize.log timeout 150 \
      "${sanitizer[@]}" --tool "$tool" "$py" -m pytest \
      tests/sequence -p no:cacheprovider -q -m cuda \
      -k "${LLTM_SANITIZER_K:-(paths_of_a_device_agree and float32 and cuda and not B300) or (fused_tiles and (B1- or B17 or B300))}"
  done
fi
# tables MD NAME... [OPTION...]: scripts/bench_tables.py over the $out/NAME.json
# that exist (a step cut short by its timeout wrote none, or part), into $out/MD.
tables() {
  local md=$1 files=()
  shift
  while [[ $# -gt 0 && $1 != --* ]]; do
    [[ -f $out/$1.json ]] && files+=("$out/$1.json")
    shift
  done
  [[ ${#files[@]} -gt 0 ]] || return 1
  "$py" scripts/bench_tables.py "${files[@]}" "$@" >"$out/$md"
}
if wants bench; then
  for p in float32 float16 bfloat16; do
    step "bench sizes $p" bench.log timeout 150 "$py" -m lltm.benchmark --sequence --device cuda \
      --sizes 64x16x32x128,64x256x256x256,32x1024x512x512,100x32x128x512,512x1x32x128 \
      --variants layer,layer-persistent,layer-steps,layer-fused,nn.LSTM --precision "$p" \
      --seconds 1 --launches --json "$out/sizes-$p.json"
  done
  step "bench tables" bench.log tables sizes.md sizes-float32 sizes-float16 sizes-bfloat16
fi
if wants sweep; then
  # One process per precision: each table is measured in a process of its own.
  for p in float32 float16; do
    step "sweep $p" sweep.log timeout 330 "$py" -m lltm.benchmark --sequence --sweep --device cuda \
      --precision "$p" --json "$out/sweep-$p.json"
  done
  step "sweep tables" sweep.log tables sweep.md sweep-float32 sweep-float16 \
    --plot "$out/heatmap.png" --plot-gpu "$out/heatmap-gpu.png" --json "$out/sweep.json"
fi
if wants ddp; then
  ddp() {
    local name=$1
    shift
    step "ddp: $name" ddp.log timeout 200 "$@" examples/train_digits.py --device cuda --seed 0 \
      --batch-size 64 --log-json "/tmp/lltm-ddp-$name.json"
  }
  ddp one-gpu "$py"
  ddp torchrun-2 "$py" -m torch.distributed.run --standalone --nproc_per_node=2
  # Tolerance: each epoch's mean loss within 0.01 of the one-GPU run's (the
  # split batch only reorders sums), and both runs at >= 95% test accuracy.
  step "ddp: compare" ddp.log "$py" - <<'EOF'
import json
one, two = (json.load(open(f"/tmp/lltm-ddp-{n}.json")) for n in ("one-gpu", "torchrun-2"))
print(f"{'epoch':>5} {'loss 1 GPU':>11} {'loss DDP x2':>12} {'test 1 GPU':>11} {'test DDP':>9}")
for a, b in zip(one["epochs"], two["epochs"], strict=True):
    print(f"{a['epoch']:>5} {a['loss']:>11.5f} {b['loss']:>12.5f} "
          f"{100 * a['test_accuracy']:>10.1f}% {100 * b['test_accuracy']:>8.1f}%")
steps = max(abs(a - b) for a, b in zip(one["step_losses"], two["step_losses"], strict=True))
epochs = max(abs(a["loss"] - b["loss"]) for a, b in zip(one["epochs"], two["epochs"], strict=True))
print(f"world sizes {one['world_size']} and {two['world_size']}, global batch {one['global_batch']}")
print(f"largest difference: per-step loss {steps:.2e}, per-epoch loss {epochs:.2e} (tolerance 1e-2)")
accuracy = (one["test_accuracy"], two["test_accuracy"])
print(f"test accuracy: 1 GPU {100 * accuracy[0]:.1f}%, DDP {100 * accuracy[1]:.1f}% (goal >= 95%)")
assert two["world_size"] == 2 and epochs <= 1e-2 and min(accuracy) >= 0.95
EOF
fi

print_summary
if wants bench; then
  grep -E '^(T,B,F,S|---|[0-9]+,|no GPU time)' "$out/bench.log" | tee -a "$out/summary.txt"
fi
if wants sweep && [[ -f $out/sweep.md ]]; then
  # The worst and median speedups, and the largest host ratios.
  grep -E '^\| (precision|[a-z0-9-]+|all) \||^Largest host ratio' "$out/sweep.md" |
    tee -a "$out/summary.txt"
fi
if wants ddp; then
  grep -E '^( *[0-9]+ |world|largest|test accuracy)' "$out/ddp.log" | tee -a "$out/summary.txt"
fi
all_passed
