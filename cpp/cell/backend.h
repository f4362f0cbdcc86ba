// What the CPU and CUDA kernels of the cell ops share (cpu.cpp,
// cuda.cpp): the tensors of the pointwise passes, and the two backward
// ops, which run the same steps on either backend.
//
// A backend is a struct with
//   Guard                     constructed from the inputs' device: a device
//                             guard, or NoGuard
//   run(Op{}, sizes, inputs[, save_X])
//                             the body of the forward op Op (ops::Cell,
//                             ops::CellForward, ops::Forward), after the
//                             checks
//   pointwise_backward(t)     the fused pointwise backward over
//                             BackwardTensors; returns d_bias ([3 * state])
//                             when t.want_bias, else an undefined tensor
//   gemms_backward(d_gates, X, weights, mask, result)
//                             the GEMMs of the gradients in mask
#pragma once

#include "cpp/cell/cell.h"
#include "cpp/ops/ops.h"

#include <ATen/ops/empty.h>
#include <c10/core/Device.h>

#include <optional>
#include <utility>

namespace lltm::backend {

// For backends that need no device guard.
struct NoGuard {
  explicit NoGuard(c10::Device /*device*/) {}
};

// The inputs of the forward ops.
struct CellInputs {
  const at::Tensor& input;
  const at::Tensor& weights;
  const at::Tensor& bias;
  const at::Tensor& old_h;
  const at::Tensor& old_cell;
};

// The kernel of a forward op: the checks (in the op's name), the device
// guard, then the backend's body. ops::Cell::kernel<ForwardKernel<B>> is
// lltm::cell's kernel on backend B, and so on.
template <typename Backend>
struct ForwardKernel {
  template <typename Op, typename... More>
  static typename Op::Result call(
      const at::Tensor& input,
      const at::Tensor& weights,
      const at::Tensor& bias,
      const at::Tensor& old_h,
      const at::Tensor& old_cell,
      More... more) {
    const Sizes sizes =
        check_forward_args(input, weights, bias, old_h, old_cell, Op::name);
    const typename Backend::Guard guard(input.device());
    return Backend::run(
        Op{},
        sizes,
        CellInputs{input, weights, bias, old_h, old_cell},
        more...);
  }
};

// The pointwise forward over z (pre-activations without the bias), writing
// new_h and new_cell, and the activations i, o, g where given.
struct ForwardTensors {
  const at::Tensor& z;
  const at::Tensor& bias;
  const at::Tensor& old_cell;
  at::Tensor& new_h;
  at::Tensor& new_cell;
  // The activations: three [batch, state] tensors, or all three packed as
  // [i | o | g] in input_gate ([batch, 3 * state]) with the others nullptr.
  // Raw offsets rather than views: a view costs a dispatcher call.
  const at::Tensor* input_gate = nullptr;
  const at::Tensor* output_gate = nullptr;
  const at::Tensor* candidate_cell = nullptr;
  bool write_z_with_bias = false;
};

// The outputs of the tutorial's forward besides X and Z: new_h, new_cell and
// the three activations, as dense [batch, state] tensors.
struct TutorialOutputs {
  at::Tensor new_h, new_cell, input_gate, output_gate, candidate_cell;

  TutorialOutputs(int64_t batch, int64_t state, const at::TensorOptions& o)
      : new_h(at::empty({batch, state}, o)),
        new_cell(at::empty({batch, state}, o)),
        input_gate(at::empty({batch, state}, o)),
        output_gate(at::empty({batch, state}, o)),
        candidate_cell(at::empty({batch, state}, o)) {}

  // The pointwise pass that writes them, and Z + b over z.
  ForwardTensors over(
      const at::Tensor& z,
      const at::Tensor& bias,
      const at::Tensor& old_cell) {
    ForwardTensors t{z, bias, old_cell, new_h, new_cell};
    t.input_gate = &input_gate;
    t.output_gate = &output_gate;
    t.candidate_cell = &candidate_cell;
    t.write_z_with_bias = true;
    return t;
  }

  ForwardResult result(at::Tensor X, at::Tensor gate_weights) && {
    return {
        std::move(new_h),
        std::move(new_cell),
        std::move(input_gate),
        std::move(output_gate),
        std::move(candidate_cell),
        std::move(X),
        std::move(gate_weights)};
  }
};

// The pointwise backward: dZ into d_gates, dc into d_old_cell when given,
// and d_bias when asked for. The activations are three dense [batch, state]
// tensors, or packed as [i | o | g] in input_gate (dense rows) with
// output_gate and candidate_cell nullptr.
struct BackwardTensors {
  const std::optional<at::Tensor>& grad_h;
  const std::optional<at::Tensor>& grad_cell;
  const at::Tensor& new_cell;
  const at::Tensor& input_gate;
  const at::Tensor* output_gate;
  const at::Tensor* candidate_cell;
  at::Tensor& d_gates;
  at::Tensor* d_old_cell;
  bool want_bias;
};

// lltm::cell_backward.
template <typename Backend>
CellBackwardResult cell_backward(
    const std::optional<at::Tensor>& grad_h,
    const std::optional<at::Tensor>& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& gates,
    const std::optional<at::Tensor>& X,
    const at::Tensor& weights,
    OutputMask mask) {
  const Sizes sizes = check_cell_backward_args(
      grad_h, grad_cell, new_cell, gates, X, weights, mask);
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const typename Backend::Guard guard(new_cell.device());
  const auto options = new_cell.options();
  // The activations are read through one row stride.
  const at::Tensor gates_c = gates.contiguous();
  at::Tensor d_gates = at::empty({B, 3 * S}, options);
  at::Tensor d_old_cell;
  if (mask[4]) {
    d_old_cell = at::empty({B, S}, options);
  }
  at::Tensor d_bias = Backend::pointwise_backward(
      {grad_h,
       grad_cell,
       new_cell,
       gates_c,
       nullptr,
       nullptr,
       d_gates,
       mask[4] ? &d_old_cell : nullptr,
       mask[2]});
  CellBackwardResult result;
  if (mask[2]) {
    std::get<2>(result) = std::move(d_bias);
  }
  if (mask[4]) {
    std::get<4>(result) = std::move(d_old_cell);
  }
  Backend::gemms_backward(d_gates, X, weights, mask, result);
  return result;
}

// lltm::backward, the tutorial's.
template <typename Backend>
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
  const typename Backend::Guard guard(grad_h.device());
  const auto options = grad_h.options();
  at::Tensor d_gates = at::empty({B, 3 * S}, options);
  at::Tensor d_old_cell = at::empty({B, S}, options);
  const std::optional<at::Tensor> grad_h_opt = grad_h;
  const std::optional<at::Tensor> grad_cell_opt = grad_cell;
  const at::Tensor input_c = input_gate.contiguous();
  const at::Tensor output_c = output_gate.contiguous();
  const at::Tensor candidate_c = candidate_cell.contiguous();
  at::Tensor d_bias = Backend::pointwise_backward(
      {grad_h_opt,
       grad_cell_opt,
       new_cell,
       input_c,
       &output_c,
       &candidate_c,
       d_gates,
       &d_old_cell,
       /*want_bias=*/true});
  CellBackwardResult gemms;
  Backend::gemms_backward(
      d_gates, X, weights, {true, true, false, true, false}, gemms);
  return {
      *std::get<3>(gemms),
      *std::get<0>(gemms),
      *std::get<1>(gemms),
      d_bias.reshape({1, 3 * S}),
      d_old_cell};
}

} // namespace lltm::backend
