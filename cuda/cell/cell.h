// Launchers of the LLTM cell's CUDA kernels: the pointwise passes
// (pointwise.cu), the small problems' (small.cu) and the tiled forward
// (tiled.cu).
//
// The kernel library is plain CUDA C++: it takes raw pointers, sizes and a
// stream, and knows nothing of ATen. cpp/cell/cuda.cpp validates and prepares
// the tensors, runs the GEMMs through ATen (cuBLAS) and calls these.
//
// T is float, double, __half or __nv_bfloat16. Each launcher returns
// cudaGetLastError() taken right after its last launch, for the caller to
// check; it launches nothing when the batch or the state is empty.
#pragma once

#include "cuda/common/cell_args.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace lltm::cuda {

using kernels::BackwardArgs;
using kernels::ForwardArgs;
using kernels::Strided;

// Writes new_h and new_cell, and the activations when asked for.
template <typename T>
cudaError_t launch_forward(const ForwardArgs<T>& args, cudaStream_t stream);

// The bytes of scratch memory launch_backward needs for these arguments on
// the current device: nonzero when d_bias is asked for and the batch is
// split over several blocks, whose partial sums are then added in a second,
// small kernel, in a fixed order.
template <typename T>
size_t backward_workspace_size(const BackwardArgs<T>& args);

// Writes d_gates, and d_old_cell and d_bias when asked for. `workspace`
// holds backward_workspace_size(args) bytes, aligned to 16.
template <typename T>
cudaError_t launch_backward(
    const BackwardArgs<T>& args,
    void* workspace,
    cudaStream_t stream);

// The small-problem path (small.cu): when the GEMMs are tiny, a cuBLAS
// call costs more in launch overhead and poorly chosen kernels than the
// math (docs/performance.md has the times). These kernels do the GEMMs
// themselves, in the accumulation type (float for 16-bit types, never TF32).

// The whole forward in one kernel: Z = [old_h | input] W^T read in place,
// then the pointwise pass of launch_forward, whose output pointers `cell`
// gives (cell.z and cell.ld_z are ignored, but for cell.z_with_bias, which
// has row stride ld_z). Writes X = [old_h | input] too when X != nullptr.
template <typename T>
struct SmallForwardArgs {
  Strided<T> old_h; // [batch, state]
  Strided<T> input; // [batch, input_features]
  Strided<T> weights; // [3 * state, state + input_features]
  ForwardArgs<T> cell;
  T* X; // [batch, state + input_features], dense, or nullptr
  int64_t input_features;
};

template <typename T>
cudaError_t launch_small_forward(
    const SmallForwardArgs<T>& args,
    cudaStream_t stream);

// The tiled path (tiled.cu), float alone: the same forward as
// launch_small_forward, with the GEMM in tiles through shared memory (the
// sequence's fused-step kernels, over [old_h | input] and all of W) and the
// cell in its epilogue: one launch, where cuBLAS would take a copy for X, a
// GEMM and the pointwise kernel, each with its host time.
cudaError_t launch_tiled_forward(
    const SmallForwardArgs<float>& a,
    cudaStream_t stream);

// The backward's GEMMs in one kernel, each output only when its pointer is
// set: d_weights = dZ^T X, d_old_h = dZ W_h, d_input = dZ W_x.
template <typename T>
struct SmallBackwardArgs {
  const T* d_gates; // [batch, 3 * state], dense
  const T* X; // [batch, state + input_features], dense; for d_weights
  Strided<T> weights; // [3 * state, state + input_features]
  T* d_weights; // [3 * state, state + input_features], dense, or nullptr
  T* d_old_h; // [batch, state], dense, or nullptr
  T* d_input; // [batch, input_features], dense, or nullptr
  int64_t batch;
  int64_t input_features;
  int64_t state;
};

template <typename T>
cudaError_t launch_small_backward_gemms(
    const SmallBackwardArgs<T>& args,
    cudaStream_t stream);

} // namespace lltm::cuda
