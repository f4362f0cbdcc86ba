// Device helpers shared by the LLTM CUDA kernels (cuda/cell/, cuda/sequence/):
// the cell's math for one element, in the accumulation type; conversions,
// strided and packed loads and stores; the device's limits; and the list of
// storage types.
#pragma once

#include "cuda/cell/cell.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

// Instantiates MACRO(T) for each storage type the launchers take.
#define LLTM_FOR_EACH_TYPE(MACRO) \
  MACRO(float) MACRO(double) MACRO(__half) MACRO(__nv_bfloat16)

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
__device__ __forceinline__ float tanh_(float x) {
  return tanhf(x);
}
__device__ __forceinline__ double tanh_(double x) {
  return tanh(x);
}
__device__ __forceinline__ float sigmoid(float z) {
  return 1.0f / (1.0f + expf(-z));
}
__device__ __forceinline__ double sigmoid(double z) {
  return 1.0 / (1.0 + exp(-z));
}
__device__ __forceinline__ float elu(float z) {
  return z > 0.0f ? z : expm1f(z);
}
__device__ __forceinline__ double elu(double z) {
  return z > 0.0 ? z : expm1(z);
}

// The cell's forward at one (row, column), from its three pre-activations
// (bias included) and the old cell:
//   i = sigmoid(z_i)   o = sigmoid(z_o)   g = elu(z_c)
//   cell = old_cell + g * i              h = tanh(cell) * o
template <typename A>
struct CellForward {
  A i;
  A o;
  A g;
  A cell;
  A h;
};

template <typename A>
__device__ __forceinline__ CellForward<A> cell_forward(
    A z_i,
    A z_o,
    A z_c,
    A old_cell) {
  CellForward<A> f;
  f.i = sigmoid(z_i);
  f.o = sigmoid(z_o);
  f.g = elu(z_c);
  f.cell = old_cell + f.g * f.i;
  f.h = tanh_(f.cell) * f.o;
  return f;
}

// The cell's backward at one (row, column), from the saved activations, t =
// tanh(cell) (the caller takes it, to issue it where its latency hides) and
// the upstream gradients gh (of h) and gc (of the cell):
//   d_cell = (1 - t^2) * o * gh + gc       (the old cell's gradient)
//   dz_i = d_cell * g * i * (1 - i)        dz_o = gh * t * o * (1 - o)
//   dz_c = d_cell * i * elu'(z_c),  elu'(z) = 1 if z > 0 else e^z = g + 1
// Each product is taken in the order written, as the kernels always have:
// another order can change the last bit.
template <typename A>
struct CellBackward {
  A d_cell;
  A dz_i;
  A dz_o;
  A dz_c;
};

