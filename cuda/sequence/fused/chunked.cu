// Fused LLTM sequence steps: the recurrent GEMM with the cell's pointwise
// math in its epilogue. This is the path where W_h does not stay on chip
// (lltm_sequence.cu): no pre-activation tensor makes a round trip through
// memory between a GEMM and a pointwise kernel. Where a step's grid fits on
// the GPU at once, one cooperative launch per direction runs every step,
// with a barrier among the blocks of a row tile between them (in float from
// sm_80, W_h's slice held in shared memory: held_forward_kernel); else the
// host issues one plain launch per step (run_steps, lltm_step.h).
//
// Forward, step t (z holds P_t = input_t W_x^T on entry):
//   Z = P_t + b + h_{t-1} W_h^T,  Z = [Z_i | Z_o | Z_c]
//   i = sigmoid(Z_i)   o = sigmoid(Z_o)   g = elu(Z_c)
//   c_t = c_{t-1} + g * i            h_t = tanh(c_t) * o
// Backward, step t, with t_c = tanh(c_t):
//   gh = grad_h + (dZ_{t+1} W_h, or grad_h_n at t = T - 1)
//   gc = dc_t (grad_c_n at t = T - 1)
//   dc_{t-1} = (1 - t_c^2) * o * gh + gc
//   dZ_i = dc_{t-1} * g * i * (1 - i)    dZ_o = gh * t_c * o * (1 - o)
//   dZ_c = dc_{t-1} * i * elu'(Z_c),  elu'(z) = 1 if z > 0 else g + 1
// (the cell's part: cell_forward and cell_backward, lltm_device.h)
//
// Work split: block (x, y) computes rows [x BM, x BM + BM) and state columns
// [y BN, y BN + BN): of all three gates in the forward (3 BN columns of Z),
// of dZ_{t+1} W_h in the backward. Chunks along k of both operands pass
// through shared memory. Thread (tx, ty) owns rows ty + r BM / TM and
// columns tx + c BN / TN: a warp's epilogue touches adjacent columns, and
// each (row, column) of the cell is computed by one thread, which reads c
// (or dc) before writing it, so these may be updated in place. float16 and
// bfloat16 compute in float here; on GPUs with tensor cores for them they
// take lltm_step_mma.cu's kernels instead.
//
// The cell (lltm::cell, cell_forward and forward on the tiled path) is one
// such forward step with X = [old_h | input] as the rows operand and all of
// W = [W_h | W_x] as the weights, K = S + F, and no P_t: a launch in place of
// a copy into X, a cuBLAS GEMM and the pointwise kernel.
#include "cuda/sequence/fused/steps.h"

