// The CPU engine's GEMMs around the blocks (gemm.cpp).
#pragma once

#include "cpp/sequence/sequence.h"

namespace lltm::sequence::cpu_paths {

// a b (a [M, K], b [K, N]), into `out` where it is defined, by the library
// measured fastest for the shape on `engine` (Engine::mm).
at::Tensor mm(
    const Engine& engine,
    const at::Tensor& a,
    const at::Tensor& b,
    const at::Tensor& out);

} // namespace lltm::sequence::cpu_paths
