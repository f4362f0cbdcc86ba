// What CUDA's sequence paths share: ATen tensors as the kernel library's
// operands (cpp/cell/cuda_tensors.h), a plan of the kernel library as the
// path's Plan, and the persistent kernels' forward and backward, which both
// the grid's path and the cluster's run.
#pragma once

#include "cpp/cell/cuda_tensors.h"
#include "cpp/sequence/path.h"
#include "cuda/sequence/sequence.h"

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>

#include <any>
#include <cstdint>
#include <optional>
#include <string>

namespace lltm::sequence::cuda_paths {

using cuda::in;
using cuda::kernel_t;
using cuda::out;
using cuda::out_or_null;
using cuda::strided;

template <typename scalar_t>
cuda::Strided3<kernel_t<scalar_t>> strided3(
    const std::optional<at::Tensor>& t) {
  if (!t) {
    return {nullptr, 0, 0, 0};
  }
  return {in<scalar_t>(*t), t->stride(0), t->stride(1), t->stride(2)};
}

// W with unit column stride, as every kernel reads it.
inline at::Tensor unit_columns(const at::Tensor& w) {
  return w.stride(1) == 1 ? w : w.contiguous();
}

// t, or a dense copy where t does not start on 16 bytes or is not dense:
// the operands of a plan of 16-byte loads.
inline at::Tensor aligned(const at::Tensor& t) {
  const bool ok = t.is_contiguous() &&
      reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
  return ok ? t : t.clone(at::MemoryFormat::Contiguous);
}

// A plan of the kernel library as a path's Plan; a plan that cannot run,
// as std::nullopt with its reason.
inline std::optional<Plan> as_plan(
    const cuda::SequencePlan& plan,
    std::string* why_not) {
  if (plan.kernel == cuda::SequenceKernel::kNone) {
    *why_not = plan.why_not != nullptr ? plan.why_not : "it does not fit";
    return std::nullopt;
  }
  return Plan{nullptr, cuda::variant_of(plan), plan};
}

// The kernel library's plan inside a path's Plan.
inline const cuda::SequencePlan& planned(const Plan& plan) {
  return std::any_cast<const cuda::SequencePlan&>(plan.detail);
}

// f(K{}) for K, the kernel library's type of a dtype.
template <typename F>
void with_kernel_type(at::ScalarType dtype, F&& f) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, dtype, "lltm_sequence_cuda", [&] {
        f(kernel_t<scalar_t>{});
      });
}

// A path's plan from the kernel library's planner(K{}, &plan), K the
// block's type; a failed query of the device raises.
template <typename Planner>
std::optional<Plan> plan_with(
    const Block& block,
    std::string* why_not,
    Planner&& planner) {
  cuda::SequencePlan plan;
  with_kernel_type(
      block.dtype, [&](auto k) { C10_CUDA_CHECK(planner(k, &plan)); });
  return as_plan(plan, why_not);
}

// Whether the fused steps of a dtype run on the current GPU's tensor cores,
// which moves the windows of auto's rules.
inline bool steps_on_tensor_cores(at::ScalarType dtype) {
  bool on = false;
  with_kernel_type(
      dtype, [&](auto k) { on = cuda::steps_on_tensor_cores<decltype(k)>(); });
  return on;
}

// The forward and backward of a persistent plan (the grid's or a
// cluster's).
void persistent_forward(
    const Plan& plan,
    const Sizes& sizes,
    const ForwardInputs& inputs,
    ForwardBuffers& b);
StateGrads persistent_backward(
    const Plan& plan,
    const Sizes& sizes,
    const BackwardInputs& inputs,
    const OutputMask& mask,
    at::Tensor& d_gates);

} // namespace lltm::sequence::cuda_paths
