// LLTM pointwise kernels, one fused kernel per direction.
//
// Forward, with the gate pre-activations Z = X W^T + b = [Z_i | Z_o | Z_c]
// (computed by cuBLAS before this kernel):
//   i = sigmoid(Z_i)    o = sigmoid(Z_o)    g = elu(Z_c)
//   new_cell = old_cell + g * i
//   new_h    = tanh(new_cell) * o
//
// Backward, with t = tanh(new_cell) and upstream gradients gh, gc:
//   d_old_cell = dc = (1 - t^2) * o * gh + gc
//   dZ_i = g * dc * i * (1 - i)
//   dZ_o = t * gh * o * (1 - o)
//   dZ_c = i * dc * elu'(Z_c),   elu'(z) = 1 if z > 0 else e^z
// (the GEMMs for d_weights, d_bias and [d_old_h | d_input] follow in cuBLAS).
//
// One thread per (row, column) element of the [batch, state] outputs, in a
// grid-stride loop over a 1-D grid, so no grid dimension limits the batch.
// float16 and bfloat16 are loaded and stored as such and computed in float.
// Indices are 32-bit when the largest tensor allows, else 64-bit.
#include "lltm_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace lltm::cuda {
namespace {

constexpr int kThreads = 256;

// The type the math runs in: float for 16-bit storage, else the type itself.
template <typename T>
struct OpMath {
  using type = T;
};
template <>
struct OpMath<__half> {
  using type = float;
};
template <>
struct OpMath<__nv_bfloat16> {
  using type = float;
};

// Overloads rather than the float-only intrinsics (expf, tanhf), so that a
// double kernel computes in double.
__device__ __forceinline__ float exp_(float x) {
  return expf(x);
}
__device__ __forceinline__ double exp_(double x) {
  return exp(x);
}
__device__ __forceinline__ float expm1_(float x) {
  return expm1f(x);
}
__device__ __forceinline__ double expm1_(double x) {
  return expm1(x);
}
__device__ __forceinline__ float tanh_(float x) {
  return tanhf(x);
}
__device__ __forceinline__ double tanh_(double x) {
  return tanh(x);
}

template <typename T>
__device__ __forceinline__ T sigmoid(T z) {
  return T(1) / (T(1) + exp_(-z));
}

template <typename T>
__device__ __forceinline__ T elu(T z) {
  return z > T(0) ? z : expm1_(z);
}

// Loads widen to the math type and stores narrow back, through the explicit
// conversion intrinsics: torch's extension builds define
// __CUDA_NO_HALF_CONVERSIONS__ and __CUDA_NO_BFLOAT16_CONVERSIONS__, which
// remove the implicit ones (CMake defines them too, so both builds agree).
__device__ __forceinline__ float widen(float x) {
  return x;
}
__device__ __forceinline__ double widen(double x) {
  return x;
}
__device__ __forceinline__ float widen(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float widen(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

__device__ __forceinline__ void store(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store(double* p, double v) {
  *p = v;
}
__device__ __forceinline__ void store(__half* p, float v) {
  *p = __float2half(v);
}
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16(v);
}

template <typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kThreads) lltm_forward_kernel(
    const scalar_t* __restrict__ gates, // [B, 3S]
    const scalar_t* __restrict__ old_cell, // [B, S]
    scalar_t* __restrict__ new_h, // [B, S]
    scalar_t* __restrict__ new_cell, // [B, S]
    scalar_t* __restrict__ input_gate, // [B, S]
    scalar_t* __restrict__ output_gate, // [B, S]
    scalar_t* __restrict__ candidate_cell, // [B, S]
    index_t numel, // B * S
    index_t state_size) {
  using acc_t = typename OpMath<scalar_t>::type;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t k = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       k < numel;
       k += stride) {
    const index_t b = k / state_size;
    const index_t s = k - b * state_size;
    const scalar_t* z = gates + b * 3 * state_size + s;
    const acc_t i = sigmoid(widen(z[0]));
    const acc_t o = sigmoid(widen(z[state_size]));
    const acc_t g = elu(widen(z[2 * state_size]));
    const acc_t c = widen(old_cell[k]) + g * i;
    store(new_cell + k, c);
    store(new_h + k, tanh_(c) * o);
    store(input_gate + k, i);
    store(output_gate + k, o);
    store(candidate_cell + k, g);
  }
}

template <typename scalar_t, typename index_t>
__global__ void __launch_bounds__(kThreads) lltm_backward_kernel(
    const scalar_t* __restrict__ grad_h, // [B, S]
    const scalar_t* __restrict__ grad_cell, // [B, S]
    const scalar_t* __restrict__ new_cell, // [B, S]
    const scalar_t* __restrict__ input_gate, // [B, S]
    const scalar_t* __restrict__ output_gate, // [B, S]
    const scalar_t* __restrict__ candidate_cell, // [B, S]
    const scalar_t* __restrict__ gates, // [B, 3S]
    scalar_t* __restrict__ d_gates, // [B, 3S]
    scalar_t* __restrict__ d_old_cell, // [B, S]
    index_t numel, // B * S
    index_t state_size) {
  using acc_t = typename OpMath<scalar_t>::type;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t k = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       k < numel;
       k += stride) {
    const index_t b = k / state_size;
    const index_t s = k - b * state_size;
    const index_t row = b * 3 * state_size + s;
    const acc_t gh = widen(grad_h[k]);
    const acc_t i = widen(input_gate[k]);
    const acc_t o = widen(output_gate[k]);
    const acc_t g = widen(candidate_cell[k]);
    const acc_t z_c = widen(gates[row + 2 * state_size]);
    const acc_t t = tanh_(widen(new_cell[k]));
    const acc_t dc = (acc_t(1) - t * t) * o * gh + widen(grad_cell[k]);
    const acc_t d_elu = z_c > acc_t(0) ? acc_t(1) : exp_(z_c);
    store(d_old_cell + k, dc);
    store(d_gates + row, g * dc * i * (acc_t(1) - i));
    store(d_gates + row + state_size, t * gh * o * (acc_t(1) - o));
    store(d_gates + row + 2 * state_size, i * dc * d_elu);
  }
}