#include "cuda/common/device.h"
#include "cuda/sequence/sequence.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace lltm::cuda {
namespace {

using namespace detail; // NOLINT(google-build-using-namespace)

template <int BM_, int BN_, int TM_, int TN_, int KS_>
struct Tile {
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr int TM = TM_;
  static constexpr int TN = TN_;
  static constexpr int KS = KS_; // groups of threads, each over its chunks
  static constexpr int NX = BN / TN; // threads of a group along the columns
  static constexpr int NY = BM / TM; // and along the rows
  static constexpr int group = NX * NY;
  static constexpr int threads = group * KS;
  // Blocks per multiprocessor that the launch bounds ask room for: two.
  // With one, a thread took up to 255 registers, and one block's 4 to 16
  // warps per multiprocessor could not hide the latency of the loads (ncu:
  // 37% of the issue slots busy); two blocks cap a thread at 128 registers
  // (64 for the 512 threads of Backward0), which hold chunks of 16.
  static constexpr int resident = 2;
};

// The k extent of a chunk. A chunk is one round trip to memory, and the
// next one is loaded into registers while this one is multiplied, since at
// these sizes a step is bound by the latency of its loads. Longer chunks (32
// or 64) spill at two blocks per multiprocessor, and lose more to the lower
// occupancy of one block than they save in rounds (docs/performance.md).
constexpr int kChunk = 16;

// With several groups, each has summed its chunks of k: groups 1.. leave
// their sums in shared memory, and group 0 adds them in a fixed order (so
// that results repeat bit for bit). True for the threads of group 0, which
// then hold the whole sums and run the epilogue.
template <typename A, typename P, int N>
__device__ __forceinline__ bool reduce_groups(A (&acc)[N], A* partials) {
  const int tid = static_cast<int>(threadIdx.x);
  const int g = tid / P::group;
  const int lane = tid - g * P::group;
  if constexpr (P::KS > 1) {
    if (g > 0) {
#pragma unroll
      for (int n = 0; n < N; ++n) {
        partials[((g - 1) * N + n) * P::group + lane] = acc[n];
      }
    }
    __syncthreads();
    if (g > 0) {
      return false;
    }
    for (int other = 0; other < P::KS - 1; ++other) {
#pragma unroll
      for (int n = 0; n < N; ++n) {
        acc[n] += partials[(other * N + n) * P::group + lane];
      }
    }
  }
  return true;
}

// Element l of thread tid in chunk k0 of a rows operand: e in the chunk,
// its batch row b and its k.
template <typename P, int C>
struct ChunkElement {
  int e;
  int64_t b;
  int k;
  __device__ __forceinline__ ChunkElement(int tid, int l, int64_t b0, int k0)
      : e(tid + l * P::group), b(b0 + e / C), k(k0 + (e - (e / C) * C)) {}
};

// Chunk k0 of the rows operand, rows [b0, b0 + BM) of a dense [B, K]
// matrix and columns [k0, k0 + C), into registers: this thread's elements
// e = tid + l NG of the chunk, zero past the ends. The operand (h_{t-1} or
// dZ_{t+1}) may come from other blocks of a cooperative launch.
template <typename P, int C, int L, typename A, typename T>
__device__ __forceinline__ void fetch_rows(
    A (&out)[L],
    const T* src,
    int64_t B,
    int K,
    int64_t b0,
    int k0,
    int tid) {
#pragma unroll
  for (int l = 0; l < L; ++l) {
    const ChunkElement<P, C> x(tid, l, b0, k0);
    out[l] = x.e < P::BM * C && x.b < B && x.k < K
        ? widen(load_shared(src + x.b * K + x.k))
        : A(0);
  }
}

// Those elements into the group's shared tile, as [k][row].
template <typename P, int C, int L, typename A>
__device__ __forceinline__ void stash_rows(
    A (*tile)[P::BM + 1],
    const A (&in)[L],
    int tid) {
#pragma unroll
  for (int l = 0; l < L; ++l) {
    const int e = tid + l * P::group;
    if (e < P::BM * C) {
      const int r = e / C;
      tile[e - r * C][r] = in[l];
    }
  }
}

// Chunk k0 of the cell's rows operand X = [old_h | input] (K = S + F, read
// through their strides) into registers, as fetch_rows does; the blocks of
// the first column tile also copy X out, when asked.
template <typename P, int C, int L, typename A, typename T>
__device__ __forceinline__ void fetch_cell_rows(
    A (&out)[L],
    const SmallForwardArgs<T>& a,
    int64_t b0,
    int k0,
    int tid) {
  const int64_t S = a.cell.state;
  const int64_t K = S + a.input_features;
  const bool copy = a.X != nullptr && blockIdx.y == 0;
#pragma unroll
  for (int l = 0; l < L; ++l) {
    const ChunkElement<P, C> x(tid, l, b0, k0);
    const bool inside = x.e < P::BM * C && x.b < a.cell.batch && x.k < K;
    out[l] = !inside ? A(0)
        : x.k < S    ? load_present(a.old_h, x.b, x.k)
                     : load_present(a.input, x.b, x.k - S);
    if (copy && inside) {
      put(a.X + x.b * K + x.k, out[l]);
    }
  }
}

// f(r, c, b, j) for each item (row b = b0 + ty + r NY, column j = j0 + tx +
// c NX) of this thread's TM x TN in a tile of P, inside the batch B and the
// state S: the epilogue's loop of every kernel here.
template <typename P, typename F>
__device__ __forceinline__ void each_item(
    int64_t b0,
    int j0,
    int tx,
    int ty,
    int64_t B,
    int S,
    F&& f) {
#pragma unroll
  for (int r = 0; r < P::TM; ++r) {
    const int64_t b = b0 + ty + r * P::NY;
#pragma unroll
    for (int c = 0; c < P::TN; ++c) {
      const int j = j0 + tx + c * P::NX;
      if (b < B && j < S) {
        f(r, c, b, j);
      }
    }
  }
}

// One step's tile of the forward: a sequence's (StepForwardArgs: the GEMM
// over h_{t-1} and W_h, P_t added in the epilogue), or the cell's
// (SmallForwardArgs: over [old_h | input] and all of W).
template <typename T, typename P, typename Args>
__device__ __forceinline__ void forward_tile(const Args& a) {
  using A = acc_t<T>;
  constexpr bool cell = std::is_same_v<Args, SmallForwardArgs<T>>;
  constexpr int BM = P::BM, BN = P::BN, TM = P::TM, TN = P::TN;
  constexpr int NX = P::NX, NY = P::NY, NG = P::group, KS = P::KS;
  constexpr int C = kChunk;
  // Elements of each operand's chunk per thread.
  constexpr int HL = (BM * C + NG - 1) / NG;
  constexpr int WL = (3 * BN * C + NG - 1) / NG;
  // +1: the stores, which run along k, fall in different banks.
  __shared__ A h_s[KS][C][BM + 1];
  __shared__ A w_s[KS][3][C][BN + 1];
  __shared__ A partials[KS > 1 ? (KS - 1) * 3 * TM * TN * NG : 1];
  int S = 0;
  int K = 0; // the GEMM's k extent
  int64_t B = 0;
  if constexpr (cell) {
    S = static_cast<int>(a.cell.state);
    K = S + static_cast<int>(a.input_features);
    B = a.cell.batch;
  } else {
    S = static_cast<int>(a.state);
    K = S;
    B = a.batch;
  }
  const int grp = static_cast<int>(threadIdx.x) / NG;
  const int tid = static_cast<int>(threadIdx.x) - grp * NG;
  const int tx = tid % NX;
  const int ty = tid / NX;
  const int64_t b0 = int64_t(blockIdx.x) * BM;
  const int j0 = static_cast<int>(blockIdx.y) * BN;
  A h_r[HL];
  A w_r[WL];
  auto fetch = [&](int k0) {
    if constexpr (cell) {
      fetch_cell_rows<P, C>(h_r, a, b0, k0, tid);
    } else {
      fetch_rows<P, C>(h_r, a.h, B, S, b0, k0, tid);
    }
#pragma unroll
    for (int l = 0; l < WL; ++l) {
      const int e = tid + l * NG;
      const int row = e / C; // g BN + jl
      const int g = row / BN;
      const int j = j0 + (row - g * BN);
      const int k = k0 + (e - row * C);
      if constexpr (cell) {
        w_r[l] = e < 3 * BN * C && j < S && k < K
            ? load_present(a.weights, int64_t(g) * S + j, k)
            : A(0);
      } else {
        w_r[l] = e < 3 * BN * C && j < S && k < S
            ? widen(a.w[(int64_t(g) * S + j) * a.ld_w + k])
            : A(0);
      }
    }
  };
  auto stash = [&]() {
    stash_rows<P, C>(h_s[grp], h_r, tid);
#pragma unroll
    for (int l = 0; l < WL; ++l) {
      const int e = tid + l * NG;
      if (e < 3 * BN * C) {
        const int row = e / C;
        const int g = row / BN;
        w_s[grp][g][e - row * C][row - g * BN] = w_r[l];
      }
    }
  };
  A acc[3 * TM * TN];
#pragma unroll
  for (int n = 0; n < 3 * TM * TN; ++n) {
    acc[n] = A(0);
  }
  over_chunks<P::KS, C, 1>(K, grp, fetch, stash, [&](int kk) {
    A hv[TM];
    A wv[3][TN];
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      hv[r] = h_s[grp][kk][ty + r * NY];
    }
#pragma unroll
    for (int g = 0; g < 3; ++g) {
#pragma unroll
      for (int c = 0; c < TN; ++c) {
        wv[g][c] = w_s[grp][g][kk][tx + c * NX];
      }
    }
#pragma unroll
    for (int g = 0; g < 3; ++g) {
#pragma unroll
      for (int r = 0; r < TM; ++r) {
#pragma unroll
        for (int c = 0; c < TN; ++c) {
          acc[(g * TM + r) * TN + c] += hv[r] * wv[g][c];
        }
      }
    }
  });
  if (!reduce_groups<A, P>(acc, partials)) {
    return;
  }
  each_item<P>(b0, j0, tx, ty, B, S, [&](int r, int c, int64_t b, int j) {
    const A z_i = acc[(0 * TM + r) * TN + c];
    const A z_o = acc[(1 * TM + r) * TN + c];
    const A z_c = acc[(2 * TM + r) * TN + c];
    if constexpr (cell) {
      cell_outputs(a.cell, b, j, z_i, z_o, z_c);
    } else {
      step_forward_epilogue(a, b, j, z_i, z_o, z_c);
    }
  });
}

