// The fused steps' plans and launches (sequence.h): which kernel runs a
// block (kernels(), below), and the launch of a plan, which chooses nothing.
#include "cuda/sequence/fused/steps.h"
#include "cuda/sequence/fused/tiles.h"

#include "cuda/common/device.h"
#include "cuda/sequence/sequence.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>
#include <vector>

namespace lltm::cuda {
namespace {

using namespace detail; // NOLINT(google-build-using-namespace)

// The counters of the cooperative steps' barriers (every_step, the held
// kernels), after the running cell gradient in the backward's workspace.
// double's steps take a launch each, and need none.
template <typename T>
size_t arrivals_bytes(int64_t batch) {
  static_assert(
      Forward0::BM >= kArrivalRows && Backward0::BM >= kArrivalRows,
      "a counter per row tile of the smallest tiles");
  if constexpr (std::is_same_v<T, double>) {
    return 0;
  } else {
    return arrivals_size(batch);
  }
}

template <typename T>
size_t dc_bytes(int64_t batch, int64_t state) {
  return static_cast<size_t>(batch * state) * sizeof(acc_t<T>);
}

template <typename T>
unsigned* arrivals_in(void* workspace, size_t offset, int64_t batch) {
  return arrivals_bytes<T>(batch) > 0
      ? reinterpret_cast<unsigned*>(static_cast<char*>(workspace) + offset)
      : nullptr;
}

template <typename T>
constexpr bool k16Bit =
    std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// The kernels that may take a block, in the order they are asked: tensor
// cores where the type has them on this GPU; W_h held, in float, where the
// GPU is not filled; W_h in chunks, every block.
template <typename T>
const std::vector<const FusedKernel<T>*>& kernels() {
  static const std::vector<const FusedKernel<T>*> list = [] {
    std::vector<const FusedKernel<T>*> out;
    if constexpr (k16Bit<T>) {
      out.push_back(&mma_kernel<T>());
    }
    if constexpr (std::is_same_v<T, float>) {
      out.push_back(&held_kernel());
    }
    out.push_back(&chunked_kernel<T>());
    return out;
  }();
  return list;
}

// The kernel a plan launches, or nullptr where it is no fused one of T.
template <typename T>
const FusedKernel<T>* kernel_of(const SequencePlan& plan) {
  switch (plan.kernel) {
    case SequenceKernel::kFusedMma:
      if constexpr (k16Bit<T>) {
        return &mma_kernel<T>();
      }
      return nullptr;
    case SequenceKernel::kFusedHeld:
      if constexpr (std::is_same_v<T, float>) {
        return &held_kernel();
      }
      return nullptr;
    case SequenceKernel::kFusedChunked:
      return &chunked_kernel<T>();
    default:
      return nullptr;
  }
}

} // namespace

template <typename T>
cudaError_t plan_fused(
    int64_t steps,
    int64_t batch,
    int64_t state,
    int64_t ld_w,
    bool backward,
    SequencePlan* out) {
  *out = SequencePlan{};
  out->backward = backward;
  if (steps == 0 || batch == 0 || state == 0) {
    out->why_not = "an empty block";
    return cudaSuccess;
  }
  DeviceLimits limits{};
  if (const cudaError_t status = device_limits(&limits);
      status != cudaSuccess) {
    return status;
  }
  const FusedShape shape{steps, batch, state, ld_w};
  out->workspace_bytes =
      (backward ? dc_bytes<T>(batch, state) : 0) + arrivals_bytes<T>(batch);
  for (const FusedKernel<T>* kernel : kernels<T>()) {
    if (kernel->plan(shape, limits, backward, out)) {
      return cudaSuccess;
    }
  }
  return cudaErrorInvalidValue; // the chunked kernel takes every block
}

template <typename T>
bool steps_on_tensor_cores() {
  DeviceLimits limits{};
  return device_limits(&limits) == cudaSuccess && step_mma_runs<T>(limits);
}

template <typename T>
cudaError_t launch_fused_forward(
    const FusedForwardArgs<T>& a,
    const SequencePlan& plan,
    void* workspace,
    cudaStream_t stream) {
  if (a.steps == 0 || a.batch == 0 || a.state == 0) {
    return cudaSuccess;
  }
  if (plan.backward) {
    return cudaErrorInvalidValue;
  }
  const FusedKernel<T>* kernel = kernel_of<T>(plan);
  return kernel != nullptr
      ? kernel->forward(a, plan, arrivals_in<T>(workspace, 0, a.batch), stream)
      : cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_fused_backward(
    const FusedBackwardArgs<T>& a,
    const SequencePlan& plan,
    void* workspace,
    cudaStream_t stream) {
  if (a.steps == 0 || a.batch == 0 || a.state == 0) {
    return cudaSuccess;
  }
  if (!plan.backward) {
    return cudaErrorInvalidValue;
  }
  const FusedKernel<T>* kernel = kernel_of<T>(plan);
  unsigned* arrivals =
      arrivals_in<T>(workspace, dc_bytes<T>(a.batch, a.state), a.batch);
  return kernel != nullptr
      ? kernel->backward(
            a, plan, static_cast<acc_t<T>*>(workspace), arrivals, stream)
      : cudaErrorInvalidValue;
}

#define LLTM_INSTANTIATE(T)                                                  \
  template cudaError_t plan_fused<T>(                                        \
      int64_t, int64_t, int64_t, int64_t, bool, SequencePlan*);              \
  template bool steps_on_tensor_cores<T>();                                  \
  template cudaError_t launch_fused_forward<T>(                              \
      const FusedForwardArgs<T>&, const SequencePlan&, void*, cudaStream_t); \
  template cudaError_t launch_fused_backward<T>(                             \
      const FusedBackwardArgs<T>&, const SequencePlan&, void*, cudaStream_t);

LLTM_FOR_EACH_TYPE(LLTM_INSTANTIATE)

#undef LLTM_INSTANTIATE

} // namespace lltm::cuda
