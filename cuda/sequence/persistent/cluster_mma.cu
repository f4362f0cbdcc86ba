// The persistent LLTM sequence kernels in one thread-block cluster (sm_90
// on), on tensor cores, for float16 and bfloat16: cluster.cu's
// cluster kernels with the recurrent product in mma.sync m16n8k16
// fragments that accumulate in float.
//
// Forward, step t (P_t = input_t W_x^T comes from cuBLAS, before):
//   Z = P_t + b + h_{t-1} W_h^T, then the cell (cell_forward)
// Backward, step t from T - 1 down to 0:
//   gh = grad_output[t] + (dZ_{t+1} W_h, or grad_h_n at t = T - 1)
//   gc = dc_t (grad_c_n at t = T - 1), then the cell's backward
//   (cell_backward); at the end d_h0 = dZ_0 W_h
//
// Work split: block x owns J state columns (a power of two from 8). Its
// shared memory holds, in T, W_h's slice for them (forward: rows g S + j, k
// along each row; backward: column j of every row, as row j with k along
// it) and a double-buffered tile of all of h_{t-1} (forward) or dZ_{t+1}
// (backward), the batch rounded up to 16 rows (zeros past it), laid out
// block by block as the blocks send it. Warps compute 16 x 8 tiles of the
// product with ldmatrix and mma.sync, rows [m, m + 16) and the block's
// columns [n, n + 8): of each gate in the forward, and in the backward summed
// over the three segments of k (dZ_i, dZ_o, dZ_c); where warps are spare,
// P of them share a tile, each over a part of k. They leave their sums in
// shared memory, and every thread takes one or two (row, column) items of
// the cell's math, adding the P parts in a fixed order (results repeat bit
// for bit), with its items' cell state (dc), bias and next inputs in
// registers from step to step. The new h_t (dZ_t) goes into a staging slab
// (double-buffered), and each block sends its slab to every other block of
// the cluster in one bulk copy per block (the exchange, cluster.h), and
// stores it into its own tile.
//
// A step is latency: every thread's share of the cell's math, and one bulk
// copy a block, beat one warp doing every item's math and 16-byte st.async
// stores a row and block at a time; the slabs are swizzled (`swizzled`)
// (docs/performance.md, "Why these thresholds").
#include "cuda/sequence/persistent/cluster.h"

#include "cuda/common/device.h"
#include "cuda/sequence/persistent/persistent.h"
#include "cuda/sequence/sequence.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace lltm::cuda::detail {
namespace {

constexpr int kMmaThreads = 512;
constexpr int kWarps = kMmaThreads / 32; // one 16 x 8 tile each, at most
// The warps that share tiles' k (P of them a tile) stop at half the block:
// more contend for shared memory's bandwidth, which bounds the product, and
// add partial sums for the cell's math to read (docs/performance.md, "Why
// these thresholds").
constexpr int kSplitWarps = kWarps / 2;

// Four 8 x 8 matrices of 16-bit elements from shared memory: lanes 8 i to
// 8 i + 7 give the rows of matrix i, and r[i] gets this lane's part of it.
[[maybe_unused]] __device__ __forceinline__ void ldmatrix_x4(
    uint32_t (&r)[4],
    const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(shared_address(p)));
#endif
}

// d += a b: a 16 x 16 (row-major), b 16 x 8 (column-major), d in float.
template <typename T>
__device__ __forceinline__ void mma(
    float (&d)[4],
    const uint32_t (&a)[4],
    uint32_t b0,
    uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#endif
}

// Where element (r, col) of a slab of [rows][J] lies: its 16-byte chunk
// col / 8 XOR a function of r, so that ldmatrix's eight rows of a matrix
// (the same chunk of rows r0..r0 + 7) fall in distinct banks when a row is
// 32 bytes or more (J >= 16): the 8 / C rows of each 128-byte line (C
// chunks a row) take distinct chunks. shift = log2(J).
[[maybe_unused]] __device__ __forceinline__ int swizzled(
    int r,
    int col,
    int shift) {
  const int lines = shift < 6 ? 6 - shift : 0; // log2(rows a 128-byte line)
  const int mask = (1 << (shift < 6 ? shift - 3 : 3)) - 1;
  return (r << shift) + ((((col >> 3) ^ ((r >> lines) & mask))) << 3) +
      (col & 7);
}

