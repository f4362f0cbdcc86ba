// The CPU's dpbf16_input path: dpbf16's step (dpbf16.cpp) with the input's
// projection in it too, Z_t = [h_{t-1} | x_t] W^T + b by VDPBF16PS over
// pairs of all of W^T's S + F rows, summed in float32, as fused_input is
// fused's: no [T, B, 3S] float32 projection is written by a GEMM and read
// back a step later. The measured choice decides between the two. bfloat16
// on AVX-512 BF16; the backward is dpbf16's.
#include "cpp/sequence/cpu/dpbf16.h"

#include "cpp/sequence/cpu/model.h"

namespace lltm::sequence::cpu_paths {
namespace {

std::optional<Plan> plan(const Block& block, std::string* why_not) {
  if (!dpbf16::runs(block, why_not)) {
    return std::nullopt;
  }
  Plan plan;
  plan.input_in_steps = !block.backward;
  return plan;
}

// Fitted by scripts/fit_cpu_paths.py --dtype bfloat16 (cpu/model.h); the
// backward is dpbf16's.
constexpr Costs kCosts{
    {0.0, 4.12, 9798.3, 7973.1},
    {0.0, 5.04, 13786.1, 9305.7},
    dpbf16::kBackwardCost};

double estimate(const Block& block) {
  return estimate_us(kCosts, block);
}

const Path kDpBf16Input{
    "dpbf16_input",
    c10::DeviceType::CPU,
    45,
    &plan,
    nullptr,
    &estimate,
    &dpbf16::forward,
    &dpbf16::backward,
    &dpbf16::forward_directions,
    &dpbf16::backward_directions};

} // namespace

LLTM_REGISTER_SEQUENCE_PATH(kDpBf16Input);

} // namespace lltm::sequence::cpu_paths
