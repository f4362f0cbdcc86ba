// The schemas of the sequence operators and their input checks, which every
// backend shares (sequence.h states the math).
#include "cpp/sequence/sequence.h"

#include "cpp/sequence/segments.h"

#include <torch/library.h>

#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace lltm::sequence {
namespace {

using checks::Arg;
using checks::check_dim;
using checks::check_dtypes_and_devices;
using checks::check_shape;
using checks::shape_str;

constexpr const char* kSteps = "[steps, batch, input_features]";
constexpr const char* kPacked = "[sum(batch_sizes), input_features]";
constexpr const char* kState = "[batch, state_size]";
constexpr const char* kStates = "[steps, batch, state_size]";
constexpr const char* kGates = "[steps, batch, 3 * state_size]";
constexpr const char* kWeights =
    "[3 * state_size, state_size + input_features]";
// With a direction dimension.
constexpr const char* kDirWeights =
    "[directions, 3 * state_size, state_size + input_features]";
constexpr const char* kDirState = "[directions, batch, state_size]";
constexpr const char* kDirStates = "[directions, steps, batch, state_size]";
constexpr const char* kDirGates = "[directions, steps, batch, 3 * state_size]";
// The output: direction d's h_t in columns [d S, (d + 1) S).
constexpr const char* kOutput = "[steps, batch, directions * state_size]";
constexpr const char* kPackedOutput =
    "[sum(batch_sizes), directions * state_size]";
constexpr const char* kPackedStates = "[sum(batch_sizes), state_size]";

// How many directions the weights hold: [3S, S + F] is one, with no
// direction dimension anywhere; [D, 3S, S + F] is D = 1 or 2.
std::pair<int64_t, bool> check_directions(
    const char* op,
    const at::Tensor& weights) {
  TORCH_CHECK_VALUE(
      weights.dim() == 2 || weights.dim() == 3,
      op,
      ": expected weights to be a 2-D tensor ",
      kWeights,
      " or a 3-D tensor ",
      kDirWeights,
      ", but got a ",
      std::to_string(weights.dim()),
      "-D tensor of shape ",
      shape_str(weights.sizes()));
  if (weights.dim() == 2) {
    return {1, false};
  }
  const int64_t D = weights.size(0);
  TORCH_CHECK_VALUE(
      D == 1 || D == 2,
      op,
      ": expected weights to hold 1 or 2 directions (its first dimension), "
      "but got ",
      std::to_string(D));
  return {D, true};
}

void check_bias(
    const char* op,
    const at::Tensor& bias,
    int64_t state_size,
    bool stacked,
    int64_t directions) {
  if (!stacked) {
    checks::check_bias(op, bias, state_size);
    return;
  }
  const int64_t G = 3 * state_size;
  const int64_t D = directions;
  const bool bias_ok =
      (bias.dim() == 2 && bias.size(0) == D && bias.size(1) == G) ||
      (bias.dim() == 3 && bias.size(0) == D && bias.size(1) == 1 &&
       bias.size(2) == G);
  TORCH_CHECK_VALUE(
      bias_ok,
      op,
      ": expected bias to have shape [directions, 3 * state_size] = ",
      shape_str({D, G}),
      " or [directions, 1, 3 * state_size] = ",
      shape_str({D, 1, G}),
      ", but got ",
      shape_str(bias.sizes()));
}

// batch_sizes as a PackedSequence holds them: int64 on the CPU, one entry
// per step, each at least 1 and none larger than the one before. Returns
// the values.
std::vector<int64_t> check_batch_sizes(
    const char* op,
    const at::Tensor& batch_sizes) {
  TORCH_CHECK_VALUE(
      batch_sizes.dim() == 1 && batch_sizes.scalar_type() == at::kLong &&
          batch_sizes.device().is_cpu(),
      op,
      ": expected batch_sizes to be a 1-D int64 tensor on the CPU, [steps] "
      "(a PackedSequence's), but got a ",
      std::to_string(batch_sizes.dim()),
      "-D ",
      std::string(c10::getDtypeNames(batch_sizes.scalar_type()).first),
      " tensor on ",
      batch_sizes.device().str());
  const at::Tensor dense = batch_sizes.contiguous();
  const int64_t* data = dense.const_data_ptr<int64_t>();
  std::vector<int64_t> values(data, data + dense.numel());
  for (size_t t = 0; t < values.size(); ++t) {
    TORCH_CHECK_VALUE(
        values[t] >= 1 && (t == 0 || values[t] <= values[t - 1]),
        op,
        ": expected batch_sizes to be at least 1 and non-increasing (the "
        "sequences sorted by decreasing length, as a PackedSequence holds "
        "them), but got batch_sizes[",
        std::to_string(t),
        "] = ",
        std::to_string(values[t]),
        t == 0 ? std::string() : " after " + std::to_string(values[t - 1]));
  }
  return values;
}

// What both checks do first, in the same order: batch_sizes, input's
// dimensions, the directions.
Problem check_head(
    const char* op,
    const Arg& input,
    const at::Tensor& weights,
    const std::optional<at::Tensor>& batch_sizes) {
  Problem p;
  p.packed = batch_sizes.has_value();
  if (p.packed) {
    p.batch_sizes = check_batch_sizes(op, *batch_sizes);
  }
  check_dim(op, input, p.packed ? 2 : 3, p.packed ? kPacked : kSteps);
  std::tie(p.directions, p.stacked) = check_directions(op, weights);
  return p;
}

// The sizes: the steps and features from input, the batch from input (or,
// for a packed input, from batch_sizes, whose sum input's rows must be),
// the state size from h0.
Sizes check_sizes(
    const char* op,
    const Problem& p,
    const Arg& input,
    const at::Tensor& h0) {
  const int64_t F = input.tensor.size(-1);
  const int64_t S = h0.size(-1);
  if (!p.packed) {
    return {input.tensor.size(0), input.tensor.size(1), F, S};
  }
  const auto T = static_cast<int64_t>(p.batch_sizes.size());
  const int64_t N =
      std::accumulate(p.batch_sizes.begin(), p.batch_sizes.end(), int64_t(0));
  check_shape(op, input, {N, F}, kPacked);
  return {T, T > 0 ? p.batch_sizes[0] : h0.size(-2), F, S};
}

void check_weights(const char* op, const Arg& weights, const Problem& p) {
  const int64_t S = p.sizes.state_size;
  const int64_t F = p.sizes.input_features;
  check_shape(
      op,
      weights,
      directed(p.stacked, p.directions, {3 * S, S + F}),
      p.stacked ? kDirWeights : kWeights);
}

} // namespace