// One step's tile of the backward.
template <typename T, typename P>
__device__ __forceinline__ void backward_tile(
    const StepBackwardArgs<T>& a,
    acc_t<T>* __restrict__ dc) {
  using A = acc_t<T>;
  constexpr int BM = P::BM, BN = P::BN, TM = P::TM, TN = P::TN;
  constexpr int NX = P::NX, NY = P::NY, NG = P::group, KS = P::KS;
  constexpr int C = kChunk;
  constexpr int DL = (BM * C + NG - 1) / NG;
  constexpr int WL = (BN * C + NG - 1) / NG;
  __shared__ A dz_s[KS][C][BM + 1];
  __shared__ A w_s[KS][C][BN];
  __shared__ A partials[KS > 1 ? (KS - 1) * TM * TN * NG : 1];
  const int S = static_cast<int>(a.state);
  const int K = 3 * S; // dZ's row length
  const int64_t B = a.batch;
  const int grp = static_cast<int>(threadIdx.x) / NG;
  const int tid = static_cast<int>(threadIdx.x) - grp * NG;
  const int tx = tid % NX;
  const int ty = tid / NX;
  const int64_t b0 = int64_t(blockIdx.x) * BM;
  const int j0 = static_cast<int>(blockIdx.y) * BN;
  A acc[TM * TN];
#pragma unroll
  for (int n = 0; n < TM * TN; ++n) {
    acc[n] = A(0);
  }
  const bool recurrent = a.dz_next != nullptr;
  if (recurrent) {
    A d_r[DL];
    A w_r[WL];
    auto fetch = [&](int k0) {
      fetch_rows<P, C>(d_r, a.dz_next, B, K, b0, k0, tid);
      // W_h's rows k, columns [j0, j0 + BN): adjacent threads, adjacent
      // columns.
#pragma unroll
      for (int l = 0; l < WL; ++l) {
        const int e = tid + l * NG;
        const int kk = e / BN;
        const int j = j0 + (e - kk * BN);
        const int k = k0 + kk;
        w_r[l] = e < BN * C && j < S && k < K
            ? widen(a.w[int64_t(k) * a.ld_w + j])
            : A(0);
      }
    };
    auto stash = [&]() {
      stash_rows<P, C>(dz_s[grp], d_r, tid);
#pragma unroll
      for (int l = 0; l < WL; ++l) {
        const int e = tid + l * NG;
        if (e < BN * C) {
          const int kk = e / BN;
          w_s[grp][kk][e - kk * BN] = w_r[l];
        }
      }
    };
    over_chunks<P::KS, C, 1>(K, grp, fetch, stash, [&](int kk) {
      A dv[TM];
      A wv[TN];
#pragma unroll
      for (int r = 0; r < TM; ++r) {
        dv[r] = dz_s[grp][kk][ty + r * NY];
      }
#pragma unroll
      for (int c = 0; c < TN; ++c) {
        wv[c] = w_s[grp][kk][tx + c * NX];
      }
#pragma unroll
      for (int r = 0; r < TM; ++r) {
#pragma unroll
        for (int c = 0; c < TN; ++c) {
          acc[r * TN + c] += dv[r] * wv[c];
        }
      }
    });
  }
  if (!reduce_groups<A, P>(acc, partials)) {
    return;
  }
  each_item<P>(b0, j0, tx, ty, B, S, [&](int r, int c, int64_t b, int j) {
    step_backward_epilogue(a, dc, b, j, acc[r * TN + c]);
  });
}

