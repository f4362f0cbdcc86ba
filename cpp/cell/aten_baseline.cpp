// LLTM in ATen operations alone: the tutorial's "C++ extension", on any
// device. It is what lltm._C._forward_aten and _backward_aten run, the
// baseline the benchmark compares the kernels with; the dispatcher's CPU
// and CUDA kernels are in cpu.cpp and cuda.cpp.
//
// Forward, with X = [old_h | input] and Z = X W^T + b split column-wise into
// three [batch, state_size] blocks Z_i, Z_o, Z_c:
//   i = sigmoid(Z_i)    o = sigmoid(Z_o)    g = elu(Z_c)
//   new_cell = old_cell + g * i
//   new_h    = tanh(new_cell) * o
//
// Backward, with t = tanh(new_cell) and upstream gradients gh, gc:
//   d_old_cell = dc = (1 - t^2) * o * gh + gc
//   dZ_i = g * dc * i * (1 - i)
//   dZ_o = t * gh * o * (1 - o)
//   dZ_c = i * dc * elu'(Z_c),   elu'(z) = 1 if z > 0 else e^z
//   d_weights = dZ^T X    d_bias = sum over the batch of dZ
//   [d_old_h | d_input] = dZ W
//
// It uses ATen's fused forms (addcmul, the *_backward ops) and writes the
// three gate gradients straight into their columns of dZ.
#include "cpp/cell/cell.h"

#include <ATen/ops/addcmul.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/elu.h>
#include <ATen/ops/elu_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sigmoid_backward.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/tanh_backward.h>

#include <utility>

namespace lltm::aten {

ForwardResult forward(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell) {
  const Sizes sizes = check_forward_args(input, weights, bias, old_h, old_cell);
  const int64_t S = sizes.state_size;

  at::Tensor X = at::cat({old_h, input}, /*dim=*/1);
  at::Tensor gate_weights =
      at::addmm(bias.reshape({1, weights.size(0)}), X, weights.t());
  at::Tensor input_gate = at::sigmoid(gate_weights.narrow(1, 0, S));
  at::Tensor output_gate = at::sigmoid(gate_weights.narrow(1, S, S));
  at::Tensor candidate_cell = at::elu(gate_weights.narrow(1, 2 * S, S));
  at::Tensor new_cell = at::addcmul(old_cell, candidate_cell, input_gate);
  at::Tensor new_h = at::tanh(new_cell).mul_(output_gate);
  return {
      new_h,
      new_cell,
      input_gate,
      output_gate,
      candidate_cell,
      X,
      gate_weights};
}

BackwardResult backward(
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

  const at::Tensor t = at::tanh(new_cell);
  // d_old_cell = (1 - t^2) * (o * gh) + gc
  at::Tensor d_old_cell =
      at::tanh_backward(at::mul(grad_h, output_gate), t).add_(grad_cell);

  at::Tensor d_gates = at::empty({B, 3 * S}, grad_h.options());
  at::Tensor d_gate_i = d_gates.narrow(1, 0, S);
  at::Tensor d_gate_o = d_gates.narrow(1, S, S);
  at::Tensor d_gate_c = d_gates.narrow(1, 2 * S, S);
  at::sigmoid_backward_out(
      d_gate_i, at::mul(candidate_cell, d_old_cell), input_gate);
  at::sigmoid_backward_out(d_gate_o, at::mul(t, grad_h), output_gate);
  at::elu_backward_out(
      d_gate_c,
      at::mul(input_gate, d_old_cell),
      /*alpha=*/1,
      /*scale=*/1,
      /*input_scale=*/1,
      /*is_result=*/false,
      gate_weights.narrow(1, 2 * S, S));

  at::Tensor d_weights = at::mm(d_gates.t(), X);
  at::Tensor d_bias = at::sum(d_gates, /*dim=*/0, /*keepdim=*/true);
  const at::Tensor d_X = at::mm(d_gates, weights);
  at::Tensor d_old_h = d_X.narrow(1, 0, S).clone(at::MemoryFormat::Contiguous);
  at::Tensor d_input =
      d_X.narrow(1, S, d_X.size(1) - S).clone(at::MemoryFormat::Contiguous);
  return {d_old_h, d_input, d_weights, d_bias, std::move(d_old_cell)};
}

} // namespace lltm::aten
