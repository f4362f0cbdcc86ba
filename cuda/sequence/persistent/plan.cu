// The persistent kernels' plans and launches (sequence.h): which kernel
// runs a cluster (tensor cores or CUDA cores), and the launch of a plan,
// which chooses nothing.
#include "cuda/sequence/persistent/persistent.h"

#include "cuda/common/device.h"
#include "cuda/sequence/sequence.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace lltm::cuda {
namespace {

using namespace detail; // NOLINT(google-build-using-namespace)

// A fresh plan of `backward`, kNone until a planner fills it.
SequencePlan empty_plan(bool backward) {
  SequencePlan plan{};
  plan.backward = backward;
  plan.why_not = "an empty block";
  return plan;
}

// A planner's result where a failed query of the device reads as a "no",
// cleared so that it is no later error.
void as_no(cudaError_t status, SequencePlan* out) {
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    const bool backward = out->backward;
    *out = SequencePlan{};
    out->backward = backward;
    out->why_not = "the GPU's limits could not be read";
  }
}

template <typename T, typename Planner>
SequencePlan planned(int64_t batch, int64_t state, bool backward, Planner p) {
  SequencePlan plan = empty_plan(backward);
  if (batch > 0 && state > 0) {
    as_no(p(&plan), &plan);
  }
  return plan;
}

template <typename T>
SequencePlan simt_plan(int64_t batch, int64_t state, bool backward) {
  return planned<T>(batch, state, backward, [&](SequencePlan* out) {
    return cluster_simt_kernel<T>().plan(batch, state, backward, out);
  });
}

template <typename T>
constexpr bool k16Bit =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// The kernel a plan launches, or nullptr where it is no persistent one of T.
template <typename T>
const PersistentKernel<T>* kernel_of(const SequencePlan& plan) {
  switch (plan.kernel) {
    case SequenceKernel::kGrid:
      return &grid_kernel<T>();
    case SequenceKernel::kClusterSimt:
      return &cluster_simt_kernel<T>();
    case SequenceKernel::kClusterMma:
      if constexpr (k16Bit<T>) {
        return &cluster_mma_kernel<T>();
      }
      return nullptr;
    default:
      return nullptr;
  }
}

} // namespace

template <typename T>
cudaError_t plan_grid(
    int64_t batch,
    int64_t state,
    bool backward,
    SequencePlan* out) {
  *out = planned<T>(batch, state, backward, [&](SequencePlan* plan) {
    return grid_kernel<T>().plan(batch, state, backward, plan);
  });
  return cudaSuccess;
}

template <typename T>
cudaError_t plan_cluster(
    int64_t batch,
    int64_t state,
    bool backward,
    SequencePlan* out) {
  if constexpr (k16Bit<T>) {
    const SequencePlan mma =
        planned<T>(batch, state, backward, [&](SequencePlan* plan) {
          return cluster_mma_kernel<T>().plan(batch, state, backward, plan);
        });
    if (mma.kernel == SequenceKernel::kClusterMma) {
      // At batch 1 the CUDA cores' exchange, from registers and with no
      // block barrier, is the faster one where it fits; past
      // kClusterMmaFirst fragments, where their tiles are small in both
      // directions (a tensor-core cluster takes the whole batch, and its
      // step grows with it). Both directions choose alike.
      if (batch == 1) {
        const SequencePlan simt = simt_plan<T>(batch, state, backward);
        *out = simt.kernel == SequenceKernel::kNone ? mma : simt;
        return cudaSuccess;
      }
      if (cluster_mma_fragments(batch, state) <= kClusterMmaFirst ||
          !cluster_small_tiles<T>(batch, state)) {
        *out = mma;
        return cudaSuccess;
      }
    }
  }
  *out = simt_plan<T>(batch, state, backward);
  return cudaSuccess;
}

template <typename T>
int64_t cluster_simt_items(int64_t batch, int64_t state, bool backward) {
  const SequencePlan plan = simt_plan<T>(batch, state, backward);
  return plan.kernel == SequenceKernel::kClusterSimt
      ? int64_t(plan.cluster.rows) * plan.cluster.columns
      : 0;
}

template <typename T>
bool cluster_small_tiles(int64_t batch, int64_t state) {
  for (const bool backward : {false, true}) {
    const int64_t items = cluster_simt_items<T>(batch, state, backward);
    if (items == 0 || items > kClusterSmallTile) {
      return false;
    }
  }
  return true;
}

template <typename T>
cudaError_t launch_sequence_forward(
    const SequenceForwardArgs<T>& a,
    const SequencePlan& plan,
    cudaStream_t stream) {
  if (a.steps == 0 || a.batch == 0 || a.state == 0) {
    return cudaSuccess;
  }
  if (plan.backward) {
    return cudaErrorInvalidValue;
  }
  const PersistentKernel<T>* kernel = kernel_of<T>(plan);
  return kernel != nullptr ? kernel->forward(a, plan, nullptr, stream)
                           : cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_sequence_backward(
    const SequenceBackwardArgs<T>& a,
    const SequencePlan& plan,
    void* workspace,
    cudaStream_t stream) {
  if (a.steps == 0 || a.batch == 0 || a.state == 0) {
    return cudaSuccess;
  }
  if (!plan.backward) {
    return cudaErrorInvalidValue;
  }
  const PersistentKernel<T>* kernel = kernel_of<T>(plan);
  return kernel != nullptr ? kernel->backward(a, plan, workspace, stream)
                           : cudaErrorInvalidValue;
}

#define LLTM_INSTANTIATE(T)                                                    \
  template cudaError_t plan_grid<T>(int64_t, int64_t, bool, SequencePlan*);    \
  template cudaError_t plan_cluster<T>(int64_t, int64_t, bool, SequencePlan*); \
  template int64_t cluster_simt_items<T>(int64_t, int64_t, bool);              \
  template bool cluster_small_tiles<T>(int64_t, int64_t);                      \
  template cudaError_t launch_sequence_forward<T>(                             \
      const SequenceForwardArgs<T>&, const SequencePlan&, cudaStream_t);       \
  template cudaError_t launch_sequence_backward<T>(                            \
      const SequenceBackwardArgs<T>&,                                          \
      const SequencePlan&,                                                     \
      void*,                                                                   \
      cudaStream_t);

LLTM_FOR_EACH_TYPE(LLTM_INSTANTIATE)

#undef LLTM_INSTANTIATE

} // namespace lltm::cuda