// The tiles hold h_{t-1} (dZ_{t+1}) block by block, as the blocks send
// them: [blocks][segments][rows][J] (each slab swizzled), so that each
// block's part is one contiguous slab, sent in one bulk copy. A lane's row
// of A for ldmatrix at (segment g, k): 8 elements of one block's slab.
struct TileRows {
  const void* tile;
  int owner_stride; // elements: segments * rows * J
  int segment_stride; // rows * J
  int shift; // log2(J)
  int row; // this lane's row: m + lane % 16
  int half; // 8 (lane / 16): ldmatrix's second pair of matrices

  template <typename T>
  __device__ __forceinline__ const T* at(int g, int k) const {
    const int kc = k + half;
    const int owner = kc >> shift;
    return static_cast<const T*>(tile) + owner * owner_stride +
        g * segment_stride + swizzled(row, kc - (owner << shift), shift);
  }
};

// acc[g] = A_g B_g^T over the chunks c0, c0 + step, ... < chunks of 32 k,
// for g = 0, 1, 2: A_g's 16 rows from the tile (segment g, or 0 when
// SameA), B_g the 8 rows at b + g b_step (row length ldb, k along it). The
// k-steps of 16 alternate between two chains per g, added at the end in a
// fixed order.
template <typename T, bool SameA>
__device__ __forceinline__ void product(
    float (&acc)[3][4],
    const TileRows& a,
    const T* b,
    int ldb,
    int b_step,
    int c0,
    int chunks,
    int step) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const T* b_lane = b + (lane & 7) * ldb + (lane >> 3) * 8;
  float odd[3][4] = {};
#pragma unroll
  for (int g = 0; g < 3; ++g) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[g][e] = 0.0f;
    }
  }
  for (int c = c0; c < chunks; c += step) {
    const int k = 32 * c;
    uint32_t x0[4], x1[4];
    if constexpr (SameA) {
      ldmatrix_x4(x0, a.at<T>(0, k));
      ldmatrix_x4(x1, a.at<T>(0, k + 16));
    }
#pragma unroll
    for (int g = 0; g < 3; ++g) {
      if constexpr (!SameA) {
        ldmatrix_x4(x0, a.at<T>(g, k));
        ldmatrix_x4(x1, a.at<T>(g, k + 16));
      }
      uint32_t y[4];
      ldmatrix_x4(y, b_lane + g * b_step + k);
      mma<T>(acc[g], x0, y[0], y[1]);
      mma<T>(odd[g], x1, y[2], y[3]);
    }
  }
#pragma unroll
  for (int g = 0; g < 3; ++g) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[g][e] += odd[g][e];
    }
  }
}

// A warp's part of the product: the 16 x 8 tile (m, n) of the block's rows
// and columns, and the chunks of k of split s (of P).
struct WarpTile {
  bool computes;
  int m;
  int n;
  int s;
};

[[maybe_unused]] __device__ __forceinline__ WarpTile
warp_tile(const MmaTiling& p) {
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int across = p.columns / 8;
  const int units = (p.rows / 16) * across;
  WarpTile w{};
  w.computes = warp < units * p.splits;
  const int u = w.computes ? warp % units : 0;
  w.s = w.computes ? warp / units : 0;
  w.m = 16 * (u / across);
  w.n = 8 * (u % across);
  return w;
}

// The (row, column) of mma's d element e of this lane, in a warp's tile.
[[maybe_unused]] __device__ __forceinline__ int d_row(int e) {
  return ((static_cast<int>(threadIdx.x) & 31) >> 2) + 8 * (e >> 1);
}
[[maybe_unused]] __device__ __forceinline__ int d_col(int e) {
  return 2 * (static_cast<int>(threadIdx.x) & 3) + (e & 1);
}

// The epilogue's items: (row, column) items of the block, item q * threads
// + tid for q = 0, 1 (the plan keeps batch * J <= 2 * threads), rows along
// the batch, columns of the block's slice; valid inside the problem.
constexpr int kRounds = 2;

