// The CPU's steps path: per step ATen's CPU GEMM (MKL or OpenBLAS), past the
// dispatcher and in place into the step's buffer, and the cell's pointwise
// kernel (loops.h). It runs every block, in every dtype.
#include "cpp/sequence/cpu/loops.h"
#include "cpp/sequence/cpu/model.h"
#include "cpp/sequence/path.h"

#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>

namespace lltm::sequence::cpu_paths {
namespace {

// W_h read in place, through W's strides (BLAS takes the leading
// dimension): a dense copy of W_h^T cost a call more than its steps gain
// (59 ms at S = 1775, against 2.3 ms a step at batch 2, and none past
// batch 16).
struct BlasGemm {
  BlasGemm(
      const at::Tensor& weights,
      const Sizes& sizes,
      PackedWeights* /*packed*/,
      bool backward)
      : w_(backward ? weights_h(weights, sizes.state_size)
                    : weights_h(weights, sizes.state_size).t()) {}

  // Z_t = P_t + h W_h^T, over P_t in z.
  at::Tensor forward(at::Tensor& z, const at::Tensor& h) const {
    at::cpu::addmm_(z, h, w_);
    return z;
  }

  // dZ_t W_h, into `out`.
  at::Tensor backward(const at::Tensor& dz, at::Tensor& out) const {
    at::cpu::mm_out(out, dz, w_);
    return out;
  }

 private:
  at::Tensor w_; // W_h^T [S, 3S] forward, W_h [3S, S] backward
};

// Every block.
std::optional<Plan> plan(const Block& /*block*/, std::string* /*why_not*/) {
  return Plan{};
}

// Fitted by scripts/fit_cpu_paths.py (cpu/model.h).
constexpr Costs kCosts{
    {3574.8, 3.47, 29136.0, 21337.4},
    {4165.2, 3.79, 25201.5, 23540.5},
    {4518.5, 7.78, 49991.3, 37720.9}};

double estimate(const Block& block) {
  return estimate_us(kCosts, block);
}

const Path kSteps{
    "steps",
    c10::DeviceType::CPU,
    10,
    &plan,
    nullptr,
    &estimate,
    &gemm_forward<BlasGemm>,
    &gemm_backward<BlasGemm>};

} // namespace

LLTM_REGISTER_SEQUENCE_PATH(kSteps);

} // namespace lltm::sequence::cpu_paths
