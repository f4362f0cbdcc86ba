// The CPU's fused_input path: fused's step (fused.cpp) with the input's
// projection in it too, Z_t = [h_{t-1} | x_t] W^T + b, the cell's own GEMM
// over panels of W^T's S + F rows. No projection is written to memory and
// read back a step later: where the state is small, the fused step spent
// most of its time waiting on those reads (on a 2-core AMD EPYC, at T=590,
// B=39, F=30, S=60), and the projection's GEMM a third of the call.
// Where the input is wide, the one large GEMM of the other paths runs
// faster than the steps' share of it: the measured choice decides.
// float32 alone; the backward is fused's.
#include "cpp/sequence/cpu/fused.h"

#include "cpp/sequence/cpu/model.h"

namespace lltm::sequence::cpu_paths {
namespace {

std::optional<Plan> plan(const Block& block, std::string* why_not) {
  if (!fused::runs(block, why_not)) {
    return std::nullopt;
  }
  Plan plan;
  plan.input_in_steps = !block.backward;
  return plan;
}

// Fitted by scripts/fit_cpu_paths.py (cpu/model.h); the backward is fused's.
constexpr Costs kCosts{
    {2498.5, 4.61, 10474.5, 15583.2},
    {2528.3, 6.15, 12806.1, 17429.1},
    fused::kBackwardCost};

double estimate(const Block& block) {
  return estimate_us(kCosts, block);
}

const Path kFusedInput{
    "fused_input",
    c10::DeviceType::CPU,
    35,
    &plan,
    nullptr,
    &estimate,
    &fused::forward,
    &fused::backward,
    &fused::forward_directions,
    &fused::backward_directions};

} // namespace

LLTM_REGISTER_SEQUENCE_PATH(kFusedInput);

} // namespace lltm::sequence::cpu_paths