struct Item {
  bool ours; // inside the batch: staged (as zero past the state)
  bool valid; // and inside the state
  int r;
  int jl;
};

[[maybe_unused]] __device__ __forceinline__ Item
item_of(const MmaTiling& p, int q, int batch, int state) {
  const int idx = static_cast<int>(threadIdx.x) + q * kMmaThreads;
  Item it{};
  it.r = idx >> p.shift;
  it.jl = idx - (it.r << p.shift);
  it.ours = it.r < batch;
  it.valid =
      it.ours && static_cast<int>(blockIdx.x) * p.columns + it.jl < state;
  return it;
}

template <typename T>
__global__ void __launch_bounds__(kMmaThreads, 1) cluster_mma_forward_kernel(
    const SequenceForwardArgs<T> a,
    const MmaTiling p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char shared[];
  const int S = static_cast<int>(a.state);
  const int B = static_cast<int>(a.batch);
  const int J = p.columns;
  const int N = static_cast<int>(gridDim.x);
  const int x = static_cast<int>(blockIdx.x);
  const int j0 = x * J;
  const int64_t BS = int64_t(B) * S;
  const int slab = p.rows * J; // a block's part of a tile
  T* w_s = reinterpret_cast<T*>(shared); // [3 J][ld_w]
  T* tiles = w_s + 3 * J * p.ld_w; // two of [N][rows][J]
  T* stages = tiles + 2 * N * slab; // two slabs
  auto* partial = reinterpret_cast<float*>(stages + 2 * slab); // [P][3][slab]
  auto* bars = reinterpret_cast<uint64_t*>(partial + p.splits * 3 * slab);
  // Every other block's slab a step: this block writes its own (see the
  // sends).
  const auto expected = static_cast<uint32_t>((N - 1) * slab * sizeof(T));
  if (threadIdx.x == 0) {
    barrier_init(bars, expected);
    barrier_init(bars + 1, expected);
  }
  // W_h's slice, w_s[(g J + jl) ld_w + k] = W_h[g S + j0 + jl][k], zeros
  // past S; the tiles and stages zeroed, then h0.
  for (int e = threadIdx.x; e < 3 * J * p.kp; e += blockDim.x) {
    const int row = e / p.kp;
    const int k = e - row * p.kp;
    const int g = row / J;
    const int j = j0 + row - g * J;
    w_s[row * p.ld_w + k] = j < S && k < S
        ? a.w[(int64_t(g) * S + j) * a.ld_w + k]
        : zero_bits<T>();
  }
  for (int e = threadIdx.x; e < 2 * N * slab + 2 * slab; e += blockDim.x) {
    tiles[e] = zero_bits<T>();
  }
  __syncthreads();
  for (int e = threadIdx.x; e < B * S; e += blockDim.x) {
    const int r = e / S;
    const int k = e - r * S;
    const int owner = k >> p.shift;
    tiles[owner * slab + swizzled(r, k - (owner << p.shift), p.shift)] =
        a.h0[e];
  }
  fence_for_bulk(); // before the bulk copies write over them
  const WarpTile wt = warp_tile(p);
  const bool save = a.cells != nullptr;
  Item its[kRounds];
  float c[kRounds], bias[kRounds][3];
  // P_t of the items, from the gates' buffer, loaded a step ahead and kept
  // as stored (stored_element).
  T pz[kRounds][3];
  const auto inputs = [&](int64_t t) {
#pragma unroll
    for (int q = 0; q < kRounds; ++q) {
      const T* z = a.gates + (t * B + its[q].r) * 3 * S + j0 + its[q].jl;
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        pz[q][g] = its[q].valid ? z[g * S] : zero_bits<T>();
      }
    }
  };
