// LLTM pointwise CPU kernels, vectorized with at::vec::Vectorized.
//
// This file is compiled once per CPU capability, as ATen's kernels are: with
// the module's other sources for DEFAULT, which any processor runs (at::vec's
// portable Vectorized, NEON on arm64), and on x86-64 again for each
// capability of cpu_capabilities.txt, with that capability's flags and
// -DCPU_CAPABILITY=<name> -DCPU_CAPABILITY_<name>, which select at::vec's
// code for it (cmake/LltmCpuKernels.cmake, and lltm.jit). Each object defines
// its capability's table, LLTM_CPU_KERNEL_TABLE(<name>), for cpu_dispatch.cpp.
//
// Forward, per (b, s), with the pre-activations Z = [Z_i | Z_o | Z_c] and
// the bias b (added here, not in the GEMM):
//   i = sigmoid(Z_i + b_i)    o = sigmoid(Z_o + b_o)    g = elu(Z_c + b_c)
//   new_cell = old_cell + g * i
//   new_h    = tanh(new_cell) * o
//
// Backward, from the saved activations i, o, g and new_cell, with
// t = tanh(new_cell) and upstream gradients gh (the sum of grad_h and, when
// given, grad_h_add), gc:
//   d_old_cell = dc = (1 - t^2) * o * gh + gc
//   dZ_i = dc * g * i * (1 - i)
//   dZ_o = gh * t * o * (1 - o)
//   dZ_c = dc * i * elu'(Z_c),  elu'(z) = 1 if z > 0 else e^z = g + 1
//   d_bias = the column sums of dZ
// so the backward needs one transcendental, tanh, and no pre-activation.
//
// float16 and bfloat16 are loaded into float vectors and stored back:
// every intermediate is float, as in ATen's reduced-precision kernels.

// DEFAULT: compiled with the module's other sources, which name no capability.
#ifndef CPU_CAPABILITY
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT
#endif

#include "cpp/cpu_kernels/kernels.h"

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <type_traits>

