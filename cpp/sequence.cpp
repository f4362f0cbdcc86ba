// Schemas of the sequence operators, their input checks (shared by every
// backend), what every backend runs around its step loops, the step loops
// in ATen operations (the CUDA per-step path), and the C++ API. sequence.h
// states the math.
#include "sequence.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <utility>

namespace lltm::sequence {
namespace {

using checks::Arg;
using checks::check_bias;
using checks::check_dim;
using checks::check_dtypes_and_devices;
using checks::check_shape;

constexpr const char* kSteps = "[steps, batch, input_features]";
constexpr const char* kState = "[batch, state_size]";
constexpr const char* kStates = "[steps, batch, state_size]";
constexpr const char* kGates = "[steps, batch, 3 * state_size]";
constexpr const char* kWeights =
    "[3 * state_size, state_size + input_features]";

std::optional<at::Tensor> step(
    const std::optional<at::Tensor>& t,
    int64_t index) {
  return t ? std::optional<at::Tensor>(t->select(0, index)) : std::nullopt;
}

// The saved tensors of zero steps.
ForwardResult with_saved(
    Result result,
    const Sizes& sizes,
    const at::Tensor& input) {
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  auto [output, h_n, c_n] = std::move(result);
  return {
      output,
      h_n,
      c_n,
      at::empty({0, B, S}, input.options()),
      at::empty({0, B, 3 * S}, input.options())};
}

} // namespace

Sizes check_forward_args(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0,
    const char* op) {
  const Arg input_arg{input, "input"};
  const Arg weights_arg{weights, "weights"};
  const Arg bias_arg{bias, "bias"};
  const Arg h0_arg{h0, "h0"};
  const Arg c0_arg{c0, "c0"};
  check_dtypes_and_devices(
      op, {input_arg, weights_arg, bias_arg, h0_arg, c0_arg});
  check_dim(op, input_arg, 3, kSteps);
  check_dim(op, h0_arg, 2, kState);
  check_dim(op, c0_arg, 2, kState);
  check_dim(op, weights_arg, 2, kWeights);
  // The steps, batch and features come from input, the state size from h0.
  const Sizes sizes{input.size(0), input.size(1), input.size(2), h0.size(1)};
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t F = sizes.input_features;
  check_shape(op, h0_arg, {B, S}, kState);
  check_shape(op, c0_arg, {B, S}, kState);
  check_shape(op, weights_arg, {3 * S, S + F}, kWeights);
  check_bias(op, bias, S);
  return sizes;
}

Sizes check_backward_args(
    const std::optional<at::Tensor>& grad_output,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const at::Tensor& output,
    const at::Tensor& cells,
    const at::Tensor& gates) {
  constexpr const char* op = "lltm::sequence_backward";
  const Arg input_arg{input, "input"};
  const Arg weights_arg{weights, "weights"};
  const Arg h0_arg{h0, "h0"};
  const Arg output_arg{output, "output"};
  const Arg cells_arg{cells, "cells"};
  const Arg gates_arg{gates, "gates"};
  // The optional tensors take part in the checks only when given.
  const at::Tensor none;
  const Arg grad_output_arg{grad_output ? *grad_output : none, "grad_output"};
  const Arg grad_h_n_arg{grad_h_n ? *grad_h_n : none, "grad_h_n"};
  const Arg grad_c_n_arg{grad_c_n ? *grad_c_n : none, "grad_c_n"};
  check_dtypes_and_devices(
      op, {input_arg, weights_arg, h0_arg, output_arg, cells_arg, gates_arg});
  for (const Arg& arg : {grad_output_arg, grad_h_n_arg, grad_c_n_arg}) {
    if (arg.tensor.defined()) {
      check_dtypes_and_devices(op, {input_arg, arg});
    }
  }
  check_dim(op, input_arg, 3, kSteps);
  check_dim(op, h0_arg, 2, kState);
  check_dim(op, weights_arg, 2, kWeights);
  for (const Arg& arg : {output_arg, cells_arg, grad_output_arg}) {
    if (arg.tensor.defined()) {
      check_dim(op, arg, 3, kStates);
    }
  }
  check_dim(op, gates_arg, 3, kGates);
  for (const Arg& arg : {grad_h_n_arg, grad_c_n_arg}) {
    if (arg.tensor.defined()) {
      check_dim(op, arg, 2, kState);
    }
  }
  const Sizes sizes{input.size(0), input.size(1), input.size(2), h0.size(1)};
  const int64_t T = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t F = sizes.input_features;
  check_shape(op, h0_arg, {B, S}, kState);
  check_shape(op, weights_arg, {3 * S, S + F}, kWeights);
  for (const Arg& arg : {output_arg, cells_arg, grad_output_arg}) {
    if (arg.tensor.defined()) {
      check_shape(op, arg, {T, B, S}, kStates);
    }
  }
  check_shape(op, gates_arg, {T, B, 3 * S}, kGates);
  for (const Arg& arg : {grad_h_n_arg, grad_c_n_arg}) {
    if (arg.tensor.defined()) {
      check_shape(op, arg, {B, S}, kState);
    }
  }
  return sizes;
}

ForwardBuffers prepare_forward(
    const Sizes& sizes,
    const at::Tensor& input,
    const at::Tensor& weights,
    bool save) {
  const int64_t T = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const auto options = input.options();
  ForwardBuffers b;
  b.output = at::empty({T, B, S}, options);
  b.h_n = at::empty({B, S}, options);
  b.c_n = at::empty({B, S}, options);
  if (save) {
    b.cells = at::empty({T, B, S}, options);
  }
  b.gates = at::empty({T, B, 3 * S}, options);
  // The input projection of every step: one GEMM over T * B rows.
  at::Tensor projection = b.gates.view({T * B, 3 * S});
  at::mm_out(
      projection,
      input.reshape({T * B, sizes.input_features}),
      weights_x(weights, S).t());
  return b;
}

namespace {

// The step loop: one GEMM and one pointwise kernel per step, then h_n and
// c_n. Without saving (cells undefined), c_t goes to c_n and the gates keep
// the pre-activations.
void forward_steps(
    const Sizes& sizes,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0,
    ForwardBuffers& b,
    const StepKernels& kernels) {
  const int64_t T = sizes.steps;
  const bool save = b.cells.defined();
  // W_h^T packed once: every step's GEMM reads a dense operand rather than
  // the strided column block of the weights.
  const at::Tensor w_h_t =
      weights_h(weights, sizes.state_size).t().contiguous();
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor z = b.gates.select(0, t);
    z.addmm_(t == 0 ? h0 : b.output.select(0, t - 1), w_h_t);
    at::Tensor new_h = b.output.select(0, t);
    // Without saving, c_t is written over c_{t-1} in c_n: the kernels read
    // each element of old_cell before they write it in new_cell.
    at::Tensor new_cell = save ? b.cells.select(0, t) : b.c_n;
    const at::Tensor old_cell =
        t == 0 ? c0 : (save ? b.cells.select(0, t - 1) : b.c_n);
    kernels.forward(z, bias, old_cell, new_h, new_cell, save);
  }
  b.h_n.copy_(b.output.select(0, T - 1));
  if (save) {
    b.c_n.copy_(b.cells.select(0, T - 1));
  }
}

// The reverse loop, per step the pointwise kernel and one GEMM: writes
// d_gates and returns dc_{-1} (= d_c0).
at::Tensor backward_steps(
    const Sizes& sizes,
    const std::optional<at::Tensor>& grad_output,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& weights,
    const at::Tensor& cells,
    const at::Tensor& gates,
    at::Tensor& d_gates,
    const StepKernels& kernels) {
  const int64_t T = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const at::Tensor w_h = weights_h(weights, S).contiguous(); // as above
  const auto options = gates.options();
  // dc_t, in turns: step t reads dc_t and writes dc_{t-1}.
  std::array<at::Tensor, 2> dc{
      at::empty({B, S}, options), at::empty({B, S}, options)};
  at::Tensor recurrent = at::empty({B, S}, options); // dZ_{t+1} W_h
  for (int64_t t = T - 1; t >= 0; --t) {
    std::optional<at::Tensor> grad_h = step(grad_output, t);
    std::optional<at::Tensor> grad_h_add;
    std::optional<at::Tensor> grad_cell;
    if (t == T - 1) {
      // grad_h_n takes the place of the recurrent term; the second addend
      // is read densely.
      if (!grad_h) {
        grad_h = grad_h_n;
      } else if (grad_h_n) {
        grad_h_add = grad_h_n->contiguous();
      }
      grad_cell = grad_c_n;
    } else {
      grad_h_add = recurrent;
      grad_cell = dc[(t + 1) % 2];
    }
    at::Tensor d_gates_t = d_gates.select(0, t);
    kernels.backward(
        grad_h,
        grad_h_add,
        grad_cell,
        cells.select(0, t),
        gates.select(0, t),
        d_gates_t,
        dc[t % 2]);
    if (t > 0) {
      at::mm_out(recurrent, d_gates_t, w_h);
    }
  }
  return dc[0];
}

} // namespace

