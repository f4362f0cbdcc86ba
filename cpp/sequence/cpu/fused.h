// What the CPU's fused paths share (fused.cpp, fused_input.cpp): W^T packed
// in the panels of cpu::FusedStepArgs, the forward's step loop, one parallel
// region a step, and the reverse loop, which both run.
#pragma once

#include "cpp/sequence/path.h"

namespace lltm::sequence::cpu_paths::fused {

// Rows [0, K) of W^T (weights [3S, S + F]: W_h^T's S rows, then W_x^T's F)
// in panels of `width` state units, [panels, K, 3, width], zeros past the
// state's end, in the layout buffer of `owner` (layout_buffer).
at::Tensor forward_panels(
    const at::Tensor& weights,
    int64_t S,
    int64_t K,
    int64_t width,
    const void* owner);

// The forward's steps over `panels` (forward_panels' layout): with `input`
// ([T, B, F], dense) each step adds x_t W_x^T itself (K = S + F); without,
// buffers.gates holds the projection (K = S).
void forward_steps(
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers,
    const at::Tensor& panels,
    const at::Tensor& input);

// The reverse loop: per step one parallel region of tasks that each run the
// recurrent GEMM of a block of rows and a panel of units and the cell's
// backward on them.
StateGrads backward(
    const Plan& plan,
    const Sizes& sizes,
    const BackwardInputs& in,
    const OutputMask& output_mask,
    at::Tensor& d_gates);

} // namespace lltm::sequence::cpu_paths::fused
