// Schemas of the sequence operators, their input checks (shared by every
// backend), and what every backend runs around its step loops: the input
// projection, the directions, the segments of a packed batch, and the GEMMs
// over all steps after the backward's loops. sequence.h states the math.
#include "cpp/sequence/sequence.h"

#include "cpp/sequence/choice.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>
#include <torch/library.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string>
#include <utility>

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

// The shape of a per-direction tensor: `shape` with the direction dimension
// in front when the arguments carry one.
std::vector<int64_t> directed(
    bool stacked,
    int64_t directions,
    std::initializer_list<int64_t> shape) {
  std::vector<int64_t> out;
  if (stacked) {
    out.push_back(directions);
  }
  out.insert(out.end(), shape);
  return out;
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

namespace {

// --- how a call's steps lie in the buffers -----------------------------------
//
// Each direction runs its steps over "work" buffers of rows: the input's
// rows in the order that direction takes them, and as many rows per step as
// its segment's batch. A dense input is one segment of T steps of B rows,
// and direction 1 takes its steps in reverse (a flip of the steps).
//
// Packed batches. Step t has batch_sizes[t] rows, the first ones of the
// batch: a sequence that has ended drops out, and rows never come back. The
// steps run in segments of a constant batch, so that each segment is one
// dense block for the step loops, which know nothing of lengths: a segment
// starts from the first rows of the state its previous segment ended with.
// Where the batch shrinks every few steps, a segment per change would cost
// a launch each on CUDA; there a segment lasts at least
// Engine::min_segment_steps steps and keeps its first step's batch, so that
// sequences that end inside it run on, as padding rows (of zero input), to
// the segment's end. Rows are independent in every kernel (W_h mixes a
// row's own columns only), so padding rows change nothing of the others:
// each sequence's h_n and c_n are read from its own last step (cells are
// always kept), and the backward gives padding rows zero upstream gradient
// and reads dZ of the real rows alone. Each direction runs over the same
// segments: direction 1 takes each sequence from its own end, and at its
// step t the same first batch_sizes[t] sequences are running.

struct Segment {
  int64_t first_step;
  int64_t steps;
  int64_t batch;
  int64_t row; // the first row of its block in the work buffers
};

class Steps {
 public:
  // A dense input: one segment.
  Steps(int64_t steps, int64_t batch)
      : work_rows_(steps * batch), segments_{{0, steps, batch, 0}} {}

  // A packed input.
  Steps(const std::vector<int64_t>& batch_sizes, int64_t min_steps)
      : batch_sizes_(batch_sizes) {
    const auto T = static_cast<int64_t>(batch_sizes.size());
    offset_.assign(T + 1, 0);
    for (int64_t t = 0; t < T; ++t) {
      offset_[t + 1] = offset_[t] + batch_sizes[t];
    }
    const int64_t B = T > 0 ? batch_sizes[0] : 0;
    length_.assign(B, 0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t r = 0; r < batch_sizes[t]; ++r) {
        length_[r] = t + 1;
      }
    }
    work_offset_.assign(T, 0);
    int64_t row = 0;
    for (int64_t t = 0; t < T;) {
      const int64_t b = batch_sizes[t];
      int64_t end = t + 1;
      while (end < T && (batch_sizes[end] == b || end - t < min_steps)) {
        ++end;
      }
      segments_.push_back({t, end - t, b, row});
      for (int64_t s = t; s < end; ++s) {
        work_offset_[s] = row + (s - t) * b;
        identity_ = identity_ && batch_sizes[s] == b;
      }
      row += (end - t) * b;
      t = end;
    }
    work_rows_ = row;
  }

  int64_t work_rows() const {
    return work_rows_;
  }
  const std::vector<Segment>& segments() const {
    return segments_;
  }
  // Direction 0's work rows are the input's own rows.
  bool identity() const {
    return identity_;
  }
  // How many sequences run at step t (0 past the last step).
  int64_t batch_at(int64_t t) const {
    return t < static_cast<int64_t>(batch_sizes_.size()) ? batch_sizes_[t] : 0;
  }

  // The segments of the backward: with grad_c_n, a segment ends wherever a
  // sequence does, so that its gradient joins at its own last step (the
  // loops take grad_c_n at a block's last step only); grad_h_n joins
  // through grad_output instead, which any step takes.
  std::vector<Segment> backward_segments(bool split) const {
    if (!split || batch_sizes_.empty()) { // dense: one segment
      return segments_;
    }
    std::vector<Segment> out;
    for (const Segment& s : segments_) {
      int64_t start = s.first_step;
      for (int64_t t = s.first_step + 1; t <= s.first_step + s.steps; ++t) {
        const bool last = t == s.first_step + s.steps;
        if (last || batch_sizes_[t] < batch_sizes_[t - 1]) {
          out.push_back(
              {start,
               t - start,
               s.batch,
               s.row + (start - s.first_step) * s.batch});
          start = t;
        }
      }
    }
    return out;
  }

  // Packed only. For each row of the packed input (step t, sequence r), its
  // work row in direction d: step t of direction 0, step length_r - 1 - t
  // of direction 1.
  std::vector<int64_t> work_of_packed(int64_t d) const {
    std::vector<int64_t> out(offset_.back());
    for (size_t t = 0; t < batch_sizes_.size(); ++t) {
      for (int64_t r = 0; r < batch_sizes_[t]; ++r) {
        const int64_t step =
            d == 0 ? static_cast<int64_t>(t) : length_[r] - 1 - t;
        out[offset_[t] + r] = work_offset_[step] + r;
      }
    }
    return out;
  }

  // For each sequence, the work row of its last step (in either direction).
  std::vector<int64_t> last_work() const {
    std::vector<int64_t> out(length_.size());
    for (size_t r = 0; r < length_.size(); ++r) {
      out[r] = work_offset_[length_[r] - 1] + r;
    }
    return out;
  }

  // For each row of the packed input, where h_{t-1} of direction d is in
  // [h0_d; the packed output's columns of d]: h0's row r at the direction's
  // first step, else the row of the step before (after, for direction 1).
  std::vector<int64_t> previous_of_packed(int64_t d) const {
    const auto B = static_cast<int64_t>(length_.size());
    std::vector<int64_t> out(offset_.back());
    for (size_t t = 0; t < batch_sizes_.size(); ++t) {
      for (int64_t r = 0; r < batch_sizes_[t]; ++r) {
        const auto step = static_cast<int64_t>(t);
        const bool first = d == 0 ? step == 0 : step == length_[r] - 1;
        out[offset_[t] + r] =
            first ? r : B + offset_[d == 0 ? step - 1 : step + 1] + r;
      }
    }
    return out;
  }

 private:
  bool identity_ = true;
  int64_t work_rows_ = 0;
  std::vector<Segment> segments_;
  std::vector<int64_t> batch_sizes_; // empty for a dense input
  std::vector<int64_t> offset_; // the packed input's first row of each step
  std::vector<int64_t> length_; // each sequence's
  std::vector<int64_t> work_offset_; // the work buffers' first row of each step
};

// A packed call's row indices on the device, made before the directions
// fork (the CPU's run on threads of their own).
struct Indices {
  std::array<at::Tensor, 2> work_of_packed; // undefined where identity
  std::array<at::Tensor, 2> previous_of_packed; // the backward's, for d_W_h
  at::Tensor last_work;

  Indices(
      const Steps& steps,
      int64_t directions,
      const Engine& engine,
      c10::Device device,
      bool previous) {
    for (int64_t d = 0; d < directions; ++d) {
      if (d > 0 || !steps.identity()) {
        work_of_packed[d] = engine.indices(steps.work_of_packed(d), device);
      }
      if (previous) {
        previous_of_packed[d] =
            engine.indices(steps.previous_of_packed(d), device);
      }
    }
    last_work = engine.indices(steps.last_work(), device);
  }
};

// One direction's view of an argument that may carry a direction dimension.
at::Tensor direction_of(const at::Tensor& t, int64_t d, bool stacked) {
  return stacked ? t.select(0, d) : t;
}

// Rows [row, row + steps * batch) of a work buffer ([rows, width]) as the
// segment's dense block [steps, batch, width].
at::Tensor block(const at::Tensor& work, const Segment& s) {
  return work.narrow(0, s.row, s.steps * s.batch)
      .view({s.steps, s.batch, work.size(-1)});
}

// The first `rows` rows of the last step before segment s (the previous
// segment's last step): where s starts from.
at::Tensor state_before(
    const at::Tensor& work,
    const Segment& previous,
    int64_t rows) {
  return work.narrow(
      0, previous.row + (previous.steps - 1) * previous.batch, rows);
}

// A packed tensor ([N, X]) in direction d's work rows ([W, X]); padding rows
// are zero. Direction 0 of an identity layout is the tensor itself.
at::Tensor to_work(
    const at::Tensor& packed,
    const Steps& steps,
    const Indices& idx,
    int64_t d) {
  if (d == 0 && steps.identity()) {
    return packed;
  }
  return at::zeros({steps.work_rows(), packed.size(1)}, packed.options())
      .index_copy_(0, idx.work_of_packed[d], packed);
}

// Direction d's work rows back in the packed order.
at::Tensor from_work(
    const at::Tensor& work,
    const Steps& steps,
    const Indices& idx,
    int64_t d) {
  if (d == 0 && steps.identity()) {
    return work;
  }
  return work.index_select(0, idx.work_of_packed[d]);
}

// A [rows, S] tensor whose first rows are `first` and the rest zero.
at::Tensor padded(const at::Tensor& first, int64_t rows) {
  if (first.size(0) == rows) {
    return first;
  }
  at::Tensor out = at::zeros({rows, first.size(1)}, first.options());
  out.narrow(0, 0, first.size(0)).copy_(first);
  return out;
}

// Direction d's columns of the output ([..., D * S]).
at::Tensor output_of(const at::Tensor& output, int64_t d, int64_t S) {
  return output.narrow(-1, d * S, S);
}

// The gradients of zero steps, where no kernel runs.
BackwardResult empty_backward(
    const Problem& p,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const OutputMask& mask) {
  const int64_t S = p.sizes.state_size;
  const auto options = input.options();
  auto state_grad = [&](const std::optional<at::Tensor>& g) {
    return g ? g->clone(at::MemoryFormat::Contiguous)
             : at::zeros(h0.sizes(), options);
  };
  BackwardResult result;
  if (mask[0]) {
    std::get<0>(result) = at::zeros(input.sizes(), options);
  }
  if (mask[1]) {
    std::get<1>(result) = at::zeros(weights.sizes(), options);
  }
  if (mask[2]) {
    std::get<2>(result) =
        at::zeros(directed(p.stacked, p.directions, {3 * S}), options);
  }
  if (mask[3]) {
    std::get<3>(result) = state_grad(grad_h_n);
  }
  if (mask[4]) {
    std::get<4>(result) = state_grad(grad_c_n);
  }
  return result;
}

// The fewest steps of a packed batch's segment (Steps): LLTM_SEGMENT_STEPS
// where set (the tests run the CUDA layout on the CPU with it), else the
// backend's.
int64_t min_segment_steps(const Engine& engine, int64_t steps) {
  const char* value = std::getenv("LLTM_SEGMENT_STEPS");
  if (value == nullptr || *value == '\0') {
    return engine.min_segment_steps(steps);
  }
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  TORCH_CHECK_VALUE(
      *end == '\0' && parsed >= 1,
      "LLTM_SEGMENT_STEPS=",
      std::string(value),
      ": expected a whole number >= 1 (or unset: the backend's)");
  return parsed;
}

// The loops' mask of a segment: its state gradients feed the segment before
// it; the first segment's are d_h0 and d_c0, computed where asked for.
OutputMask segment_mask(bool first, const OutputMask& mask) {
  return {false, false, false, !first || mask[3], !first || mask[4]};
}

// The loops of a block: the thread's forced ones while a choice measures
// them, else the engine's choice.
const StepLoops& loops_for(
    const Engine& engine,
    const Sizes& sizes,
    at::ScalarType dtype,
    bool backward,
    bool save,
    const char* op) {
  if (const StepLoops* forced = choice::Forced::get(backward)) {
    return *forced;
  }
  return engine.loops(sizes, dtype, backward, save, op);
}

// The path that runs a block of steps, as a range in torch.profiler
// ("lltm::sequence_path::onednn", "lltm::sequence_backward_path::steps"):
// how the tests and the benchmark see which path ran, on any device. The
// name is made only while a profiler listens.
class RecordPath {
 public:
  RecordPath(const StepLoops& loops, bool backward)
      : guard_(at::RecordScope::USER_SCOPE) {
    if (guard_.isActive()) {
      guard_.before(
          std::string(
              backward ? "lltm::sequence_backward_path::"
                       : "lltm::sequence_path::") +
          loops.name);
    }
  }

 private:
  at::RecordFunction guard_;
};

// The backward's loops over one block, chosen and recorded.
StateGrads backward_block(
    const Engine& engine,
    const Sizes& sizes,
    at::ScalarType dtype,
    const BackwardInputs& inputs,
    const OutputMask& mask,
    at::Tensor& d_gates) {
  const StepLoops& loops = loops_for(
      engine,
      sizes,
      dtype,
      /*backward=*/true,
      /*save=*/true,
      "lltm::sequence_backward");
  const RecordPath record(loops, /*backward=*/true);
  return loops.backward(sizes, inputs, mask, d_gates);
}

} // namespace

