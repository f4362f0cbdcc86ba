// Device helpers shared by the LLTM CUDA kernels (lltm_kernel.cu,
// lltm_small.cu, lltm_sequence.cu, lltm_step.cu): the math in the accumulation type, conversions, packed
// loads and stores, and launch-configuration queries.
#pragma once

#include "lltm_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace lltm::cuda::detail {

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
template <typename T>
using acc_t = typename OpMath<T>::type;

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

template <typename A>
__device__ __forceinline__ A sigmoid(A z) {
  return A(1) / (A(1) + exp_(-z));
}

template <typename A>
__device__ __forceinline__ A elu(A z) {
  return z > A(0) ? z : expm1_(z);
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

__device__ __forceinline__ float narrow(float v, float*) {
  return v;
}
__device__ __forceinline__ double narrow(double v, double*) {
  return v;
}
__device__ __forceinline__ __half narrow(float v, __half*) {
  return __float2half(v);
}
__device__ __forceinline__ __nv_bfloat16 narrow(float v, __nv_bfloat16*) {
  return __float2bfloat16(v);
}

template <typename T>
__device__ __forceinline__ void put(T* p, acc_t<T> v) {
  *p = narrow(v, static_cast<T*>(nullptr));
}

// One element of a strided operand, in the math type; none reads as zero.
template <typename T>
__device__ __forceinline__ acc_t<T> load_element(
    const Strided<T>& m,
    int64_t row,
    int64_t col) {
  return m.data == nullptr
      ? acc_t<T>(0)
      : widen(m.data[row * m.row_stride + col * m.col_stride]);
}

// V elements moved as one access (16 bytes when V = 16 / sizeof(T)).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, typename T>
__device__ __forceinline__ void load(const T* p, acc_t<T> (&out)[V]) {
  const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    out[j] = widen(pack.v[j]);
  }
}

template <int V, typename T>
__device__ __forceinline__ void store(T* p, const acc_t<T> (&in)[V]) {
  Pack<T, V> pack;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    pack.v[j] = narrow(in[j], static_cast<T*>(nullptr));
  }
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

// A strided operand: a packed load where the columns are adjacent and
// aligned (`packed`, decided on the host), else element by element, which
// also reads a broadcast (stride 0) column.
template <int V, typename T, typename I>
__device__ __forceinline__ void load(
    const Strided<T>& m,
    bool packed,
    I row,
    I col,
    acc_t<T> (&out)[V]) {
  if (m.data == nullptr) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      out[j] = acc_t<T>(0);
    }
    return;
  }
  const T* p = m.data + row * static_cast<I>(m.row_stride) +
      col * static_cast<I>(m.col_stride);
  if (packed) {
    load<V>(p, out);
    return;
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    out[j] = widen(p[j * static_cast<I>(m.col_stride)]);
  }
}

inline int multiprocessors() {
  // Asked once per device: the attribute query is a driver call.
  static std::array<std::atomic<int>, 64> cached{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    return 132;
  }
  const size_t slot = static_cast<size_t>(device) % cached.size();
  int sms = cached[slot].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) !=
            cudaSuccess ||
        sms <= 0) {
      sms = 132;
    }
    cached[slot].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

inline bool aligned16(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <typename T>
constexpr int kPack = static_cast<int>(16 / sizeof(T));

} // namespace lltm::cuda::detail
