// The bfloat16 sequence steps on AVX-512 BF16 (bf16.h), per (b, s) of a
// task's rows and panel:
//
// Forward, with h_{t-1} and W_h in bfloat16 and the products summed in
// float32 by VDPBF16PS (acc += h[2k] W[2k] + h[2k + 1] W[2k + 1] per lane):
//   Z = z + h_{t-1} W_h^T + b
//   i = sigmoid(Z_i)    o = sigmoid(Z_o)    g = elu(Z_c)
//   c_t = c_{t-1} + g * i          (float32, rounded only where stored)
//   h_t = tanh(c_t) * o            (rounded to bfloat16: the next step's h)
//
// Backward, from the saved activations and c_t, t = tanh(c_t):
//   gh = grad_h + dZ_{t+1} W_h     (VDPBF16PS over dZ_{t+1}'s bfloat16)
//   dc = (1 - t^2) * o * gh + gc   (float32 between steps)
//   dZ_i = dc * g * i * (1 - i)    dZ_o = gh * t * o * (1 - o)
//   dZ_c = dc * i * (g > 0 ? 1 : g + 1)
//
// The functions that use AVX-512 carry its target attribute instead of the
// whole file carrying its flags: this object is compiled with the module's
// other sources, and its inline functions from headers (c10, the standard
// library) stay those of the default target, so no code outside these
// kernels can run an AVX-512 copy (cmake/LltmCpuKernels.cmake says why that
// matters). They are reached only through bf16::kernels(), which is
// nullptr where the processor lacks them.
#include "cpp/cpu_kernels/bf16.h"

#include <ATen/Version.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

// Compilers that know the avx512bf16 target and __builtin_cpu_supports'
// name for it.
#if defined(__x86_64__) &&                            \
    ((defined(__clang__) && __clang_major__ >= 12) || \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define LLTM_HAVE_BF16_KERNELS 1
#include <immintrin.h>
#define LLTM_BF16_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
#endif

namespace lltm::cpu::bf16 {

int64_t forward_panels_numel(int64_t state, int64_t features) {
  const int64_t panels = (state + kPanelWidth - 1) / kPanelWidth;
  return panels * ((state + 1) / 2 + (features + 1) / 2) * 3 * kPanelWidth * 2;
}

int64_t backward_panels_numel(int64_t state) {
  const int64_t panels = (state + kPanelWidth - 1) / kPanelWidth;
  return panels * ((3 * state + 1) / 2) * kPanelWidth * 2;
}

void pack_forward(
    const BFloat16* w,
    int64_t row_stride,
    int64_t col_stride,
    int64_t state,
    int64_t features,
    BFloat16* out,
    int64_t panel_begin,
    int64_t panel_end) {
  const int64_t S = state;
  const int64_t pairs = (S + 1) / 2 + (features + 1) / 2;
  constexpr int64_t kPairStride = 3 * kPanelWidth * 2;
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    BFloat16* o = out + p * pairs * kPairStride;
    const int64_t units = std::min(kPanelWidth, S - p * kPanelWidth);
    if (units < kPanelWidth || S % 2 != 0 || features % 2 != 0) {
      std::fill(o, o + pairs * kPairStride, BFloat16(0.0f));
    }
    // W's columns [first, first + K) into the pairs from `into`.
    const auto pack = [&](int64_t first, int64_t K, BFloat16* into) {
      // Tiles of 16 pairs of k by a gate's 16 units: the tile's rows and
      // its slice of the output both stay in L1 (by rows alone, each line
      // of the output went to L2 once per unit).
      constexpr int64_t kTile = 16;
      for (int64_t g = 0; g < 3; ++g) {
        const BFloat16* rows =
            w + (g * S + p * kPanelWidth) * row_stride + first * col_stride;
        BFloat16* slice = into + g * kPanelWidth * 2;
        for (int64_t kk0 = 0; kk0 < K / 2; kk0 += kTile) {
          const int64_t kk1 = std::min(kk0 + kTile, K / 2);
          for (int64_t j = 0; j < units; ++j) {
            const BFloat16* row = rows + j * row_stride;
            for (int64_t kk = kk0; kk < kk1; ++kk) {
              BFloat16* dst = slice + kk * kPairStride + j * 2;
              dst[0] = row[2 * kk * col_stride];
              dst[1] = row[(2 * kk + 1) * col_stride];
            }
          }
        }
        if (K % 2 != 0) {
          for (int64_t j = 0; j < units; ++j) {
            slice[(K / 2) * kPairStride + j * 2] =
                rows[j * row_stride + (K - 1) * col_stride];
          }
        }
      }
    };
    pack(0, S, o);
    pack(S, features, o + (S + 1) / 2 * kPairStride);
  }
}

void pack_backward(
    const BFloat16* w,
    int64_t row_stride,
    int64_t col_stride,
    int64_t state,
    BFloat16* out,
    int64_t panel_begin,
    int64_t panel_end) {
  const int64_t S = state;
  const int64_t pairs = (3 * S + 1) / 2;
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    BFloat16* o = out + p * pairs * kPanelWidth * 2;
    for (int64_t kk = 0; kk < pairs; ++kk) {
      for (int64_t j = 0; j < kPanelWidth; ++j) {
        const int64_t unit = p * kPanelWidth + j;
        for (int64_t e = 0; e < 2; ++e) {
          const int64_t k = 2 * kk + e;
          *o++ = unit < S && k < 3 * S ? w[k * row_stride + unit * col_stride]
                                       : BFloat16(0.0f);
        }
      }
    }
  }
}