#pragma unroll
  for (int q = 0; q < kRounds; ++q) {
    its[q] = item_of(p, q, B, S);
    const int j = j0 + its[q].jl;
#pragma unroll
    for (int g = 0; g < 3; ++g) {
      bias[q][g] = its[q].valid ? widen(a.bias[g * S + j]) : 0.0f;
    }
    c[q] = its[q].valid ? widen(a.c0[int64_t(its[q].r) * S + j]) : 0.0f;
  }
  inputs(0);
  cluster_sync(); // W_h, h0 and the barriers in, in every block
  for (int64_t t = 0; t < a.steps; ++t) {
    const bool last = t == a.steps - 1;
    if (wt.computes) {
      const int lane = static_cast<int>(threadIdx.x) & 31;
      const TileRows rows{
          tiles + (t & 1) * N * slab,
          slab,
          0,
          p.shift,
          wt.m + (lane & 15),
          (lane >> 4) * 8};
      float acc[3][4];
      product<T, true>(
          acc,
          rows,
          w_s + wt.n * p.ld_w,
          p.ld_w,
          J * p.ld_w,
          wt.s,
          p.kp / 32,
          p.splits);
      float* mine = partial + wt.s * 3 * slab;
#pragma unroll
      for (int g = 0; g < 3; ++g) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          mine[g * slab + ((wt.m + d_row(e)) << p.shift) + wt.n + d_col(e)] =
              acc[g][e];
        }
      }
    }
    __syncthreads();
    T* stage = stages + (t & 1) * slab;
    T* own = tiles + ((t + 1) & 1) * N * slab + x * slab;
    CellForward<float> f[kRounds];
#pragma unroll
    for (int q = 0; q < kRounds; ++q) {
      if (!its[q].ours) {
        continue;
      }
      const int at = (its[q].r << p.shift) + its[q].jl;
      float z[3] = {0.0f, 0.0f, 0.0f};
      for (int s = 0; s < p.splits; ++s) {
#pragma unroll
        for (int g = 0; g < 3; ++g) {
          z[g] += partial[(s * 3 + g) * slab + at];
        }
      }
      f[q] = cell_forward(
          z[0] + widen(pz[q][0]) + bias[q][0],
          z[1] + widen(pz[q][1]) + bias[q][1],
          z[2] + widen(pz[q][2]) + bias[q][2],
          c[q]);
      T h = zero_bits<T>();
      if (its[q].valid) {
        put(&h, f[q].h);
      }
      const int to = swizzled(its[q].r, its[q].jl, p.shift);
      stage[to] = h;
      if (!last) {
        own[to] = h;
      }
    }
    // h_t to every other block: this block's slab, a bulk copy each; its
    // own slot it wrote above. A bulk copy into the sender's own shared
    // memory through the cluster window is legal and lands right, but
    // compute-sanitizer's memcheck stops it ("not located in remote CTA"),
    // even in a 40-line program; the store costs no more.
    if (!last) {
      fence_for_bulk();
      __syncthreads();
      if (static_cast<int>(threadIdx.x) < N &&
          static_cast<int>(threadIdx.x) != x) {
        send_bulk(
            own,
            static_cast<int>(threadIdx.x),
            stage,
            static_cast<uint32_t>(slab * sizeof(T)),
            bars + ((t + 1) & 1));
      }
    }
#pragma unroll
    for (int q = 0; q < kRounds; ++q) {
      if (!its[q].valid) {
        continue;
      }
      const int j = j0 + its[q].jl;
      const int64_t at = int64_t(its[q].r) * S + j;
      T* z = a.gates + (t * B + its[q].r) * 3 * S + j;
      put((save ? a.cells + t * BS : a.c_n) + at, f[q].cell);
      put(a.output + t * BS + at, f[q].h);
      if (save) {
        put(z, f[q].i);
        put(z + S, f[q].o);
        put(z + 2 * S, f[q].g);
      }
      if (last) {
        put(a.h_n + at, f[q].h);
        put(a.c_n + at, f[q].cell);
      } else {
        c[q] = as_stored<T>(f[q].cell);
      }
    }
    if (!last) {
      inputs(t + 1);
      barrier_pass( // all of h_t
          bars + ((t + 1) & 1),
          static_cast<uint32_t>((t >> 1) & 1),
          expected);
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap(); // launched only where the device has clusters
#endif
}

