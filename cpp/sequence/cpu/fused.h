// What the CPU's fused paths share (fused.cpp, fused_input.cpp): where they
// run, the forward over W^T packed in the panels of cpu::FusedStepArgs, and
// the reverse loop, which both run.
#pragma once

#include "cpp/sequence/cpu/model.h"
#include "cpp/sequence/path.h"

namespace lltm::sequence::cpu_paths::fused {

// Whether the kernels run a block: float32; else false, and why not.
bool runs(const Block& block, std::string* why_not);

// The forward: W^T packed once a call in panels of the kernel's vector
// width (rows [0, S), or [0, S + F) where the plan's steps add the input's
// projection), in the layout of the plan's path; then per step one
// parallel region of (rows, panel) tasks.
void forward(
    const Plan& plan,
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers);

// The reverse loop: per step one parallel region of tasks that each run the
// recurrent GEMM of a block of rows and a panel of units and the cell's
// backward on them.
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
// on fused's blocks: each path that runs it estimates its backward so.
inline constexpr Cost kBackwardCost{3746.8, 5.20, 31457.9, 38258.3};

} // namespace lltm::sequence::cpu_paths::fused
