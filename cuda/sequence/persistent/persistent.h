// What the persistent kernels share (grid.cu, cluster.cu, cluster_mma.cu,
// plan.cu): a sum over the lanes of an item, the elements of a [steps,
// batch, state] operand, how many lanes an item takes, and each kernel's
// planner and launchers, which plan.cu calls.
#pragma once

#include "cuda/common/device.h"
#include "cuda/sequence/sequence.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lltm::cuda::detail {

// The sum of v over the `lanes` adjacent lanes of each group, in every lane
// of it. Every lane of the warp takes part.
template <typename A>
__device__ __forceinline__ A sum_lanes(A v, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// v as T stores it, in the math type: what a reader of the stored tensor
// gets, so that every path feeds the next step the same values.
template <typename T>
__device__ __forceinline__ acc_t<T> as_stored(acc_t<T> v) {
  T x;
  put(&x, v);
  return widen(x);
}

// load_element for a [steps, batch, state] operand, in one index
// expression: a Strided view of the step costs the backward registers
// (spills on sm_75).
template <typename T>
__device__ __forceinline__ acc_t<T> load_element(
    const Strided3<T>& m,
    int64_t step,
    int64_t row,
    int64_t col) {
  return m.data == nullptr
      ? acc_t<T>(0)
      : widen(m.data
                  [step * m.step_stride + row * m.row_stride +
                   col * m.col_stride]);
}

// stored_element (cuda/common/device.h) for a [steps, batch, state] operand.
template <typename T>
__device__ __forceinline__ T
stored_element(const Strided3<T>& m, int64_t step, int64_t row, int64_t col) {
  return m.data == nullptr
      ? zero_bits<T>()
      : m.data[step * m.step_stride + row * m.row_stride + col * m.col_stride];
}

// Threads per item: the most, up to a warp, that leave every item of a tile
// of `items` a group in one round.
inline int lanes_for(int64_t items, int threads = kThreads) {
  int lanes = 1;
  while (lanes < 32 && items * lanes * 2 <= threads) {
    lanes *= 2;
  }
  return lanes;
}

// What each persistent kernel brings to plan.cu: its plan of a [batch,
// state] block (kernel kNone where it does not fit), and its launches of a
// plan, with plan.workspace_bytes of workspace.
template <typename T>
struct PersistentKernel {
  cudaError_t (
      *plan)(int64_t batch, int64_t state, bool backward, SequencePlan* out);
  cudaError_t (*forward)(
      const SequenceForwardArgs<T>& args,
      const SequencePlan& plan,
      void* workspace,
      cudaStream_t stream);
  cudaError_t (*backward)(
      const SequenceBackwardArgs<T>& args,
      const SequencePlan& plan,
      void* workspace,
      cudaStream_t stream);
};

// The grid (grid.cu), the cluster on CUDA cores (cluster.cu) and on tensor
// cores (cluster_mma.cu: float16 and bfloat16 alone).
template <typename T>
const PersistentKernel<T>& grid_kernel();
template <typename T>
const PersistentKernel<T>& cluster_simt_kernel();
template <typename T>
const PersistentKernel<T>& cluster_mma_kernel();

} // namespace lltm::cuda::detail
