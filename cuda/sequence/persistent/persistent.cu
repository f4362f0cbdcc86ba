// Persistent LLTM sequence kernels (Diamos et al., "Persistent RNNs", ICML
// 2016): one cooperative launch runs all T steps of a layer, with a grid-wide
// barrier between steps, so that neither a launch nor a load of the
// recurrent weights from global memory is paid per step.
//
// Forward, step t (P_t = input_t W_x^T comes from cuBLAS, before):
//   Z = P_t + b + h_{t-1} W_h^T,  Z = [Z_i | Z_o | Z_c]
//   i = sigmoid(Z_i)   o = sigmoid(Z_o)   g = elu(Z_c)
//   c_t = c_{t-1} + g * i            h_t = tanh(c_t) * o
// Backward, step t from T - 1 down to 0, with t_c = tanh(c_t):
//   gh = grad_output[t] + (dZ_{t+1} W_h, or grad_h_n at t = T - 1)
//   gc = dc_t (grad_c_n at t = T - 1)
//   dc_{t-1} = (1 - t_c^2) * o * gh + gc
//   dZ_i = dc_{t-1} * g * i * (1 - i)    dZ_o = gh * t_c * o * (1 - o)
//   dZ_c = dc_{t-1} * i * elu'(Z_c),  elu'(z) = 1 if z > 0 else g + 1
// (the cell's part: cell_forward and cell_backward, lltm_device.h)
// then d_h0 = dZ_0 W_h and d_c0 = dc_{-1}. d_weights, d_input and d_bias
// follow in cuBLAS and ATen from the dZ of all steps.
//
// Work split: block x owns the J state columns [x J, x J + J). Its shared
// memory holds the 3 J rows of W_h those columns need (forward: rows
// g S + j; backward: the columns j of every row, for dZ W_h), transposed to
// [k][g J + j] so that a warp reads adjacent words, and a tile of rows of
// h_{t-1} (forward) or dZ_{t+1} (backward), which every block reads whole
// from global memory (L2) after the barrier. A group of adjacent lanes
// (one thread, where the tile has an item per thread) computes each (row,
// column) item: the three dot products over k, split between its lanes,
// then, in its first lane, the pointwise math in registers. The same lane
// owns the same items at every step, so dc in the backward passes from step
// to step without a barrier.
//
// float16 and bfloat16 are computed in float, W_h is kept in shared memory
// in that type; h_t, c_t and dZ are stored in T between steps, as in the
// per-step path.
#include "cuda/sequence/sequence.h"

#include "cuda/common/device.h"
#include "cuda/sequence/persistent/cluster.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <type_traits>

