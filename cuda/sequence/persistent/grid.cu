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
// (the cell's part: cell_forward and cell_backward, cuda/common/device.h)
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
#include "cuda/sequence/persistent/persistent.h"

#include "cuda/common/device.h"
#include "cuda/sequence/sequence.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

namespace lltm::cuda::detail {
namespace {

namespace cg = cooperative_groups;

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

  __device__ Rounds(const GridTiling& p, int rows)
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
    const GridTiling& p) {
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
__global__ void __launch_bounds__(kThreads) sequence_forward_kernel(
    const SequenceForwardArgs<T> a,
    const GridTiling p) {
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
    const GridTiling p,
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

template <typename T, bool Backward>
const void* kernel_of() {
  if constexpr (Backward) {
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

template <typename T, bool Backward>
cudaError_t plan_grid_kernel(int64_t batch, int64_t state, SequencePlan* out) {
  using A = acc_t<T>;
  DeviceLimits limits{};
  cudaError_t status = device_limits(&limits);
  if (status != cudaSuccess) {
    return status;
  }
  if (!limits.cooperative || limits.multiprocessors <= 0) {
    out->why_not = "this GPU has no cooperative launch";
    return cudaSuccess;
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
    out->why_not =
        "W_h's slices do not fit in the shared memory of its "
        "multiprocessors";
    return cudaSuccess;
  }
  const int64_t blocks = (state + columns - 1) / columns;
  const int64_t weight_bytes = columns * column_bytes;
  const int64_t room = int64_t(limits.shared_bytes) - weight_bytes;
  const int64_t rows = std::min<int64_t>(batch, room / row_bytes);
  const size_t bytes = static_cast<size_t>(weight_bytes + rows * row_bytes);
  const void* kernel = kernel_of<T, Backward>();
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
    out->why_not = "its grid cannot be resident on the GPU at once";
    return cudaSuccess;
  }
  out->kernel = SequenceKernel::kGrid;
  out->grid = GridTiling{
      static_cast<int>(columns),
      static_cast<int>(rows),
      static_cast<int>(ld),
      lanes_for(rows * columns)};
  out->blocks = static_cast<int>(blocks);
  out->shared_bytes = bytes;
  // The backward's dc, the running cell gradient, in the math type.
  out->workspace_bytes =
      Backward ? static_cast<size_t>(batch * state) * sizeof(A) : 0;
  return cudaSuccess;
}

template <typename T>
cudaError_t plan_grid(
    int64_t batch,
    int64_t state,
    bool backward,
    SequencePlan* out) {
  return backward ? plan_grid_kernel<T, true>(batch, state, out)
                  : plan_grid_kernel<T, false>(batch, state, out);
}

// The cooperative launch of the grid's kernel; the backward's workspace is
// dc, the running cell gradient.
template <typename T, bool Backward, typename Args>
cudaError_t launch_grid(
    const Args& args,
    const SequencePlan& plan,
    void* workspace,
    cudaStream_t stream) {
  Args a = args;
  GridTiling tiling = plan.grid;
  auto* dc = static_cast<acc_t<T>*>(workspace);
  void* backward_params[] = {&a, &tiling, &dc};
  void* forward_params[] = {&a, &tiling};
  const cudaError_t launched = cudaLaunchCooperativeKernel(
      kernel_of<T, Backward>(),
      dim3(static_cast<unsigned int>(plan.blocks)),
      dim3(kThreads),
      Backward ? backward_params : forward_params,
      plan.shared_bytes,
      stream);
  return launched != cudaSuccess ? launched : cudaGetLastError();
}

} // namespace

template <typename T>
const PersistentKernel<T>& grid_kernel() {
  static constexpr PersistentKernel<T> kKernel{
      &plan_grid<T>, &launch_grid<T, false>, &launch_grid<T, true>};
  return kKernel;
}

#define LLTM_INSTANTIATE(T) \
  template const PersistentKernel<T>& grid_kernel<T>();

LLTM_FOR_EACH_TYPE(LLTM_INSTANTIATE)

#undef LLTM_INSTANTIATE

} // namespace lltm::cuda::detail
