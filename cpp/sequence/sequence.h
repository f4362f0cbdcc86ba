// The LLTM sequence operators: a layer run over T steps in one call, with
// backpropagation through time in one call too.
//
//   lltm::sequence          (output, h_n, c_n): no graph, saves nothing
//   lltm::sequence_forward  (output, h_n, c_n, cells, gates): also what the
//                           backward needs
//   lltm::sequence_backward the gradients in output_mask, the order of the
//                           forward's inputs (input, weights, bias, h0, c0)
//
// With input [T, B, F], weights W = [W_h | W_x] ([3S, S + F], the cell's
// layout), h_{-1} = h0 and c_{-1} = c0, step t is the cell:
//   Z_t = P_t + h_{t-1} W_h^T,  P = input W_x^T (one GEMM for all steps)
//   (h_t, c_t) = the cell's pointwise math on Z_t + bias and c_{t-1}
// output[t] = h_t, h_n = h_{T-1}, c_n = c_{T-1}. The forward saves, per step,
// h_t (output), c_t (cells) and the activations [i | o | g] (gates), which
// is all the backward reads. The backward runs in reverse:
//   dh_t = grad_output[t] + dZ_{t+1} W_h   (grad_h_n instead of the GEMM at
//                                           t = T - 1)
//   (dZ_t, dc_{t-1}) = the cell's pointwise backward of (dh_t, dc_t)
// and then, for all steps at once: d_W_x = dZ^T input, d_W_h = dZ_0^T h0 +
// dZ_{1:}^T output_{:-1}, d_input = dZ W_x, d_bias = the column sums of dZ,
// d_h0 = dZ_0 W_h, d_c0 = dc_{-1}.
//
// Two directions. Weights [D, 3S, S + F] (bias [D, 3S] or [D, 1, 3S], h0 and
// c0 [D, B, S]) run D = 2 layers over the same input in one call, as
// nn.LSTM's bidirectional layer does: direction 1 runs from the last step to
// the first. output is [T, B, D * S] (direction d in columns [d S, (d+1) S)),
// h_n and c_n [D, B, S], and d_input the sum of both directions'. The two
// run at once (Engine::for_each_direction, Engine::together). Weights
// [3S, S + F] are one direction with no direction dimension anywhere.
//
// Variable lengths. With batch_sizes (int64 on the CPU, [T], as a
// PackedSequence holds it: non-increasing, batch_sizes[0] = B), input is
// packed: [N, F] with N = sum(batch_sizes), step t's rows after step t - 1's,
// the batch's first batch_sizes[t] sequences; output is packed the same way
// ([N, D * S]), and h_n, c_n hold each sequence's state after its own last
// step (for direction 1, after its first). A sequence that has ended drops
// out of the work: the steps run in segments of a constant batch, each a
// dense block for the paths (segments.h).
//
// The files: checks.cpp (the schemas and the checks every backend shares),
// segments.{h,cpp} (how a call's steps lie in the buffers: directions and
// the segments of a packed batch), run.cpp and backward.cpp (what every
// backend runs around a block of steps: the input projection, the GEMMs for
// all steps after the backward's loop, zero steps), path.h and choice.{h,cpp}
// (the paths, one file each under cpu/ and cuda/, and the choice of one per
// block). The op kernels below are templates over a backend, which brings its
// Engine.
#pragma once

#include "cpp/cell/cell.h"