// --- W_h held: the cooperative steps in float, from sm_80 ------------------
// In one cooperative launch a block keeps its tile from step to step, so
// these kernels load its slice of W_h into shared memory once, and take a
// step's rows operand (h_{t-1}, or dZ_{t+1}) whole, by 16-byte asynchronous
// copies issued together: one round trip to L2 a step, where the loop over
// chunks above pays one a chunk (six a step in the backward at state 128,
// where a step is bound by that latency). The groups of threads split k in
// contiguous ranges read four k at a time (16-byte shared loads: a quarter
// of the instructions of one k at a time, which bound the product), and
// the epilogue's inputs are loaded before the barrier, while other blocks
// finish the step before. Between steps a block waits only for the blocks
// of its own rows (arrive, wait_for). They run where the smallest tiles' grid
// fits on the GPU at once with their shared memory, the state is a multiple of
// 4 (rows of 16 bytes) and the operands are 16-byte aligned (launch_held).

// 16 bytes from global `from` to shared `to`, or zeros where !inside, past
// L1 (.cg: the rows were written by other blocks before the barrier).
__device__ __forceinline__ void copy_16(
    float* to,
    const float* from,
    bool inside) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(to))),
               "l"(from),
               "r"(inside ? 16 : 0)
               : "memory");
#endif
}

