#!/usr/bin/env bash
# cibuildwheel's before-all on Linux, in the manylinux_2_28 image (AlmaLinux
# 8). For a CUDA variant (LLTM_WHEEL_VARIANT=cuNNN): the CUDA compiler of that
# version from NVIDIA's RHEL 8 repository at /usr/local/cuda (CUDA_HOME in
# pyproject.toml), and the newest GCC that version supports as its host
# compiler at /opt/lltm-cuda-host (CUDAHOSTCXX in pyproject.toml): the
# image's default GCC can be newer than nvcc accepts (GCC <= 13 for CUDA 12.6).
# Like this project's CI machine, only the compiler, the runtime headers and
# the tools: cuBLAS and the other libraries come with the CUDA build of torch.
# The cpu variant needs nothing.
set -euo pipefail
variant=${LLTM_WHEEL_VARIANT:?set LLTM_WHEEL_VARIANT: cpu, cu126, cu130, ...}
if [[ $variant == cpu ]]; then
  echo "manylinux-cuda.sh: the cpu variant needs no CUDA toolkit"
  exit 0
fi
if [[ ! $variant =~ ^cu([0-9]+)([0-9])$ ]]; then
  echo "manylinux-cuda.sh: LLTM_WHEEL_VARIANT=$variant: expected cpu or cuNNN, like cu130" >&2
  exit 1
fi
major=${BASH_REMATCH[1]}
minor=${BASH_REMATCH[2]}
if [[ $(uname -m) != x86_64 ]]; then
  echo "manylinux-cuda.sh: the CUDA variants are built for x86_64, not $(uname -m)" >&2
  exit 1
fi
# The newest GCC each CUDA major supports as host compiler (NVIDIA's
# installation guide): 12.6 takes GCC 13, 13.x takes GCC 14 (and 15).
case $major in
  12) gcc=13 ;;
  13) gcc=14 ;;
  *)
    echo "manylinux-cuda.sh: no host compiler chosen for CUDA $major.$minor: add it here" >&2
    exit 1
    ;;
esac

v=$major-$minor
echo "=== CUDA $major.$minor compiler, gcc-toolset-$gcc host compiler"
dnf install -y -q dnf-plugins-core
dnf config-manager --add-repo \
  https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo
dnf install -y -q --setopt=install_weak_deps=False \
  "cuda-nvcc-$v" "cuda-cudart-devel-$v" "cuda-cccl-$v" "cuda-nvtx-$v" \
  "cuda-profiler-api-$v" "cuda-cupti-$v" "cuda-driver-devel-$v" "cuda-cuobjdump-$v" \
  "gcc-toolset-$gcc-gcc-c++"
dnf clean all
ln -sfn "/usr/local/cuda-$major.$minor" /usr/local/cuda
ln -sfn "/opt/rh/gcc-toolset-$gcc/root/usr" /opt/lltm-cuda-host

# Fail here, clearly, rather than deep in a CMake run.
/usr/local/cuda/bin/nvcc --version
/opt/lltm-cuda-host/bin/g++ --version | head -n 1
probe=$(mktemp -d)
printf '__global__ void k(float *x) { x[threadIdx.x] += 1.0f; }\n' >"$probe/probe.cu"
/usr/local/cuda/bin/nvcc -ccbin /opt/lltm-cuda-host/bin/g++ -c "$probe/probe.cu" -o "$probe/probe.o"
rm -r "$probe"
echo "manylinux-cuda.sh: nvcc $major.$minor with gcc-toolset-$gcc compiles"
