// The fused steps' plans and launches (sequence.h): which kernel runs a
// block (tensor cores where the type has them on this GPU; else W_h held in
// float where the GPU is not filled; else W_h in chunks), and the launch of
// a plan, which chooses nothing.
#include "cuda/sequence/fused/steps.h"
#include "cuda/sequence/fused/tiles.h"

#include "cuda/common/device.h"
#include "cuda/sequence/sequence.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

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

// Whether the plan is a fused one of this direction, for these operands.
bool runs(const SequencePlan& plan, bool backward) {
  return plan.backward == backward &&
      (plan.kernel == SequenceKernel::kFusedChunked ||
       plan.kernel == SequenceKernel::kFusedHeld ||
       plan.kernel == SequenceKernel::kFusedMma);
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
  if constexpr (k16Bit<T>) {
    if (step_mma_runs<T>(limits)) {
      backward ? plan_mma<T, true>(shape, limits, out)
               : plan_mma<T, false>(shape, limits, out);
      return cudaSuccess;
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (backward ? plan_held<true>(shape, limits, out)
                 : plan_held<false>(shape, limits, out)) {
      return cudaSuccess;
    }
  }
  backward ? plan_chunked<T, true>(shape, limits, out)
           : plan_chunked<T, false>(shape, limits, out);
  return cudaSuccess;
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
  if (!runs(plan, false)) {
    return cudaErrorInvalidValue;
  }
  unsigned* arrivals = arrivals_in<T>(workspace, 0, a.batch);
  switch (plan.kernel) {
    case SequenceKernel::kFusedMma:
      if constexpr (k16Bit<T>) {
        return launch_mma_forward(a, plan, arrivals, stream);
      }
      return cudaErrorInvalidValue;
    case SequenceKernel::kFusedHeld:
      if constexpr (std::is_same_v<T, float>) {
        return launch_held_forward(a, plan, arrivals, stream);
      }
      return cudaErrorInvalidValue;
    default:
      return launch_chunked_forward(a, plan, arrivals, stream);
  }
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
  if (!runs(plan, true)) {
    return cudaErrorInvalidValue;
  }
  auto* dc = static_cast<acc_t<T>*>(workspace);
  unsigned* arrivals =
      arrivals_in<T>(workspace, dc_bytes<T>(a.batch, a.state), a.batch);
  switch (plan.kernel) {
    case SequenceKernel::kFusedMma:
      if constexpr (k16Bit<T>) {
        return launch_mma_backward(a, plan, dc, arrivals, stream);
      }
      return cudaErrorInvalidValue;
    case SequenceKernel::kFusedHeld:
      if constexpr (std::is_same_v<T, float>) {
        return launch_held_backward(a, plan, dc, arrivals, stream);
      }
      return cudaErrorInvalidValue;
    default:
      return launch_chunked_backward(a, plan, dc, arrivals, stream);
  }
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