namespace lltm::cuda {
namespace {

namespace cg = cooperative_groups;

using namespace detail; // NOLINT(google-build-using-namespace)

// Data that other blocks wrote in this launch, before the last barrier:
// read past L1, which is not coherent across multiprocessors.
template <typename T>
__device__ __forceinline__ acc_t<T> load_shared_data(const T* p) {
  return widen(__ldcg(p));
}

// The barrier between steps: a grid-wide one, or, where the grid is one
// block, the block's, which costs a fraction of it.
__device__ __forceinline__ void step_barrier(cg::grid_group& grid) {
  if (gridDim.x == 1) {
    __syncthreads();
  } else {
    grid.sync();
  }
}

// A tile of `rows` rows of `length` elements, which other blocks wrote
// before the last barrier, into shared memory with row stride ld. Each
// thread has kInFlight loads in flight before it stores any: one round trip
// to L2 per kInFlight elements rather than per element.
constexpr int kInFlight = 16;

template <typename T>
__device__ __forceinline__ void load_tile(
    acc_t<T>* dst,
    int ld,
    const T* src,
    int rows,
    int length) {
  const int n = rows * length;
  const int stride = static_cast<int>(blockDim.x);
  for (int e0 = threadIdx.x; e0 < n; e0 += kInFlight * stride) {
    acc_t<T> v[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int e = e0 + u * stride;
      v[u] = e < n ? load_shared_data(src + e) : acc_t<T>(0);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int e = e0 + u * stride;
      if (e < n) {
        const int r = e / length;
        dst[r * ld + (e - r * length)] = v[u];
      }
    }
  }
}

// How the problem is cut: `columns` (J) state columns per block, tiles of
// `rows` rows of `ld` elements (odd: the rows of a tile fall in different
// banks) after the 3 J S elements of W_h.
struct Tiling {
  int columns;
  int rows;
  int ld;
  // Threads per (row, column) item, a power of two up to 32: adjacent
  // lanes of a warp split the k of its dot products, and their sums meet by
  // shuffles in a fixed order, where a tile has fewer items than threads.
  int lanes;
};

// The sum of v over the `lanes` adjacent lanes of each group, in every lane
// of it. Every lane of the warp takes part.
template <typename A>
__device__ __forceinline__ A sum_lanes(A v, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// A (row, column) item of a tile, as a thread of its group sees it.
struct Item {
  int r; // the row in the tile
  int jl; // the column in the block's slice
  int j; // the state column
  bool owner; // the group's first lane, on an item inside the problem
  int64_t b; // the batch row
  int64_t at; // b * S + j
};

// The items of a tile of `rows` rows, dealt a round at a time to groups of
// p.lanes adjacent threads, an item a group. Every thread runs the same
// rounds, so that the shuffles of a warp meet; items past the end compute on
// zeros and store nothing.
struct Rounds {
  int lanes;
  int part; // the thread's lane in its group
  int groups; // items a round
  int items;
  int J;

  __device__ Rounds(const Tiling& p, int rows)
      : lanes(p.lanes),
        part(static_cast<int>(threadIdx.x) % p.lanes),
        groups(static_cast<int>(blockDim.x) / p.lanes),
        items(rows * p.columns),
        J(p.columns) {}

  // This thread's item in the round from item0.
  __device__ Item item(int item0, int j0, int S, int64_t b0) const {
    const int item = item0 + static_cast<int>(threadIdx.x) / lanes;
    const int r = item < items ? item / J : 0;
    const int jl = item < items ? item - r * J : 0;
    const int j = j0 + jl;
    const int64_t b = b0 + r;
    return {r, jl, j, item < items && j < S && part == 0, b, b * S + j};
  }
};

// W_h's slice of this block into shared memory, as w_s[k * 3J + g J + jl]:
// forward: W_h[g S + j][k]; backward: W_h[g S + k][j] (j = j0 + jl; zero
// past the last column).
template <typename T, bool Backward>
__device__ void load_weights(
    acc_t<T>* w_s,
    const T* w,
    int64_t ld_w,
    int S,
    int J,
    int j0) {
  const int width = 3 * J;
  for (int e = threadIdx.x; e < S * width; e += blockDim.x) {
    const int k = e / width;
    const int r = e - k * width;
    const int g = r / J;
    const int j = j0 + (r - g * J);
    acc_t<T> v = 0;
    if (j < S) {
      const int64_t row = Backward ? int64_t(g) * S + k : int64_t(g) * S + j;
      const int64_t col = Backward ? j : k;
      v = widen(w[row * ld_w + col]);
    }
    w_s[e] = v;
  }
}

// This block's slice of the problem: state columns [j0, j0 + J) of S, and
// in shared memory W_h's 3 J rows for them (w_s, rows of `width` = 3 J),
// then the tile.
template <typename A>
struct Slice {
  int S;
  int J;
  int width;
  int j0;
  A* w_s;
  A* tile;
};

template <typename T, bool Backward>
__device__ __forceinline__ Slice<acc_t<T>> load_slice(
    const T* w,
    int64_t ld_w,
    int64_t state,
    const Tiling& p) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char shared[];
  const int S = static_cast<int>(state);
  const int J = p.columns;
  const int width = 3 * J;
  const int j0 = static_cast<int>(blockIdx.x) * J;
  A* w_s = reinterpret_cast<A*>(shared);
  load_weights<T, Backward>(w_s, w, ld_w, S, J, j0);
  return {S, J, width, j0, w_s, w_s + S * width};
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    sequence_forward_kernel(const SequenceForwardArgs<T> a, const Tiling p) {
  using A = acc_t<T>;
  cg::grid_group grid = cg::this_grid();
  const auto [S, J, width, j0, w_s, h_s] =
      load_slice<T, false>(a.w, a.ld_w, a.state, p);
  const int64_t B = a.batch;
  const int64_t BS = B * S;
  const bool save = a.cells != nullptr;
  for (int64_t t = 0; t < a.steps; ++t) {
    const T* h_prev = t == 0 ? a.h0 : a.output + (t - 1) * BS;
    const T* c_prev = t == 0 ? a.c0 : (save ? a.cells + (t - 1) * BS : a.c_n);
    T* c_out = save ? a.cells + t * BS : a.c_n;
    T* h_out = a.output + t * BS;
    T* z_t = a.gates + t * B * 3 * S;
    const bool last = t == a.steps - 1;
    for (int64_t b0 = 0; b0 < B; b0 += p.rows) {
      const int rows = static_cast<int>(B - b0 < p.rows ? B - b0 : p.rows);
      __syncthreads(); // the last tile's readers are done (and W_h is in)
      load_tile(h_s, p.ld, h_prev + b0 * S, rows, S);
      __syncthreads();
      const Rounds q(p, rows);
      for (int item0 = 0; item0 < q.items; item0 += q.groups) {
        const auto [r, jl, j, owner, b, at] = q.item(item0, j0, S, b0);
        // Loads that do not wait for h_{t-1}, issued before the dot product
        // so that their latency hides behind it.
        T* z = z_t + b * 3 * S;
        A pi = 0, po = 0, pc = 0, c_old = 0;
        if (owner) {
          pi = widen(z[j]) + widen(a.bias[j]);
          po = widen(z[S + j]) + widen(a.bias[S + j]);
          pc = widen(z[2 * S + j]) + widen(a.bias[2 * S + j]);
          c_old = widen(c_prev[at]);
        }
        const A* h_r = h_s + r * p.ld;
        const A* w_j = w_s + jl;
        A zi = 0, zo = 0, zc = 0;
        for (int k = q.part; k < S; k += q.lanes) {
          const A h = h_r[k];
          const A* w_k = w_j + k * width;
          zi += h * w_k[0];
          zo += h * w_k[J];
          zc += h * w_k[2 * J];
        }
        zi = sum_lanes(zi, q.lanes);
        zo = sum_lanes(zo, q.lanes);
        zc = sum_lanes(zc, q.lanes);
        if (!owner) {
          continue;
        }
        const CellForward<A> f = cell_forward(zi + pi, zo + po, zc + pc, c_old);
        put(c_out + at, f.cell);
        put(h_out + at, f.h);
        if (save) {
          put(z + j, f.i);
          put(z + S + j, f.o);
          put(z + 2 * S + j, f.g);
        }
        if (last) {
          put(a.h_n + at, f.h);
          put(a.c_n + at, f.cell);
        }
      }
    }
    step_barrier(grid); // h_t is complete before any block reads it
  }
}

// Steps t = T - 1 down to 0, then, with d_h0, a last pass that only
// computes dZ_0 W_h. dc, the running cell gradient, is in the workspace.
template <typename T>
__global__ void __launch_bounds__(kThreads) sequence_backward_kernel(
    const SequenceBackwardArgs<T> a,
    const Tiling p,
    acc_t<T>* __restrict__ dc) {
  using A = acc_t<T>;
  cg::grid_group grid = cg::this_grid();
  const auto [S, J, width, j0, w_s, dz_s] =
      load_slice<T, true>(a.w, a.ld_w, a.state, p);
  const int64_t B = a.batch;
  const int64_t G = 3 * static_cast<int64_t>(S); // dZ's row length
  const int64_t end = a.d_h0 != nullptr ? -1 : 0;
  for (int64_t t = a.steps - 1; t >= end; --t) {
    const bool last = t == a.steps - 1;
    const T* dz_next = last ? nullptr : a.d_gates + (t + 1) * B * G;
    for (int64_t b0 = 0; b0 < B; b0 += p.rows) {
      const int rows = static_cast<int>(B - b0 < p.rows ? B - b0 : p.rows);
      if (!last) {
        __syncthreads(); // the last tile's readers are done (and W_h is in)
        load_tile(dz_s, p.ld, dz_next + b0 * G, rows, 3 * S);
        __syncthreads();
      }
      const Rounds q(p, rows);
      for (int item0 = 0; item0 < q.items; item0 += q.groups) {
        const auto [r, jl, j, owner, b, at] = q.item(item0, j0, S, b0);
        // Loads that do not wait for dZ_{t+1}, issued before the dot
        // product so that their latency hides behind it.
        A gh = 0, gc = 0, i = 0, o = 0, g = 0, tc = 0;
        if (owner && t >= 0) {
          gh = load_element(a.grad_output, t, b, j);
          if (last) {
            gh += load_element(a.grad_h_n, b, j);
          }
          gc = last ? load_element(a.grad_c_n, b, j) : dc[at];
          const T* act = a.gates + (t * B + b) * G;
          i = widen(act[j]);
          o = widen(act[S + j]);
          g = widen(act[2 * S + j]);
          tc = tanh_(widen(a.cells[t * B * S + at]));
        }
        A recurrent = 0; // dZ_{t+1} W_h at (b, j)
        if (!last) {
          const A* dz_r = dz_s + r * p.ld;
          const A* w_j = w_s + jl;
          A ri = 0, ro = 0, rc = 0;
          for (int k = q.part; k < S; k += q.lanes) {
            const A* w_k = w_j + k * width;
            ri += dz_r[k] * w_k[0];
            ro += dz_r[S + k] * w_k[J];
            rc += dz_r[2 * S + k] * w_k[2 * J];
          }
          recurrent = sum_lanes(ri + ro + rc, q.lanes);
        }
        if (!owner) {
          continue;
        }
        if (t < 0) {
          put(a.d_h0 + at, recurrent);
          continue;
        }
        gh += recurrent;
        const CellBackward<A> d = cell_backward(i, o, g, tc, gh, gc);
        T* dz = a.d_gates + (t * B + b) * G;
        put(dz + j, d.dz_i);
        put(dz + S + j, d.dz_o);
        put(dz + 2 * S + j, d.dz_c);
        dc[at] = d.d_cell;
        if (t == 0 && a.d_c0 != nullptr) {
          put(a.d_c0 + at, d.d_cell);
        }
      }
    }
    step_barrier(grid); // dZ_t is complete before any block reads it
  }
}

// --- thread-block clusters (sm_90 on) ---------------------------------------
// Where a tile of the batch's rows fits in the blocks of one cluster (up to
// 16 on sm_90) with one (row, column) item per group of lanes, a cluster per
// tile (plan_cluster: a block's items set a step's time), the blocks pass
// h_t (dZ_t) to each other through distributed shared memory, not L2, and
// no step waits at a grid's barrier or a cluster's: each block waits for
// the bytes of its own tile (the exchange, lltm_cluster.h). The tile is
// double-buffered: a step reads buffer t % 2 while the blocks write the next
// step's into the other one. A thread keeps its item's cell state (dc in the
// backward), its bias and the next step's inputs in registers, and loads
// those while the exchange is under way.
//
// Rows of W_h and of the tile run along k in packs of 16 bytes (zeros past
// S), read in one instruction each, and their lengths leave a pack per lane
// of an item over a multiple of 128 bytes (banked), so that the lanes of a
// quarter-warp read distinct banks.

// The cluster's blocks are twice the grid kernel's: a multiprocessor holds
// one, and its dot products wait on shared memory, which more warps hide.
constexpr int kClusterThreads = 512;

template <typename A>
struct alignas(16) Pack {
  static constexpr int kSize = static_cast<int>(16 / sizeof(A));
  A v[kSize];
};

// A pack in one 16-byte access: a plain copy of the struct compiles to an
// access per element, four times the shared-memory instructions.
template <typename A>
__device__ __forceinline__ Pack<A> load(const Pack<A>* at) {
  const uint4 bits = *reinterpret_cast<const uint4*>(at);
  Pack<A> p;
  memcpy(&p, &bits, sizeof(p));
  return p;
}

template <typename A>
__device__ __forceinline__ A dot(const Pack<A>& x, const Pack<A>& y, A sum) {
#pragma unroll
  for (int u = 0; u < Pack<A>::kSize; ++u) {
    sum += x.v[u] * y.v[u];
  }
  return sum;
}

// How a cluster cuts the problem: `columns` (J) state columns per block, and
// `rows` rows of the batch, its tile: cluster y takes rows [y rows, y rows +
// rows), as batch rows are independent recurrences. Lengths are in elements of
// the math type: `padded` is S rounded up to whole packs; `ld_w` the row length
// of W_h's slice ([3 J][ld_w]: gate g, column jl, along k); `ld` the row
// length of the tile, whose rows hold one segment of `padded` (the forward's
// h) or three (the backward's dZ, a gate each).
struct ClusterTiling {
  int columns;
  int rows;
  int padded;
  int ld_w;
  int ld;
  int lanes; // threads per item, as in Tiling
};

// v from the first lane of this thread's group of `lanes`.
template <typename A>
__device__ __forceinline__ A from_first_lane(A v, int lanes) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  return __shfl_sync(0xffffffffu, v, lane & ~(lanes - 1));
}

// This thread's item: one round covers the tile.
struct ClusterItem {
  int r; // the row in the tile
  int b; // the batch row
  int jl; // the column in the block's slice
  int j; // the state column
  int part; // the thread's lane in its group
  bool owner; // the group's first lane, on an item inside the problem
  bool active; // any lane of such a group
  int64_t at; // b * S + j
};

[[maybe_unused]] __device__ __forceinline__ ClusterItem
cluster_item(const ClusterTiling& p, int B, int S) {
  const int item = static_cast<int>(threadIdx.x) / p.lanes;
  const int part = static_cast<int>(threadIdx.x) % p.lanes;
  const int b0 = static_cast<int>(blockIdx.y) * p.rows;
  const bool inside = item < p.rows * p.columns;
  const int r = inside ? item / p.columns : 0;
  const int jl = inside ? item - r * p.columns : 0;
  const int j = static_cast<int>(blockIdx.x) * p.columns + jl;
  const int b = min(b0 + r, B - 1);
  const bool active = inside && j < S && b0 + r < B;
  return {r, b, jl, j, part, active && part == 0, active, int64_t(b) * S + j};
}

// The rows of this cluster's tile that are inside the batch.
[[maybe_unused]] __device__ __forceinline__ int tile_rows(
    const ClusterTiling& p,
    int B) {
  return min(p.rows, B - static_cast<int>(blockIdx.y) * p.rows);
}

// The rows of W_h's slice that column jl's three gates read, as packs.
template <typename A>
struct GateRows {
  const Pack<A>* i;
  const Pack<A>* o;
  const Pack<A>* c;
};

template <typename A>
__device__ __forceinline__ GateRows<A> gate_rows(
    const A* w_s,
    const ClusterTiling& p,
    int jl) {
  const auto row = [&](int g) {
    return reinterpret_cast<const Pack<A>*>(
        w_s + (g * p.columns + jl) * p.ld_w);
  };
  return {row(0), row(1), row(2)};
}

// W_h's slice into w_s[(g J + jl) ld_w + k]: forward W_h[g S + j][k],
// backward W_h[g S + k][j] (j = blockIdx.x J + jl); zeros past S. The
// tiles' buffers after it are zeroed, so that their padding reads as zeros;
// returns their start.
template <typename T, bool Backward>
__device__ acc_t<T>* cluster_slice(
    const T* w,
    int64_t ld_w,
    int S,
    const ClusterTiling& p) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char shared[];
  A* w_s = reinterpret_cast<A*>(shared);
  const int J = p.columns;
  const int j0 = static_cast<int>(blockIdx.x) * J;
  const int n = 3 * J * p.padded;
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    // Adjacent threads read adjacent words of W_h: k, or in the backward jl.
    int g, jl, k;
    if constexpr (Backward) {
      jl = e % J;
      k = (e / J) % p.padded;
      g = e / (J * p.padded);
    } else {
      k = e % p.padded;
      jl = (e / p.padded) % J;
      g = e / (J * p.padded);
    }
    const int j = j0 + jl;
    A v = 0;
    if (j < S && k < S) {
      const int64_t row = Backward ? int64_t(g) * S + k : int64_t(g) * S + j;
      v = widen(w[row * ld_w + (Backward ? j : k)]);
    }
    w_s[(g * J + jl) * p.ld_w + k] = v;
  }
  A* tiles = w_s + 3 * J * p.ld_w;
  for (int e = threadIdx.x; e < 2 * p.rows * p.ld; e += blockDim.x) {
    tiles[e] = 0;
  }
  __syncthreads(); // zeroed before the forward loads h0 over it
  return tiles;
}

