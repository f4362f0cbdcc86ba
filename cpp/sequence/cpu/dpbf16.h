// What the CPU's bfloat16 paths share (dpbf16.cpp, dpbf16_input.cpp): where
// they run, the forward over W packed in bf16.h's pairs, and the reverse
// loop, which both run.
#pragma once

#include "cpp/sequence/cpu/model.h"
#include "cpp/sequence/path.h"

namespace lltm::sequence::cpu_paths::dpbf16 {

// Whether the kernels run a block: bfloat16 on AVX-512 BF16; else false,
// and why not.
bool runs(const Block& block, std::string* why_not);

// The forward: W_h^T's pairs packed once a call (and W_x^T's after them
// where the plan's steps add the input's projection), in the layout of the
// plan's path; then per step one parallel region of (rows, panel) tasks,
// the cell in float32 between steps.
void forward(
    const Plan& plan,
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers);

// The reverse loop, dc in float32 between steps.
StateGrads backward(
    const Plan& plan,
    const Sizes& sizes,
    const BackwardInputs& in,
    const OutputMask& output_mask,
    at::Tensor& d_gates);

// Both directions at once (Path::forward_directions and
// backward_directions): each step's tasks of the two in one parallel
// region, each direction with its own panels.
void forward_directions(
    const Plan& plan,
    const Sizes& sizes,
    c10::ArrayRef<ForwardInputs> inputs,
    c10::ArrayRef<ForwardBuffers> buffers);
std::vector<StateGrads> backward_directions(
    const Plan& plan,
    const Sizes& sizes,
    c10::ArrayRef<BackwardInputs> inputs,
    const OutputMask& output_mask,
    c10::ArrayRef<at::Tensor> d_gates);

// The reverse loop's cost (cpu/model.h), fitted by scripts/fit_cpu_paths.py
// --dtype bfloat16 on dpbf16's blocks: each path that runs it estimates its
// backward so.
inline constexpr Cost kBackwardCost{5829.7, 4.07, 27866.7, 20528.9};

} // namespace lltm::sequence::cpu_paths::dpbf16