StepLoops aten_step_loops(const StepKernels& kernels) {
  return {
      [kernels](
          const Sizes& sizes,
          const at::Tensor& weights,
          const at::Tensor& bias,
          const at::Tensor& h0,
          const at::Tensor& c0,
          ForwardBuffers& b) {
        forward_steps(sizes, weights, bias, h0, c0, b, kernels);
      },
      [kernels](
          const Sizes& sizes,
          const std::optional<at::Tensor>& grad_output,
          const std::optional<at::Tensor>& grad_h_n,
          const std::optional<at::Tensor>& grad_c_n,
          const at::Tensor& weights,
          const at::Tensor& cells,
          const at::Tensor& gates,
          at::Tensor& d_gates) {
        return backward_steps(
            sizes,
            grad_output,
            grad_h_n,
            grad_c_n,
            weights,
            cells,
            gates,
            d_gates,
            kernels);
      }};
}

BackwardResult finish_backward(
    const Sizes& sizes,
    const at::Tensor& d_gates,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const at::Tensor& output,
    const at::Tensor& d_c0,
    const OutputMask& mask,
    std::optional<at::Tensor> d_h0) {
  const int64_t T = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t F = sizes.input_features;
  const int64_t S = sizes.state_size;
  const at::Tensor dz = d_gates.view({T * B, 3 * S});
  BackwardResult result;
  if (mask[0]) {
    std::get<0>(result) = at::mm(dz, weights_x(weights, S)).view({T, B, F});
  }
  if (mask[1]) {
    // Into the column blocks of d_weights: [d_W_h | d_W_x].
    at::Tensor d_weights = at::empty({3 * S, S + F}, weights.options());
    at::Tensor d_w_x = d_weights.narrow(1, S, F);
    at::mm_out(d_w_x, dz.t(), input.reshape({T * B, F}));
    at::Tensor d_w_h = d_weights.narrow(1, 0, S);
    at::mm_out(d_w_h, d_gates.select(0, 0).t(), h0);
    if (T > 1) {
      d_w_h.addmm_(
          d_gates.narrow(0, 1, T - 1).view({(T - 1) * B, 3 * S}).t(),
          output.narrow(0, 0, T - 1).reshape({(T - 1) * B, S}));
    }
    std::get<1>(result) = std::move(d_weights);
  }
  if (mask[2]) {
    std::get<2>(result) = dz.sum(0);
  }
  if (mask[3]) {
    std::get<3>(result) = d_h0
        ? std::move(*d_h0)
        : at::mm(d_gates.select(0, 0), weights_h(weights, S));
  }
  if (mask[4]) {
    std::get<4>(result) = d_c0;
  }
  return result;
}

