// CUDA's cluster path (sm_90 on): the persistent kernels in one
// thread-block cluster, h_t passing between its blocks through distributed
// shared memory; on tensor cores ("cluster/mma") or CUDA cores
// ("cluster/simt", a cluster per tile of the batch's rows), as the kernel
// library's plan says (cuda/sequence/persistent/). It runs as the
// persistent path does (persistent.cpp).
#include "cpp/sequence/cuda/operands.h"
#include "cpp/sequence/path.h"

namespace lltm::sequence::cuda_paths {
namespace {

// Where auto takes the cluster, by its rules, before any other path: where
// the fused steps run on tensor cores, up to kMmaMostFragments of a
// tensor-core cluster's block, or where the CUDA cores' tiles are small in
// both directions; elsewhere while a block of the CUDA-core cluster takes
// at most kFloatMostItems (row, column) items in float32, whose fused steps
// hold W_h, and kMostItems in other types (docs/performance.md, "Why these
// thresholds").
constexpr int64_t kMmaMostFragments = 512;
constexpr int64_t kFloatMostItems = 224;
constexpr int64_t kMostItems = 256;

bool window(const Block& block) {
  const int64_t B = block.sizes.batch;
  const int64_t S = block.sizes.state_size;
  bool inside = false;
  with_kernel_type(block.dtype, [&](auto k) {
    using K = decltype(k);
    if (steps_on_tensor_cores(block.dtype)) {
      inside = cuda::cluster_mma_fragments(B, S) <= kMmaMostFragments ||
          cuda::cluster_small_tiles<K>(B, S);
      return;
    }
    const int64_t items = cuda::cluster_simt_items<K>(B, S, block.backward);
    inside = items > 0 &&
        items <= (block.dtype == at::kFloat ? kFloatMostItems : kMostItems);
  });
  return inside;
}

std::optional<Plan> plan(const Block& block, std::string* why_not) {
  return plan_with(block, why_not, [&](auto k, cuda::SequencePlan* p) {
    return cuda::plan_cluster<decltype(k)>(
        block.sizes.batch, block.sizes.state_size, block.backward, p);
  });
}

const Path kCluster{
    "cluster",
    c10::DeviceType::CUDA,
    10,
    &plan,
    &window,
    nullptr,
    &persistent_forward,
    &persistent_backward};

} // namespace

LLTM_REGISTER_SEQUENCE_PATH(kCluster);

} // namespace lltm::sequence::cuda_paths
