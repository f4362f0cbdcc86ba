# shellcheck shell=bash
# The plumbing of the GPU check scripts (gpu-check.sh, gpu-sequence-check.sh,
# gpu-hardening.sh, gpu-wheel-check.sh, gpu-all.sh), sourced from the
# repository root:
#   gpu_setup DEFAULT_OUT "DEFAULT STEPS" "$@"   sets out and steps
#   wants STEP                                   whether STEP was asked for
#   device_wheels SITE [--fresh]                 the packages of .whl/
#   gpu_header                                   the machine, into summary.txt
#   step NAME LOG COMMAND...                     one check, timed, logged
#   build_step                                   lltm with its CUDA kernels
#   print_summary, all_passed                    the summary, the exit status
# A script may set step_width (the summary's name column) and step_tail (the
# lines of a step's log echoed after it) before it calls step.

py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
summary=()
step_width=24
step_tail=4
# The sanitizer's options every check uses; the tool and the command follow.
# shellcheck disable=SC2034 # used by the scripts that source this file
sanitizer=(compute-sanitizer --error-exitcode 1 --print-limit 20)

# gpu_setup DEFAULT_OUT DEFAULT_STEPS [OUT_DIR [STEP...]]: the output folder
# ($OUT when not given) and the steps (every step when none is given).
gpu_setup() {
  local default_out=$1 default_steps=$2
  shift 2
  out=${1:-${OUT:-$default_out}}
  shift || true
  steps=${*:-$default_steps}
  mkdir -p "$out"
}

wants() { [[ " $steps " == *" $1 "* ]]; }

# device_wheels SITE [--fresh]: the machine has no network, so packages it
# lacks travel as wheels in .whl/ (scripts/fetch-device-wheels.sh); install
# them into SITE (emptied first with --fresh) and put it on PYTHONPATH.
# Returns 1 when .whl/ holds none.
device_wheels() {
  local site=$1
  compgen -G ".whl/*.whl" >/dev/null || return 1
  [[ ${2:-} == --fresh ]] && rm -rf "$site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl || exit 1
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
}

# gpu_header: the GPUs, Python, torch and the architecture list, to the
# terminal and into a new summary.txt.
gpu_header() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "no nvidia-smi"
    "$py" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
    echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-}"
  } | tee "$out/summary.txt"
}

# step NAME LOG COMMAND...: run, append to $out/LOG, record pass/fail and time.
step() {
  local name=$1 log=$2
  shift 2
  local start=$SECONDS
  echo "=== $name"
  echo "=== $name: $*" >>"$out/$log"
  "$@" >>"$out/$log" 2>&1
  local rc=$?
  tail -n "$step_tail" "$out/$log"
  summary+=("$(printf "%-${step_width}s %s (%ds, %s)" "$name" "$([ $rc = 0 ] && echo ok || echo "FAILED rc=$rc")" $((SECONDS - start)) "$log")")
  return $rc
}

# build_step: lltm with its CUDA kernels into this Python, then
# `python -m lltm`, both into build.log.
build_step() {
  LLTM_CUDA=1 step build build.log "$py" -m pip install --no-build-isolation --no-deps -v . &&
    step "python -m lltm" build.log "$py" -m lltm
}

print_summary() {
  echo
  echo "=== summary"
  printf '%s\n' "${summary[@]}" | tee -a "$out/summary.txt"
}

# The exit status of a check script: no step failed.
all_passed() { ! grep -q FAILED "$out/summary.txt"; }