// Each capability's kernels in a namespace of their own, as in ATen: its
// instantiations are other functions than the other capabilities'.
namespace lltm::cpu {
inline namespace CPU_CAPABILITY {

template <typename T>
using acc_t = at::opmath_type<T>;
template <typename T>
using Vec = at::vec::Vectorized<acc_t<T>>;

// Loads n <= Vec::size() elements (the rest read as zero).
template <typename T>
Vec<T> load(const T* p, int64_t n) {
  if constexpr (std::is_same_v<T, acc_t<T>>) {
    return n == Vec<T>::size() ? Vec<T>::loadu(p) : Vec<T>::loadu(p, n);
  } else {
    if (n == Vec<T>::size()) {
      Vec<T> out;
      at::vec::load_to_float(p, out);
      return out;
    }
    acc_t<T> buffer[Vec<T>::size()] = {};
    std::copy(p, p + n, buffer);
    return Vec<T>::loadu(buffer);
  }
}

template <typename T>
Vec<T> load(const Strided<T>& m, int64_t row, int64_t col, int64_t n) {
  if (m.data == nullptr) {
    return Vec<T>(acc_t<T>(0));
  }
  const T* p = m.data + row * m.row_stride + col * m.col_stride;
  if (m.col_stride == 1) {
    return load(p, n);
  }
  if (m.col_stride == 0) {
    return Vec<T>(static_cast<acc_t<T>>(*p));
  }
  acc_t<T> buffer[Vec<T>::size()] = {};
  for (int64_t j = 0; j < n; ++j) {
    buffer[j] = static_cast<acc_t<T>>(p[j * m.col_stride]);
  }
  return Vec<T>::loadu(buffer);
}

// Stores the first n elements.
template <typename T>
void store(T* p, const Vec<T>& v, int64_t n) {
  if constexpr (std::is_same_v<T, acc_t<T>>) {
    n == Vec<T>::size() ? v.store(p) : v.store(p, static_cast<int>(n));
  } else {
    // One vector of T holds two float vectors; only the first is used.
    at::vec::convert_from_float<T>(v, v).store(p, static_cast<int>(n));
  }
}

// e^x in float on x86-64: Cephes' expf (a degree-5 polynomial after
// reducing x by n ln 2, then 2^n built in the exponent bits), inline. Sleef's
// expf, which Vectorized::exp calls, is an out-of-line call that spills
// every live vector around it; the forward takes three exps per element.
// The activations from it are within 2.5 ulp of float64's (measured from
// -100 to 100); x is clamped to [-87.3, 88.37] (so that 2^n stays a normal
// float), and NaN stays NaN. Other types and capabilities keep Sleef
// (or at::vec's portable exp).
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
constexpr bool kInlineExp = true;
#else
constexpr bool kInlineExp = false;
#endif

// What the fused step calls inlines into it, always: out of line (GCC chose
// so for tanh and expm1 once the step's rows were unrolled, and for the
// step's GEMM, called twice), each call spilled or kept the rows' live
// accumulators in memory.
#if defined(__GNUC__) || defined(__clang__)
#define LLTM_ALWAYS_INLINE __attribute__((always_inline)) inline
#else
#define LLTM_ALWAYS_INLINE inline
#endif

template <typename V>
LLTM_ALWAYS_INLINE V exp_fast(const V& x) {
  using S = typename V::value_type;
  if constexpr (kInlineExp && std::is_same_v<S, float>) {
    // at::vec::clamp keeps NaN (x86's min and max return their second operand
    // when either is NaN, and clamp passes x second).
    const V a = at::vec::clamp(x, V(-87.3f), V(88.37f));
    const V n = (a * V(1.44269504088896341f)).round();
    V r = at::vec::fmadd(n, V(-0.693359375f), a);
    r = at::vec::fmadd(n, V(2.12194440e-4f), r);
    V p = at::vec::fmadd(V(1.9875691500e-4f), r, V(1.3981999507e-3f));
    p = at::vec::fmadd(p, r, V(8.3334519073e-3f));
    p = at::vec::fmadd(p, r, V(4.1665795894e-2f));
    p = at::vec::fmadd(p, r, V(1.6666665459e-1f));
    p = at::vec::fmadd(p, r, V(5.0000001201e-1f));
    p = at::vec::fmadd(p, r * r, r + V(1));
    // 2^n: (n + 127) << 23 as the bits of a float, computed in float, where
    // it is exact (n + 127 is in [1, 254]).
    const V bits = (n + V(127)) * V(8388608.0f);
    return p * at::vec::cast<float>(at::vec::convert_to_int_of_same_size(bits));
  } else {
    return x.exp();
  }
}

template <typename V>
LLTM_ALWAYS_INLINE V sigmoid(const V& z) {
  const V one(1);
  return one / (one + exp_fast(z.neg()));
}

// tanh in float: Cephes' tanhf, an odd polynomial below |x| = 0.625 and
// 1 - 2 / (e^{2|x|} + 1) above, within a few ulp of tanh. Sleef's tanh, which
// Vectorized::tanh calls, costs about three exps; the forward and the
// backward each take one tanh per element. double keeps Sleef's.
template <typename V>
LLTM_ALWAYS_INLINE V tanh(const V& x) {
  using S = typename V::value_type;
  if constexpr (std::is_same_v<S, float>) {
    const V z = x * x;
    V p = at::vec::fmadd(V(-5.70498872745e-3f), z, V(2.06390887954e-2f));
    p = at::vec::fmadd(p, z, V(-5.37397155531e-2f));
    p = at::vec::fmadd(p, z, V(1.33314422036e-1f));
    p = at::vec::fmadd(p, z, V(-3.33332819422e-1f));
    const V small = at::vec::fmadd(p * z, x, x);
    const V a = x.abs();
    const V large = V(1) - V(2) / (exp_fast(a + a) + V(1));
    return V::blendv(
        V::blendv(large, large.neg(), x < V(0)), small, a < V(0.625f));
  } else {
    return x.tanh();
  }
}

// e^z - 1 for z <= 0 (elu's negative side): where exp_fast is inline, e^z -
// 1 where that loses nothing (z < -0.5) and Taylor's degree-8 polynomial
// above, inline for the same reason as exp; elsewhere at::vec's expm1.
template <typename V>
LLTM_ALWAYS_INLINE V expm1_negative(const V& z) {
  using S = typename V::value_type;
  if constexpr (kInlineExp && std::is_same_v<S, float>) {
    V p = at::vec::fmadd(V(1.0f / 40320), z, V(1.0f / 5040));
    p = at::vec::fmadd(p, z, V(1.0f / 720));
    p = at::vec::fmadd(p, z, V(1.0f / 120));
    p = at::vec::fmadd(p, z, V(1.0f / 24));
    p = at::vec::fmadd(p, z, V(1.0f / 6));
    p = at::vec::fmadd(p, z, V(0.5f));
    const V near_zero = at::vec::fmadd(p * z, z, z);
    return V::blendv(exp_fast(z) - V(1), near_zero, z >= V(-0.5f));
  } else {
    return z.expm1();
  }
}

template <typename V>
LLTM_ALWAYS_INLINE V elu(const V& z) {
  return V::blendv(expm1_negative(z), z, z > V(0));
}

template <typename T>
void forward_rows(const ForwardArgs<T>& a, int64_t begin, int64_t end) {
  constexpr int64_t kWidth = Vec<T>::size();
  const int64_t S = a.state;
  const bool save = a.input_gate != nullptr;
  for (int64_t b = begin; b < end; ++b) {
    const T* z = a.z + b * a.ld_z;
    for (int64_t s = 0; s < S; s += kWidth) {
      const int64_t n = std::min(kWidth, S - s);
      Vec<T> z_i = load(z + s, n);
      Vec<T> z_o = load(z + S + s, n);
      Vec<T> z_c = load(z + 2 * S + s, n);
      if (a.bias != nullptr) {
        z_i = z_i + load(a.bias + s, n);
        z_o = z_o + load(a.bias + S + s, n);
        z_c = z_c + load(a.bias + 2 * S + s, n);
      }
      if (a.z_with_bias != nullptr) {
        T* out = a.z_with_bias + b * a.ld_z;
        store(out + s, z_i, n);
        store(out + S + s, z_o, n);
        store(out + 2 * S + s, z_c, n);
      }
      const Vec<T> i = sigmoid(z_i);
      const Vec<T> o = sigmoid(z_o);
      const Vec<T> g = elu(z_c);
      const Vec<T> c = load(a.old_cell + b * S + s, n) + g * i;
      store(a.new_cell + b * S + s, c, n);
      store(a.new_h + b * S + s, tanh(c) * o, n);
      if (save) {
        store(a.input_gate + b * a.ld_act + s, i, n);
        store(a.output_gate + b * a.ld_act + s, o, n);
        store(a.candidate_cell + b * a.ld_act + s, g, n);
      }
    }
  }
}

template <typename T>
void backward_rows(const BackwardArgs<T>& a, int64_t begin, int64_t end) {
  constexpr int64_t kWidth = Vec<T>::size();
  const int64_t S = a.state;
  const Vec<T> one(1);
  const Vec<T> zero(0);
  for (int64_t b = begin; b < end; ++b) {
    T* dz = a.d_gates + b * 3 * S;
    for (int64_t s = 0; s < S; s += kWidth) {
      const int64_t n = std::min(kWidth, S - s);
      Vec<T> gh = load(a.grad_h, b, s, n);
      if (a.grad_h_add != nullptr) {
        gh = gh + load(a.grad_h_add + b * a.ld_grad_h_add + s, n);
      }
      const Vec<T> gc = load(a.grad_cell, b, s, n);
      const Vec<T> i = load(a.input_gate + b * a.ld_act + s, n);
      const Vec<T> o = load(a.output_gate + b * a.ld_act + s, n);
      const Vec<T> g = load(a.candidate_cell + b * a.ld_act + s, n);
      const Vec<T> t = tanh(load(a.new_cell + b * S + s, n));
      const Vec<T> dc = (one - t * t) * o * gh + gc;
      const Vec<T> dz_i = dc * g * i * (one - i);
      const Vec<T> dz_o = gh * t * o * (one - o);
      const Vec<T> dz_c = dc * i * Vec<T>::blendv(g + one, one, g > zero);
      store(dz + s, dz_i, n);
      store(dz + S + s, dz_o, n);
      store(dz + 2 * S + s, dz_c, n);
      if (a.d_old_cell != nullptr) {
        store(a.d_old_cell + b * S + s, dc, n);
      }
      if (a.d_bias != nullptr) {
        acc_t<T>* sum = a.d_bias;
        (Vec<T>::loadu(sum + s, n) + dz_i).store(sum + s, n);
        (Vec<T>::loadu(sum + S + s, n) + dz_o).store(sum + S + s, n);
        (Vec<T>::loadu(sum + 2 * S + s, n) + dz_c).store(sum + 2 * S + s, n);
      }
    }
  }
}

// --- the fused step (float) -------------------------------------------------

// Rows of a task: their accumulators, three vectors a row, stay in
// registers beside a broadcast and a panel's three vectors of W (32 vector
// registers with AVX-512, 16 else).
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kBlockRows = 8;
#else
constexpr int kBlockRows = 4;
#endif

// Panel::run<rows>(a, p, row) over a block's rows, their count a
// compile-time constant (so that their accumulators stay in registers).
template <typename Panel, int kRows, typename Args>
void run_rows(const Args& a, int64_t p, int64_t row, int64_t rows) {
  if constexpr (kRows > 1) {
    if (rows < kRows) {
      run_rows<Panel, kRows - 1>(a, p, row, rows);
      return;
    }
  }
  Panel::template run<kRows>(a, p, row);
}

// Tasks [begin, end) of a fused step, numbered as FusedStepArgs says: task
// i is panel i / row_blocks, its block of kBlock rows i % row_blocks.
template <typename Panel, int kBlock, typename Args>
void run_tasks(const Args& a, int64_t begin, int64_t end) {
  const int64_t row_blocks = (a.batch + kBlock - 1) / kBlock;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t row = (task % row_blocks) * kBlock;
    run_rows<Panel, kBlock>(
        a, task / row_blocks, row, std::min<int64_t>(kBlock, a.batch - row));
  }
}

// acc += kRows rows of m ([kRows, K], dense) times a panel's rows [0, K)
// from w.
template <int kRows>
LLTM_ALWAYS_INLINE void multiply(
    Vec<float> (&acc)[kRows][3],
    const float* m,
    int64_t K,
    const float* w) {
  using V = Vec<float>;
  constexpr int64_t kWidth = V::size();
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = w + k * 3 * kWidth;
    const V w_i = V::loadu(wk);
    const V w_o = V::loadu(wk + kWidth);
    const V w_c = V::loadu(wk + 2 * kWidth);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const V x(m[r * K + k]);
      acc[r][0] = at::vec::fmadd(x, w_i, acc[r][0]);
      acc[r][1] = at::vec::fmadd(x, w_o, acc[r][1]);
      acc[r][2] = at::vec::fmadd(x, w_c, acc[r][2]);
    }
  }
}

