// What the CPU's bfloat16 paths share (dpbf16.cpp, dpbf16_input.cpp): where
// they run, W packed in bf16.h's pairs, the forward's step loop and the
// reverse loop, which both run.
#pragma once

#include "cpp/sequence/path.h"

namespace lltm::sequence::cpu_paths::dpbf16 {

// Whether the kernels run a block: bfloat16 on AVX-512 BF16; else false,
// and why not.
bool runs(const Block& block, std::string* why_not);

// W_h^T's pairs, and with `features` W_x^T's after them (bf16.h,
// pack_forward), in the layout buffer of `owner` (layout_buffer).
at::Tensor forward_panels(
    const at::Tensor& weights,
    int64_t S,
    int64_t features,
    const void* owner);

// The forward's steps over `panels` (forward_panels' layout): with `input`
// ([T, B, F], dense) each step adds x_t W_x^T itself; without, the
// projection is in buffers.projection (float32) or buffers.gates.
void forward_steps(
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers,
    const at::Tensor& panels,
    const at::Tensor& input);

// The reverse loop, dc in float32 between steps.
StateGrads backward(
    const Plan& plan,
    const Sizes& sizes,
    const BackwardInputs& in,
    const OutputMask& output_mask,
    at::Tensor& d_gates);

} // namespace lltm::sequence::cpu_paths::dpbf16