#ifdef LLTM_HAVE_BF16_KERNELS

namespace {

LLTM_BF16_TARGET inline __mmask16 first(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}

LLTM_BF16_TARGET inline __m512 load(const BFloat16* p, int64_t n) {
  const __m256i raw = _mm256_maskz_loadu_epi16(first(n), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

LLTM_BF16_TARGET inline __m512 load(const float* p, int64_t n) {
  return _mm512_maskz_loadu_ps(first(n), p);
}

// Rounded to nearest even, as c10::BFloat16 rounds.
LLTM_BF16_TARGET inline void store(BFloat16* p, __m512 v, int64_t n) {
  const __m256bh b = _mm512_cvtneps_pbh(v);
  __m256i bits;
  std::memcpy(&bits, &b, sizeof(bits));
  _mm256_mask_storeu_epi16(p, first(n), bits);
}

LLTM_BF16_TARGET inline void store(float* p, __m512 v, int64_t n) {
  _mm512_mask_storeu_ps(p, first(n), v);
}

LLTM_BF16_TARGET inline __m512 load(
    const Strided& m,
    int64_t row,
    int64_t col,
    int64_t n) {
  if (m.data == nullptr) {
    return _mm512_setzero_ps();
  }
  const BFloat16* p = m.data + row * m.row_stride + col * m.col_stride;
  if (m.col_stride == 1) {
    return load(p, n);
  }
  BFloat16 buffer[16] = {};
  for (int64_t j = 0; j < n; ++j) {
    buffer[j] = p[j * m.col_stride];
  }
  return load(buffer, n);
}

LLTM_BF16_TARGET inline __m512 set(float x) {
  return _mm512_set1_ps(x);
}

// e^x: Cephes' expf, as kernels.cpp's exp_fast, with 2^n by VSCALEFPS. x
// is clamped to [-87.3, 88.37] with NaN kept (max and min return their
// second operand where either is NaN).
LLTM_BF16_TARGET inline __m512 exp(__m512 x) {
  const __m512 a = _mm512_min_ps(set(88.37f), _mm512_max_ps(set(-87.3f), x));
  const __m512 n = _mm512_roundscale_ps(
      _mm512_mul_ps(a, set(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, set(-0.693359375f), a);
  r = _mm512_fmadd_ps(n, set(2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(set(1.9875691500e-4f), r, set(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, set(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, set(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, set(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, set(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, set(1.0f)));
  return _mm512_scalef_ps(p, n);
}

LLTM_BF16_TARGET inline __m512 sigmoid(__m512 z) {
  const __m512 e = exp(_mm512_sub_ps(_mm512_setzero_ps(), z));
  return _mm512_div_ps(set(1.0f), _mm512_add_ps(set(1.0f), e));
}

// Cephes' tanhf, as kernels.cpp's: an odd polynomial below |x| = 0.625,
// 1 - 2 / (e^{2|x|} + 1) with x's sign above.
LLTM_BF16_TARGET inline __m512 tanh(__m512 x) {
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p =
      _mm512_fmadd_ps(set(-5.70498872745e-3f), z, set(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, set(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, set(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, set(-3.33332819422e-1f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  const __m512 sign = _mm512_and_ps(x, set(-0.0f));
  const __m512 a = _mm512_xor_ps(x, sign);
  const __m512 large = _mm512_sub_ps(
      set(1.0f),
      _mm512_div_ps(
          set(2.0f), _mm512_add_ps(exp(_mm512_add_ps(a, a)), set(1.0f))));
  const __mmask16 below = _mm512_cmp_ps_mask(a, set(0.625f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(below, _mm512_or_ps(large, sign), small);
}

// elu: z above 0; e^z - 1 below, Taylor's degree-8 polynomial from -0.5 up
// (e^z - 1 loses digits there), as kernels.cpp's.
LLTM_BF16_TARGET inline __m512 elu(__m512 z) {
  __m512 p = _mm512_fmadd_ps(set(1.0f / 40320), z, set(1.0f / 5040));
  p = _mm512_fmadd_ps(p, z, set(1.0f / 720));
  p = _mm512_fmadd_ps(p, z, set(1.0f / 120));
  p = _mm512_fmadd_ps(p, z, set(1.0f / 24));
  p = _mm512_fmadd_ps(p, z, set(1.0f / 6));
  p = _mm512_fmadd_ps(p, z, set(0.5f));
  const __m512 near_zero = _mm512_fmadd_ps(_mm512_mul_ps(p, z), z, z);
  const __m512 far = _mm512_sub_ps(exp(z), set(1.0f));
  const __mmask16 near = _mm512_cmp_ps_mask(z, set(-0.5f), _CMP_GE_OQ);
  const __mmask16 positive =
      _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_GT_OQ);
  return _mm512_mask_blend_ps(
      positive, _mm512_mask_blend_ps(near, far, near_zero), z);
}

// The pair (p[0], p[1]) broadcast to every lane; with `one`, (p[0], 0): a
// row's last k where the row is odd, so that nothing past it is read.
LLTM_BF16_TARGET inline __m512bh pair(const BFloat16* p, bool one = false) {
  uint32_t bits = 0;
  std::memcpy(&bits, p, one ? 2 : 4);
  const __m512i v = _mm512_set1_epi32(static_cast<int>(bits));
  __m512bh out;
  std::memcpy(&out, &v, sizeof(out));
  return out;
}

LLTM_BF16_TARGET inline __m512bh panel(const BFloat16* p) {
  const __m512i v = _mm512_loadu_si512(p);
  __m512bh out;
  std::memcpy(&out, &v, sizeof(out));
  return out;
}

// acc += kRows rows of m ([kRows, K], dense) times a panel's pairs of rows
// from w. Inline, always: called twice, and its accumulators must stay in
// registers.
template <int kRows>
LLTM_BF16_TARGET __attribute__((always_inline)) inline void multiply(
    __m512 (&acc)[kRows][3],
    const BFloat16* m,
    int64_t K,
    const BFloat16* w) {
  constexpr int64_t kW = kPanelWidth;
  for (int64_t kk = 0; kk < K / 2; ++kk) {
    const BFloat16* wk = w + kk * 3 * kW * 2;
    const __m512bh w_i = panel(wk);
    const __m512bh w_o = panel(wk + 2 * kW);
    const __m512bh w_c = panel(wk + 4 * kW);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512bh x = pair(m + r * K + 2 * kk);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, w_i);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, w_o);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], x, w_c);
    }
  }
  if (K % 2 != 0) {
    const BFloat16* wk = w + (K / 2) * 3 * kW * 2;
    const __m512bh w_i = panel(wk);
    const __m512bh w_o = panel(wk + 2 * kW);
    const __m512bh w_c = panel(wk + 4 * kW);
    for (int r = 0; r < kRows; ++r) {
      const __m512bh x = pair(m + r * K + K - 1, /*one=*/true);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, w_i);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, w_o);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], x, w_c);
    }
  }
}

// Rows [row, row + kRows) of panel p.
template <int kRows>
LLTM_BF16_TARGET void forward_panel(const StepArgs& a, int64_t p, int64_t row) {
  constexpr int64_t kW = kPanelWidth;
  const int64_t S = a.state;
  // Without z, the step adds x's projection (none for zero features).
  const bool in_step = a.z == nullptr && a.z_f32 == nullptr;
  const int64_t F = in_step ? a.features : 0;
  const int64_t h_pairs = (S + 1) / 2;
  const BFloat16* w = a.w + p * (h_pairs + (F + 1) / 2) * 3 * kW * 2;
  __m512 acc[kRows][3];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    acc[r][0] = acc[r][1] = acc[r][2] = _mm512_setzero_ps();
  }
  multiply<kRows>(acc, a.h + row * S, S, w);
  if (F > 0) {
    multiply<kRows>(acc, a.x + row * F, F, w + h_pairs * 3 * kW * 2);
  }
  const int64_t s = p * kW;
  const int64_t n = std::min(kW, S - s);
  const __m512 b_i = load(a.bias + s, n);
  const __m512 b_o = load(a.bias + S + s, n);
  const __m512 b_c = load(a.bias + 2 * S + s, n);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const int64_t b = row + r;
    // The projection of gate `gate`'s units of this panel, in float32
    // (in the accumulators already where x is given).
    const auto z = [&](int64_t gate) {
      const int64_t at = b * 3 * S + gate * S + s;
      return in_step           ? set(0.0f)
          : a.z_f32 != nullptr ? load(a.z_f32 + at, n)
                               : load(a.z + at, n);
    };
    const __m512 i =
        sigmoid(_mm512_add_ps(_mm512_add_ps(acc[r][0], z(0)), b_i));
    const __m512 o =
        sigmoid(_mm512_add_ps(_mm512_add_ps(acc[r][1], z(1)), b_o));
    const __m512 g = elu(_mm512_add_ps(_mm512_add_ps(acc[r][2], z(2)), b_c));
    float* cell = a.cell + b * S + s;
    const __m512 c = _mm512_fmadd_ps(g, i, load(cell, n));
    store(cell, c, n);
    if (a.new_cell != nullptr) {
      store(a.new_cell + b * S + s, c, n);
    }
    store(a.new_h + b * S + s, _mm512_mul_ps(tanh(c), o), n);
    if (a.activations != nullptr) {
      BFloat16* act = a.activations + b * 3 * S;
      store(act + s, i, n);
      store(act + S + s, o, n);
      store(act + 2 * S + s, g, n);
    }
  }
}

template <int kRows>
LLTM_BF16_TARGET void backward_panel(
    const BackwardStepArgs& a,
    int64_t p,
    int64_t row) {
  constexpr int64_t kW = kPanelWidth;
  const int64_t S = a.state;
  const int64_t K = 3 * S;
  __m512 acc[kRows];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    acc[r] = _mm512_setzero_ps();
  }
  if (a.dz_next != nullptr) {
    const BFloat16* w = a.w + p * ((K + 1) / 2) * kW * 2;
    const BFloat16* dz = a.dz_next + row * K;
    for (int64_t kk = 0; kk < K / 2; ++kk) {
      const __m512bh w_k = panel(w + kk * kW * 2);
#pragma GCC unroll 16
      for (int r = 0; r < kRows; ++r) {
        acc[r] = _mm512_dpbf16_ps(acc[r], pair(dz + r * K + 2 * kk), w_k);
      }
    }
    if (K % 2 != 0) {
      const __m512bh w_k = panel(w + (K / 2) * kW * 2);
      for (int r = 0; r < kRows; ++r) {
        acc[r] = _mm512_dpbf16_ps(acc[r], pair(dz + r * K + K - 1, true), w_k);
      }
    }
  }
  const int64_t s = p * kW;
  const int64_t n = std::min(kW, S - s);
  const __m512 one = set(1.0f);
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
    const int64_t b = row + r;
    __m512 gh = _mm512_add_ps(load(a.grad_h, b, s, n), acc[r]);
    if (a.grad_h_add != nullptr) {
      gh = _mm512_add_ps(gh, load(a.grad_h_add + b * S + s, n));
    }
    const __m512 gc = a.grad_cell_f != nullptr
        ? load(a.grad_cell_f + b * S + s, n)
        : load(a.grad_cell, b, s, n);
    const BFloat16* act = a.activations + b * K;
    const __m512 i = load(act + s, n);
    const __m512 o = load(act + S + s, n);
    const __m512 g = load(act + 2 * S + s, n);
    const __m512 t = tanh(load(a.new_cell + b * S + s, n));
    const __m512 dc =
        _mm512_fmadd_ps(_mm512_mul_ps(_mm512_fnmadd_ps(t, t, one), o), gh, gc);
    const __m512 d_elu = _mm512_mask_blend_ps(
        _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GT_OQ),
        _mm512_add_ps(g, one),
        one);
    BFloat16* dz = a.d_gates + b * K;
    store(
        dz + s,
        _mm512_mul_ps(
            _mm512_mul_ps(dc, g), _mm512_mul_ps(i, _mm512_sub_ps(one, i))),
        n);
    store(
        dz + S + s,
        _mm512_mul_ps(
            _mm512_mul_ps(gh, t), _mm512_mul_ps(o, _mm512_sub_ps(one, o))),
        n);
    store(dz + 2 * S + s, _mm512_mul_ps(_mm512_mul_ps(dc, i), d_elu), n);
    store(a.d_old_cell + b * S + s, dc, n);
  }
}

// A block's rows, their count a compile-time constant (so that their
// accumulators stay in registers).
template <int kRows, typename Args>
LLTM_BF16_TARGET void run_rows(
    const Args& a,
    int64_t p,
    int64_t row,
    int64_t rows) {
  if constexpr (kRows > 1) {
    if (rows < kRows) {
      run_rows<kRows - 1>(a, p, row, rows);
      return;
    }
  }
  if constexpr (std::is_same_v<Args, StepArgs>) {
    forward_panel<kRows>(a, p, row);
  } else {
    backward_panel<kRows>(a, p, row);
  }
}

// Task i is panel i / row_blocks, its block of kBlock rows i % row_blocks.
template <int kBlock, typename Args>
LLTM_BF16_TARGET void run_tasks(const Args& a, int64_t begin, int64_t end) {
  const int64_t row_blocks = (a.batch + kBlock - 1) / kBlock;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t row = (task % row_blocks) * kBlock;
    run_rows<kBlock>(
        a, task / row_blocks, row, std::min<int64_t>(kBlock, a.batch - row));
  }
}

LLTM_BF16_TARGET void step(const StepArgs& args, int64_t begin, int64_t end) {
  run_tasks<kBlockRows>(args, begin, end);
}

LLTM_BF16_TARGET void backward_step(
    const BackwardStepArgs& args,
    int64_t begin,
    int64_t end) {
  run_tasks<kBackwardBlockRows>(args, begin, end);
}

constexpr Kernels kKernels{&step, &backward_step};

} // namespace

const Kernels* kernels() {
  // ATen's capability first: ATEN_CPU_CAPABILITY=avx2 turns these off as
  // it turns off ATen's and lltm's AVX-512 kernels.
  static const bool ok = at::get_cpu_capability() == "AVX512" &&
      __builtin_cpu_supports("avx512bf16");
  return ok ? &kKernels : nullptr;
}

#else

const Kernels* kernels() {
  return nullptr;
}

#endif

} // namespace lltm::cpu::bf16