// Rows [row, row + kRows) of panel p: the GEMM over k, then the cell's
// forward on the accumulators.
template <int kRows>
void fused_panel(const FusedStepArgs<float>& a, int64_t p, int64_t row) {
  using V = Vec<float>;
  constexpr int64_t kWidth = V::size();
  const int64_t S = a.state;
  V acc[kRows][3];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    acc[r][0] = acc[r][1] = acc[r][2] = V(0.0f);
  }
  // Without z, the step adds x's projection (none for zero features).
  const int64_t F = a.z == nullptr ? a.features : 0;
  const int64_t K = S + F;
  const float* w = a.w + p * K * 3 * kWidth;
  multiply<kRows>(acc, a.h + row * S, S, w);
  if (F > 0) {
    multiply<kRows>(acc, a.x + row * F, F, w + S * 3 * kWidth);
  }
  const int64_t s = p * kWidth;
  const int64_t n = std::min(kWidth, S - s);
  const V b_i = load(a.bias + s, n);
  const V b_o = load(a.bias + S + s, n);
  const V b_c = load(a.bias + 2 * S + s, n);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const int64_t b = row + r;
    V z_i = acc[r][0];
    V z_o = acc[r][1];
    V z_c = acc[r][2];
    if (a.z != nullptr) {
      const float* z = a.z + b * 3 * S;
      z_i = z_i + load(z + s, n);
      z_o = z_o + load(z + S + s, n);
      z_c = z_c + load(z + 2 * S + s, n);
    }
    const V i = sigmoid(z_i + b_i);
    const V o = sigmoid(z_o + b_o);
    const V g = elu(z_c + b_c);
    const V c = load(a.old_cell + b * S + s, n) + g * i;
    store(a.new_cell + b * S + s, c, n);
    store(a.new_h + b * S + s, tanh(c) * o, n);
    if (a.activations != nullptr) {
      float* act = a.activations + b * 3 * S;
      store(act + s, i, n);
      store(act + S + s, o, n);
      store(act + 2 * S + s, g, n);
    }
  }
}

