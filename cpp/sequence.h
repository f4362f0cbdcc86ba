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
// The schemas and checks live in sequence.cpp, with what every backend runs
// around its step loops: the input projection, the GEMMs for all steps
// after the backward's loop, and zero steps. The op kernels below are
// templates over a backend, which brings the loops: the CPU's
// (sequence_cpu.cpp) and the three paths of CUDA (sequence_cuda.cpp).
#pragma once

#include "lltm.h"

#include <ATen/core/Tensor.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <type_traits>

namespace lltm::sequence {

struct Sizes {
  int64_t steps;
  int64_t batch;
  int64_t input_features;
  int64_t state_size;
};

// (output, h_n, c_n)
using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// (output, h_n, c_n, cells, gates)
using ForwardResult =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// (d_input, d_weights, d_bias, d_h0, d_c0), each undefined unless its
// output_mask entry is set; d_bias is [3 * state_size].
using BackwardResult = CellBackwardResult;

// The signatures of the ops' kernels; the schemas (sequence.cpp) name the
// arguments, and ops.h calls the ops with them.
using Signature = Result(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0);
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
    OutputMask output_mask);

// The forward's buffers, allocated, with the input projection input W_x^T
// (no bias) already in gates: output [T, B, S], h_n and c_n [B, S], cells
// [T, B, S] (undefined unless saved), gates [T, B, 3S].
struct ForwardBuffers {
  at::Tensor output;
  at::Tensor h_n;
  at::Tensor c_n;
  at::Tensor cells;
  at::Tensor gates;
};

// What the forward's loops read besides the sizes and the buffers.
struct ForwardInputs {
  const at::Tensor& weights;
  const at::Tensor& bias;
  const at::Tensor& h0;
  const at::Tensor& c0;
};

// What the backward's loops read; cells and gates are dense.
struct BackwardInputs {
  const std::optional<at::Tensor>& grad_output;
  const std::optional<at::Tensor>& grad_h_n;
  const std::optional<at::Tensor>& grad_c_n;
  const at::Tensor& weights;
  const at::Tensor& cells;
  const at::Tensor& gates;
};

// Validate the arguments of lltm::sequence and lltm::sequence_forward (`op`
// names the op in the message), and of lltm::sequence_backward, and return
// the problem sizes.
Sizes check_forward_args(
    const at::Tensor& input,
    const ForwardInputs& inputs,
    const char* op);
Sizes check_backward_args(
    const at::Tensor& input,
    const at::Tensor& h0,
    const at::Tensor& output,
    const BackwardInputs& inputs);

// What a backward loop returns besides d_gates: d_c0 = dc_{-1}, and d_h0
// when the loop computes it itself (else finish_backward does).
struct StateGrads {
  at::Tensor d_c0;
  std::optional<at::Tensor> d_h0;
};

// A way to run the steps (T > 0). The forward runs every step over buffers
// from prepare_forward; without saving (cells undefined), c_t goes to c_n
// and gates may keep the pre-activations. The backward runs the reverse
// loop and writes d_gates ([T, B, 3S]).
struct StepLoops {
  void (*forward)(const Sizes&, const ForwardInputs&, ForwardBuffers&);
  StateGrads (*backward)(
      const Sizes&,
      const BackwardInputs&,
      const OutputMask& output_mask,
      at::Tensor& d_gates);
};

// The ops on a backend's step loops: the input projection before them, the
// GEMMs for all steps after the backward's, and zero steps (where no loop
// runs).
ForwardBuffers run_forward(
    const Sizes& sizes,
    const at::Tensor& input,
    const ForwardInputs& inputs,
    const StepLoops& loops,
    bool save);
BackwardResult run_backward(
    const Sizes& sizes,
    const at::Tensor& input,
    const at::Tensor& h0,
    const at::Tensor& output,
    const BackwardInputs& inputs,
    const OutputMask& output_mask,
    const StepLoops& loops);

// The kernels of the three ops on a backend: a struct with a Guard,
// constructed from the inputs' device (a device guard, or
// lltm::backend::NoGuard), and
//   static const StepLoops& loops(const Sizes&, at::ScalarType,
//                                 bool backward, const char* op);
// which picks the loops of a call.

// lltm::sequence (kSave false) and lltm::sequence_forward (kSave true).
template <typename Backend, bool kSave>
std::conditional_t<kSave, ForwardResult, Result> sequence_forward_kernel(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0) {
  constexpr const char* op =
      kSave ? "lltm::sequence_forward" : "lltm::sequence";
  const ForwardInputs inputs{weights, bias, h0, c0};
  const Sizes sizes = check_forward_args(input, inputs, op);
  const typename Backend::Guard guard(input.device());
  const StepLoops& loops =
      Backend::loops(sizes, input.scalar_type(), /*backward=*/false, op);
  ForwardBuffers b = run_forward(sizes, input, inputs, loops, kSave);
  if constexpr (kSave) {
    return {b.output, b.h_n, b.c_n, b.cells, b.gates};
  } else {
    return {b.output, b.h_n, b.c_n};
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
    OutputMask mask) {
  constexpr const char* op = "lltm::sequence_backward";
  const Sizes sizes = check_backward_args(
      input,
      h0,
      output,
      {grad_output, grad_h_n, grad_c_n, weights, cells, gates});
  const typename Backend::Guard guard(input.device());
  const StepLoops& loops =
      Backend::loops(sizes, input.scalar_type(), /*backward=*/true, op);
  const at::Tensor cells_c = cells.contiguous();
  const at::Tensor gates_c = gates.contiguous();
  return run_backward(
      sizes,
      input,
      h0,
      output,
      {grad_output, grad_h_n, grad_c_n, weights, cells_c, gates_c},
      mask,
      loops);
}

} // namespace lltm::sequence