template <typename T>
__global__ void __launch_bounds__(kClusterThreads) cluster_forward_kernel(
    const SequenceForwardArgs<T> a,
    const ClusterTiling p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using A = acc_t<T>;
  const int S = static_cast<int>(a.state);
  const int B = static_cast<int>(a.batch);
  A* h_s = cluster_slice<T, false>(a.w, a.ld_w, S, p);
  const A* w_s = reinterpret_cast<const A*>(h_s) - 3 * p.columns * p.ld_w;
  const int64_t BS = int64_t(B) * S;
  const int buffer = p.rows * p.ld; // h_{t-1} of every row in buffer t % 2
  const int rows = tile_rows(p, B);
  const auto expected = static_cast<uint32_t>(rows * S * sizeof(A)); // a tile
  uint64_t* bars = reinterpret_cast<uint64_t*>(h_s + 2 * buffer); // one each
  if (threadIdx.x == 0) {
    barrier_init(bars, expected);
    barrier_init(bars + 1, expected);
  }
  const T* h0 = a.h0 + int64_t(blockIdx.y) * p.rows * S;
  for (int e = threadIdx.x; e < rows * S; e += blockDim.x) {
    h_s[(e / S) * p.ld + e % S] = widen(h0[e]);
  }
  const ClusterItem it = cluster_item(p, B, S);
  const bool save = a.cells != nullptr;
  A bi = 0, bo = 0, bc = 0, c = 0;
  // P_t, loaded a step ahead and kept as stored (stored_element).
  T pi = zero_bits<T>(), po = zero_bits<T>(), pc = zero_bits<T>();
  if (it.owner) {
    bi = widen(a.bias[it.j]);
    bo = widen(a.bias[S + it.j]);
    bc = widen(a.bias[2 * S + it.j]);
    c = widen(a.c0[it.at]);
    const T* z = a.gates + int64_t(it.b) * 3 * S;
    pi = z[it.j];
    po = z[S + it.j];
    pc = z[2 * S + it.j];
  }
  cluster_sync(); // W_h, h0 and the barriers in, in every block
  const int packs = it.active ? p.padded / Pack<A>::kSize : 0;
  const auto [w_i, w_o, w_c] = gate_rows(w_s, p, it.jl);
  for (int64_t t = 0; t < a.steps; ++t) {
    const bool last = t == a.steps - 1;
    const auto* h_r =
        reinterpret_cast<const Pack<A>*>(h_s + (t & 1) * buffer + it.r * p.ld);
    A zi = 0, zo = 0, zc = 0;
    for (int u = it.part; u < packs; u += p.lanes) {
      const Pack<A> h = load(h_r + u);
      zi = dot(h, load(w_i + u), zi);
      zo = dot(h, load(w_o + u), zo);
      zc = dot(h, load(w_c + u), zc);
    }
    zi = sum_lanes(zi, p.lanes);
    zo = sum_lanes(zo, p.lanes);
    zc = sum_lanes(zc, p.lanes);
    const CellForward<A> f = cell_forward(
        zi + widen(pi) + bi, zo + widen(po) + bo, zc + widen(pc) + bc, c);
    A* next = h_s + ((t + 1) & 1) * buffer;
    uint64_t* bar = bars + ((t + 1) & 1);
    if (!last) { // h_t to every block, the group's lanes a block each
      const A h = from_first_lane(as_stored<T>(f.h), p.lanes);
      if (it.active) {
        for (int rank = it.part; rank < static_cast<int>(gridDim.x);
             rank += p.lanes) {
          send_element(next + it.r * p.ld + it.j, rank, h, bar);
        }
      }
    }
    if (it.owner) {
      T* z = a.gates + (t * B + it.b) * 3 * S;
      put((save ? a.cells + t * BS : a.c_n) + it.at, f.cell);
      put(a.output + t * BS + it.at, f.h);
      if (save) {
        put(z + it.j, f.i);
        put(z + S + it.j, f.o);
        put(z + 2 * S + it.j, f.g);
      }
      if (last) {
        put(a.h_n + it.at, f.h);
        put(a.c_n + it.at, f.cell);
      } else {
        c = as_stored<T>(f.cell);
        const T* z_next = z + int64_t(B) * 3 * S;
        pi = z_next[it.j];
        po = z_next[S + it.j];
        pc = z_next[2 * S + it.j];
      }
    }
    if (!last) { // the buffer's (t / 2)-th phase: all of h_t
      barrier_pass(bar, static_cast<uint32_t>((t >> 1) & 1), expected);
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap(); // launched only where the device has clusters
#endif
}

// The backward in one cluster: dc, the running cell gradient, stays in the
// owner's registers, so it needs no workspace.
template <typename T>
__global__ void __launch_bounds__(kClusterThreads) cluster_backward_kernel(
    const SequenceBackwardArgs<T> a,
    const ClusterTiling p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using A = acc_t<T>;
  const int S = static_cast<int>(a.state);
  const int B = static_cast<int>(a.batch);
  A* dz_s = cluster_slice<T, true>(a.w, a.ld_w, S, p);
  const A* w_s = reinterpret_cast<const A*>(dz_s) - 3 * p.columns * p.ld_w;
  const int64_t G = 3 * static_cast<int64_t>(S);
  const int buffer = p.rows * p.ld; // dZ_t of every row in buffer t % 2
  const int64_t end = a.d_h0 != nullptr ? -1 : 0;
  const auto expected =
      static_cast<uint32_t>(3 * tile_rows(p, B) * S * sizeof(A));
  uint64_t* bars = reinterpret_cast<uint64_t*>(dz_s + 2 * buffer);
  if (threadIdx.x == 0) {
    barrier_init(bars, expected);
    barrier_init(bars + 1, expected);
  }
  const ClusterItem it = cluster_item(p, B, S);
  // The loads of step t that do not wait for dZ_{t+1}, a step ahead and
  // kept as stored (stored_element), so that they hide behind the exchange.
  T gh = zero_bits<T>(), i = gh, o = gh, g = gh, cell = gh;
  const auto load_step = [&](int64_t t) {
    gh = stored_element(a.grad_output, t, it.b, it.j);
    const T* act = a.gates + (t * B + it.b) * G;
    i = act[it.j];
    o = act[S + it.j];
    g = act[2 * S + it.j];
    cell = a.cells[t * B * S + it.at];
  };
  A dc = 0, gh_n = 0; // gh_n: grad_h_n, at t = T - 1
  if (it.owner) {
    load_step(a.steps - 1);
    gh_n = load_element(a.grad_h_n, it.b, it.j);
    dc = load_element(a.grad_c_n, it.b, it.j);
    if constexpr (std::is_same_v<T, A>) { // nothing to widen: no gh_n held
      gh += gh_n;
      gh_n = 0;
    }
  }
  cluster_sync(); // as in the forward
  const int packs = it.active ? p.padded / Pack<A>::kSize : 0;
  const auto [w_i, w_o, w_c] = gate_rows(w_s, p, it.jl);
  for (int64_t t = a.steps - 1; t >= end; --t) {
    A recurrent = gh_n; // dZ_{t+1} W_h at (r, j); grad_h_n at T - 1
    if (t != a.steps - 1) {
      const A* row = dz_s + ((t + 1) & 1) * buffer + it.r * p.ld;
      const auto* dz_i = reinterpret_cast<const Pack<A>*>(row);
      const auto* dz_o = reinterpret_cast<const Pack<A>*>(row + p.padded);
      const auto* dz_c = reinterpret_cast<const Pack<A>*>(row + 2 * p.padded);
      A ri = 0, ro = 0, rc = 0;
      for (int u = it.part; u < packs; u += p.lanes) {
        ri = dot(load(dz_i + u), load(w_i + u), ri);
        ro = dot(load(dz_o + u), load(w_o + u), ro);
        rc = dot(load(dz_c + u), load(w_c + u), rc);
      }
      recurrent = sum_lanes(ri + ro + rc, p.lanes);
    }
    if (t < 0) { // the last pass: d_h0 = dZ_0 W_h
      if (it.owner) {
        put(a.d_h0 + it.at, recurrent);
      }
      break;
    }
    const CellBackward<A> d = cell_backward(
        widen(i),
        widen(o),
        widen(g),
        tanh_(widen(cell)),
        widen(gh) + recurrent,
        dc);
    A* next = dz_s + (t & 1) * buffer;
    uint64_t* bar = bars + (t & 1);
    if (t > end) { // dZ_t to every block, as in the forward
      const A di = from_first_lane(as_stored<T>(d.dz_i), p.lanes);
      const A dout = from_first_lane(as_stored<T>(d.dz_o), p.lanes);
      const A dcand = from_first_lane(as_stored<T>(d.dz_c), p.lanes);
      if (it.active) {
        A* mine = next + it.r * p.ld + it.j;
        for (int rank = it.part; rank < static_cast<int>(gridDim.x);
             rank += p.lanes) {
          send_element(mine, rank, di, bar);
          send_element(mine + p.padded, rank, dout, bar);
          send_element(mine + 2 * p.padded, rank, dcand, bar);
        }
      }
    }
    if (it.owner) {
      T* dz = a.d_gates + (t * B + it.b) * G;
      put(dz + it.j, d.dz_i);
      put(dz + S + it.j, d.dz_o);
      put(dz + 2 * S + it.j, d.dz_c);
      dc = d.d_cell;
      if (t == 0 && a.d_c0 != nullptr) {
        put(a.d_c0 + it.at, d.d_cell);
      }
      if (t > 0) {
        load_step(t - 1);
      }
    }
    if (t > end) {
      barrier_pass(
          bar, static_cast<uint32_t>(((a.steps - 1 - t) >> 1) & 1), expected);
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap(); // launched only where the device has clusters
#endif
}

struct Plan {
  bool fits;
  Tiling tiling; // of the grid
  ClusterTiling cluster; // of the cluster
  int blocks; // of the grid, or of a cluster
  int tiles; // the clusters
  size_t shared_bytes;
};

template <typename T, bool Backward, Exchange X>
const void* kernel_of() {
  if constexpr (X == Exchange::kCluster) {
    return Backward ? reinterpret_cast<const void*>(&cluster_backward_kernel<T>)
                    : reinterpret_cast<const void*>(&cluster_forward_kernel<T>);
  } else if constexpr (Backward) {
    return reinterpret_cast<const void*>(&sequence_backward_kernel<T>);
  } else {
    return reinterpret_cast<const void*>(&sequence_forward_kernel<T>);
  }
}

// Columns per block: at least enough that one block per multiprocessor
// covers the state, and, where shared memory allows, enough for
// kItemsPerBlock (row, column) items at small batch. Fewer columns spread a
// step over more multiprocessors, each with a shorter dot product, at the
// price of a grid-wide barrier over more blocks; where a tile has fewer
// items than threads, lanes split each item's dot product.
constexpr int64_t kItemsPerBlock = 32;

// The (row, column) items of a block of a cluster's tile where the batch is
// cut into tiles (plan_cluster): at state 128 in float32 on the H200, a step
// of 8 rows took 3.8 µs, of 16 rows 6.0 (docs/performance.md).
constexpr int64_t kTileItems = 64;

// Threads per item: the most, up to a warp, that leave every item of a tile
// of `items` a group in one round.
int lanes_for(int64_t items, int threads = kThreads) {
  int lanes = 1;
  while (lanes < 32 && items * lanes * 2 <= threads) {
    lanes *= 2;
  }
  return lanes;
}

template <typename T, bool Backward>
cudaError_t plan_grid(int64_t batch, int64_t state, Plan* out) {
  using A = acc_t<T>;
  DeviceLimits limits{};
  cudaError_t status = device_limits(&limits);
  if (status != cudaSuccess || !limits.cooperative ||
      limits.multiprocessors <= 0) {
    return status;
  }
  const int64_t sms = limits.multiprocessors;
  const int64_t row_length = Backward ? 3 * state : state;
  const int64_t ld = row_length % 2 == 0 ? row_length + 1 : row_length;
  const int64_t row_bytes = ld * int64_t(sizeof(A));
  const int64_t column_bytes = 3 * state * int64_t(sizeof(A)); // of W_h
  // At least one block per multiprocessor's share of the columns; more
  // where shared memory allows, up to a thread's item each at this batch.
  const int64_t fewest = (state + sms - 1) / sms;
  const int64_t most =
      (int64_t(limits.shared_bytes) - row_bytes) / column_bytes;
  // A problem of one item per thread or fewer runs in one block where it
  // fits, whose barrier costs a fraction of a grid-wide one.
  const bool one_block = batch * state <= kThreads && most >= state;
  const int64_t columns = one_block
      ? state
      : std::min(
            {std::max(fewest, (kItemsPerBlock + batch - 1) / batch),
             most,
             state});
  if (columns < fewest || columns < 1) {
    return cudaSuccess; // W_h's slices do not fit
  }
  const int64_t blocks = (state + columns - 1) / columns;
  const int64_t weight_bytes = columns * column_bytes;
  const int64_t room = int64_t(limits.shared_bytes) - weight_bytes;
  const int64_t rows = std::min<int64_t>(batch, room / row_bytes);
  const size_t bytes = static_cast<size_t>(weight_bytes + rows * row_bytes);
  const void* kernel = kernel_of<T, Backward, Exchange::kGrid>();
  // Raised only when a launch needs more than before: after the first call
  // of a size, a call (say, during a CUDA graph capture) makes no driver
  // call to set it. The lock keeps the limit from going down when threads
  // that need different sizes raise it at once (the ops run without the
  // GIL): the one that needed less must not set it last.
  static std::array<std::atomic<int>, 64> allowed{};
  static std::mutex raising;
  std::atomic<int>& allowed_here = allowed[device_slot(limits.device)];
  if (allowed_here.load(std::memory_order_acquire) < static_cast<int>(bytes)) {
    const std::lock_guard<std::mutex> lock(raising);
    if (allowed_here.load(std::memory_order_relaxed) <
        static_cast<int>(bytes)) {
      status = cudaFuncSetAttribute(
          kernel,
          cudaFuncAttributeMaxDynamicSharedMemorySize,
          static_cast<int>(bytes));
      if (status != cudaSuccess) {
        return status;
      }
      allowed_here.store(static_cast<int>(bytes), std::memory_order_release);
    }
  }
  int per_sm = 0;
  status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, kernel, kThreads, bytes);
  if (status != cudaSuccess) {
    return status;
  }
  if (int64_t(per_sm) * sms < blocks) {
    return cudaSuccess; // the grid cannot be resident at once
  }
  out->fits = true;
  out->tiling = Tiling{
      static_cast<int>(columns),
      static_cast<int>(rows),
      static_cast<int>(ld),
      lanes_for(rows * columns)};
  out->blocks = static_cast<int>(blocks);
  out->shared_bytes = bytes;
  return cudaSuccess;
}

// A row length for n elements: n rounded up to 128 bytes, plus a pack per
// lane of an item (up to 4), so that the 8 lanes of a quarter-warp, which
// read 16 bytes each, read adjacent rows' packs from distinct banks: items of
// `lanes` lanes read `lanes` adjacent packs of a row.
int64_t banked(int64_t n, int64_t element_bytes, int lanes) {
  const int64_t bytes =
      (n * element_bytes + 127) / 128 * 128 + 16 * (lanes < 8 ? lanes : 1);
  return bytes / element_bytes;
}

// How many clusters of `blocks` blocks run at once, each block with the
// device's most shared memory (one a multiprocessor: a lower bound for any
// tile), asked once per device, kernel and cluster size; at least 1.
template <typename T, bool Backward>
int64_t clusters_at_once(const DeviceLimits& limits, int blocks) {
  static std::array<std::array<std::atomic<int>, 6>, 64> known{};
  int size = 0; // log2(blocks): blocks is a power of two up to 32
  while ((1 << size) < blocks && size < 5) {
    ++size;
  }
  std::atomic<int>& here = known[device_slot(limits.device)][size];
  int clusters = here.load(std::memory_order_acquire);
  if (clusters == 0) {
    const ClusterLaunch launch(
        blocks,
        kClusterThreads,
        static_cast<size_t>(limits.shared_bytes),
        nullptr);
    if (cudaOccupancyMaxActiveClusters(
            &clusters,
            kernel_of<T, Backward, Exchange::kCluster>(),
            &launch.config) != cudaSuccess) {
      (void)cudaGetLastError();
      clusters = 0;
    }
    clusters = std::max(clusters, 1);
    here.store(clusters, std::memory_order_release);
  }
  return clusters;
}

template <typename T, bool Backward>
cudaError_t plan_cluster(int64_t batch, int64_t state, Plan* out) {
  using A = acc_t<T>;
  DeviceLimits limits{};
  int most = 0;
  const cudaError_t status =
      cluster_limits<&cluster_forward_kernel<T>, &cluster_backward_kernel<T>>(
          Backward, kClusterThreads, &limits, &most);
  if (status != cudaSuccess || most == 0) {
    return status;
  }
  // As many blocks as a cluster holds (a power of two), or fewer where the
  // state has fewer columns.
  int64_t blocks = 1;
  while (blocks < most && blocks < state) {
    blocks *= 2;
  }
  const int64_t columns = (state + blocks - 1) / blocks;
  constexpr int64_t kSize = Pack<A>::kSize;
  const int64_t padded = (state + kSize - 1) / kSize * kSize;
  // The batch in tiles of kTileItems items a block, a cluster each, where
  // that many clusters run at once (a step's time grows with a block's
  // items); else the fewest tiles that do.
  int64_t rows = std::min(batch, std::max<int64_t>(1, kTileItems / columns));
  if (rows < batch) {
    const int64_t clusters =
        clusters_at_once<T, Backward>(limits, static_cast<int>(blocks));
    rows = std::max(rows, (batch + clusters - 1) / clusters);
  }
  if (rows * columns > kClusterThreads) {
    return cudaSuccess; // more items than one round of a block's threads
  }
  const int lanes = lanes_for(rows * columns, kClusterThreads);
  const int64_t ld_w = banked(padded, sizeof(A), lanes);
  const int64_t ld = banked((Backward ? 3 : 1) * padded, sizeof(A), lanes);
  const int64_t bytes =
      (3 * columns * ld_w + 2 * rows * ld) * int64_t(sizeof(A)) +
      2 * int64_t(sizeof(uint64_t)); // and the buffers' barriers
  if (bytes > limits.shared_bytes) {
    return cudaSuccess;
  }
  out->fits = true;
  out->cluster = ClusterTiling{
      static_cast<int>(columns),
      static_cast<int>(rows),
      static_cast<int>(padded),
      static_cast<int>(ld_w),
      static_cast<int>(ld),
      lanes};
  out->blocks = static_cast<int>(blocks);
  out->tiles = static_cast<int>((batch + rows - 1) / rows);
  out->shared_bytes = static_cast<size_t>(bytes);
  return cudaSuccess;
}

template <typename T, bool Backward>
cudaError_t plan(int64_t batch, int64_t state, Exchange x, Plan* out) {
  *out = Plan{};
  if (batch <= 0 || state <= 0) {
    return cudaSuccess;
  }
  return x == Exchange::kCluster ? plan_cluster<T, Backward>(batch, state, out)
                                 : plan_grid<T, Backward>(batch, state, out);
}

template <typename T, bool Backward, typename Args>
cudaError_t launch(
    const Args& args,
    Exchange x,
    acc_t<T>* workspace,
    cudaStream_t stream) {
  Plan p{};
  const cudaError_t status = plan<T, Backward>(args.batch, args.state, x, &p);
  if (status != cudaSuccess) {
    return status;
  }
  if (!p.fits) {
    return cudaErrorNotSupported;
  }
  Args a = args;
  cudaError_t launched = cudaSuccess;
  if (x == Exchange::kCluster) {
    ClusterTiling tiling = p.cluster;
    void* params[] = {&a, &tiling};
    ClusterLaunch launch(
        p.blocks, kClusterThreads, p.shared_bytes, stream, p.tiles);
    launched = cudaLaunchKernelExC(
        &launch.config, kernel_of<T, Backward, Exchange::kCluster>(), params);
  } else {
    Tiling tiling = p.tiling;
    void* backward_params[] = {&a, &tiling, &workspace};
    void* forward_params[] = {&a, &tiling};
    launched = cudaLaunchCooperativeKernel(
        kernel_of<T, Backward, Exchange::kGrid>(),
        dim3(static_cast<unsigned int>(p.blocks)),
        dim3(kThreads),
        Backward ? backward_params : forward_params,
        p.shared_bytes,
        stream);
  }
  return launched != cudaSuccess ? launched : cudaGetLastError();
}

// Whether the cluster runs on tensor cores (lltm_cluster_mma.cu): in
// float16 and bfloat16 where those kernels fit, but on CUDA cores where
// these fit at batch 1 (their exchange, from registers and with no block
// barrier, is the faster one there), and past kClusterMmaFirst fragments
// (cluster_mma_fragments) where the cluster on CUDA cores, which takes the
// batch in tiles of rows, has small tiles in both directions: a tensor-core
// cluster takes the whole batch, and its step grows with it. At T = 512 on
// the H200, float16, µs a step: 512,48,32,128 4.00 against 4.72,
// 512,64,32,128 4.39 against 5.69, 512,32,128,256 5.93 against 6.14, but
// at 256 fragments 512,16,128,256 5.31 against 4.67. Both directions
// choose alike: at 512,16,256,512, where the backward's tile does not fit
// on CUDA cores, the forward's on CUDA cores took the step from 7.84 to
// 8.82 (docs/performance.md).
template <typename T>
bool on_tensor_cores(
    int64_t batch,
    int64_t state,
    bool backward,
    Exchange exchange) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    if (exchange != Exchange::kCluster ||
        !cluster_mma_fits<T>(batch, state, backward)) {
      return false;
    }
    if (batch == 1) {
      Plan p{};
      const cudaError_t status = backward
          ? plan<T, true>(batch, state, exchange, &p)
          : plan<T, false>(batch, state, exchange, &p);
      if (status != cudaSuccess) {
        (void)cudaGetLastError();
        return true;
      }
      return !p.fits;
    }
    return cluster_mma_fragments(batch, state) <= kClusterMmaFirst ||
        !sequence_cluster_small_tiles<T>(batch, state);
  } else {
    return false;
  }
}

} // namespace