#include <ATen/core/Tensor.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/FunctionRef.h>

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace lltm::sequence {

// One dense block of steps, as a path runs it.
struct Sizes {
  int64_t steps;
  int64_t batch;
  int64_t input_features;
  int64_t state_size;
};

// A whole call: its sizes (the batch of its first step), its directions,
// and, for a packed input, the batch of each step.
struct Problem {
  Sizes sizes;
  int64_t directions = 1;
  // The arguments carry a direction dimension (weights [D, 3S, S + F]).
  bool stacked = false;
  // A packed input: batch_sizes' values ([steps]), else empty.
  std::vector<int64_t> batch_sizes;
  bool packed = false;
};

// (output, h_n, c_n)
using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// (output, h_n, c_n, cells, gates)
using ForwardResult =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// (d_input, d_weights, d_bias, d_h0, d_c0), each undefined unless its
// output_mask entry is set; d_bias is [3 * state_size] ([D, 3 *
// state_size] with a direction dimension).
using BackwardResult = CellBackwardResult;

// The signatures of the ops' kernels; the schemas (checks.cpp) name the
// arguments, and ops.h calls the ops with them.
using Signature = Result(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0,
    const std::optional<at::Tensor>& batch_sizes);
using ForwardSignature = Extend<ForwardResult, Signature>::type;
using BackwardSignature = BackwardResult(
    const std::optional<at::Tensor>& grad_output,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const at::Tensor& output,
    const at::Tensor& cells,
    const at::Tensor& gates,
    const std::optional<at::Tensor>& batch_sizes,
    OutputMask output_mask);

// The buffers of one dense block of steps, with the input projection input
// W_x^T (no bias) already in gates: output [T, B, S], h_n and c_n [B, S],
// cells [T, B, S] (undefined unless saved), gates [T, B, 3S].
struct ForwardBuffers {
  at::Tensor output;
  at::Tensor h_n;
  at::Tensor c_n;
  at::Tensor cells;
  at::Tensor gates;
  // The projection in float32, [T, B, 3S], where the block's plan asked for
  // it (Plan::float32_projection); gates then hold no projection.
  at::Tensor projection;
  // The block's input, [T, B, F], dense, where its plan adds the projection
  // in its steps (Plan::input_in_steps); gates then hold no projection.
  at::Tensor input;
};

// W_h^T ([S, 3S]) and W_h ([3S, S]) copied dense, for the loops whose
// GEMMs read them so, and the paths' own layouts of W_h: made once per
// direction where a packed batch runs its blocks one after another
// (packed_w_h_t, packed_w_h, layout).
struct PackedWeights {
  at::Tensor w_h_t;
  at::Tensor w_h;

  // The slot of a path's layout `index`, named by an address of the path's
  // own (its Path constant): a path keeps what it needs without a slot here.
  at::Tensor* layout(const void* owner, int index);

 private:
  struct Layout {
    const void* owner;
    int index;
    at::Tensor tensor;
  };
  // A deque: slots stay where they are as others are added.
  std::deque<Layout> layouts_;
};

// A buffer for a path's layout of W (`owner` and `index` as
// PackedWeights::layout names it) that this thread keeps from call to call,
// as Engine::scratch keeps the op's buffers: packed into fresh memory, W
// cost its page faults, most of a short call (0.8 ms a call at S = 481).
// The choice's measured runs, which must leave the call's own layouts
// alone, keep a set of their own. The CPU's (cpu/engine.cpp, beside
// Engine::scratch's).
at::Tensor layout_buffer(
    const void* owner,
    int index,
    at::IntArrayRef sizes,
    const at::TensorOptions& options);

// What the forward's loops read besides the sizes and the buffers.
struct ForwardInputs {
  const at::Tensor& weights;
  const at::Tensor& bias;
  const at::Tensor& h0;
  const at::Tensor& c0;
  PackedWeights* packed = nullptr;
};

// What the backward's loops read; cells and gates are dense.
struct BackwardInputs {
  const std::optional<at::Tensor>& grad_output;
  const std::optional<at::Tensor>& grad_h_n;
  const std::optional<at::Tensor>& grad_c_n;
  const at::Tensor& weights;
  const at::Tensor& cells;
  const at::Tensor& gates;
  PackedWeights* packed = nullptr;
};

// What `slot` holds, else `make()`, kept in `slot` where there is one (a
// PackedWeights' slot, or nullptr).
template <typename Make>
at::Tensor kept(at::Tensor* slot, Make make) {
  if (slot != nullptr && slot->defined()) {
    return *slot;
  }
  at::Tensor made = make();
  if (slot != nullptr) {
    *slot = made;
  }
  return made;
}

// W_h^T and W_h of weights, dense: from `packed` where it has them, else
// made (and kept there, where given).
at::Tensor packed_w_h_t(
    const at::Tensor& weights,
    int64_t state_size,
    PackedWeights* packed);
at::Tensor packed_w_h(
    const at::Tensor& weights,
    int64_t state_size,
    PackedWeights* packed);

// Validate the arguments of lltm::sequence and lltm::sequence_forward (`op`
// names the op in the message), and of lltm::sequence_backward, and return
// the problem.
Problem check_forward_args(
    const at::Tensor& input,
    const ForwardInputs& inputs,
    const std::optional<at::Tensor>& batch_sizes,
    const char* op);
Problem check_backward_args(
    const at::Tensor& input,
    const at::Tensor& h0,
    const at::Tensor& output,
    const BackwardInputs& inputs,
    const std::optional<at::Tensor>& batch_sizes);

// What a backward loop returns besides d_gates: d_c0 = dc_{-1}, and d_h0
// when the loop computes it itself (else the caller does).
struct StateGrads {
  at::Tensor d_c0;
  std::optional<at::Tensor> d_h0;
};

// The op's own buffers, which Engine::scratch may keep between calls.
// kSecond*: direction 1's, where both directions run on one thread
// (Engine::together).
enum class Scratch {
  kGates,
  kCells,
  kOutput,
  kDGates,
  kProjection,
  kSecondDGates,
  kSecondProjection
};
constexpr size_t kScratchSlots = 7;

// What a device brings to the ops besides its paths (path.h).
struct Engine {
  c10::DeviceType device;
  // What a measured choice depends on besides the block, for its key
  // ("threads=2", "gpu=NVIDIA H200").
  std::string (*context)();
  // The microseconds run() takes on this device: the CPU's steady clock;
  // CUDA's events on the current stream, waited for.
  double (*time_us)(c10::function_ref<void()> run);
  // The most steps a measured block runs (longer ones are extrapolated from
  // this many and a quarter of them): enough that the cost per step stands
  // out of the run-to-run noise of the fixed costs.
  int64_t steps_timed;
  // Whether a launch now would be captured into a CUDA graph, where nothing
  // is measured (nullptr: never).
  bool (*capturing)();
  // Runs body(d) for each direction d < directions, at once where the
  // backend can (CUDA: a second stream; the CPU: a thread each, where that
  // pays at these sizes), and returns once all have run.
  void (*for_each_direction)(
      const Sizes& sizes,
      int64_t directions,
      c10::function_ref<void(int64_t)> body);
  // Whether a bidirectional call of these sizes runs its directions'
  // steps together, one parallel region a step for the work of both, where
  // the block's path can (Path::forward_directions); else
  // for_each_direction runs them. nullptr: never.
  bool (*together)(const Sizes& sizes, int64_t directions);
  // The fewest steps of a packed batch's segment that ends where a
  // sequence ends before its last step (1: a segment wherever the batch
  // shrinks).
  int64_t (*min_segment_steps)(int64_t steps);
  // The row indices of a packed batch, from the host, on `device`.
  at::Tensor (*indices)(std::vector<int64_t>&& values, c10::Device device);
  // A buffer that never leaves the op (at most one in use per Scratch and
  // thread): where a fresh allocation costs more than its use (the CPU's
  // page faults), one the backend keeps from call to call, and a set apart
  // for the choice's measured runs inside a call.
  at::Tensor (*scratch)(
      Scratch slot,
      at::IntArrayRef sizes,
      const at::TensorOptions& options);
  // a b (a [M, K], b [K, N]), into `out` where it is defined: the GEMMs
  // around the blocks (the input's projection, d_input), by the library the
  // backend measured fastest for the shape on this engine (nullptr: at::mm).
  at::Tensor (*mm)(
      const Engine& engine,
      const at::Tensor& a,
      const at::Tensor& b,
      const at::Tensor& out);
};

// a b (a [M, K], b [K, N]) by at::mm, into `out` where it is defined: the
// GEMM of an engine without Engine::mm, and one of the CPU's candidates.
at::Tensor aten_mm(
    const at::Tensor& a,
    const at::Tensor& b,
    const at::Tensor& out);

// The ops on a backend.
ForwardResult run_forward(
    const Problem& problem,
    const at::Tensor& input,
    const ForwardInputs& inputs,
    const Engine& engine,
    bool save,
    const char* op);
BackwardResult run_backward(
    const Problem& problem,
    const at::Tensor& input,
    const at::Tensor& h0,
    const at::Tensor& output,
    const BackwardInputs& inputs,
    const OutputMask& output_mask,
    const Engine& engine);

// The kernels of the three ops on a backend: a struct with a Guard,
// constructed from the inputs' device (a device guard, or
// lltm::backend::NoGuard), and a static `engine()` (Engine above).

// lltm::sequence (kSave false) and lltm::sequence_forward (kSave true).
template <typename Backend, bool kSave>
std::conditional_t<kSave, ForwardResult, Result> sequence_forward_kernel(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0,
    const std::optional<at::Tensor>& batch_sizes) {
  constexpr const char* op =
      kSave ? "lltm::sequence_forward" : "lltm::sequence";
  const ForwardInputs inputs{weights, bias, h0, c0};
  const Problem problem = check_forward_args(input, inputs, batch_sizes, op);
  const typename Backend::Guard guard(input.device());
  auto [output, h_n, c_n, cells, gates] =
      run_forward(problem, input, inputs, Backend::engine(), kSave, op);
  if constexpr (kSave) {
    return {output, h_n, c_n, cells, gates};
  } else {
    return {output, h_n, c_n};
  }
}

template <typename Backend>
BackwardResult sequence_backward_kernel(
    const std::optional<at::Tensor>& grad_output,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const at::Tensor& output,
    const at::Tensor& cells,
    const at::Tensor& gates,
    const std::optional<at::Tensor>& batch_sizes,
    OutputMask mask) {
  const BackwardInputs inputs{
      grad_output, grad_h_n, grad_c_n, weights, cells, gates};
  const Problem problem =
      check_backward_args(input, h0, output, inputs, batch_sizes);
  const typename Backend::Guard guard(input.device());
  const at::Tensor cells_c = cells.contiguous();
  const at::Tensor gates_c = gates.contiguous();
  return run_backward(
      problem,
      input,
      h0,
      output,
      {grad_output, grad_h_n, grad_c_n, weights, cells_c, gates_c},
      mask,
      Backend::engine());
}

} // namespace lltm::sequence
