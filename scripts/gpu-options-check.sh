#!/usr/bin/env bash
# nn.LSTM's options of LLTMLayer (bidirectional, dropout, PackedSequence) on a
# GPU machine, in calls of under ten minutes each:
#   build     pip install --no-build-isolation, LLTM_CUDA=1, for the H200 only
#   tests     tests/sequence, CUDA
#             cases, every path
#   sanitize  compute-sanitizer memcheck (caching allocator off) over the
#             packed and bidirectional cases of every path: the segments'
#             views and the direction streams reach no byte they should not
#   bench     the layer against cuDNN's nn.LSTM with the same options,
#             forward + backward, one process per table: bidirectional over
#             the sequence sweep's grid in float32 (TF32 off) and float16;
#             packed batches (lengths uniform in [T/4, T]) against cuDNN's
#             packed LSTM and against the same batch padded
#   deploy    the deploy tests' CUDA cases (AOTInductor in a fresh
#             process, with its control)
# Usage: scripts/gpu-options-check.sh [OUT_DIR [STEP...]]  (default: every step)
# Writes summary.txt, a log per step and the benchmark JSON and Markdown to
# OUT_DIR (default $OUT).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/gpu-lib.sh
. scripts/gpu-lib.sh
gpu_setup /tmp/lltm-gpu-options "build tests sanitize bench deploy" "$@"
step_width=28
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
device_wheels /tmp/lltm-site
gpu_header

if wants build; then
  build_step
fi
if wants tests; then
  # LLTM_TESTS: the test folders, space-separated (default: the sequence's).
  read -ra test_files <<<"${LLTM_TESTS:-tests/sequence}"
  step tests tests.log timeout "${LLTM_TEST_TIMEOUT:-240}" "$py" -m pytest "${test_files[@]}" \
    -m cuda -p no:cacheprovider -q -rs --durations=10
fi
if wants sanitize; then
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 step memcheck sanitize.log timeout 120 \
    "${sanitizer[@]}" --tool memcheck "$py" -m pytest tests/sequence \
    -p no:cacheprovider -q -m cuda \
    -k "(packed_matches and (mixed or all-different)) or (padded_matches and given-state and L2) or bitwise"
fi
# One JSON and one Markdown table per benchmark, from the sequence benchmark's
# own options (scripts/bench_tables.py makes the Markdown).
bench() {
  local name=$1
  shift
  step "bench $name" bench.log timeout "${LLTM_BENCH_TIMEOUT:-170}" \
    "$py" -m lltm.benchmark --sequence --device cuda --json "$out/$name.json" "$@"
}
if wants bench; then
  LLTM_BENCH_TIMEOUT=80 bench packed-float32 --sweep --packed --precision float32
  LLTM_BENCH_TIMEOUT=80 bench packed-float16 --sweep --packed --precision float16
  # Wall time only (the goal's measure): the GPU time's captures would double a sweep.
  bench bidirectional-float32 --sweep --bidirectional --precision float32 --no-gpu-time
  bench bidirectional-float16 --sweep --bidirectional --precision float16 --no-gpu-time
  for f in "$out"/*.json; do
    "$py" scripts/bench_tables.py "$f" >"${f%.json}.md" 2>>"$out/bench.log"
  done
fi
if wants deploy; then
  step deploy deploy.log timeout 150 "$py" -m pytest tests/packaging -k deploy -m cuda \
    -p no:cacheprovider -q -rs
fi
print_summary
all_passed
