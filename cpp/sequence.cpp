// Schemas of the sequence operators, their input checks (shared by every
// backend), and what every backend runs around its step loops. sequence.h
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

} // namespace

Sizes check_forward_args(
    const at::Tensor& input,
    const ForwardInputs& inputs,
    const char* op) {
  const auto& [weights, bias, h0, c0] = inputs;
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
    const at::Tensor& input,
    const at::Tensor& h0,
    const at::Tensor& output,
    const BackwardInputs& inputs) {
  const auto& [grad_output, grad_h_n, grad_c_n, weights, cells, gates] = inputs;
  constexpr const char* op = "lltm::sequence_backward";
  const Arg input_arg{input, "input"};
  const Arg weights_arg{weights, "weights"};
  const Arg h0_arg{h0, "h0"};
  const Arg output_arg{output, "output"};
  const Arg cells_arg{cells, "cells"};
  const Arg gates_arg{gates, "gates"};
  const Arg grad_output_arg = checks::optional_arg(grad_output, "grad_output");
  const Arg grad_h_n_arg = checks::optional_arg(grad_h_n, "grad_h_n");
  const Arg grad_c_n_arg = checks::optional_arg(grad_c_n, "grad_c_n");
  check_dtypes_and_devices(
      op, {input_arg, weights_arg, h0_arg, output_arg, cells_arg, gates_arg});
  checks::check_given_like(
      op, input_arg, {grad_output_arg, grad_h_n_arg, grad_c_n_arg});
  check_dim(op, input_arg, 3, kSteps);
  check_dim(op, h0_arg, 2, kState);
  check_dim(op, weights_arg, 2, kWeights);
  checks::check_dims(op, {output_arg, cells_arg, grad_output_arg}, 3, kStates);
  check_dim(op, gates_arg, 3, kGates);
  checks::check_dims(op, {grad_h_n_arg, grad_c_n_arg}, 2, kState);
  const Sizes sizes{input.size(0), input.size(1), input.size(2), h0.size(1)};
  const int64_t T = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t F = sizes.input_features;
  check_shape(op, h0_arg, {B, S}, kState);
  check_shape(op, weights_arg, {3 * S, S + F}, kWeights);
  checks::check_shapes(
      op, {output_arg, cells_arg, grad_output_arg}, {T, B, S}, kStates);
  check_shape(op, gates_arg, {T, B, 3 * S}, kGates);
  checks::check_shapes(op, {grad_h_n_arg, grad_c_n_arg}, {B, S}, kState);
  return sizes;
}

namespace {

// The buffers of T > 0 steps, with the input projection in gates.
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

// What every backend computes after the reverse loop, from d_gates ([T, B,
// 3S]): the GEMMs and the bias sum of the gradients in the mask.
BackwardResult finish_backward(
    const Sizes& sizes,
    const at::Tensor& d_gates,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const at::Tensor& output,
    StateGrads state,
    const OutputMask& mask) {
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
    std::get<3>(result) = state.d_h0
        ? std::move(*state.d_h0)
        : at::mm(d_gates.select(0, 0), weights_h(weights, S));
  }
  if (mask[4]) {
    std::get<4>(result) = std::move(state.d_c0);
  }
  return result;
}

// The gradients of zero steps, where no kernel runs.
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

ForwardBuffers run_forward(
    const Sizes& sizes,
    const at::Tensor& input,
    const ForwardInputs& inputs,
    const StepLoops& loops,
    bool save) {
  if (sizes.steps == 0) {
    const auto options = input.options();
    const int64_t B = sizes.batch;
    const int64_t S = sizes.state_size;
    ForwardBuffers b;
    b.output = at::empty({0, B, S}, options);
    b.h_n = inputs.h0.clone(at::MemoryFormat::Contiguous);
    b.c_n = inputs.c0.clone(at::MemoryFormat::Contiguous);
    if (save) {
      b.cells = at::empty({0, B, S}, options);
      b.gates = at::empty({0, B, 3 * S}, options);
    }
    return b;
  }
  ForwardBuffers b = prepare_forward(sizes, input, inputs.weights, save);
  loops.forward(sizes, inputs, b);
  return b;
}

BackwardResult run_backward(
    const Sizes& sizes,
    const at::Tensor& input,
    const at::Tensor& h0,
    const at::Tensor& output,
    const BackwardInputs& inputs,
    const OutputMask& mask,
    const StepLoops& loops) {
  if (sizes.steps == 0) {
    return empty_backward(
        sizes, inputs.grad_h_n, inputs.grad_c_n, input, inputs.weights, mask);
  }
  at::Tensor d_gates = at::empty(inputs.gates.sizes(), inputs.gates.options());
  StateGrads state = loops.backward(sizes, inputs, mask, d_gates);
  return finish_backward(
      sizes,
      d_gates,
      input,
      inputs.weights,
      h0,
      output,
      std::move(state),
      mask);
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
