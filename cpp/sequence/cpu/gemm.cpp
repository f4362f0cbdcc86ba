// The GEMMs around the CPU's blocks: the input's projection before the
// forward's blocks and d_input after the backward's, a [M, K] times
// b [K, N] over every step's rows at once. Two libraries can run one:
// at::mm (MKL in torch's x86 wheels) and oneDNN's matmul (ATen's mkldnn
// linear). Neither wins everywhere: on a 2-core AMD EPYC, one thread of MKL
// takes 10 ms for a [23010, 30] x [30, 180] projection that oneDNN runs in
// 4, while MKL runs [65536, 64] x [64, 384] in half oneDNN's time
// (docs/performance.md, "The GEMMs around the recurrence"). So each shape,
// M in power-of-two buckets, is timed on both at its first call and keeps
// the faster (choice::choose_library), as cudnn.benchmark does.
#include "cpp/sequence/cpu/gemm.h"

#include "cpp/sequence/choice.h"
#include "cpp/sequence/cpu/onednn.h"

#include <array>

namespace lltm::sequence::cpu_paths {
namespace {

constexpr std::array<const char*, 2> kLibraries = {"aten", "onednn"};
constexpr size_t kAten = 0;
constexpr size_t kOneDnn = 1;

// A GEMM of fewer multiply-adds than this takes tens of microseconds
// whichever library runs it: at::mm, unmeasured.
constexpr int64_t kMeasuredMacs = int64_t(1) << 20;

// oneDNN's ops where it can run the GEMM and the choice is worth its
// measuring: float32 (its 16-bit matmuls need processor features that
// vary), a row-major a, torch with oneDNN on, and work enough.
const OneDnnOps* onednn_for(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != at::kFloat || !a.is_contiguous() ||
      a.size(0) * a.size(1) * b.size(1) < kMeasuredMacs) {
    return nullptr;
  }
  return OneDnnOps::get();
}

at::Tensor run(
    size_t library,
    const OneDnnOps* ops,
    const at::Tensor& a,
    const at::Tensor& b,
    const at::Tensor& out) {
  if (library == kAten) {
    return aten_mm(a, b, out);
  }
  // A linear layer's weight is [out, in], b^T, reordered into oneDNN's
  // blocked layout for M rows.
  const at::Tensor w = ops->reorder.call(b.t().contiguous(), a.size(0));
  at::Tensor result = ops->linear.call(
      a,
      w,
      std::nullopt,
      "none",
      c10::List<std::optional<c10::Scalar>>(),
      std::nullopt);
  return out.defined() ? out.copy_(result) : result;
}

} // namespace

at::Tensor mm(
    const Engine& engine,
    const at::Tensor& a,
    const at::Tensor& b,
    const at::Tensor& out) {
  const OneDnnOps* ops = onednn_for(a, b);
  if (ops == nullptr) {
    return run(kAten, nullptr, a, b, out);
  }
  const std::string key = std::string("cpu|") + c10::toString(a.scalar_type()) +
      "|gemm|" + engine.context() +
      "|M=" + std::to_string(choice::power_of_two_at_least(a.size(0))) +
      "|K=" + std::to_string(a.size(1)) + "|N=" + std::to_string(b.size(1));
  // Timed on the whole GEMM: MKL's time per row changes with M (on an AMD
  // EPYC at one thread, 23,010 rows take 3-10x what 8,192 do).
  const size_t library = choice::choose_library(
      engine, key, kLibraries, kOneDnn, [&](size_t candidate) {
        run(candidate, ops, a, b, out);
      });
  return run(library, ops, a, b, out);
}

} // namespace lltm::sequence::cpu_paths