Problem check_forward_args(
    const at::Tensor& input,
    const ForwardInputs& inputs,
    const std::optional<at::Tensor>& batch_sizes,
    const char* op) {
  const at::Tensor& weights = inputs.weights;
  const at::Tensor& bias = inputs.bias;
  const at::Tensor& h0 = inputs.h0;
  const at::Tensor& c0 = inputs.c0;
  const Arg input_arg{input, "input"};
  const Arg weights_arg{weights, "weights"};
  const Arg h0_arg{h0, "h0"};
  const Arg c0_arg{c0, "c0"};
  check_dtypes_and_devices(
      op, {input_arg, weights_arg, Arg{bias, "bias"}, h0_arg, c0_arg});
  Problem p = check_head(op, input_arg, weights, batch_sizes);
  const int64_t D = p.directions;
  const char* state_layout = p.stacked ? kDirState : kState;
  check_dim(op, h0_arg, p.stacked ? 3 : 2, state_layout);
  check_dim(op, c0_arg, p.stacked ? 3 : 2, state_layout);
  p.sizes = check_sizes(op, p, input_arg, h0);
  const int64_t B = p.sizes.batch;
  const int64_t S = p.sizes.state_size;
  check_shape(op, h0_arg, directed(p.stacked, D, {B, S}), state_layout);
  check_shape(op, c0_arg, directed(p.stacked, D, {B, S}), state_layout);
  check_weights(op, weights_arg, p);
  check_bias(op, bias, S, p.stacked, D);
  return p;
}

