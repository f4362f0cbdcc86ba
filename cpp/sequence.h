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
// around its step loops (the input projection, the GEMMs for all steps
// after the backward's loop) and step loops in ATen operations, which the
// CUDA per-step path runs over its pointwise kernels; the CPU
// (sequence_cpu.cpp) runs its own loops on raw pointers, and CUDA also a
// persistent kernel (sequence_cuda.cpp).
#pragma once

#include "lltm.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <tuple>

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

// Validates the arguments of lltm::sequence and lltm::sequence_forward
// (`op` names the op in the message) and returns the problem sizes.
Sizes check_forward_args(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0,
    const char* op);

// Validates the arguments of lltm::sequence_backward.
Sizes check_backward_args(
    const std::optional<at::Tensor>& grad_output,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const at::Tensor& output,
    const at::Tensor& cells,
    const at::Tensor& gates);

// A backend's pointwise kernels, as the step loops call them.
struct StepKernels {
  // The cell's pointwise forward over z ([B, 3S] pre-activations without
  // the bias, row stride z.stride(0)): writes new_h and new_cell (dense),
  // and the activations [i | o | g] in place over z when save is set.
  void (*forward)(
      at::Tensor& z,
      const at::Tensor& bias,
      const at::Tensor& old_cell,
      at::Tensor& new_h,
      at::Tensor& new_cell,
      bool save);
  // The cell's pointwise backward: dZ into d_gates ([B, 3S], dense) and dc
  // into d_old_cell, from gh = grad_h (strided, or none) + grad_h_add
  // (dense, or none) and gc = grad_cell (strided, or none).
  void (*backward)(
      const std::optional<at::Tensor>& grad_h,
      const std::optional<at::Tensor>& grad_h_add,
      const std::optional<at::Tensor>& grad_cell,
      const at::Tensor& new_cell,
      const at::Tensor& gates,
      at::Tensor& d_gates,
      at::Tensor& d_old_cell);
};

// The forward's buffers, allocated, with the input projection input W_x^T
// (no bias) already in gates: output [T, B, S], h_n and c_n [B, S], cells
// [T, B, S] (undefined unless `save`), gates [T, B, 3S]. T > 0.
struct ForwardBuffers {
  at::Tensor output;
  at::Tensor h_n;
  at::Tensor c_n;
  at::Tensor cells;
  at::Tensor gates;
};
ForwardBuffers prepare_forward(
    const Sizes& sizes,
    const at::Tensor& input,
    const at::Tensor& weights,
    bool save);

// What every backend computes after the reverse loop, from d_gates ([T, B,
// 3S]) and d_c0: the GEMMs and the bias sum of the gradients in
// output_mask. d_h0 is computed here unless given (the persistent CUDA
// kernel computes it itself).
BackwardResult finish_backward(
    const Sizes& sizes,
    const at::Tensor& d_gates,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const at::Tensor& output,
    const at::Tensor& d_c0,
    const OutputMask& output_mask,
    std::optional<at::Tensor> d_h0);

// A backend's step loops. The forward runs every step over buffers from
// prepare_forward (T > 0); the backward runs the reverse loop, writes
// d_gates ([T, B, 3S]) and returns dc_{-1} (= d_c0). cells and gates are
// dense.
struct StepLoops {
  std::function<void(
      const Sizes& sizes,
      const at::Tensor& weights,
      const at::Tensor& bias,
      const at::Tensor& h0,
      const at::Tensor& c0,
      ForwardBuffers& buffers)>
      forward;
  std::function<at::Tensor(
      const Sizes& sizes,
      const std::optional<at::Tensor>& grad_output,
      const std::optional<at::Tensor>& grad_h_n,
      const std::optional<at::Tensor>& grad_c_n,
      const at::Tensor& weights,
      const at::Tensor& cells,
      const at::Tensor& gates,
      at::Tensor& d_gates)>
      backward;
};

// The step loops in ATen operations: per step, one GEMM (at::addmm_ or
// at::mm) and one of `kernels`, on any device.
StepLoops aten_step_loops(const StepKernels& kernels);

// The ops on a backend's step loops: the input projection before them, the
// GEMMs for all steps after the backward's, and zero steps.
Result sequence_steps(
    const Sizes& sizes,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0,
    const StepLoops& loops);
ForwardResult sequence_forward_steps(
    const Sizes& sizes,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0,
    const StepLoops& loops);
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
    const OutputMask& output_mask,
    const StepLoops& loops);

// The C++ API: lltm::sequence through the dispatcher, so through autograd
// when a graph is recorded, on the inputs' device.
Result run(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0);

} // namespace lltm::sequence
