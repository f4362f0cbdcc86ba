// The LLTM operator: its C++ entry points and the input checks that every
// backend shares.
//
// The schemas live in lltm.cpp (TORCH_LIBRARY). Each backend registers its
// kernels with TORCH_LIBRARY_IMPL in its own file (lltm_cpu.cpp, and
// lltm_cuda.cpp when CUDA is built). Every kernel calls the check helper of
// its op first, so all backends reject bad input with the same message.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <tuple>

namespace lltm {

// (new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights)
using ForwardResult = std::tuple<
    at::Tensor,
    at::Tensor,
    at::Tensor,
    at::Tensor,
    at::Tensor,
    at::Tensor,
    at::Tensor>;

// (d_old_h, d_input, d_weights, d_bias, d_old_cell)
using BackwardResult =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The dtypes every backend supports: float32, float64, float16 and bfloat16.
c10::ArrayRef<at::ScalarType> supported_dtypes();

struct Sizes {
  int64_t batch;
  int64_t input_features;
  int64_t state_size;
};

// Validates the arguments of lltm::forward and returns the problem sizes.
// Throws c10::Error with a message that names the offending argument.
Sizes check_forward_args(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell);

// Validates the arguments of lltm::backward and returns the problem sizes.
Sizes check_backward_args(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& input_gate,
    const at::Tensor& output_gate,
    const at::Tensor& candidate_cell,
    const at::Tensor& X,
    const at::Tensor& gate_weights,
    const at::Tensor& weights);

// The GEMM parts, shared by every backend (ATen picks BLAS or cuBLAS).

// Returns X = [old_h | input] and the gate pre-activations
// gate_weights = X W^T + b, [batch, 3 * state_size].
std::tuple<at::Tensor, at::Tensor> gate_preactivations(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h);

// From d_gates = dZ ([batch, 3 * state_size]): d_weights = dZ^T X,
// d_bias = the batch sum of dZ, and [d_old_h | d_input] = dZ W. Returns the
// backward's outputs with d_old_cell passed through.
BackwardResult backward_gemms(
    const at::Tensor& d_gates,
    const at::Tensor& X,
    const at::Tensor& weights,
    at::Tensor d_old_cell);

// The implementation in ATen operations alone: the CPU kernels, registered
// in lltm_cpu.cpp. It runs on any device; on CUDA tensors it is the
// tutorial's "C++ extension on the GPU" that the benchmark compares the
// CUDA kernels with.
namespace aten {

ForwardResult forward(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell);

BackwardResult backward(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& input_gate,
    const at::Tensor& output_gate,
    const at::Tensor& candidate_cell,
    const at::Tensor& X,
    const at::Tensor& gate_weights,
    const at::Tensor& weights);

} // namespace aten

// The C++ API: calls the dispatcher, so it reaches the kernel of whatever
// device the tensors live on (and autograd, when it is registered).
ForwardResult forward(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell);

BackwardResult backward(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& input_gate,
    const at::Tensor& output_gate,
    const at::Tensor& candidate_cell,
    const at::Tensor& X,
    const at::Tensor& gate_weights,
    const at::Tensor& weights);

} // namespace lltm
