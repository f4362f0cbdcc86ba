// The cell's tiled forward (lltm::cell, cell_forward and forward on the
// tiled path), in float: one step of the fused sequence steps' GEMM
// (cuda/sequence/fused/tiles.h) with X = [old_h | input] as the rows operand
// and all of W = [W_h | W_x] as the weights, K = S + F, and no P_t:
//   Z = X W^T + b,  Z = [Z_i | Z_o | Z_c]
//   i = sigmoid(Z_i)   o = sigmoid(Z_o)   g = elu(Z_c)
//   c = old_cell + g * i            h = tanh(c) * o
// One launch in place of a copy into X, a cuBLAS GEMM and the pointwise
// kernel, each with its host time.
#include "cuda/cell/cell.h"

#include "cuda/common/device.h"
#include "cuda/sequence/fused/steps.h"
#include "cuda/sequence/fused/tiles.h"

namespace lltm::cuda {
namespace {

using namespace detail; // NOLINT(google-build-using-namespace)

template <typename P>
__global__ void __launch_bounds__(P::threads, P::resident)
    tiled_cell_kernel(const SmallForwardArgs<float> a) {
  forward_tile<float, P>(a);
}

} // namespace

cudaError_t launch_tiled_forward(
    const SmallForwardArgs<float>& a,
    cudaStream_t stream) {
  if (a.cell.batch == 0 || a.cell.state == 0) {
    return cudaSuccess;
  }
  int64_t sms = 0;
  if (const cudaError_t status = multiprocessors(&sms); status != cudaSuccess) {
    return status;
  }
  const int64_t B = a.cell.batch;
  const int64_t S = a.cell.state;
  // Forward3 is left out: its registers spill with the strided loads.
  const int tile = largest_filling<Forward2, Forward1, Forward0>(B, S, sms);
  return with_tile<Forward2, Forward1, Forward0>(tile, [&](auto p) {
    using P = decltype(p);
    tiled_cell_kernel<P><<<grid_of<P>(B, S), P::threads, 0, stream>>>(a);
    return cudaGetLastError();
  });
}

} // namespace lltm::cuda
