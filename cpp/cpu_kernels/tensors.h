// From ATen tensors to the CPU kernels' operands: shared by the C++ layers
// over them (cpp/cell/cpu.cpp, cpp/sequence/cpu/).
#pragma once

#include "cpp/cpu_kernels/kernels.h"

#include <ATen/core/Tensor.h>

#include <optional>

namespace lltm::cpu {

// A 2-D tensor through its strides; none reads as zeros.
template <typename T>
Strided<T> strided(const std::optional<at::Tensor>& t) {
  if (!t) {
    return {nullptr, 0, 0};
  }
  return {t->const_data_ptr<T>(), t->stride(0), t->stride(1)};
}

} // namespace lltm::cpu