at::Tensor packed_w_h_t(
    const at::Tensor& weights,
    int64_t state_size,
    PackedWeights* packed) {
  return kept(packed != nullptr ? &packed->w_h_t : nullptr, [&] {
    return weights_h(weights, state_size).t().contiguous();
  });
}

at::Tensor packed_w_h(
    const at::Tensor& weights,
    int64_t state_size,
    PackedWeights* packed) {
  return kept(packed != nullptr ? &packed->w_h : nullptr, [&] {
    return weights_h(weights, state_size).contiguous();
  });
}

ForwardResult run_forward(
    const Problem& p,
    const at::Tensor& input,
    const ForwardInputs& in,
    const Engine& engine,
    bool save,
    const char* op) {
  const auto [T, B, F, S] = p.sizes;
  const int64_t D = p.directions;
  const bool stacked = p.stacked;
  const auto options = input.options();
  const int64_t N = p.packed ? input.size(0) : T * B;
  const std::vector<int64_t> output_shape = p.packed
      ? std::vector<int64_t>{N, D * S}
      : std::vector<int64_t>{T, B, D * S};
  if (T == 0) {
    at::Tensor cells;
    at::Tensor gates;
    if (save) {
      cells = at::empty(directed(stacked, D, {0, B, S}), options);
      gates = at::empty(directed(stacked, D, {0, B, 3 * S}), options);
    }
    return {
        at::empty(output_shape, options),
        in.h0.clone(at::MemoryFormat::Contiguous),
        in.c0.clone(at::MemoryFormat::Contiguous),
        cells,
        gates};
  }
  const Steps steps = p.packed
      ? Steps(p.batch_sizes, min_segment_steps(engine, T))
      : Steps(T, B);
  const int64_t W = steps.work_rows();
  const std::optional<Indices> idx = p.packed
      ? std::optional<Indices>(
            std::in_place, steps, D, engine, input.device(), false)
      : std::nullopt;
  // A packed batch reads each sequence's last c_t from cells, saved or not.
  const bool keep_cells = save || p.packed;
  at::Tensor h_n = at::empty(directed(stacked, D, {B, S}), options);
  at::Tensor c_n = at::empty(directed(stacked, D, {B, S}), options);
  at::Tensor cells;
  // What the op returns is shaped for any lengths ([T, B] rows a
  // direction); what it keeps to itself, the work rows alone.
  const int64_t rows = save ? T * B : W;
  if (keep_cells) {
    cells = save ? at::empty(directed(stacked, D, {T, B, S}), options)
                 : engine.scratch(Scratch::kCells, {D, W, S}, options);
  }
  at::Tensor gates = save
      ? at::empty(directed(stacked, D, {T, B, 3 * S}), options)
      : engine.scratch(Scratch::kGates, {D, W, 3 * S}, options);
  at::Tensor output = at::empty(output_shape, options);
  // Each direction's h_t in its own work rows: the output itself for one
  // direction over the input's own rows.
  const bool own_output = D == 1 && steps.identity();
  const at::Tensor work_output = own_output
      ? output.view({1, W, S})
      : engine.scratch(Scratch::kOutput, {D, W, S}, options);
  // A segment's h_n and c_n are not the sequences' (each sequence's comes
  // from its own last step): scratch, one pair per direction.
  const bool scratch = p.packed;
  const at::ScalarType dtype = input.scalar_type();

  engine.for_each_direction(p.sizes, D, [&](int64_t d) {
    const at::Tensor w = direction_of(in.weights, d, stacked);
    const at::Tensor bias = direction_of(in.bias, d, stacked);
    const at::Tensor h0 = direction_of(in.h0, d, stacked);
    const at::Tensor c0 = direction_of(in.c0, d, stacked);
    const at::Tensor h_n_d = direction_of(h_n, d, stacked);
    const at::Tensor c_n_d = direction_of(c_n, d, stacked);
    const at::Tensor gates_d = direction_of(gates, d, stacked || !save)
                                   .view({rows, 3 * S})
                                   .narrow(0, 0, W);
    const at::Tensor cells_d = keep_cells
        ? direction_of(cells, d, stacked || !save)
              .view({rows, S})
              .narrow(0, 0, W)
        : at::Tensor();
    const at::Tensor out_d = work_output.select(0, d);
    // The input projection of every step: one GEMM over the work rows.
    const at::Tensor x = p.packed ? to_work(input, steps, *idx, d)
                                  : (d == 0 ? input : input.flip(0));
    at::Tensor projection = gates_d;
    at::mm_out(projection, x.reshape({W, F}), weights_x(w, S).t());
    const at::Tensor h_scratch =
        scratch ? at::empty({B, S}, options) : at::Tensor();
    const at::Tensor c_scratch =
        scratch ? at::empty({B, S}, options) : at::Tensor();
    const std::vector<Segment>& segments = steps.segments();
    PackedWeights packed;
    for (size_t i = 0; i < segments.size(); ++i) {
      const Segment& s = segments[i];
      const Sizes sizes{s.steps, s.batch, F, S};
      ForwardBuffers b;
      b.output = block(out_d, s);
      b.gates = block(gates_d, s);
      if (keep_cells) {
        b.cells = block(cells_d, s);
      }
      b.h_n = scratch ? h_scratch.narrow(0, 0, s.batch) : h_n_d;
      b.c_n = scratch ? c_scratch.narrow(0, 0, s.batch) : c_n_d;
      const at::Tensor h_first =
          i == 0 ? h0 : state_before(out_d, segments[i - 1], s.batch);
      const at::Tensor c_first =
          i == 0 ? c0 : state_before(cells_d, segments[i - 1], s.batch);
      const StepLoops& loops =
          loops_for(engine, sizes, dtype, /*backward=*/false, save, op);
      const RecordPath record(loops, /*backward=*/false);
      loops.forward(sizes, {w, bias, h_first, c_first, &packed}, b);
    }
    if (p.packed) {
      at::Tensor h = h_n_d;
      at::Tensor c = c_n_d;
      at::index_select_out(h, out_d, 0, idx->last_work);
      at::index_select_out(c, cells_d, 0, idx->last_work);
      if (!own_output) {
        output_of(output, d, S).copy_(from_work(out_d, steps, *idx, d));
      }
    } else if (!own_output) {
      const at::Tensor h = out_d.view({T, B, S});
      output_of(output, d, S).copy_(d == 0 ? h : h.flip(0));
    }
  });
  if (save && p.packed && W < T * B) {
    // The rows past the work rows: never read, but an output's bytes are
    // all defined.
    gates.view({D, T * B, 3 * S}).narrow(1, W, T * B - W).zero_();
    cells.view({D, T * B, S}).narrow(1, W, T * B - W).zero_();
  }
  return {output, h_n, c_n, save ? cells : at::Tensor(), gates};
}