Problem check_backward_args(
    const at::Tensor& input,
    const at::Tensor& h0,
    const at::Tensor& output,
    const BackwardInputs& inputs,
    const std::optional<at::Tensor>& batch_sizes) {
  const auto& grad_output = inputs.grad_output;
  const auto& grad_h_n = inputs.grad_h_n;
  const auto& grad_c_n = inputs.grad_c_n;
  const at::Tensor& weights = inputs.weights;
  const at::Tensor& cells = inputs.cells;
  const at::Tensor& gates = inputs.gates;
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
  Problem p = check_head(op, input_arg, weights, batch_sizes);
  const int64_t D = p.directions;
  const bool stacked = p.stacked;
  const char* state_layout = stacked ? kDirState : kState;
  const char* states_layout = stacked ? kDirStates : kStates;
  const char* gates_layout = stacked ? kDirGates : kGates;
  const char* output_layout = p.packed
      ? (stacked ? kPackedOutput : kPackedStates)
      : (stacked ? kOutput : kStates);
  check_dim(op, h0_arg, stacked ? 3 : 2, state_layout);
  checks::check_dims(
      op, {output_arg, grad_output_arg}, p.packed ? 2 : 3, output_layout);
  checks::check_dims(op, {cells_arg}, stacked ? 4 : 3, states_layout);
  check_dim(op, gates_arg, stacked ? 4 : 3, gates_layout);
  checks::check_dims(
      op, {grad_h_n_arg, grad_c_n_arg}, stacked ? 3 : 2, state_layout);
  p.sizes = check_sizes(op, p, input_arg, h0);
  const auto [T, B, F, S] = p.sizes;
  const std::vector<int64_t> output_shape = p.packed
      ? std::vector<int64_t>{input.size(0), D * S}
      : std::vector<int64_t>{T, B, D * S};
  check_shape(op, h0_arg, directed(stacked, D, {B, S}), state_layout);
  check_weights(op, weights_arg, p);
  checks::check_shapes(
      op, {output_arg, grad_output_arg}, output_shape, output_layout);
  check_shape(op, cells_arg, directed(stacked, D, {T, B, S}), states_layout);
  check_shape(op, gates_arg, directed(stacked, D, {T, B, 3 * S}), gates_layout);
  checks::check_shapes(
      op,
      {grad_h_n_arg, grad_c_n_arg},
      directed(stacked, D, {B, S}),
      state_layout);
  return p;
}

} // namespace lltm::sequence

TORCH_LIBRARY_FRAGMENT(lltm, m) {
  m.set_python_module("lltm._sequence_fakes");
  // One layer over a whole sequence (sequence.h), in one or two directions,
  // of a dense or a packed batch: the op that the layer calls, then the
  // forward that also returns what its backward needs, and the backward,
  // which computes only the gradients in output_mask, in the order of the
  // forward's inputs.
  m.def(
      "sequence(Tensor input, Tensor weights, Tensor bias, Tensor h0, "
      "Tensor c0, Tensor? batch_sizes=None) -> (Tensor output, Tensor h_n, "
      "Tensor c_n)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "sequence_forward(Tensor input, Tensor weights, Tensor bias, "
      "Tensor h0, Tensor c0, Tensor? batch_sizes=None) -> (Tensor output, "
      "Tensor h_n, Tensor c_n, Tensor cells, Tensor gates)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "sequence_backward(Tensor? grad_output, Tensor? grad_h_n, "
      "Tensor? grad_c_n, Tensor input, Tensor weights, Tensor h0, "
      "Tensor output, Tensor cells, Tensor gates, Tensor? batch_sizes, "
      "bool[5] output_mask) -> (Tensor? d_input, Tensor? d_weights, "
      "Tensor? d_bias, Tensor? d_h0, Tensor? d_c0)",
      {at::Tag::pt2_compliant_tag});
}
