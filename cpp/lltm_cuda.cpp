// LLTM on CUDA: the C++ layer over the kernel library in cuda/.
//
// Forward:  X = [old_h | input], Z = X W^T + b (cuBLAS), then one fused
//           kernel for the gates and the new state (cuda/lltm_kernel.cu).
// Backward: one fused kernel for d_gates = dZ and d_old_cell, then cuBLAS for
//           d_weights = dZ^T X, [d_old_h | d_input] = dZ W, and a reduction
//           for d_bias.
//
// Each call validates its inputs with the shared checks, makes the operands
// contiguous, and launches on the current stream of the inputs' device.
#include "lltm.h"

#include "../cuda/lltm_kernel.h"

#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <utility>

namespace lltm {
namespace {

// The kernel library's element type for an ATen scalar type (same layout).
template <typename scalar_t>
struct KernelType {
  using type = scalar_t;
};
template <>
struct KernelType<c10::Half> {
  using type = __half;
};
template <>
struct KernelType<c10::BFloat16> {
  using type = __nv_bfloat16;
};

template <typename scalar_t>
using kernel_t = typename KernelType<scalar_t>::type;

template <typename scalar_t>
const kernel_t<scalar_t>* in(const at::Tensor& t) {
  return reinterpret_cast<const kernel_t<scalar_t>*>(
      t.const_data_ptr<scalar_t>());
}

template <typename scalar_t>
kernel_t<scalar_t>* out(at::Tensor& t) {
  return reinterpret_cast<kernel_t<scalar_t>*>(t.mutable_data_ptr<scalar_t>());
}

ForwardResult lltm_forward_cuda(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell) {
  const Sizes sizes = check_forward_args(input, weights, bias, old_h, old_cell);
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const c10::cuda::CUDAGuard device_guard(input.device());

  auto [X, gate_weights] = gate_preactivations(input, weights, bias, old_h);
  const at::Tensor old_cell_c = old_cell.contiguous();
  const auto options = old_cell.options();
  at::Tensor new_h = at::empty({B, S}, options);
  at::Tensor new_cell = at::empty({B, S}, options);
  at::Tensor input_gate = at::empty({B, S}, options);
  at::Tensor output_gate = at::empty({B, S}, options);
  at::Tensor candidate_cell = at::empty({B, S}, options);

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "lltm_forward_cuda", [&] {
        C10_CUDA_CHECK(
            cuda::launch_forward_pointwise(
                in<scalar_t>(gate_weights),
                in<scalar_t>(old_cell_c),
                out<scalar_t>(new_h),
                out<scalar_t>(new_cell),
                out<scalar_t>(input_gate),
                out<scalar_t>(output_gate),
                out<scalar_t>(candidate_cell),
                B,
                S,
                stream));
      });
  return {
      new_h,
      new_cell,
      input_gate,
      output_gate,
      candidate_cell,
      X,
      gate_weights};
}

BackwardResult lltm_backward_cuda(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& input_gate,
    const at::Tensor& output_gate,
    const at::Tensor& candidate_cell,
    const at::Tensor& X,
    const at::Tensor& gate_weights,
    const at::Tensor& weights) {
  const Sizes sizes = check_backward_args(
      grad_h,
      grad_cell,
      new_cell,
      input_gate,
      output_gate,
      candidate_cell,
      X,
      gate_weights,
      weights);
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const c10::cuda::CUDAGuard device_guard(grad_h.device());

  // Upstream gradients are often expanded (e.g. from .sum()): make every
  // operand dense once, here.
  const at::Tensor grad_h_c = grad_h.contiguous();
  const at::Tensor grad_cell_c = grad_cell.contiguous();
  const at::Tensor new_cell_c = new_cell.contiguous();
  const at::Tensor input_gate_c = input_gate.contiguous();
  const at::Tensor output_gate_c = output_gate.contiguous();
  const at::Tensor candidate_cell_c = candidate_cell.contiguous();
  const at::Tensor gate_weights_c = gate_weights.contiguous();
  at::Tensor d_gates = at::empty({B, 3 * S}, grad_h.options());
  at::Tensor d_old_cell = at::empty({B, S}, grad_h.options());

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      grad_h.scalar_type(),
      "lltm_backward_cuda",
      [&] {
        C10_CUDA_CHECK(
            cuda::launch_backward_pointwise(
                in<scalar_t>(grad_h_c),
                in<scalar_t>(grad_cell_c),
                in<scalar_t>(new_cell_c),
                in<scalar_t>(input_gate_c),
                in<scalar_t>(output_gate_c),
                in<scalar_t>(candidate_cell_c),
                in<scalar_t>(gate_weights_c),
                out<scalar_t>(d_gates),
                out<scalar_t>(d_old_cell),
                B,
                S,
                stream));
      });
  return backward_gemms(d_gates, X, weights, std::move(d_old_cell));
}

} // namespace
} // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CUDA, m) {
  m.impl("forward", &lltm::lltm_forward_cuda);
  m.impl("backward", &lltm::lltm_backward_cuda);
}