// Enough blocks to fill the device several times over; the grid-stride loop
// covers the rest. Never more than gridDim.x allows.
unsigned int grid_size(int64_t numel) {
  int device = 0;
  int sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess) {
    sms = 132;
  }
  const int64_t wanted = (numel + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(sms) * 32;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(wanted, cap)));
}

// The largest index any thread forms is below 3 * numel (the gate rows).
bool fits_int32(int64_t numel) {
  return 3 * numel < std::numeric_limits<int32_t>::max();
}

} // namespace

template <typename scalar_t>
cudaError_t launch_forward_pointwise(
    const scalar_t* gates,
    const scalar_t* old_cell,
    scalar_t* new_h,
    scalar_t* new_cell,
    scalar_t* input_gate,
    scalar_t* output_gate,
    scalar_t* candidate_cell,
    int64_t batch,
    int64_t state_size,
    cudaStream_t stream) {
  const int64_t numel = batch * state_size;
  if (numel == 0) {
    return cudaSuccess;
  }
  const unsigned int blocks = grid_size(numel);
  if (fits_int32(numel)) {
    lltm_forward_kernel<scalar_t, int32_t>
        <<<blocks, kThreads, /*shared_mem=*/0, stream>>>(
            gates,
            old_cell,
            new_h,
            new_cell,
            input_gate,
            output_gate,
            candidate_cell,
            static_cast<int32_t>(numel),
            static_cast<int32_t>(state_size));
  } else {
    lltm_forward_kernel<scalar_t, int64_t>
        <<<blocks, kThreads, /*shared_mem=*/0, stream>>>(
            gates,
            old_cell,
            new_h,
            new_cell,
            input_gate,
            output_gate,
            candidate_cell,
            numel,
            state_size);
  }
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch_backward_pointwise(
    const scalar_t* grad_h,
    const scalar_t* grad_cell,
    const scalar_t* new_cell,
    const scalar_t* input_gate,
    const scalar_t* output_gate,
    const scalar_t* candidate_cell,
    const scalar_t* gates,
    scalar_t* d_gates,
    scalar_t* d_old_cell,
    int64_t batch,
    int64_t state_size,
    cudaStream_t stream) {
  const int64_t numel = batch * state_size;
  if (numel == 0) {
    return cudaSuccess;
  }
  const unsigned int blocks = grid_size(numel);
  if (fits_int32(numel)) {
    lltm_backward_kernel<scalar_t, int32_t>
        <<<blocks, kThreads, /*shared_mem=*/0, stream>>>(
            grad_h,
            grad_cell,
            new_cell,
            input_gate,
            output_gate,
            candidate_cell,
            gates,
            d_gates,
            d_old_cell,
            static_cast<int32_t>(numel),
            static_cast<int32_t>(state_size));
  } else {
    lltm_backward_kernel<scalar_t, int64_t>
        <<<blocks, kThreads, /*shared_mem=*/0, stream>>>(
            grad_h,
            grad_cell,
            new_cell,
            input_gate,
            output_gate,
            candidate_cell,
            gates,
            d_gates,
            d_old_cell,
            numel,
            state_size);
  }
  return cudaGetLastError();
}

#define LLTM_INSTANTIATE(T)                                                    \
  template cudaError_t launch_forward_pointwise<T>(                            \
      const T*, const T*, T*, T*, T*, T*, T*, int64_t, int64_t, cudaStream_t); \
  template cudaError_t launch_backward_pointwise<T>(                           \
      const T*,                                                                \
      const T*,                                                                \
      const T*,                                                                \
      const T*,                                                                \
      const T*,                                                                \
      const T*,                                                                \
      const T*,                                                                \
      T*,                                                                      \
      T*,                                                                      \
      int64_t,                                                                 \
      int64_t,                                                                 \
      cudaStream_t);

LLTM_INSTANTIATE(float)
LLTM_INSTANTIATE(double)
LLTM_INSTANTIATE(__half)
LLTM_INSTANTIATE(__nv_bfloat16)

#undef LLTM_INSTANTIATE

} // namespace lltm::cuda
