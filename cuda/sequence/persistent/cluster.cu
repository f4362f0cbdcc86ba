// The persistent kernels in one thread-block cluster (sm_90 on), on CUDA
// cores in every type: the math of grid.cu's kernels, with h_t (dZ_t)
// passed between the blocks through distributed shared memory.
#include "cuda/sequence/persistent/cluster.h"

#include "cuda/common/device.h"
#include "cuda/sequence/persistent/persistent.h"
#include "cuda/sequence/sequence.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

namespace lltm::cuda::detail {
namespace {

// --- thread-block clusters (sm_90 on) ---------------------------------------
// Where a tile of the batch's rows fits in the blocks of one cluster (up to
// 16 on sm_90) with one (row, column) item per group of lanes, a cluster per
// tile (plan_cluster: a block's items set a step's time), the blocks pass
// h_t (dZ_t) to each other through distributed shared memory, not L2, and
// no step waits at a grid's barrier or a cluster's: each block waits for
// the bytes of its own tile (the exchange, cluster.h). The tile is
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
struct alignas(16) Pack16 {
  static constexpr int kSize = static_cast<int>(16 / sizeof(A));
  A v[kSize];
};

// A pack in one 16-byte access: a plain copy of the struct compiles to an
// access per element, four times the shared-memory instructions.
template <typename A>
__device__ __forceinline__ Pack16<A> load(const Pack16<A>* at) {
  const uint4 bits = *reinterpret_cast<const uint4*>(at);
  Pack16<A> p;
  memcpy(&p, &bits, sizeof(p));
  return p;
}

template <typename A>
__device__ __forceinline__ A
dot(const Pack16<A>& x, const Pack16<A>& y, A sum) {
#pragma unroll
  for (int u = 0; u < Pack16<A>::kSize; ++u) {
    sum += x.v[u] * y.v[u];
  }
  return sum;
}

// How a cluster cuts the problem: `columns` (J) state columns per block, and
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
  const Pack16<A>* i;
  const Pack16<A>* o;
  const Pack16<A>* c;
};

template <typename A>
__device__ __forceinline__ GateRows<A> gate_rows(
    const A* w_s,
    const ClusterTiling& p,
    int jl) {
  const auto row = [&](int g) {
    return reinterpret_cast<const Pack16<A>*>(
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
  const int packs = it.active ? p.padded / Pack16<A>::kSize : 0;
  const auto [w_i, w_o, w_c] = gate_rows(w_s, p, it.jl);
  for (int64_t t = 0; t < a.steps; ++t) {
    const bool last = t == a.steps - 1;
    const auto* h_r = reinterpret_cast<const Pack16<A>*>(
        h_s + (t & 1) * buffer + it.r * p.ld);
    A zi = 0, zo = 0, zc = 0;
    for (int u = it.part; u < packs; u += p.lanes) {
      const Pack16<A> h = load(h_r + u);
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
  const int packs = it.active ? p.padded / Pack16<A>::kSize : 0;
  const auto [w_i, w_o, w_c] = gate_rows(w_s, p, it.jl);
  for (int64_t t = a.steps - 1; t >= end; --t) {
    A recurrent = gh_n; // dZ_{t+1} W_h at (r, j); grad_h_n at T - 1
    if (t != a.steps - 1) {
      const A* row = dz_s + ((t + 1) & 1) * buffer + it.r * p.ld;
      const auto* dz_i = reinterpret_cast<const Pack16<A>*>(row);
      const auto* dz_o = reinterpret_cast<const Pack16<A>*>(row + p.padded);
      const auto* dz_c = reinterpret_cast<const Pack16<A>*>(row + 2 * p.padded);
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

template <typename T, bool Backward>
const void* kernel_of() {
  return Backward ? reinterpret_cast<const void*>(&cluster_backward_kernel<T>)
                  : reinterpret_cast<const void*>(&cluster_forward_kernel<T>);
}

// The (row, column) items of a block of a cluster's tile where the batch is
// cut into tiles: a step's time grows with a block's items
// (docs/performance.md, "Why these thresholds").
constexpr int64_t kTileItems = 64;

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
            &clusters, kernel_of<T, Backward>(), &launch.config) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      clusters = 0;
    }
    clusters = std::max(clusters, 1);
    here.store(clusters, std::memory_order_release);
  }
  return clusters;
}

template <typename T, bool Backward>
cudaError_t plan_cluster_simt(int64_t batch, int64_t state, SequencePlan* out) {
  using A = acc_t<T>;
  DeviceLimits limits{};
  int most = 0;
  const cudaError_t status =
      cluster_limits<&cluster_forward_kernel<T>, &cluster_backward_kernel<T>>(
          Backward, kClusterThreads, &limits, &most);
  if (status != cudaSuccess) {
    return status;
  }
  if (most == 0) {
    out->why_not = "this GPU has no thread-block clusters (sm_90 on)";
    return cudaSuccess;
  }
  // As many blocks as a cluster holds (a power of two), or fewer where the
  // state has fewer columns.
  int64_t blocks = 1;
  while (blocks < most && blocks < state) {
    blocks *= 2;
  }
  const int64_t columns = (state + blocks - 1) / blocks;
  constexpr int64_t kSize = Pack16<A>::kSize;
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
    out->why_not =
        "the batch's tiles take more items than a round of a "
        "cluster block's threads";
    return cudaSuccess;
  }
  const int lanes = lanes_for(rows * columns, kClusterThreads);
  const int64_t ld_w = banked(padded, sizeof(A), lanes);
  const int64_t ld = banked((Backward ? 3 : 1) * padded, sizeof(A), lanes);
  const int64_t bytes =
      (3 * columns * ld_w + 2 * rows * ld) * int64_t(sizeof(A)) +
      2 * int64_t(sizeof(uint64_t)); // and the buffers' barriers
  if (bytes > limits.shared_bytes) {
    out->why_not =
        "W_h's slices and the tiles do not fit in the shared "
        "memory of one cluster";
    return cudaSuccess;
  }
  out->kernel = SequenceKernel::kClusterSimt;
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
template <typename T>
cudaError_t plan_simt(
    int64_t batch,
    int64_t state,
    bool backward,
    SequencePlan* out) {
  return backward ? plan_cluster_simt<T, true>(batch, state, out)
                  : plan_cluster_simt<T, false>(batch, state, out);
}

template <typename T, bool Backward, typename Args>
cudaError_t launch_simt(
    const Args& args,
    const SequencePlan& plan,
    void* /*workspace*/,
    cudaStream_t stream) {
  return launch_clusters(
      kernel_of<T, Backward>(),
      args,
      plan.cluster,
      plan,
      kClusterThreads,
      stream);
}

} // namespace

template <typename T>
const PersistentKernel<T>& cluster_simt_kernel() {
  static constexpr PersistentKernel<T> kKernel{
      &plan_simt<T>, &launch_simt<T, false>, &launch_simt<T, true>};
  return kKernel;
}

#define LLTM_INSTANTIATE(T) \
  template const PersistentKernel<T>& cluster_simt_kernel<T>();

LLTM_FOR_EACH_TYPE(LLTM_INSTANTIATE)

#undef LLTM_INSTANTIATE

} // namespace lltm::cuda::detail