struct ForwardPanel {
  template <int kRows>
  static void run(const FusedStepArgs<float>& a, int64_t p, int64_t row) {
    fused_panel<kRows>(a, p, row);
  }
};

void fused_step(const FusedStepArgs<float>& a, int64_t begin, int64_t end) {
  run_tasks<ForwardPanel, kBlockRows>(a, begin, end);
}

// The backward's rows of a task: one accumulator vector a row.
constexpr int kBackwardBlockRows = 2 * kBlockRows;

template <int kRows>
void fused_backward_panel(
    const FusedBackwardStepArgs<float>& a,
    int64_t p,
    int64_t row) {
  using V = Vec<float>;
  constexpr int64_t kWidth = V::size();
  const int64_t S = a.state;
  V acc[kRows];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    acc[r] = V(0.0f);
  }
  if (a.dz_next != nullptr) {
    const float* w = a.w + p * 3 * S * kWidth;
    const float* dz = a.dz_next + row * 3 * S;
    for (int64_t k = 0; k < 3 * S; ++k) {
      const V w_k = V::loadu(w + k * kWidth);
#pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        acc[r] = at::vec::fmadd(V(dz[r * 3 * S + k]), w_k, acc[r]);
      }
    }
  }
  const int64_t s = p * kWidth;
  const int64_t n = std::min(kWidth, S - s);
  const V one(1.0f);
  const V zero(0.0f);
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    const int64_t b = row + r;
    V gh = load(a.grad_h, b, s, n) + acc[r];
    if (a.grad_h_add != nullptr) {
      gh = gh + load(a.grad_h_add + b * S + s, n);
    }
    const V gc = load(a.grad_cell, b, s, n);
    const float* act = a.activations + b * 3 * S;
    const V i = load(act + s, n);
    const V o = load(act + S + s, n);
    const V g = load(act + 2 * S + s, n);
    const V t = tanh(load(a.new_cell + b * S + s, n));
    const V dc = (one - t * t) * o * gh + gc;
    float* dz = a.d_gates + b * 3 * S;
    store(dz + s, dc * g * i * (one - i), n);
    store(dz + S + s, gh * t * o * (one - o), n);
    store(dz + 2 * S + s, dc * i * V::blendv(g + one, one, g > zero), n);
    store(a.d_old_cell + b * S + s, dc, n);
  }
}

