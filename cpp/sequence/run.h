// What the forward's and the backward's drivers (run.cpp, backward.cpp)
// share.
#pragma once

#include "cpp/sequence/path.h"
#include "cpp/sequence/segments.h"
#include "cpp/sequence/sequence.h"

#include <c10/core/Device.h>

#include <optional>
#include <string_view>

namespace lltm::sequence {

// a b by the engine's GEMM, into `out` where it is defined.
at::Tensor engine_mm(
    const Engine& engine,
    const at::Tensor& a,
    const at::Tensor& b,
    const at::Tensor& out = at::Tensor());

// A block with no rows or no state: nothing for a path to compute.
bool empty_block(const Sizes& sizes);

// How a call's steps lie in the work buffers: a packed batch's segments,
// else one dense block.
Steps steps_of(const Engine& engine, const Problem& p);

// A packed call's row indices (with `previous`, the backward's for d_W_h),
// made before the directions fork; none for a dense call.
std::optional<Indices> indices_of(
    const Engine& engine,
    const Problem& p,
    const Steps& steps,
    c10::Device device,
    bool previous);

// LLTM_DIRECTIONS, read and checked at every call, whether it has two
// directions or not: "together", "apart", or "" (unset, or "calls", which
// LLTMLayer reads: the engine's rule).
std::string_view directions_setting();

// The plan of a call whose two directions run their steps together (the
// path's forward_directions or backward_directions), else std::nullopt: a
// dense bidirectional call where `wanted` (directions_setting) is
// "together", or, where it is "", the engine's rule (Engine::together);
// "apart" leaves them to for_each_direction.
std::optional<Plan> together_plan(
    const Engine& engine,
    const Problem& p,
    const Block& b,
    std::string_view wanted,
    const char* op);

} // namespace lltm::sequence
