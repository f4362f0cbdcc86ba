// Launchers of the LLTM pointwise CUDA kernels (lltm_kernel.cu).
//
// The kernel library is plain CUDA C++: it takes raw pointers, sizes and a
// stream, and knows nothing of ATen. cpp/lltm_cuda.cpp validates and prepares
// the tensors, runs the GEMMs through ATen (cuBLAS) and calls these.
//
// scalar_t is float, double, __half or __nv_bfloat16; every tensor is
// contiguous. Each launcher returns cudaGetLastError() taken right after its
// launch, for the caller to check.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lltm::cuda {

// From the pre-activations gates = [Z_i | Z_o | Z_c] ([batch, 3 * state]) and
// old_cell ([batch, state]), writes the five [batch, state] outputs.
template <typename scalar_t>
cudaError_t launch_forward_pointwise(
    const scalar_t* gates,
    const scalar_t* old_cell,
    scalar_t* new_h,
    scalar_t* new_cell,
    scalar_t* input_gate,
    scalar_t* output_gate,
    scalar_t* candidate_cell,
    int64_t batch,
    int64_t state_size,
    cudaStream_t stream);

// Writes d_gates = [dZ_i | dZ_o | dZ_c] ([batch, 3 * state]) and d_old_cell
// ([batch, state]) from the upstream gradients and the saved activations.
template <typename scalar_t>
cudaError_t launch_backward_pointwise(
    const scalar_t* grad_h,
    const scalar_t* grad_cell,
    const scalar_t* new_cell,
    const scalar_t* input_gate,
    const scalar_t* output_gate,
    const scalar_t* candidate_cell,
    const scalar_t* gates,
    scalar_t* d_gates,
    scalar_t* d_old_cell,
    int64_t batch,
    int64_t state_size,
    cudaStream_t stream);

} // namespace lltm::cuda
