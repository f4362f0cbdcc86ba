// The CPU's onednn path: the loops of steps (loops.h) with the step's GEMM
// through oneDNN's matmul (ATen's mkldnn ops), W_h reordered once per call
// into oneDNN's blocked layout. A call costs the dispatcher and an
// allocation, and oneDNN runs a GEMM of a few rows faster than MKL does on
// some processors (docs/performance.md, "The CPU's paths").
#include "cpp/sequence/cpu/onednn.h"
#include "cpp/sequence/cpu/loops.h"
#include "cpp/sequence/cpu/model.h"
#include "cpp/sequence/path.h"

#include <ATen/Context.h>

namespace lltm::sequence::cpu_paths {
namespace {

std::optional<OneDnnOps> find_ops() {
  auto& dispatcher = c10::Dispatcher::singleton();
  const auto reorder =
      dispatcher.findSchema({"mkldnn::_reorder_linear_weight", ""});
  const auto linear = dispatcher.findSchema({"mkldnn::_linear_pointwise", ""});
  const auto linear_add =
      dispatcher.findSchema({"mkldnn::_linear_pointwise", "binary"});
  if (!reorder || !linear || !linear_add ||
      !reorder->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
    return std::nullopt;
  }
  return OneDnnOps{
      reorder->typed<OneDnnOps::Reorder>(),
      linear->typed<OneDnnOps::Linear>(),
      linear_add->typed<OneDnnOps::LinearAdd>()};
}

// Where this path keeps its layouts of W_h (PackedWeights::layout).
constexpr char kLayouts = 0;

struct OneDnnGemm {
  OneDnnGemm(
      const at::Tensor& weights,
      const Sizes& sizes,
      PackedWeights* packed,
      bool backward)
      : ops_(*OneDnnOps::get()),
        w_(kept(
            packed == nullptr ? nullptr
                              : packed->layout(&kLayouts, backward ? 1 : 0),
            [&] {
              // A linear layer's weight is [out, in]: W_h ([3S, S])
              // forward, W_h^T ([S, 3S]) backward.
              const int64_t S = sizes.state_size;
              return ops_.reorder.call(
                  backward ? packed_w_h_t(weights, S, packed)
                           : packed_w_h(weights, S, packed),
                  sizes.batch);
            })) {}

  at::Tensor forward(at::Tensor& z, const at::Tensor& h) const {
    return ops_.linear_add.call(h, z, w_, std::nullopt, "add");
  }

  at::Tensor backward(const at::Tensor& dz, at::Tensor& /*out*/) const {
    return ops_.linear.call(
        dz,
        w_,
        std::nullopt,
        "none",
        c10::List<std::optional<c10::Scalar>>(),
        std::nullopt);
  }

 private:
  const OneDnnOps& ops_;
  at::Tensor w_;
};

// float32 alone: oneDNN's 16-bit matmuls need processor features that vary
// (float16: AVX-512 FP16 or AVX-NE-CONVERT), and it has no float64.
std::optional<Plan> plan(const Block& block, std::string* why_not) {
  if (block.dtype != at::kFloat) {
    *why_not =
        "float32 only (oneDNN's 16-bit matmuls need processor "
        "features that vary, and it has no float64)";
    return std::nullopt;
  }
  if (OneDnnOps::get() == nullptr) {
    *why_not =
        "this torch has no oneDNN, or torch.backends.mkldnn.enabled "
        "is False";
    return std::nullopt;
  }
  return Plan{};
}

// Fitted by scripts/fit_cpu_paths.py (cpu/model.h).
constexpr Costs kCosts{
    {1872.6, 24.10, 17454.7, 23243.8},
    {1835.7, 23.66, 21919.4, 25981.2},
    {5419.1, 21.72, 31470.3, 42450.2}};

double estimate(const Block& block) {
  return estimate_us(kCosts, block);
}

const Path kOneDnn{
    "onednn",
    c10::DeviceType::CPU,
    20,
    &plan,
    nullptr,
    &estimate,
    &gemm_forward<OneDnnGemm>,
    &gemm_backward<OneDnnGemm>};

} // namespace

const OneDnnOps* OneDnnOps::get() {
  static const std::optional<OneDnnOps> ops = find_ops();
  if (!ops || !at::globalContext().userEnabledMkldnn()) {
    return nullptr;
  }
  return &*ops;
}

LLTM_REGISTER_SEQUENCE_PATH(kOneDnn);

} // namespace lltm::sequence::cpu_paths