namespace {

// Direction d's weight gradients and d_input (in its own order), from
// d_gates ([T, B, 3S], its work rows) of a dense input: d_W_x = dZ^T x,
// d_W_h = dZ_0^T h0 + dZ_{1:}^T output_{:-1}, and d_bias, into the slices
// given.
at::Tensor dense_weight_grads(
    const Sizes& sizes,
    const at::Tensor& d_gates,
    const at::Tensor& x,
    const at::Tensor& w,
    const at::Tensor& h0,
    const at::Tensor& output,
    const OutputMask& mask,
    at::Tensor& d_weights,
    at::Tensor& d_bias) {
  const auto [T, B, F, S] = sizes;
  const at::Tensor dz = d_gates.view({T * B, 3 * S});
  if (mask[1]) {
    // Into the column blocks of d_weights: [d_W_h | d_W_x].
    at::Tensor d_w_x = d_weights.narrow(1, S, F);
    at::mm_out(d_w_x, dz.t(), x.reshape({T * B, F}));
    at::Tensor d_w_h = d_weights.narrow(1, 0, S);
    at::mm_out(d_w_h, d_gates.select(0, 0).t(), h0);
    if (T > 1) {
      d_w_h.addmm_(
          d_gates.narrow(0, 1, T - 1).view({(T - 1) * B, 3 * S}).t(),
          output.narrow(0, 0, T - 1).reshape({(T - 1) * B, S}));
    }
  }
  if (mask[2]) {
    at::sum_out(d_bias, dz, 0);
  }
  return mask[0] ? at::mm(dz, weights_x(w, S)).view({T, B, F}) : at::Tensor();
}

} // namespace