template <typename T>
bool sequence_persistent_fits(
    int64_t batch,
    int64_t state,
    bool backward,
    Exchange exchange) {
  if (on_tensor_cores<T>(batch, state, backward, exchange)) {
    return true;
  }
  Plan p{};
  const cudaError_t status = backward
      ? plan<T, true>(batch, state, exchange, &p)
      : plan<T, false>(batch, state, exchange, &p);
  if (status != cudaSuccess) {
    (void)cudaGetLastError(); // a failed query is a "no", not a later error
    return false;
  }
  return p.fits;
}

template <typename T>
int64_t sequence_cluster_items(int64_t batch, int64_t state, bool backward) {
  Plan p{};
  const cudaError_t status = backward
      ? plan<T, true>(batch, state, Exchange::kCluster, &p)
      : plan<T, false>(batch, state, Exchange::kCluster, &p);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return p.fits ? int64_t(p.cluster.rows) * p.cluster.columns : 0;
}

template <typename T>
bool sequence_cluster_small_tiles(int64_t batch, int64_t state) {
  constexpr int64_t kSmallTile = 160; // items a block
  for (const bool backward : {false, true}) {
    const int64_t items = sequence_cluster_items<T>(batch, state, backward);
    if (items == 0 || items > kSmallTile) {
      return false;
    }
  }
  return true;
}