// Rows [b0, b0 + BM) of the dense [B, K] `src` into rows_s ([BM][K + 4]),
// zeros past B; every thread waits for them.
template <int BM>
__device__ __forceinline__ void fetch_whole_rows(
    float* rows_s,
    const float* src,
    int64_t B,
    int K,
    int64_t b0) {
  const int quads = K / 4;
  for (int e = static_cast<int>(threadIdx.x); e < BM * quads;
       e += static_cast<int>(blockDim.x)) {
    const int r = e / quads;
    const int q = e - r * quads;
    const bool inside = b0 + r < B;
    copy_16(
        rows_s + r * (K + 4) + 4 * q,
        inside ? src + (b0 + r) * K + 4 * q : src,
        inside);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
  __syncthreads();
}

// The floats of shared memory of a block: W_h's slice and the rows, both
// with k contiguous (rows of K + 4: 16-byte aligned, and the eight threads
// of a quarter warp reading 16 bytes each at a stride of K + 4 fall in
// distinct banks), and the groups' partial sums.
template <typename P, bool Backward>
constexpr int64_t held_floats(int64_t state) {
  const int64_t K = Backward ? 3 * state : state;
  const int64_t columns = Backward ? P::BN : 3 * P::BN;
  const int64_t sums = Backward ? P::TM * P::TN : 3 * P::TM * P::TN;
  return (columns + P::BM) * (K + 4) + (P::KS - 1) * sums * P::group;
}

// This group's range of k in [0, K), in fours.
struct Range {
  int begin, end;
};
template <typename P>
__device__ __forceinline__ Range k_range(int K, int grp) {
  const int span = ((K / 4 + P::KS - 1) / P::KS) * 4;
  const int begin = min(K, grp * span);
  return {begin, min(K, begin + span)};
}

__device__ __forceinline__ float4 quad_at(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

// k to k + 3 of this thread's TM rows of rows_s (rows of `ld`).
template <typename P>
__device__ __forceinline__ void row_quads(
    float4 (&out)[P::TM],
    const float* rows_s,
    int ld,
    int ty,
    int k) {
#pragma unroll
  for (int r = 0; r < P::TM; ++r) {
    out[r] = quad_at(rows_s + (ty + r * P::NY) * ld + k);
  }
}

// acc + the dot product of four k.
__device__ __forceinline__ float dot4(float acc, float4 x, float4 w) {
  acc = fmaf(x.x, w.x, acc);
  acc = fmaf(x.y, w.y, acc);
  acc = fmaf(x.z, w.z, acc);
  return fmaf(x.w, w.w, acc);
}

template <typename P>
__global__ void __launch_bounds__(P::threads, P::resident)
    held_forward_kernel(const FusedForwardArgs<float> a, unsigned* arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int BM = P::BM, BN = P::BN, TM = P::TM, TN = P::TN;
  constexpr int NX = P::NX, NG = P::group;
  extern __shared__ __align__(16) float held[];
  const int S = static_cast<int>(a.state);
  const int ld = S + 4;
  const int64_t B = a.batch;
  float* w_s = held; // [3 BN][ld]: W_h[g S + j0 + jl][k] at (g BN + jl) ld + k
  float* rows_s = w_s + 3 * BN * ld; // [BM][ld]: h_{t-1}
  float* partials = rows_s + BM * ld;
  const int grp = static_cast<int>(threadIdx.x) / NG;
  const int tid = static_cast<int>(threadIdx.x) - grp * NG;
  const int tx = tid % NX;
  const int ty = tid / NX;
  const int64_t b0 = int64_t(blockIdx.x) * BM;
  const int j0 = static_cast<int>(blockIdx.y) * BN;
  for (int e = static_cast<int>(threadIdx.x); e < 3 * BN * S;
       e += static_cast<int>(blockDim.x)) {
    const int row = e / S; // g BN + jl
    const int k = e - row * S;
    const int g = row / BN;
    const int j = j0 + (row - g * BN);
    w_s[row * ld + k] = j < S ? a.w[(int64_t(g) * S + j) * a.ld_w + k] : 0.0f;
  }
  const Range ks = k_range<P>(S, grp);
  ForwardEpilogueInputs<float> in[TM][TN];
  every_step(
      a,
      false,
      arrivals,
      [&](const StepForwardArgs<float>& s) {
        if (grp == 0) { // the epilogue's inputs, while other blocks finish
          each_item<P>(
              b0, j0, tx, ty, B, S, [&](int r, int c, int64_t b, int j) {
                in[r][c] = load_forward_epilogue(s, b, j);
              });
        }
      },
      [&](const StepForwardArgs<float>& s) {
        fetch_whole_rows<BM>(rows_s, s.h, B, S, b0);
        float acc[3 * TM * TN] = {};
#pragma unroll 2
        for (int k = ks.begin; k < ks.end; k += 4) {
          float4 hv[TM];
          row_quads<P>(hv, rows_s, ld, ty, k);
#pragma unroll
          for (int g = 0; g < 3; ++g) {
#pragma unroll
            for (int c = 0; c < TN; ++c) {
              const float4 wv = quad_at(w_s + (g * BN + tx + c * NX) * ld + k);
#pragma unroll
              for (int r = 0; r < TM; ++r) {
                float& sum = acc[(g * TM + r) * TN + c];
                sum = dot4(sum, hv[r], wv);
              }
            }
          }
        }
        if (reduce_groups<float, P>(acc, partials)) {
          each_item<P>(
              b0, j0, tx, ty, B, S, [&](int r, int c, int64_t b, int j) {
                finish_forward_epilogue(
                    s,
                    b,
                    j,
                    in[r][c],
                    acc[(0 * TM + r) * TN + c],
                    acc[(1 * TM + r) * TN + c],
                    acc[(2 * TM + r) * TN + c]);
              });
        }
      });
#endif
}

template <typename P>
__global__ void __launch_bounds__(P::threads, P::resident) held_backward_kernel(
    const FusedBackwardArgs<float> a,
    float* dc,
    unsigned* arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int BM = P::BM, BN = P::BN, TM = P::TM, TN = P::TN;
  constexpr int NX = P::NX, NG = P::group;
  extern __shared__ __align__(16) float held[];
  const int S = static_cast<int>(a.state);
  const int K = 3 * S; // dZ's row length
  const int ld = K + 4;
  const int64_t B = a.batch;
  float* w_s = held; // [BN][ld]: W_h[k][j0 + jl] at jl ld + k
  float* rows_s = w_s + BN * ld; // [BM][ld]: dZ_{t+1}
  float* partials = rows_s + BM * ld;
  const int grp = static_cast<int>(threadIdx.x) / NG;
  const int tid = static_cast<int>(threadIdx.x) - grp * NG;
  const int tx = tid % NX;
  const int ty = tid / NX;
  const int64_t b0 = int64_t(blockIdx.x) * BM;
  const int j0 = static_cast<int>(blockIdx.y) * BN;
  // Adjacent threads, adjacent columns of a row of W_h.
  for (int e = static_cast<int>(threadIdx.x); e < K * BN;
       e += static_cast<int>(blockDim.x)) {
    const int k = e / BN;
    const int jl = e - k * BN;
    const int j = j0 + jl;
    w_s[jl * ld + k] = j < S ? a.w[int64_t(k) * a.ld_w + j] : 0.0f;
  }
  const Range ks = k_range<P>(K, grp);
  BackwardEpilogueInputs<float> in[TM][TN];
  every_step(
      a,
      true,
      arrivals,
      [&](const StepBackwardArgs<float>& s) {
        if (grp == 0) { // as in the forward
          each_item<P>(
              b0, j0, tx, ty, B, S, [&](int r, int c, int64_t b, int j) {
                in[r][c] = load_backward_epilogue(s, dc, b, j);
              });
        }
      },
      [&](const StepBackwardArgs<float>& s) {
        float acc[TM * TN] = {};
        if (s.dz_next != nullptr) {
          fetch_whole_rows<BM>(rows_s, s.dz_next, B, K, b0);
#pragma unroll 2
          for (int k = ks.begin; k < ks.end; k += 4) {
            float4 dv[TM];
            row_quads<P>(dv, rows_s, ld, ty, k);
#pragma unroll
            for (int c = 0; c < TN; ++c) {
              const float4 wv = quad_at(w_s + (tx + c * NX) * ld + k);
#pragma unroll
              for (int r = 0; r < TM; ++r) {
                float& sum = acc[r * TN + c];
                sum = dot4(sum, dv[r], wv);
              }
            }
          }
        }
        if (reduce_groups<float, P>(acc, partials)) {
          each_item<P>(
              b0, j0, tx, ty, B, S, [&](int r, int c, int64_t b, int j) {
                finish_backward_epilogue(
                    s, dc, b, j, in[r][c], acc[r * TN + c]);
              });
        }
      });
#endif
}

// Where the steps of T run on tensor cores (has_fragments), the kernels
// here are never launched: their bodies are left out of those passes.
template <typename T, typename P>
__global__ void __launch_bounds__(P::threads, P::resident)
    step_forward_kernel(const StepForwardArgs<T> a) {
  if constexpr (has_fragments<T>()) {
    __trap();
  } else {
    forward_tile<T, P>(a);
  }
}

template <typename T, typename P>
__global__ void __launch_bounds__(P::threads, P::resident)
    step_backward_kernel(const StepBackwardArgs<T> a, acc_t<T>* dc) {
  if constexpr (has_fragments<T>()) {
    __trap();
  } else {
    backward_tile<T, P>(a, dc);
  }
}

// Every step in one cooperative launch (run_steps, lltm_step.h).
template <typename T, typename P>
__global__ void __launch_bounds__(P::threads, P::resident)
    fused_forward_kernel(const FusedForwardArgs<T> a, unsigned* arrivals) {
  if constexpr (has_fragments<T>()) {
    __trap();
  } else {
    every_step(
        a,
        false,
        arrivals,
        [](const auto&) {},
        [](const StepForwardArgs<T>& step) { forward_tile<T, P>(step); });
  }
}

template <typename T, typename P>
__global__ void __launch_bounds__(P::threads, P::resident)
    fused_backward_kernel(
        const FusedBackwardArgs<T> a,
        acc_t<T>* dc,
        unsigned* arrivals) {
  if constexpr (has_fragments<T>()) {
    __trap();
  } else {
    every_step(
        a,
        true,
        arrivals,
        [](const auto&) {},
        [dc](const StepBackwardArgs<T>& step) {
          backward_tile<T, P>(step, dc);
        });
  }
}

// The tiles, from small to large: <rows, columns, rows and columns per
// thread, groups over k>. A launch takes the largest tile that still fills
// every multiprocessor, or the smallest: at the batch sizes of this path a
// step is too short for a partial wave of large tiles, and small tiles
// split k over groups of threads to keep enough of them busy.
using Forward0 = Tile<16, 8, 2, 1, 4>;
using Forward1 = Tile<16, 32, 2, 2, 2>;
using Forward2 = Tile<64, 32, 4, 2, 1>;
using Forward3 = Tile<64, 64, 4, 4, 1>;
using Backward0 = Tile<16, 16, 2, 1, 4>;
using Backward1 = Tile<16, 64, 2, 4, 2>;
using Backward2 = Tile<64, 64, 4, 4, 1>;
using Backward3 = Tile<64, 128, 4, 8, 1>;

// The cell (SmallForwardArgs), in one launch: float only, where the wheel
// takes this path (use_tiled_path).
template <typename P>
__global__ void __launch_bounds__(P::threads, P::resident)
    tiled_cell_kernel(const SmallForwardArgs<float> a) {
  forward_tile<float, P>(a);
}

template <typename P>
cudaError_t tiled_cell_with(
    const SmallForwardArgs<float>& a,
    cudaStream_t stream) {
  tiled_cell_kernel<P>
      <<<grid_of<P>(a.cell.batch, a.cell.state), P::threads, 0, stream>>>(a);
  return cudaGetLastError();
}

// double keeps a launch per step: it is there to check gradients, and its
// cooperative kernels would add half a megabyte per architecture to the
// wheel.
template <typename T, typename P>
constexpr auto fused_forward_of() {
  if constexpr (std::is_same_v<T, double>) {
    return nullptr;
  } else {
    return &fused_forward_kernel<T, P>;
  }
}

template <typename T, typename P>
constexpr auto fused_backward_of() {
  if constexpr (std::is_same_v<T, double>) {
    return nullptr;
  } else {
    return &fused_backward_kernel<T, P>;
  }
}

template <typename T, typename P>
cudaError_t forward_with(
    const FusedForwardArgs<T>& a,
    unsigned* arrivals,
    const DeviceLimits& limits,
    cudaStream_t stream) {
  return run_steps<fused_forward_of<T, P>(), &step_forward_kernel<T, P>, P>(
      a, false, arrivals, limits, stream);
}

template <typename T, typename P>
cudaError_t backward_with(
    const FusedBackwardArgs<T>& a,
    acc_t<T>* dc,
    unsigned* arrivals,
    const DeviceLimits& limits,
    cudaStream_t stream) {
  return run_steps<fused_backward_of<T, P>(), &step_backward_kernel<T, P>, P>(
      a, true, arrivals, limits, stream, dc);
}

// Every step of a direction in one cooperative launch of Kernel, W_h held
// (held_forward_kernel, held_backward_kernel), where it runs: float from
// sm_80, two steps or more, a state of a multiple of 4, the rows operands
// (`rows`) 16-byte aligned, and the grid of P resident at once with its
// shared memory. Elsewhere cudaErrorNotSupported: the chunked kernels take
// the steps.
template <
    auto Kernel,
    typename P,
    bool Backward,
    typename Args,
    typename... Extra>
cudaError_t launch_held(
    const Args& a,
    std::initializer_list<const void*> rows,
    unsigned* arrivals,
    const DeviceLimits& limits,
    cudaStream_t stream,
    Extra... extra) {
  const size_t bytes = held_floats<P, Backward>(a.state) * sizeof(float);
  const bool aligned = std::all_of(rows.begin(), rows.end(), [](const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
  });
  if (limits.capability < 80 || !limits.cooperative || a.steps < 2 ||
      a.state % 4 != 0 || !aligned || arrivals == nullptr ||
      bytes > static_cast<size_t>(limits.shared_bytes)) {
    return cudaErrorNotSupported;
  }
  const auto* kernel = reinterpret_cast<const void*>(Kernel);
  // The opt-in to the most shared memory, once per device; then whether
  // the grid is resident at once with this state's bytes. A failed query
  // is a "no", and is cleared.
  static std::array<std::atomic<bool>, 64> raised{};
  std::atomic<bool>& here = raised[device_slot(limits.device)];
  if (!here.load(std::memory_order_acquire)) {
    if (cudaFuncSetAttribute(
            kernel,
            cudaFuncAttributeMaxDynamicSharedMemorySize,
            limits.shared_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return cudaErrorNotSupported;
    }
    here.store(true, std::memory_order_release);
  }
  const dim3 grid = grid_of<P>(a.batch, a.state);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, kernel, P::threads, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return cudaErrorNotSupported;
  }
  // The counters of arrivals reach steps * grid.y, in 32 bits.
  if (int64_t(per_sm) * limits.multiprocessors < int64_t(grid.x) * grid.y ||
      !counts_fit(a.steps, grid)) {
    return cudaErrorNotSupported;
  }
  Args args = a;
  void* params[] = {&args, &extra..., &arrivals};
  const cudaError_t launched = cudaLaunchCooperativeKernel(
      kernel, grid, dim3(P::threads), params, bytes, stream);
  return launched != cudaSuccess ? launched : cudaGetLastError();
}

// The steps on CUDA cores, with the tile that suits their size.
template <typename T>
cudaError_t forward_steps(
    const FusedForwardArgs<T>& a,
    unsigned* arrivals,
    const DeviceLimits& limits,
    cudaStream_t stream) {
  const int64_t sms = limits.multiprocessors;
  if constexpr (std::is_same_v<T, float>) {
    if (!fills<Forward1>(a.batch, a.state, sms)) { // the smallest tiles
      const cudaError_t status =
          launch_held<&held_forward_kernel<Forward0>, Forward0, false>(
              a, {a.h0, a.output}, arrivals, limits, stream);
      if (status != cudaErrorNotSupported) {
        return status;
      }
    }
  }
  if (fills<Forward3>(a.batch, a.state, sms)) {
    return forward_with<T, Forward3>(a, arrivals, limits, stream);
  }
  if (fills<Forward2>(a.batch, a.state, sms)) {
    return forward_with<T, Forward2>(a, arrivals, limits, stream);
  }
  if (fills<Forward1>(a.batch, a.state, sms)) {
    return forward_with<T, Forward1>(a, arrivals, limits, stream);
  }
  return forward_with<T, Forward0>(a, arrivals, limits, stream);
}

template <typename T>
cudaError_t backward_steps(
    const FusedBackwardArgs<T>& a,
    acc_t<T>* dc,
    unsigned* arrivals,
    const DeviceLimits& limits,
    cudaStream_t stream) {
  const int64_t sms = limits.multiprocessors;
  if constexpr (std::is_same_v<T, float>) {
    if (!fills<Backward1>(a.batch, a.state, sms)) {
      const cudaError_t status =
          launch_held<&held_backward_kernel<Backward0>, Backward0, true>(
              a, {a.d_gates}, arrivals, limits, stream, dc);
      if (status != cudaErrorNotSupported) {
        return status;
      }
    }
  }
  if (fills<Backward3>(a.batch, a.state, sms)) {
    return backward_with<T, Backward3>(a, dc, arrivals, limits, stream);
  }
  if (fills<Backward2>(a.batch, a.state, sms)) {
    return backward_with<T, Backward2>(a, dc, arrivals, limits, stream);
  }
  if (fills<Backward1>(a.batch, a.state, sms)) {
    return backward_with<T, Backward1>(a, dc, arrivals, limits, stream);
  }
  return backward_with<T, Backward0>(a, dc, arrivals, limits, stream);
}

// The counters of the cooperative steps' barriers (every_step, the held
// kernels), after the running cell gradient in the backward's workspace.
// double's steps take a launch each, and need none.
template <typename T>
size_t arrivals_size(int64_t batch) {
  static_assert(
      Forward0::BM >= kArrivalRows && Backward0::BM >= kArrivalRows,
      "a counter per row tile of the smallest tiles");
  if constexpr (std::is_same_v<T, double>) {
    return 0;
  } else {
    return detail::arrivals_size(batch);
  }
}

template <typename T>
size_t dc_size(const FusedBackwardArgs<T>& a) {
  return static_cast<size_t>(a.batch * a.state) * sizeof(acc_t<T>);
}

template <typename T>
unsigned* arrivals_in(void* workspace, size_t offset, int64_t batch) {
  return arrivals_size<T>(batch) > 0
      ? reinterpret_cast<unsigned*>(static_cast<char*>(workspace) + offset)
      : nullptr;
}

} // namespace

template <typename T>
cudaError_t launch_fused_forward(
    const FusedForwardArgs<T>& a,
    void* workspace,
    cudaStream_t stream) {
  if (a.steps == 0 || a.batch == 0 || a.state == 0) {
    return cudaSuccess;
  }
  DeviceLimits limits{};
  if (const cudaError_t status = device_limits(&limits);
      status != cudaSuccess) {
    return status;
  }
  unsigned* arrivals = arrivals_in<T>(workspace, 0, a.batch);
  if constexpr (sizeof(T) == 2) {
    if (step_mma_runs<T>(limits)) {
      return launch_fused_forward_mma(a, arrivals, limits, stream);
    }
  }
  return forward_steps(a, arrivals, limits, stream);
}

template <typename T>
bool steps_on_tensor_cores() {
  DeviceLimits limits{};
  return device_limits(&limits) == cudaSuccess && step_mma_runs<T>(limits);
}

template <typename T>
size_t fused_forward_workspace_size(const FusedForwardArgs<T>& a) {
  return arrivals_size<T>(a.batch);
}

template <typename T>
size_t fused_backward_workspace_size(const FusedBackwardArgs<T>& a) {
  return dc_size<T>(a) + arrivals_size<T>(a.batch);
}

template <typename T>
cudaError_t launch_fused_backward(
    const FusedBackwardArgs<T>& a,
    void* workspace,
    cudaStream_t stream) {
  if (a.steps == 0 || a.batch == 0 || a.state == 0) {
    return cudaSuccess;
  }
  auto* dc = static_cast<acc_t<T>*>(workspace);
  DeviceLimits limits{};
  if (const cudaError_t status = device_limits(&limits);
      status != cudaSuccess) {
    return status;
  }
  unsigned* arrivals = arrivals_in<T>(workspace, dc_size(a), a.batch);
  if constexpr (sizeof(T) == 2) {
    if (step_mma_runs<T>(limits)) {
      return launch_fused_backward_mma(a, dc, arrivals, limits, stream);
    }
  }
  return backward_steps(a, dc, arrivals, limits, stream);
}

bool use_tiled_path(int64_t batch, int64_t input_features, int64_t state) {
  // Up to 2^28 multiply-adds: beyond, cuBLAS's larger tiles win back more
  // GPU time than its host time costs (docs/performance.md).
  constexpr int64_t kMaxMacs = int64_t(1) << 28;
  return batch > 0 && state > 0 &&
      batch * 3 * state * (state + input_features) <= kMaxMacs;
}

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
  // Forward3 is left out: its registers spill with the strided loads.
  const int64_t B = a.cell.batch;
  const int64_t S = a.cell.state;
  if (fills<Forward2>(B, S, sms)) {
    return tiled_cell_with<Forward2>(a, stream);
  }
  if (fills<Forward1>(B, S, sms)) {
    return tiled_cell_with<Forward1>(a, stream);
  }
  return tiled_cell_with<Forward0>(a, stream);
}

#define LLTM_INSTANTIATE(T)                                                    \
  template size_t fused_forward_workspace_size<T>(const FusedForwardArgs<T>&); \
  template cudaError_t launch_fused_forward<T>(                                \
      const FusedForwardArgs<T>&, void*, cudaStream_t);                        \
  template bool steps_on_tensor_cores<T>();                                    \
  template size_t fused_backward_workspace_size<T>(                            \
      const FusedBackwardArgs<T>&);                                            \
  template cudaError_t launch_fused_backward<T>(                               \
      const FusedBackwardArgs<T>&, void*, cudaStream_t);

LLTM_FOR_EACH_TYPE(LLTM_INSTANTIATE)

#undef LLTM_INSTANTIATE

} // namespace lltm::cuda
