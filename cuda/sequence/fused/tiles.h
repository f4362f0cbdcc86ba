// The fused steps' GEMM on CUDA cores, by tiles (chunked.cu, held.cu, and
// the cell's tiled forward, cuda/cell/tiled.cu): a block's tile of a
// step's product, chunks along k through shared memory, and the cell's
// math in its epilogue.
//
// Work split: block (x, y) computes rows [x BM, x BM + BM) and state columns
// [y BN, y BN + BN): of all three gates in the forward (3 BN columns of Z),
// of dZ_{t+1} W_h in the backward. Chunks along k of both operands pass
// through shared memory. Thread (tx, ty) owns rows ty + r BM / TM and
// columns tx + c BN / TN: a warp's epilogue touches adjacent columns, and
// each (row, column) of the cell is computed by one thread, which reads c
// (or dc) before writing it, so these may be updated in place. float16 and
// bfloat16 compute in float here.
#pragma once

#include "cuda/common/device.h"
#include "cuda/sequence/fused/epilogue.h"
#include "cuda/sequence/fused/steps.h"
#include "cuda/sequence/sequence.h"

#include <cstdint>

namespace lltm::cuda::detail {

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
  // warps per multiprocessor could not hide the latency of the loads; two
  // blocks cap a thread at 128 registers (64 for the 512 threads of
  // Backward0), which hold chunks of 16 (docs/performance.md).
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

} // namespace lltm::cuda::detail