namespace {

// Values of the cell's usual range, from no generator: n of them, in a
// [rows, cols] tensor.
at::Tensor made_up(
    at::IntArrayRef sizes,
    double scale,
    const at::TensorOptions& options) {
  return at::arange(
             c10::multiply_integers(sizes),
             options.dtype(at::kFloat).device(at::kCPU))
      .mul_(0.37)
      .sin_()
      .mul_(scale)
      .view(sizes)
      .to(options);
}

template <typename Run>
double best_of_three(Run run) {
  run(); // warm-up: the first run's allocations and packed weights
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const std::chrono::duration<double, std::micro> took =
        std::chrono::steady_clock::now() - start;
    best = i == 0 ? took.count() : std::min(best, took.count());
  }
  return best;
}

} // namespace

double time_loops(
    const Engine& engine,
    const StepLoops& loops,
    const Sizes& sizes,
    at::ScalarType dtype,
    c10::Device device,
    bool backward,
    bool save) {
  const auto [T, B, F, S] = sizes;
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  const at::Tensor input = made_up({T, B, F}, 1.0, options);
  const at::Tensor weights =
      made_up({3 * S, S + F}, 1.0 / std::sqrt(double(S + F)), options);
  const at::Tensor bias = made_up({3 * S}, 0.1, options);
  const at::Tensor h0 = made_up({B, S}, 0.5, options);
  const at::Tensor c0 = made_up({B, S}, 0.5, options);
  const Problem p{sizes};
  const ForwardInputs in{weights, bias, h0, c0};
  constexpr const char* op = "lltm::sequence (measuring a path)";
  // Any loops' forward saves what any loops' backward reads.
  const choice::Forced forced(&loops, &loops);
  // The runs are the choice's, not the caller's: a profiler sees none.
  const at::DisableRecordFunctionGuard unrecorded;
  if (!backward) {
    return best_of_three([&] { run_forward(p, input, in, engine, save, op); });
  }
  const auto [output, h_n, c_n, cells, gates] =
      run_forward(p, input, in, engine, /*save=*/true, op);
  const std::optional<at::Tensor> grad_output =
      made_up({T, B, S}, 1.0, options);
  const BackwardInputs back{
      grad_output, std::nullopt, std::nullopt, weights, cells, gates};
  return best_of_three([&] {
    run_backward(
        p, input, h0, output, back, {true, true, true, true, true}, engine);
  });
}