namespace {

// The results of zero steps, where no kernel runs.
Result empty_forward(
    const Sizes& sizes,
    const at::Tensor& input,
    const at::Tensor& h0,
    const at::Tensor& c0) {
  return {
      at::empty({0, sizes.batch, sizes.state_size}, input.options()),
      h0.clone(at::MemoryFormat::Contiguous),
      c0.clone(at::MemoryFormat::Contiguous)};
}

BackwardResult empty_backward(
    const Sizes& sizes,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& input,
    const at::Tensor& weights,
    const OutputMask& mask) {
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const auto options = input.options();
  auto state_grad = [&](const std::optional<at::Tensor>& g) {
    return g ? g->clone(at::MemoryFormat::Contiguous)
             : at::zeros({B, S}, options);
  };
  BackwardResult result;
  if (mask[0]) {
    std::get<0>(result) = at::empty({0, B, sizes.input_features}, options);
  }
  if (mask[1]) {
    std::get<1>(result) = at::zeros(weights.sizes(), options);
  }
  if (mask[2]) {
    std::get<2>(result) = at::zeros({3 * S}, options);
  }
  if (mask[3]) {
    std::get<3>(result) = state_grad(grad_h_n);
  }
  if (mask[4]) {
    std::get<4>(result) = state_grad(grad_c_n);
  }
  return result;
}

} // namespace