template <typename A>
__device__ __forceinline__ CellBackward<A> cell_backward(
    A i,
    A o,
    A g,
    A t,
    A gh,
    A gc) {
  CellBackward<A> d;
  d.d_cell = (A(1) - t * t) * o * gh + gc;
  d.dz_i = d.d_cell * g * i * (A(1) - i);
  d.dz_o = gh * t * o * (A(1) - o);
  d.dz_c = d.d_cell * i * (g > A(0) ? A(1) : g + A(1));
  return d;
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

// v into *p, in p's type.
template <typename T>
__device__ __forceinline__ void put(T* p, acc_t<T> v) {
  if constexpr (std::is_same_v<T, __half>) {
    *p = __float2half(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    *p = __float2bfloat16(v);
  } else {
    *p = v;
  }
}

// The zero of T; of a 16-bit T (float16 or bfloat16), from its bits.
template <typename T>
__device__ __forceinline__ T zero_bits() {
  if constexpr (std::is_same_v<T, __half>) {
    return __ushort_as_half(0);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __ushort_as_bfloat16(0);
  } else {
    return T(0);
  }
}

// One element of a strided operand, in the math type, where the operand is
// always given (no test in the small kernels' inner loops).
template <typename T>
__device__ __forceinline__ acc_t<T> load_present(
    const Strided<T>& m,
    int64_t row,
    int64_t col) {
  return widen(m.data[row * m.row_stride + col * m.col_stride]);
}

// One element of a strided operand that may be absent: none reads as zero.
template <typename T>
__device__ __forceinline__ acc_t<T> load_element(
    const Strided<T>& m,
    int64_t row,
    int64_t col) {
  return m.data == nullptr ? acc_t<T>(0) : load_present(m, row, col);
}

// The same element as T stores it (zero where m is absent), for kernels
// that load ahead and widen where they use it: a widened load is waited
// for where it is loaded, one kept narrow at its use, so that its latency
// can pass behind a barrier or a product in between.
template <typename T>
__device__ __forceinline__ T
stored_element(const Strided<T>& m, int64_t row, int64_t col) {
  return m.data == nullptr ? zero_bits<T>()
                           : m.data[row * m.row_stride + col * m.col_stride];
}

// The cell at (b, s) once a kernel has summed Z = X W^T there: adds the
// bias, writes Z + b when asked (the tutorial's gate_weights), then
// new_cell, new_h and the activations that c asks for (ForwardArgs; c.z is
// not read).
template <typename T>
__device__ __forceinline__ void cell_outputs(
    const ForwardArgs<T>& c,
    int64_t b,
    int64_t s,
    acc_t<T> z_i,
    acc_t<T> z_o,
    acc_t<T> z_c) {
  const int64_t S = c.state;
  if (c.bias != nullptr) {
    z_i += widen(c.bias[s]);
    z_o += widen(c.bias[S + s]);
    z_c += widen(c.bias[2 * S + s]);
  }
  if (c.z_with_bias != nullptr) {
    T* z = c.z_with_bias + b * c.ld_z;
    put(z + s, z_i);
    put(z + S + s, z_o);
    put(z + 2 * S + s, z_c);
  }
  const CellForward<acc_t<T>> f =
      cell_forward(z_i, z_o, z_c, widen(c.old_cell[b * S + s]));
  put(c.new_cell + b * S + s, f.cell);
  put(c.new_h + b * S + s, f.h);
  if (c.input_gate != nullptr) {
    put(c.input_gate + b * c.ld_act + s, f.i);
    put(c.output_gate + b * c.ld_act + s, f.o);
    put(c.candidate_cell + b * c.ld_act + s, f.g);
  }
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
    put(&pack.v[j], in[j]);
  }
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

// V adjacent columns of a strided operand: a packed load where they are
// adjacent and aligned (`packed`, decided on the host), else element by
// element, which also reads a broadcast (stride 0) column.
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

// What the current device offers, asked once per device: the attribute
// queries are driver calls.
struct DeviceLimits {
  int device;
  int multiprocessors;
  int shared_bytes; // per block, with the opt-in
  bool cooperative;
  int capability; // 10 major + minor
};

// A slot of the per-device caches.
inline size_t device_slot(int device) {
  return static_cast<size_t>(device) % 64;
}

// The limits of the current device, or the error of the query that failed
// (nothing is cached then, and the next call asks again).
inline cudaError_t device_limits(DeviceLimits* out) {
  static std::array<std::atomic<int>, 64> sms{};
  static std::array<std::atomic<int>, 64> shared{};
  static std::array<std::atomic<int>, 64> coop{};
  static std::array<std::atomic<int>, 64> capability{};
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) {
    return status;
  }
  const size_t slot = device_slot(device);
  // The multiprocessor count is stored last (release): a reader that sees
  // it nonzero sees the others.
  if (sms[slot].load(std::memory_order_acquire) == 0) {
    int n = 0, bytes = 0, can = 0, major = 0, minor = 0;
    if ((status = cudaDeviceGetAttribute(
             &major, cudaDevAttrComputeCapabilityMajor, device)) !=
            cudaSuccess ||
        (status = cudaDeviceGetAttribute(
             &minor, cudaDevAttrComputeCapabilityMinor, device)) !=
            cudaSuccess ||
        (status = cudaDeviceGetAttribute(
             &bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device)) !=
            cudaSuccess ||
        (status = cudaDeviceGetAttribute(
             &can, cudaDevAttrCooperativeLaunch, device)) != cudaSuccess ||
        (status = cudaDeviceGetAttribute(
             &n, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) {
      return status;
    }
    shared[slot].store(bytes, std::memory_order_relaxed);
    coop[slot].store(can, std::memory_order_relaxed);
    capability[slot].store(10 * major + minor, std::memory_order_relaxed);
    sms[slot].store(n, std::memory_order_release);
  }
  out->device = device;
  out->multiprocessors = sms[slot].load(std::memory_order_acquire);
  out->shared_bytes = shared[slot].load(std::memory_order_relaxed);
  out->cooperative = coop[slot].load(std::memory_order_relaxed) != 0;
  out->capability = capability[slot].load(std::memory_order_relaxed);
  return cudaSuccess;
}

// The current device's multiprocessor count, for the size of a grid.
inline cudaError_t multiprocessors(int64_t* out) {
  DeviceLimits limits{};
  const cudaError_t status = device_limits(&limits);
  *out = limits.multiprocessors;
  return status;
}

// Blocks for a grid-stride loop over `threads` threads: one thread each, up
// to 16 blocks per multiprocessor.
inline unsigned int grid_stride_blocks(int64_t threads, int64_t sms) {
  const int64_t wanted = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(
      std::max<int64_t>(1, std::min<int64_t>(wanted, sms * 16)));
}

inline bool aligned16(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <typename T>
constexpr int kPack = static_cast<int>(16 / sizeof(T));

} // namespace lltm::cuda::detail