template <typename T>
cudaError_t launch_sequence_forward(
    const SequenceForwardArgs<T>& a,
    Exchange exchange,
    cudaStream_t stream) {
  if (a.steps == 0 || a.batch == 0 || a.state == 0) {
    return cudaSuccess;
  }
  if (on_tensor_cores<T>(a.batch, a.state, false, exchange)) {
    return launch_cluster_mma_forward(a, stream);
  }
  return launch<T, false>(a, exchange, nullptr, stream);
}

template <typename T>
size_t sequence_backward_workspace_size(
    const SequenceBackwardArgs<T>& a,
    Exchange exchange) {
  // The clusters keep dc in registers.
  return exchange == Exchange::kCluster
      ? 0
      : static_cast<size_t>(a.batch * a.state) * sizeof(acc_t<T>);
}

template <typename T>
cudaError_t launch_sequence_backward(
    const SequenceBackwardArgs<T>& a,
    Exchange exchange,
    void* workspace,
    cudaStream_t stream) {
  if (a.steps == 0 || a.batch == 0 || a.state == 0) {
    return cudaSuccess;
  }
  if (on_tensor_cores<T>(a.batch, a.state, true, exchange)) {
    return launch_cluster_mma_backward(a, stream);
  }
  return launch<T, true>(
      a, exchange, static_cast<acc_t<T>*>(workspace), stream);
}

#define LLTM_INSTANTIATE(T)                                                    \
  template bool sequence_persistent_fits<T>(int64_t, int64_t, bool, Exchange); \
  template int64_t sequence_cluster_items<T>(int64_t, int64_t, bool);          \
  template bool sequence_cluster_small_tiles<T>(int64_t, int64_t);             \
  template cudaError_t launch_sequence_forward<T>(                             \
      const SequenceForwardArgs<T>&, Exchange, cudaStream_t);                  \
  template size_t sequence_backward_workspace_size<T>(                         \
      const SequenceBackwardArgs<T>&, Exchange);                               \
  template cudaError_t launch_sequence_backward<T>(                            \
      const SequenceBackwardArgs<T>&, Exchange, void*, cudaStream_t);

LLTM_FOR_EACH_TYPE(LLTM_INSTANTIATE)

#undef LLTM_INSTANTIATE

} // namespace lltm::cuda