Result sequence_steps(
    const Sizes& sizes,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0,
    const StepLoops& loops) {
  if (sizes.steps == 0) {
    return empty_forward(sizes, input, h0, c0);
  }
  ForwardBuffers b = prepare_forward(sizes, input, weights, /*save=*/false);
  loops.forward(sizes, weights, bias, h0, c0, b);
  return {b.output, b.h_n, b.c_n};
}

ForwardResult sequence_forward_steps(
    const Sizes& sizes,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0,
    const StepLoops& loops) {
  if (sizes.steps == 0) {
    return with_saved(empty_forward(sizes, input, h0, c0), sizes, input);
  }
  ForwardBuffers b = prepare_forward(sizes, input, weights, /*save=*/true);
  loops.forward(sizes, weights, bias, h0, c0, b);
  return {b.output, b.h_n, b.c_n, b.cells, b.gates};
}

BackwardResult sequence_backward_steps(
    const Sizes& sizes,
    const std::optional<at::Tensor>& grad_output,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const at::Tensor& output,
    const at::Tensor& cells,
    const at::Tensor& gates,
    const OutputMask& mask,
    const StepLoops& loops) {
  if (sizes.steps == 0) {
    return empty_backward(sizes, grad_h_n, grad_c_n, input, weights, mask);
  }
  at::Tensor d_gates = at::empty(gates.sizes(), gates.options());
  const at::Tensor d_c0 = loops.backward(
      sizes, grad_output, grad_h_n, grad_c_n, weights, cells, gates, d_gates);
  return finish_backward(
      sizes, d_gates, input, weights, h0, output, d_c0, mask, std::nullopt);
}

Result run(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0) {
  static const auto op = find_op<decltype(run)>("lltm::sequence");
  return op.call(input, weights, bias, h0, c0);
}

} // namespace lltm::sequence

TORCH_LIBRARY_FRAGMENT(lltm, m) {
  m.set_python_module("lltm.ops");
  // One layer over a whole sequence (sequence.h): the op that the layer
  // calls, then the forward that also returns what its backward needs, and
  // the backward, which computes only the gradients in output_mask, in the
  // order of the forward's inputs.
  m.def(
      "sequence(Tensor input, Tensor weights, Tensor bias, Tensor h0, "
      "Tensor c0) -> (Tensor output, Tensor h_n, Tensor c_n)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "sequence_forward(Tensor input, Tensor weights, Tensor bias, "
      "Tensor h0, Tensor c0) -> (Tensor output, Tensor h_n, Tensor c_n, "
      "Tensor cells, Tensor gates)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "sequence_backward(Tensor? grad_output, Tensor? grad_h_n, "
      "Tensor? grad_c_n, Tensor input, Tensor weights, Tensor h0, "
      "Tensor output, Tensor cells, Tensor gates, bool[5] output_mask) -> "
      "(Tensor? d_input, Tensor? d_weights, Tensor? d_bias, Tensor? d_h0, "
      "Tensor? d_c0)",
      {at::Tag::pt2_compliant_tag});
}
