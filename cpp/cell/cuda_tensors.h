// From ATen tensors to the CUDA kernel library's raw pointers: shared by the
// C++ layers over it (cpp/cell/cuda.cpp, cpp/sequence/cuda/).
#pragma once

#include "cuda/cell/cell.h"

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <optional>

namespace lltm::cuda {

// The kernel library's element type for an ATen scalar type (same layout).
template <typename scalar_t>
struct KernelType {
  using type = scalar_t;
};
template <>
struct KernelType<c10::Half> {
  using type = __half;
};
template <>
struct KernelType<c10::BFloat16> {
  using type = __nv_bfloat16;
};

template <typename scalar_t>
using kernel_t = typename KernelType<scalar_t>::type;

template <typename scalar_t>
const kernel_t<scalar_t>* in(const at::Tensor& t) {
  return reinterpret_cast<const kernel_t<scalar_t>*>(
      t.const_data_ptr<scalar_t>());
}

template <typename scalar_t>
kernel_t<scalar_t>* out(const at::Tensor& t) {
  return reinterpret_cast<kernel_t<scalar_t>*>(t.mutable_data_ptr<scalar_t>());
}

// An output that may be absent: a null pointer or an undefined tensor.
template <typename scalar_t>
kernel_t<scalar_t>* out_or_null(const at::Tensor* t) {
  return t != nullptr && t->defined() ? out<scalar_t>(*t) : nullptr;
}

// A 2-D tensor through its strides; none reads as zeros.
template <typename scalar_t>
Strided<kernel_t<scalar_t>> strided(const std::optional<at::Tensor>& t) {
  if (!t) {
    return {nullptr, 0, 0};
  }
  return {in<scalar_t>(*t), t->stride(0), t->stride(1)};
}

} // namespace lltm::cuda