struct BackwardPanel {
  template <int kRows>
  static void run(
      const FusedBackwardStepArgs<float>& a,
      int64_t p,
      int64_t row) {
    fused_backward_panel<kRows>(a, p, row);
  }
};

void fused_backward_step(
    const FusedBackwardStepArgs<float>& a,
    int64_t begin,
    int64_t end) {
  run_tasks<BackwardPanel, kBackwardBlockRows>(a, begin, end);
}

void transpose(
    const float* src,
    int64_t ld_src,
    float* dst,
    int64_t ld_dst,
    int64_t rows,
    int64_t cols) {
  at::vec::transpose_mxn<float>(
      src, ld_src, dst, ld_dst, static_cast<int>(rows), static_cast<int>(cols));
}

template <typename T>
constexpr Kernels<T> kernels() {
  if constexpr (std::is_same_v<T, float>) {
    return {
        &forward_rows<T>,
        &backward_rows<T>,
        &fused_step,
        &fused_backward_step,
        &transpose,
        Vec<float>::size(),
        kBlockRows,
        kBackwardBlockRows};
  } else {
    return {
        &forward_rows<T>,
        &backward_rows<T>,
        nullptr,
        nullptr,
        nullptr,
        0,
        0,
        0};
  }
}

} // namespace CPU_CAPABILITY
} // namespace lltm::cpu

// C linkage, for a name that the build can keep global.
extern "C" const lltm::cpu::KernelTable LLTM_CPU_KERNEL_TABLE(CPU_CAPABILITY) =
    {lltm::cpu::kernels<float>(),
     lltm::cpu::kernels<double>(),
     lltm::cpu::kernels<c10::Half>(),
     lltm::cpu::kernels<c10::BFloat16>()};