BackwardResult run_backward(
    const Problem& p,
    const at::Tensor& input,
    const at::Tensor& h0,
    const at::Tensor& output,
    const BackwardInputs& in,
    const OutputMask& mask,
    const Engine& engine) {
  const auto [T, B, F, S] = p.sizes;
  const int64_t D = p.directions;
  const bool stacked = p.stacked;
  if (T == 0) {
    return empty_backward(
        p, in.grad_h_n, in.grad_c_n, input, in.weights, h0, mask);
  }
  const auto options = input.options();
  const at::ScalarType dtype = input.scalar_type();
  const Steps steps = p.packed
      ? Steps(p.batch_sizes, min_segment_steps(engine, T))
      : Steps(T, B);
  const int64_t W = steps.work_rows();
  const std::optional<Indices> idx = p.packed
      ? std::optional<Indices>(
            std::in_place, steps, D, engine, input.device(), mask[1])
      : std::nullopt;
  const std::vector<Segment> segments =
      steps.backward_segments(in.grad_c_n.has_value());

  BackwardResult result;
  at::Tensor d_weights;
  at::Tensor d_bias;
  if (mask[1]) {
    d_weights = at::empty(in.weights.sizes(), options);
  }
  if (mask[2]) {
    d_bias = at::empty(directed(stacked, D, {3 * S}), options);
  }
  // Each direction's d_input (in the packed or the steps' order), d_h0 and
  // d_c0.
  std::array<at::Tensor, 2> d_inputs;
  std::array<at::Tensor, 2> d_h0s;
  std::array<at::Tensor, 2> d_c0s;

  engine.for_each_direction(p.sizes, D, [&](int64_t d) {
    const at::Tensor w = direction_of(in.weights, d, stacked);
    const at::Tensor h0_d = direction_of(h0, d, stacked);
    const at::Tensor cells_d =
        direction_of(in.cells, d, stacked).view({T * B, S}).narrow(0, 0, W);
    const at::Tensor gates_d =
        direction_of(in.gates, d, stacked).view({T * B, 3 * S}).narrow(0, 0, W);
    at::Tensor d_weights_d =
        mask[1] ? direction_of(d_weights, d, stacked) : at::Tensor();
    at::Tensor d_bias_d =
        mask[2] ? direction_of(d_bias, d, stacked) : at::Tensor();
    const std::optional<at::Tensor> grad_h_n = in.grad_h_n
        ? std::optional<at::Tensor>(direction_of(*in.grad_h_n, d, stacked))
        : std::nullopt;
    const std::optional<at::Tensor> grad_c_n = in.grad_c_n
        ? std::optional<at::Tensor>(direction_of(*in.grad_c_n, d, stacked))
        : std::nullopt;
    const at::Tensor output_d = D == 1 ? output : output_of(output, d, S);

    if (!p.packed) {
      // One segment; direction 1's steps in reverse.
      const Sizes sizes{T, B, F, S};
      std::optional<at::Tensor> grad_output;
      if (in.grad_output) {
        const at::Tensor g =
            D == 1 ? *in.grad_output : output_of(*in.grad_output, d, S);
        grad_output = d == 0 ? g : g.flip(0);
      }
      at::Tensor d_gates =
          engine.scratch(Scratch::kDGates, {T, B, 3 * S}, options);
      StateGrads state = backward_block(
          engine,
          sizes,
          dtype,
          {grad_output,
           grad_h_n,
           grad_c_n,
           w,
           cells_d.view({T, B, S}),
           gates_d.view({T, B, 3 * S})},
          mask,
          d_gates);
      const at::Tensor x = d == 0 ? input : input.flip(0);
      const at::Tensor h = d == 0 ? output_d : output_d.flip(0);
      const at::Tensor d_input = dense_weight_grads(
          sizes, d_gates, x, w, h0_d, h, mask, d_weights_d, d_bias_d);
      if (mask[0]) {
        d_inputs[d] = d == 0 ? d_input : d_input.flip(0);
      }
      if (mask[3]) {
        d_h0s[d] = state.d_h0 ? *state.d_h0
                              : at::mm(d_gates.select(0, 0), weights_h(w, S));
      }
      d_c0s[d] = state.d_c0;
      return;
    }

    // A packed input: the upstream gradient in the work rows, with each
    // sequence's grad_h_n added at its last step.
    at::Tensor g;
    if (in.grad_output) {
      g = to_work(output_of(*in.grad_output, d, S), steps, *idx, d);
      if (grad_h_n && d == 0 && steps.identity()) {
        g = g.clone(at::MemoryFormat::Contiguous);
      }
    } else {
      g = at::zeros({W, S}, options);
    }
    if (grad_h_n) {
      g.index_copy_(
          0, idx->last_work, g.index_select(0, idx->last_work).add_(*grad_h_n));
    }
    at::Tensor d_gates = engine.scratch(Scratch::kDGates, {W, 3 * S}, options);
    // The segments from the last: each hands the one before it the
    // gradients of the state it started from.
    at::Tensor d_h_next;
    at::Tensor d_c_next;
    PackedWeights packed;
    for (size_t i = segments.size(); i-- > 0;) {
      const Segment& s = segments[i];
      const Sizes sizes{s.steps, s.batch, F, S};
      std::optional<at::Tensor> gh;
      std::optional<at::Tensor> gc;
      if (d_h_next.defined()) {
        gh = padded(d_h_next, s.batch);
        gc = padded(d_c_next, s.batch);
      }
      const int64_t end = s.first_step + s.steps;
      const int64_t ended = steps.batch_at(end);
      if (grad_c_n && ended < steps.batch_at(end - 1)) {
        // The sequences whose last step is this segment's.
        if (!gc) {
          gc = at::zeros({s.batch, S}, options);
        }
        const int64_t n = steps.batch_at(end - 1) - ended;
        gc->narrow(0, ended, n).add_(grad_c_n->narrow(0, ended, n));
      }
      at::Tensor dz = block(d_gates, s);
      const OutputMask wanted = segment_mask(i == 0, mask);
      StateGrads state = backward_block(
          engine,
          sizes,
          dtype,
          {block(g, s),
           gh,
           gc,
           w,
           block(cells_d, s),
           block(gates_d, s),
           &packed},
          wanted,
          dz);
      if (wanted[3]) {
        d_h_next = state.d_h0
            ? *state.d_h0
            : at::mm(dz.select(0, 0), packed_w_h(w, S, &packed));
      }
      d_c_next = state.d_c0;
    }
    d_h0s[d] = d_h_next;
    d_c0s[d] = d_c_next;
    // The GEMMs over the real rows alone, in the packed order.
    const at::Tensor dz = from_work(d_gates, steps, *idx, d);
    if (mask[0]) {
      d_inputs[d] = at::mm(dz, weights_x(w, S));
    }
    if (mask[1]) {
      at::Tensor d_w_x = d_weights_d.narrow(1, S, F);
      at::mm_out(d_w_x, dz.t(), input);
      const at::Tensor previous =
          at::cat({h0_d, output_d}).index_select(0, idx->previous_of_packed[d]);
      at::Tensor d_w_h = d_weights_d.narrow(1, 0, S);
      at::mm_out(d_w_h, dz.t(), previous);
    }
    if (mask[2]) {
      at::sum_out(d_bias_d, dz, 0);
    }
  });
  if (mask[0]) {
    std::get<0>(result) = D == 1 ? d_inputs[0] : d_inputs[0].add_(d_inputs[1]);
  }
  if (mask[1]) {
    std::get<1>(result) = std::move(d_weights);
  }
  if (mask[2]) {
    std::get<2>(result) = std::move(d_bias);
  }
  // The state gradients with the arguments' direction dimension.
  const auto states = [&](const std::array<at::Tensor, 2>& grads) {
    if (!stacked) {
      return grads[0];
    }
    return D == 1 ? grads[0].unsqueeze(0) : at::stack({grads[0], grads[1]});
  };
  if (mask[3]) {
    std::get<3>(result) = states(d_h0s);
  }
  if (mask[4]) {
    std::get<4>(result) = states(d_c0s);
  }
  return result;
}

} // namespace lltm::sequence

TORCH_LIBRARY_FRAGMENT(lltm, m) {
  m.set_python_module("lltm.ops");
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
