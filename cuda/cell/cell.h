// Launchers of the LLTM pointwise CUDA kernels (lltm_kernel.cu).
//
// The kernel library is plain CUDA C++: it takes raw pointers, sizes and a
// stream, and knows nothing of ATen. cpp/lltm_cuda.cpp validates and prepares
// the tensors, runs the GEMMs through ATen (cuBLAS) and calls these.
//
// T is float, double, __half or __nv_bfloat16. Each launcher returns
// cudaGetLastError() taken right after its last launch, for the caller to
// check; it launches nothing when the batch or the state is empty.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace lltm::cuda {

// The forward pass over a [batch, state] problem. Rows are addressed as
// row * ld + column.
template <typename T>
struct ForwardArgs {
  // Pre-activations [batch, 3 * state] = [Z_i | Z_o | Z_c], with row stride
  // ld_z, without the bias unless `bias` is nullptr.
  const T* z;
  int64_t ld_z;
  const T* bias; // [3 * state], or nullptr
  const T* old_cell; // [batch, state], dense
  T* new_h; // [batch, state], dense
  T* new_cell; // [batch, state], dense
  // The activations i, o and g, with row stride ld_act, or all nullptr when
  // nothing is saved for a backward. They may alias z element for element:
  // each pre-activation is read before its activation is written.
  T* input_gate;
  T* output_gate;
  T* candidate_cell;
  int64_t ld_act;
  // z + bias written back in place (the tutorial's gate_weights), or nullptr.
  T* z_with_bias;
  int64_t batch;
  int64_t state;
};

// A [batch, state] operand read through its strides, which may be 0 (an
// expanded upstream gradient); nullptr reads as zeros (no gradient).
template <typename T>
struct Strided {
  const T* data;
  int64_t row_stride;
  int64_t col_stride;
};

template <typename T>
struct BackwardArgs {
  Strided<T> grad_h;
  Strided<T> grad_cell;
  const T* new_cell; // [batch, state], dense
  // The saved activations, with row stride ld_act.
  const T* input_gate;
  const T* output_gate;
  const T* candidate_cell;
  int64_t ld_act;
  T* d_gates; // [batch, 3 * state], dense: [dZ_i | dZ_o | dZ_c]
  T* d_old_cell; // [batch, state], dense, or nullptr
  T* d_bias; // [3 * state]: the column sums of d_gates, or nullptr
  int64_t batch;
  int64_t state;
  // A second addend of grad_h, dense rows with row stride ld_grad_h_add (a
  // sequence's recurrent gradient, dZ_{t+1} W_h), or nullptr.
  const T* grad_h_add = nullptr;
  int64_t ld_grad_h_add = 0;
};

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

// The small-problem path (lltm_small.cu): when the GEMMs are tiny, a cuBLAS
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
