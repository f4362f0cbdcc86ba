// The fused steps on CUDA cores with W_h read in chunks: per step the
// recurrent GEMM by tiles (tiles.h) with the cell's pointwise math in its
// epilogue, so that no pre-activation tensor makes a round trip through
// memory between a GEMM and a pointwise kernel. Where a step's grid fits on
// the GPU at once, one cooperative launch per direction runs every step,
// with a barrier among the blocks of a row tile between them; else the
// host issues one plain launch per step (run_steps, steps.h).
//
// Forward, step t (z holds P_t = input_t W_x^T on entry):
//   Z = P_t + b + h_{t-1} W_h^T,  Z = [Z_i | Z_o | Z_c]
//   i = sigmoid(Z_i)   o = sigmoid(Z_o)   g = elu(Z_c)
//   c_t = c_{t-1} + g * i            h_t = tanh(c_t) * o
// Backward, step t, with t_c = tanh(c_t):
//   gh = grad_h + (dZ_{t+1} W_h, or grad_h_n at t = T - 1)
//   gc = dc_t (grad_c_n at t = T - 1)
//   dc_{t-1} = (1 - t_c^2) * o * gh + gc
//   dZ_i = dc_{t-1} * g * i * (1 - i)    dZ_o = gh * t_c * o * (1 - o)
//   dZ_c = dc_{t-1} * i * elu'(Z_c),  elu'(z) = 1 if z > 0 else g + 1
// (the cell's part: cell_forward and cell_backward, cuda/common/device.h)
#include "cuda/sequence/fused/steps.h"
#include "cuda/sequence/fused/tiles.h"

#include "cuda/common/device.h"
#include "cuda/sequence/sequence.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace lltm::cuda::detail {
namespace {

// Where the steps of T run on tensor cores (has_fragments), the kernels
// here are never launched: their bodies are left out of those passes.
template <typename T, typename P>
__global__ void __launch_bounds__(P::threads, P::resident)
    step_forward_kernel(const StepForwardArgs<T> a) {
  if constexpr (has_fragments<T>()) {
    __trap();
  } else {
    forward_tile<T, P>(a);
  }
}

template <typename T, typename P>
__global__ void __launch_bounds__(P::threads, P::resident)
    step_backward_kernel(const StepBackwardArgs<T> a, acc_t<T>* dc) {
  if constexpr (has_fragments<T>()) {
    __trap();
  } else {
    backward_tile<T, P>(a, dc);
  }
}

// Every step in one cooperative launch (run_steps, steps.h).
template <typename T, typename P>
__global__ void __launch_bounds__(P::threads, P::resident)
    fused_forward_kernel(const FusedForwardArgs<T> a, unsigned* arrivals) {
  if constexpr (has_fragments<T>()) {
    __trap();
  } else {
    every_step(
        a,
        false,
        arrivals,
        [](const auto&) {},
        [](const StepForwardArgs<T>& step) { forward_tile<T, P>(step); });
  }
}

template <typename T, typename P>
__global__ void __launch_bounds__(P::threads, P::resident)
    fused_backward_kernel(
        const FusedBackwardArgs<T> a,
        acc_t<T>* dc,
        unsigned* arrivals) {
  if constexpr (has_fragments<T>()) {
    __trap();
  } else {
    every_step(
        a,
        true,
        arrivals,
        [](const auto&) {},
        [dc](const StepBackwardArgs<T>& step) {
          backward_tile<T, P>(step, dc);
        });
  }
}

// double keeps a launch per step: it is there to check gradients, and its
// cooperative kernels would add half a megabyte per architecture to the
// wheel.
template <typename T, typename P>
constexpr auto fused_forward_of() {
  if constexpr (std::is_same_v<T, double>) {
    return nullptr;
  } else {
    return &fused_forward_kernel<T, P>;
  }
}

template <typename T, typename P>
constexpr auto fused_backward_of() {
  if constexpr (std::is_same_v<T, double>) {
    return nullptr;
  } else {
    return &fused_backward_kernel<T, P>;
  }
}

// Whether the plan of tile P runs every step in one cooperative launch.
template <auto Fused, typename P>
bool cooperative_of(const FusedShape& shape, const DeviceLimits& limits) {
  if constexpr (std::is_same_v<decltype(Fused), std::nullptr_t>) {
    return false;
  } else {
    return cooperative<Fused, P>(shape, limits);
  }
}

template <typename T, bool Backward>
void plan_chunked(
    const FusedShape& shape,
    const DeviceLimits& limits,
    SequencePlan* out) {
  const int64_t sms = limits.multiprocessors;
  const auto set = [&](auto tile, int index) {
    using P = decltype(tile);
    set_tile<P>(out, index);
    // if constexpr: a ternary would instantiate both directions' kernels for
    // every tile, which the wheel would carry without ever launching.
    if constexpr (Backward) {
      out->cooperative =
          cooperative_of<fused_backward_of<T, P>(), P>(shape, limits);
    } else {
      out->cooperative =
          cooperative_of<fused_forward_of<T, P>(), P>(shape, limits);
    }
    return cudaSuccess;
  };
  out->kernel = SequenceKernel::kFusedChunked;
  if constexpr (Backward) {
    const int index =
        largest_filling<Backward3, Backward2, Backward1, Backward0>(
            shape.batch, shape.state, sms);
    with_tile<Backward3, Backward2, Backward1, Backward0>(
        index, [&](auto tile) { return set(tile, index); });
  } else {
    const int index = largest_filling<Forward3, Forward2, Forward1, Forward0>(
        shape.batch, shape.state, sms);
    with_tile<Forward3, Forward2, Forward1, Forward0>(
        index, [&](auto tile) { return set(tile, index); });
  }
}

template <typename T>
cudaError_t launch_chunked_forward(
    const FusedForwardArgs<T>& a,
    const SequencePlan& plan,
    unsigned* arrivals,
    cudaStream_t stream) {
  return with_tile<Forward3, Forward2, Forward1, Forward0>(
      plan.tile, [&](auto tile) {
        using P = decltype(tile);
        return run_steps<
            fused_forward_of<T, P>(),
            &step_forward_kernel<T, P>,
            P>(a, false, plan.cooperative, arrivals, stream);
      });
}

template <typename T>
cudaError_t launch_chunked_backward(
    const FusedBackwardArgs<T>& a,
    const SequencePlan& plan,
    acc_t<T>* dc,
    unsigned* arrivals,
    cudaStream_t stream) {
  return with_tile<Backward3, Backward2, Backward1, Backward0>(
      plan.tile, [&](auto tile) {
        using P = decltype(tile);
        return run_steps<
            fused_backward_of<T, P>(),
            &step_backward_kernel<T, P>,
            P>(a, true, plan.cooperative, arrivals, stream, dc);
      });
}

// Every block.
template <typename T>
bool plan(
    const FusedShape& shape,
    const DeviceLimits& limits,
    bool backward,
    SequencePlan* out) {
  backward ? plan_chunked<T, true>(shape, limits, out)
           : plan_chunked<T, false>(shape, limits, out);
  return true;
}

} // namespace

template <typename T>
const FusedKernel<T>& chunked_kernel() {
  static constexpr FusedKernel<T> kKernel{
      &plan<T>, &launch_chunked_forward<T>, &launch_chunked_backward<T>};
  return kKernel;
}

#define LLTM_INSTANTIATE(T) template const FusedKernel<T>& chunked_kernel<T>();

LLTM_FOR_EACH_TYPE(LLTM_INSTANTIATE)

#undef LLTM_INSTANTIATE

} // namespace lltm::cuda::detail