template <typename T>
__global__ void __launch_bounds__(kMmaThreads, 1) cluster_mma_backward_kernel(
    const SequenceBackwardArgs<T> a,
    const MmaTiling p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char shared[];
  const int S = static_cast<int>(a.state);
  const int B = static_cast<int>(a.batch);
  const int J = p.columns;
  const int N = static_cast<int>(gridDim.x);
  const int x = static_cast<int>(blockIdx.x);
  const int j0 = x * J;
  const int64_t G = 3 * static_cast<int64_t>(S);
  const int slab = p.rows * J; // a gate's part of a block's
  T* w_s = reinterpret_cast<T*>(shared); // [J][ld_w]
  T* tiles = w_s + J * p.ld_w; // two of [N][3][rows][J]: dZ_i, dZ_o, dZ_c
  T* stages = tiles + 2 * N * 3 * slab; // two of [3][rows][J]
  auto* partial = reinterpret_cast<float*>(stages + 2 * 3 * slab); // [P][slab]
  auto* bars = reinterpret_cast<uint64_t*>(partial + p.splits * slab);
  const int64_t end = a.d_h0 != nullptr ? -1 : 0;
  const auto expected = // as in the forward
      static_cast<uint32_t>((N - 1) * 3 * slab * sizeof(T));
  if (threadIdx.x == 0) {
    barrier_init(bars, expected);
    barrier_init(bars + 1, expected);
  }
  // W_h's slice, w_s[jl ld_w + g kp + k] = W_h[g S + k][j0 + jl], zeros
  // past S; adjacent threads read adjacent columns of a row of W_h.
  for (int e = threadIdx.x; e < 3 * J * p.kp; e += blockDim.x) {
    const int jl = e & (J - 1);
    const int gk = e >> p.shift;
    const int g = gk / p.kp;
    const int k = gk - g * p.kp;
    const int j = j0 + jl;
    w_s[jl * p.ld_w + gk] = j < S && k < S
        ? a.w[(int64_t(g) * S + k) * a.ld_w + j]
        : zero_bits<T>();
  }
  for (int e = threadIdx.x; e < 2 * N * 3 * slab + 2 * 3 * slab;
       e += blockDim.x) {
    tiles[e] = zero_bits<T>();
  }
  fence_for_bulk(); // before the bulk copies write over them
  const WarpTile wt = warp_tile(p);
  Item its[kRounds];
  // Step t's loads that do not wait for dZ_{t+1}, a step ahead and kept as
  // stored (stored_element), so that they hide behind the exchange.
  T gh[kRounds], i[kRounds], o[kRounds], g[kRounds], cell[kRounds];
  float dc[kRounds], gh_n[kRounds]; // gh_n: grad_h_n, at t = T - 1
  const auto load_step = [&](int64_t t) {
#pragma unroll
    for (int q = 0; q < kRounds; ++q) {
      if (!its[q].valid) {
        gh[q] = i[q] = o[q] = g[q] = cell[q] = zero_bits<T>();
        continue;
      }
      const int r = its[q].r;
      const int j = j0 + its[q].jl;
      gh[q] = stored_element(a.grad_output, t, r, j);
      const T* act = a.gates + (t * B + r) * G;
      i[q] = act[j];
      o[q] = act[S + j];
      g[q] = act[2 * S + j];
      cell[q] = a.cells[(t * B + r) * S + j];
    }
  };
#pragma unroll
  for (int q = 0; q < kRounds; ++q) {
    its[q] = item_of(p, q, B, S);
  }
  load_step(a.steps - 1);
#pragma unroll
  for (int q = 0; q < kRounds; ++q) {
    dc[q] = gh_n[q] = 0.0f;
    if (its[q].valid) {
      const int j = j0 + its[q].jl;
      gh_n[q] = load_element(a.grad_h_n, its[q].r, j);
      dc[q] = load_element(a.grad_c_n, its[q].r, j);
    }
  }
  cluster_sync(); // as in the forward
  for (int64_t t = a.steps - 1; t >= end; --t) {
    const bool recurrent = t != a.steps - 1;
    if (recurrent) { // dZ_{t+1} W_h, split over the warps
      if (wt.computes) {
        const int lane = static_cast<int>(threadIdx.x) & 31;
        const TileRows rows{
            tiles + ((t + 1) & 1) * N * 3 * slab,
            3 * slab,
            slab,
            p.shift,
            wt.m + (lane & 15),
            (lane >> 4) * 8};
        float acc[3][4];
        product<T, false>(
            acc,
            rows,
            w_s + wt.n * p.ld_w,
            p.ld_w,
            p.kp,
            wt.s,
            p.kp / 32,
            p.splits);
        float* mine = partial + wt.s * slab;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          mine[((wt.m + d_row(e)) << p.shift) + wt.n + d_col(e)] =
              acc[0][e] + acc[1][e] + acc[2][e];
        }
      }
      __syncthreads();
    }
    float sum[kRounds] = {}; // dZ_{t+1} W_h at the items
    if (recurrent) {
#pragma unroll
      for (int q = 0; q < kRounds; ++q) {
        if (its[q].ours) {
          const int at = (its[q].r << p.shift) + its[q].jl;
          for (int s = 0; s < p.splits; ++s) {
            sum[q] += partial[s * slab + at];
          }
        }
      }
    }
    if (t < 0) { // the last pass: d_h0 = dZ_0 W_h
#pragma unroll
      for (int q = 0; q < kRounds; ++q) {
        if (its[q].valid) {
          put(a.d_h0 + int64_t(its[q].r) * S + j0 + its[q].jl, sum[q]);
        }
      }
      break;
    }
    CellBackward<float> d[kRounds];
    T* stage = stages + (t & 1) * 3 * slab;
    T* own = tiles + (t & 1) * N * 3 * slab + x * 3 * slab;
#pragma unroll
    for (int q = 0; q < kRounds; ++q) {
      if (!its[q].ours) {
        continue;
      }
      d[q] = cell_backward(
          widen(i[q]),
          widen(o[q]),
          widen(g[q]),
          tanh_(widen(cell[q])),
          widen(gh[q]) + (recurrent ? sum[q] : gh_n[q]),
          dc[q]);
      T v[3] = {zero_bits<T>(), zero_bits<T>(), zero_bits<T>()};
      if (its[q].valid) {
        put(&v[0], d[q].dz_i);
        put(&v[1], d[q].dz_o);
        put(&v[2], d[q].dz_c);
      }
      const int at = swizzled(its[q].r, its[q].jl, p.shift);
      stage[at] = v[0];
      stage[slab + at] = v[1];
      stage[2 * slab + at] = v[2];
      if (t > end) {
        own[at] = v[0];
        own[slab + at] = v[1];
        own[2 * slab + at] = v[2];
      }
    }
    if (t > end) { // dZ_t to every other block, as in the forward
      fence_for_bulk();
      __syncthreads();
      if (static_cast<int>(threadIdx.x) < N &&
          static_cast<int>(threadIdx.x) != x) {
        send_bulk(
            own,
            static_cast<int>(threadIdx.x),
            stage,
            static_cast<uint32_t>(3 * slab * sizeof(T)),
            bars + (t & 1));
      }
    }
#pragma unroll
    for (int q = 0; q < kRounds; ++q) {
      if (!its[q].valid) {
        continue;
      }
      const int j = j0 + its[q].jl;
      T* dz = a.d_gates + (t * B + its[q].r) * G + j;
      put(dz, d[q].dz_i);
      put(dz + S, d[q].dz_o);
      put(dz + 2 * S, d[q].dz_c);
      dc[q] = d[q].d_cell;
      if (t == 0 && a.d_c0 != nullptr) {
        put(a.d_c0 + int64_t(its[q].r) * S + j, d[q].d_cell);
      }
    }
    if (t > 0) {
      load_step(t - 1);
    }
    if (t > end) {
      barrier_pass(
          bars + (t & 1),
          static_cast<uint32_t>(((a.steps - 1 - t) >> 1) & 1),
          expected);
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap(); // launched only where the device has clusters
#endif
}

int64_t round_up(int64_t n, int64_t m) {
  return (n + m - 1) / m * m;
}

// The cluster's cut of a [batch, state] problem: J, the state columns of a
// block, a power of two from 8 that leaves at most as many blocks as a
// cluster holds, and as many blocks (a power of two) as the state needs; a
// warp for each 16 x 8 tile of a block's product, P warps each where
// there are warps to spare (up to kSplitWarps in all); at most two epilogue
// items per thread; and the shared memory of W_h's slice, the two tiles, the
// two stages and the partial sums.
template <typename T, bool Backward>
cudaError_t plan_cluster_mma(int64_t batch, int64_t state, SequencePlan* out) {
  DeviceLimits limits{};
  int most = 0;
  const cudaError_t status = cluster_limits<
      &cluster_mma_forward_kernel<T>,
      &cluster_mma_backward_kernel<T>>(Backward, kMmaThreads, &limits, &most);
  if (status != cudaSuccess) {
    return status;
  }
  if (most == 0) {
    out->why_not = "this GPU has no thread-block clusters (sm_90 on)";
    return cudaSuccess;
  }
  int64_t columns = 8;
  int shift = 3;
  while (columns * most < state) {
    columns *= 2;
    ++shift;
  }
  // At least 32 columns in all, the product's chunk of k.
  int64_t blocks = 1;
  while (blocks * columns < std::max<int64_t>(state, 32)) {
    blocks *= 2; // at most `most`, a power of two
  }
  const int64_t rows = round_up(batch, 16);
  const int64_t units = (rows / 16) * (columns / 8);
  if (units > kWarps || batch * columns > kRounds * kMmaThreads) {
    out->why_not =
        "the batch takes more warps and items than a cluster "
        "block has";
    return cudaSuccess;
  }
  const int64_t kp = blocks * columns;
  int64_t splits = 1;
  while (units * splits * 2 <= kSplitWarps && splits * 2 <= kp / 32) {
    splits *= 2;
  }
  const int64_t segments = Backward ? 3 : 1;
  // 16 bytes past a multiple of 32 elements: ldmatrix's eight rows of a
  // matrix of W_h fall in distinct banks.
  const int64_t ld_w = segments * kp + 8;
  const int64_t slab = rows * columns;
  const int64_t elements = (Backward ? columns : 3 * columns) * ld_w +
      2 * blocks * segments * slab + 2 * segments * slab;
  const int64_t bytes = elements * int64_t(sizeof(T)) +
      splits * (Backward ? 1 : 3) * slab * int64_t(sizeof(float)) +
      2 * int64_t(sizeof(uint64_t)); // and the buffers' barriers
  if (bytes > limits.shared_bytes) {
    out->why_not =
        "W_h's slices and the batch do not fit in the shared "
        "memory of one cluster";
    return cudaSuccess;
  }
  out->kernel = SequenceKernel::kClusterMma;
  out->mma = MmaTiling{
      static_cast<int>(columns),
      shift,
      static_cast<int>(rows),
      static_cast<int>(kp),
      static_cast<int>(ld_w),
      static_cast<int>(splits)};
  out->blocks = static_cast<int>(blocks);
  out->shared_bytes = static_cast<size_t>(bytes);
  return cudaSuccess;
}

template <typename T>
cudaError_t plan_mma(
    int64_t batch,
    int64_t state,
    bool backward,
    SequencePlan* out) {
  return backward ? plan_cluster_mma<T, true>(batch, state, out)
                  : plan_cluster_mma<T, false>(batch, state, out);
}

template <typename T, bool Backward, typename Args>
cudaError_t launch_mma(
    const Args& args,
    const SequencePlan& plan,
    void* /*workspace*/,
    cudaStream_t stream) {
  const void* kernel = Backward
      ? reinterpret_cast<const void*>(&cluster_mma_backward_kernel<T>)
      : reinterpret_cast<const void*>(&cluster_mma_forward_kernel<T>);
  return launch_clusters(kernel, args, plan.mma, plan, kMmaThreads, stream);
}

} // namespace

template <typename T>
const PersistentKernel<T>& cluster_mma_kernel() {
  static constexpr PersistentKernel<T> kKernel{
      &plan_mma<T>, &launch_mma<T, false>, &launch_mma<T, true>};
  return kKernel;
}

template const PersistentKernel<__half>& cluster_mma_kernel<__half>();
template const PersistentKernel<__nv_bfloat16>& cluster_mma_kernel<
    __nv_bfloat16>();

} // namespace lltm::cuda::detail
