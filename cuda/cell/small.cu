// LLTM kernels for small problems, whose GEMMs these kernels do themselves.
//
// Forward, in one kernel, with X = [old_h | input] read in place and one
// warp per (b, s), its lanes splitting the sum over k:
//   Z_g[b, s] = sum_k X[b, k] W[g * S + s, k] + b[g * S + s],  g = i, o, c
// then the cell's forward (cell_forward, common/device.h: i, o, g, new_cell,
// new_h).
//
// Backward GEMMs, in one kernel, one thread per output element:
//   d_weights[j, k] = sum_b dZ[b, j] X[b, k]
//   d_old_h[b, k]   = sum_j dZ[b, j] W[j, k]        (k < S)
//   d_input[b, k]   = sum_j dZ[b, j] W[j, S + k]
//
// At the tutorial's size (batch 16, state 128, 32 features) a step's GEMMs
// are a few MFLOP, yet cuBLAS picks kernels for them that take far longer
// than these (docs/performance.md has the times), and these save two
// launches per direction. Sums run in the accumulation type, in a fixed
// order: the results are the same bits on every run.
#include "cuda/cell/cell.h"

#include "cuda/common/device.h"

#include <cstdint>

namespace lltm::cuda {
namespace {

using namespace detail; // NOLINT(google-build-using-namespace)

constexpr int kWarp = 32;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    small_forward_kernel(const SmallForwardArgs<T> a) {
  using A = acc_t<T>;
  const ForwardArgs<T>& c = a.cell;
  const int64_t S = c.state;
  const int64_t K = S + a.input_features;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  // Each warp's lanes run the loops together, so the shuffles see them all.
  for (int64_t w =
           (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) /
           kWarp;
       w < c.batch * S;
       w += warps) {
    const int64_t b = w / S;
    const int64_t s = w - b * S;
    A z_i = 0;
    A z_o = 0;
    A z_c = 0;
    for (int64_t k = lane; k < K; k += kWarp) {
      const A x =
          k < S ? load_present(a.old_h, b, k) : load_present(a.input, b, k - S);
      z_i += x * load_present(a.weights, s, k);
      z_o += x * load_present(a.weights, S + s, k);
      z_c += x * load_present(a.weights, 2 * S + s, k);
      if (a.X != nullptr && s == 0) {
        put(a.X + b * K + k, x);
      }
    }
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      z_i += __shfl_down_sync(0xffffffff, z_i, offset);
      z_o += __shfl_down_sync(0xffffffff, z_o, offset);
      z_c += __shfl_down_sync(0xffffffff, z_c, offset);
    }
    if (lane != 0) {
      continue;
    }
    cell_outputs(c, b, s, z_i, z_o, z_c);
  }
}

// sum_j dZ[b, j] W[j, col], over the 3 * state rows of W, with four
// accumulators for the latency and a fixed order of addition.
template <typename T>
__device__ __forceinline__ acc_t<T> d_x_sum(
    const SmallBackwardArgs<T>& a,
    int64_t b,
    int64_t col) {
  using A = acc_t<T>;
  const int64_t G = 3 * a.state;
  const T* dz = a.d_gates + b * G;
  A acc[4] = {0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 4 <= G; j += 4) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      acc[u] += widen(dz[j + u]) * load_present(a.weights, j + u, col);
    }
  }
  for (; j < G; ++j) {
    acc[0] += widen(dz[j]) * load_present(a.weights, j, col);
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) small_backward_gemms_kernel(
    const SmallBackwardArgs<T> a,
    int64_t n_weights,
    int64_t n_old_h,
    int64_t n_input) {
  using A = acc_t<T>;
  const int64_t S = a.state;
  const int64_t F = a.input_features;
  const int64_t K = S + F;
  const int64_t G = 3 * S;
  const int64_t total = n_weights + n_old_h + n_input;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (t < n_weights) {
      const int64_t j = t / K;
      const int64_t k = t - j * K;
      A acc = 0;
      for (int64_t b = 0; b < a.batch; ++b) {
        acc += widen(a.d_gates[b * G + j]) * widen(a.X[b * K + k]);
      }
      put(a.d_weights + t, acc);
    } else if (t < n_weights + n_old_h) {
      const int64_t u = t - n_weights;
      const int64_t b = u / S;
      put(a.d_old_h + u, d_x_sum(a, b, u - b * S));
    } else {
      const int64_t u = t - n_weights - n_old_h;
      const int64_t b = u / F;
      put(a.d_input + u, d_x_sum(a, b, S + (u - b * F)));
    }
  }
}

// Launches a grid-stride kernel over `threads` threads.
template <typename... Params, typename... Args>
cudaError_t launch_over(
    void (*kernel)(Params...),
    int64_t threads,
    cudaStream_t stream,
    const Args&... args) {
  int64_t sms = 0;
  if (const cudaError_t status = multiprocessors(&sms); status != cudaSuccess) {
    return status;
  }
  kernel<<<grid_stride_blocks(threads, sms), kThreads, 0, stream>>>(args...);
  return cudaGetLastError();
}

} // namespace

template <typename T>
cudaError_t launch_small_forward(
    const SmallForwardArgs<T>& a,
    cudaStream_t stream) {
  const int64_t warps = a.cell.batch * a.cell.state;
  if (warps == 0) {
    return cudaSuccess;
  }
  return launch_over(small_forward_kernel<T>, warps * kWarp, stream, a);
}

template <typename T>
cudaError_t launch_small_backward_gemms(
    const SmallBackwardArgs<T>& a,
    cudaStream_t stream) {
  const int64_t S = a.state;
  const int64_t K = S + a.input_features;
  const int64_t n_weights = a.d_weights != nullptr ? 3 * S * K : 0;
  const int64_t n_old_h = a.d_old_h != nullptr ? a.batch * S : 0;
  const int64_t n_input = a.d_input != nullptr ? a.batch * a.input_features : 0;
  const int64_t total = n_weights + n_old_h + n_input;
  if (total == 0) {
    return cudaSuccess;
  }
  return launch_over(
      small_backward_gemms_kernel<T>,
      total,
      stream,
      a,
      n_weights,
      n_old_h,
      n_input);
}

#define LLTM_INSTANTIATE(T)                            \
  template cudaError_t launch_small_forward<T>(        \
      const SmallForwardArgs<T>&, cudaStream_t);       \
  template cudaError_t launch_small_backward_gemms<T>( \
      const SmallBackwardArgs<T>&, cudaStream_t);

LLTM_FOR_EACH_TYPE(LLTM_INSTANTIATE)

#undef LLTM_INSTANTIATE

} // namespace lltm::cuda
