// The CPU engine's GEMMs around the blocks (gemm.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace lltm::sequence::cpu_paths {

// a b (a [M, K], b [K, N]), into `out` where it is defined, by the library
// measured fastest for the shape on `context`'s threads ("threads=2").
at::Tensor mm(
    const std::string& context,
    const at::Tensor& a,
    const at::Tensor& b,
    const at::Tensor& out);

} // namespace lltm::sequence::cpu_paths
