// Fused LLTM sequence steps on tensor cores, for float16 and bfloat16: the
// steps of held.cu, with the recurrent GEMM in 16 x 16 x 16 WMMA
// fragments that accumulate in float.
//
// Forward, step t (z holds P_t = input_t W_x^T on entry):
//   Z = P_t + b + h_{t-1} W_h^T, then the cell (step_forward_epilogue)
// Backward, step t:
//   gh = grad_h + dZ_{t+1} W_h, then the cell's backward
//   (step_backward_epilogue)
//
// Work split: block (x, y) computes rows [x BM, x BM + BM) and state columns
// [y BN, y BN + BN): of all three gates in the forward. Its warps form KS
// groups along k; group grp takes chunks grp, grp + KS, ... of C values of
// k, and in a group warp w owns the 16 x 16 tile (w / NT, w % NT) of the
// block's rows and columns (of each gate, in the forward). Chunks pass from
// global memory through registers into shared memory, the next one in
// flight while this one is multiplied. Then every group leaves its sums in
// shared memory, and each (row, column) of the epilogue is one thread's,
// which adds the groups' sums in a fixed order: results repeat bit for bit,
// and c (or dc) may be updated in place.
//
// Where the grid of a step fits on the GPU at once, one cooperative launch
// per direction runs every step, a barrier among the blocks of a row tile
// between them (no launch, and no host time, per step); else one launch per
// step.
#include "cuda/sequence/fused/epilogue.h"
#include "cuda/sequence/fused/steps.h"

#include "cuda/common/device.h"
#include "cuda/sequence/sequence.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace lltm::cuda::detail {
namespace {

namespace wmma = nvcuda::wmma;

constexpr int kFrag = 16; // a fragment's rows, columns and depth
// Elements past each shared row: rows stay 16-byte aligned for the packed
// stores and 32-byte aligned every 16 rows for the fragment loads, and
// neighbouring rows start in different banks.
constexpr int kPad = 8;
constexpr int kSumPad = 4; // the same, for the float sums

template <int MT_, int NT_, int KS_, int C_>
struct MmaTile {
  static constexpr int NT = NT_;
  static constexpr int KS = KS_;
  static constexpr int C = C_;
  static constexpr int BM = kFrag * MT_;
  static constexpr int BN = kFrag * NT_;
  static constexpr int group = 32 * MT_ * NT_; // threads of a group
  static constexpr int threads = group * KS;
  // Blocks per multiprocessor that a cooperative launch asks room for: the
  // more, the larger the grid that runs all steps in one launch.
  static constexpr int resident = threads <= 256 ? 2 : 1;
};

// The epilogue's (row, column) items of a block, BM x BN: thread x takes
// items x + n threads for n < epilogue_items, f(n, b, j) for those inside
// the problem (row b, state column j). The same thread each step: c and dc
// stay one thread's.
template <typename P>
constexpr int epilogue_items = (P::BM * P::BN + P::threads - 1) / P::threads;

// Whether the cooperative kernels of tile P load the epilogue's inputs
// before the barrier, while other blocks finish the step before (as the
// held kernels of held.cu do): where a thread's items are few enough
// to wait in registers, the smallest tiles, which the small batches take.
// There a step is a chain of round trips to memory, and this takes one off.
template <typename P>
constexpr bool prefetches = epilogue_items<P> <= 2;

template <typename P, typename F>
__device__ __forceinline__ void each_epilogue_item(
    int64_t b0,
    int j0,
    int64_t B,
    int S,
    F&& f) {
  auto item = [&](int n) {
    const int e = static_cast<int>(threadIdx.x) + n * P::threads;
    const int r = e / P::BN;
    const int64_t b = b0 + r;
    const int j = j0 + (e - r * P::BN);
    if (e < P::BM * P::BN && b < B && j < S) {
      f(n, b, j);
    }
  };
  if constexpr (prefetches<P>) { // n indexes registers
#pragma unroll
    for (int n = 0; n < epilogue_items<P>; ++n) {
      item(n);
    }
  } else { // one item's registers at a time
#pragma unroll 1
    for (int n = 0; n < epilogue_items<P>; ++n) {
      item(n);
    }
  }
}

// A chunk of R rows by W columns of a row-major operand, on its way to
// shared memory: held by the NG threads of a group, V elements per access.
template <typename T, int R, int W, int V, int NG>
struct Staged {
  static constexpr int per_row = W / V;
  static constexpr int vectors = R * per_row;
  static constexpr int L = (vectors + NG - 1) / NG;
  Pack<T, V> v[L];

  // Row r of the chunk is row rows(r) of src (-1: past the end), columns
  // [col0, col0 + W); columns from `cols` on read as zero. With V > 1 the
  // caller has made `cols`, ld and col0 multiples of V, and src aligned.
  // Shared: src was written by other blocks in this launch (the sequence's
  // h or dZ, before the last barrier), so the loads go past L1, as
  // load_shared's.
  template <bool Shared, typename Rows>
  __device__ __forceinline__ void fetch(
      const T* src,
      int64_t ld,
      Rows&& rows,
      int col0,
      int cols,
      int tid) {
#pragma unroll
    for (int l = 0; l < L; ++l) {
      const int e = tid + l * NG;
      const int r = e / per_row;
      const int col = col0 + (e - r * per_row) * V;
      const int64_t row = e < vectors ? rows(r) : -1;
      if (row >= 0 && col < cols) {
        const T* p = src + row * ld + col;
        if constexpr (!Shared) {
          v[l] = *reinterpret_cast<const Pack<T, V>*>(p);
        } else if constexpr (V == 8) {
          *reinterpret_cast<uint4*>(&v[l]) =
              __ldcg(reinterpret_cast<const uint4*>(p));
        } else {
          static_assert(V == 1, "a pack of 8 or 1");
          v[l].v[0] = load_shared(p);
        }
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          v[l].v[j] = zero_bits<T>();
        }
      }
    }
  }

  // Into shared memory: row r at dst + r ld.
  __device__ __forceinline__ void stash(T* dst, int ld, int tid) const {
#pragma unroll
    for (int l = 0; l < L; ++l) {
      const int e = tid + l * NG;
      if (e < vectors) {
        const int r = e / per_row;
        *reinterpret_cast<Pack<T, V>*>(dst + r * ld + (e - r * per_row) * V) =
            v[l];
      }
    }
  }
};

// One step's tile of the forward; inputs(n, b, j): the epilogue's inputs
// (ForwardEpilogueInputs) of the thread's item n, at row b, column j.
template <typename T, typename P, int V, typename Inputs>
__device__ __forceinline__ void forward_tile(
    const StepForwardArgs<T>& a,
    Inputs&& inputs) {
  if constexpr (!has_fragments<T>()) {
    __trap(); // launched only where step_mma_runs
  } else {
    constexpr int BM = P::BM, BN = P::BN, C = P::C, KS = P::KS;
    constexpr int NG = P::group;
    constexpr int LD = C + kPad;
    constexpr int SLD = BN + kSumPad;
    constexpr int per_group = (BM + 3 * BN) * LD;
    constexpr int operands = KS * per_group * static_cast<int>(sizeof(T));
    constexpr int sums = KS * 3 * BM * SLD * static_cast<int>(sizeof(float));
    __shared__ __align__(
        128) unsigned char smem[operands > sums ? operands : sums];
    const int S = static_cast<int>(a.state);
    const int64_t B = a.batch;
    const int grp = static_cast<int>(threadIdx.x) / NG;
    const int tid = static_cast<int>(threadIdx.x) - grp * NG;
    const int rt = tid / 32 / P::NT;
    const int ct = tid / 32 % P::NT;
    const int64_t b0 = int64_t(blockIdx.x) * BM;
    const int j0 = static_cast<int>(blockIdx.y) * BN;
    T* h_s = reinterpret_cast<T*>(smem) + grp * per_group;
    T* w_s = h_s + BM * LD;
    Staged<T, BM, C, V, NG> h_r;
    Staged<T, 3 * BN, C, V, NG> w_r;
    wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> acc[3];
#pragma unroll
    for (int g = 0; g < 3; ++g) {
      wmma::fill_fragment(acc[g], 0.0f);
    }
    auto fetch = [&](int k0) {
      h_r.template fetch<true>(
          a.h,
          S,
          [&](int r) { return b0 + r < B ? b0 + r : int64_t(-1); },
          k0,
          S,
          tid);
      // Row g BN + jl of the chunk: row g S + j0 + jl of W_h.
      w_r.template fetch<false>(
          a.w,
          a.ld_w,
          [&](int r) {
            const int g = r / BN;
            const int j = j0 + r - g * BN;
            return j < S ? int64_t(g) * S + j : int64_t(-1);
          },
          k0,
          S,
          tid);
    };
    auto stash = [&]() {
      h_r.stash(h_s, LD, tid);
      w_r.stash(w_s, LD, tid);
    };
    over_chunks<KS, C, kFrag>(S, grp, fetch, stash, [&](int kk) {
      wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, wmma::row_major> x;
      wmma::load_matrix_sync(x, h_s + rt * kFrag * LD + kk, LD);
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, wmma::col_major>
            y;
        wmma::load_matrix_sync(y, w_s + (g * BN + ct * kFrag) * LD + kk, LD);
        wmma::mma_sync(acc[g], x, y, acc[g]);
      }
    });
    auto* sum = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int g = 0; g < 3; ++g) {
      wmma::store_matrix_sync(
          sum + ((grp * 3 + g) * BM + rt * kFrag) * SLD + ct * kFrag,
          acc[g],
          SLD,
          wmma::mem_row_major);
    }
    __syncthreads();
    each_epilogue_item<P>(b0, j0, B, S, [&](int n, int64_t b, int j) {
      const int r = static_cast<int>(b - b0);
      const int c = j - j0;
      float z[3] = {0.0f, 0.0f, 0.0f};
      for (int q = 0; q < KS; ++q) {
#pragma unroll
        for (int g = 0; g < 3; ++g) {
          z[g] += sum[((q * 3 + g) * BM + r) * SLD + c];
        }
      }
      finish_forward_epilogue(a, b, j, inputs(n, b, j), z[0], z[1], z[2]);
    });
  }
}

// One step's tile of the backward; inputs as forward_tile's
// (BackwardEpilogueInputs).
template <typename T, typename P, int V, typename Inputs>
__device__ __forceinline__ void backward_tile(
    const StepBackwardArgs<T>& a,
    float* dc,
    Inputs&& inputs) {
  if constexpr (!has_fragments<T>()) {
    __trap(); // launched only where step_mma_runs
  } else {
    constexpr int BM = P::BM, BN = P::BN, C = P::C, KS = P::KS;
    constexpr int NG = P::group;
    constexpr int LD = C + kPad; // of dZ_{t+1}'s chunk, [BM][C]
    constexpr int WLD = BN + kPad; // of W_h's, [C][BN]
    constexpr int SLD = BN + kSumPad;
    constexpr int per_group = BM * LD + C * WLD;
    constexpr int operands = KS * per_group * static_cast<int>(sizeof(T));
    constexpr int sums = KS * BM * SLD * static_cast<int>(sizeof(float));
    __shared__ __align__(
        128) unsigned char smem[operands > sums ? operands : sums];
    const int S = static_cast<int>(a.state);
    const int K = 3 * S; // dZ's row length
    const int64_t B = a.batch;
    const int grp = static_cast<int>(threadIdx.x) / NG;
    const int tid = static_cast<int>(threadIdx.x) - grp * NG;
    const int rt = tid / 32 / P::NT;
    const int ct = tid / 32 % P::NT;
    const int64_t b0 = int64_t(blockIdx.x) * BM;
    const int j0 = static_cast<int>(blockIdx.y) * BN;
    const bool recurrent = a.dz_next != nullptr;
    auto* sum = reinterpret_cast<float*>(smem);
    if (recurrent) {
      T* d_s = reinterpret_cast<T*>(smem) + grp * per_group;
      T* w_s = d_s + BM * LD;
      Staged<T, BM, C, V, NG> d_r;
      Staged<T, C, BN, V, NG> w_r;
      wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      auto fetch = [&](int k0) {
        d_r.template fetch<true>(
            a.dz_next,
            K,
            [&](int r) { return b0 + r < B ? b0 + r : int64_t(-1); },
            k0,
            K,
            tid);
        // Rows k0 + r of W_h, columns [j0, j0 + BN).
        w_r.template fetch<false>(
            a.w,
            a.ld_w,
            [&](int r) { return k0 + r < K ? int64_t(k0 + r) : int64_t(-1); },
            j0,
            S,
            tid);
      };
      auto stash = [&]() {
        d_r.stash(d_s, LD, tid);
        w_r.stash(w_s, WLD, tid);
      };
      over_chunks<KS, C, kFrag>(K, grp, fetch, stash, [&](int kk) {
        wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, wmma::row_major>
            x;
        wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, wmma::row_major>
            y;
        wmma::load_matrix_sync(x, d_s + rt * kFrag * LD + kk, LD);
        wmma::load_matrix_sync(y, w_s + kk * WLD + ct * kFrag, WLD);
        wmma::mma_sync(acc, x, y, acc);
      });
      wmma::store_matrix_sync(
          sum + (grp * BM + rt * kFrag) * SLD + ct * kFrag,
          acc,
          SLD,
          wmma::mem_row_major);
      __syncthreads();
    }
    each_epilogue_item<P>(b0, j0, B, S, [&](int n, int64_t b, int j) {
      const int r = static_cast<int>(b - b0);
      const int c = j - j0;
      float total = 0.0f;
      if (recurrent) {
        for (int q = 0; q < KS; ++q) {
          total += sum[(q * BM + r) * SLD + c];
        }
      }
      finish_backward_epilogue(a, dc, b, j, inputs(n, b, j), total);
    });
  }
}

// One step per launch: the epilogue loads its inputs after the product.
template <typename T, typename P, int V>
__global__ void __launch_bounds__(P::threads)
    step_forward_mma_kernel(const StepForwardArgs<T> a) {
  forward_tile<T, P, V>(
      a, [&](int, int64_t b, int j) { return load_forward_epilogue(a, b, j); });
}

template <typename T, typename P, int V>
__global__ void __launch_bounds__(P::threads)
    step_backward_mma_kernel(const StepBackwardArgs<T> a, float* dc) {
  backward_tile<T, P, V>(a, dc, [&](int, int64_t b, int j) {
    return load_backward_epilogue(a, dc, b, j);
  });
}

// Every step of a direction in a cooperative launch (every_step), tile(step,
// inputs) each: inputs(n, b, j) gives the epilogue's inputs of item n,
// load(step, b, j) read before the barrier where P prefetches (into
// registers, of type Inputs), else when the tile asks for them.
template <
    typename P,
    typename Inputs,
    typename Args,
    typename Load,
    typename Tile>
__device__ __forceinline__ void prefetching_steps(
    const Args& a,
    bool backward,
    unsigned* arrivals,
    Load&& load,
    Tile&& tile) {
  const int64_t b0 = int64_t(blockIdx.x) * P::BM;
  const int j0 = static_cast<int>(blockIdx.y) * P::BN;
  const int S = static_cast<int>(a.state);
  Inputs in[prefetches<P> ? epilogue_items<P> : 1];
  every_step(
      a,
      backward,
      arrivals,
      [&](const auto& step) {
        if constexpr (prefetches<P>) {
          each_epilogue_item<P>(
              b0, j0, a.batch, S, [&](int n, int64_t b, int j) {
                in[n] = load(step, b, j);
              });
        }
      },
      [&](const auto& step) {
        tile(step, [&](int n, int64_t b, int j) {
          if constexpr (prefetches<P>) {
            return in[n];
          } else {
            return load(step, b, j);
          }
        });
      });
}

// Every step in one cooperative launch (run_steps, steps.h).
template <typename T, typename P, int V>
__global__ void __launch_bounds__(P::threads, P::resident)
    fused_forward_mma_kernel(const FusedForwardArgs<T> a, unsigned* arrivals) {
  prefetching_steps<P, ForwardEpilogueInputs<T>>(
      a,
      false,
      arrivals,
      [](const StepForwardArgs<T>& step, int64_t b, int j) {
        return load_forward_epilogue(step, b, j);
      },
      [](const StepForwardArgs<T>& step, auto&& inputs) {
        forward_tile<T, P, V>(step, inputs);
      });
}

template <typename T, typename P, int V>
__global__ void __launch_bounds__(P::threads, P::resident)
    fused_backward_mma_kernel(
        const FusedBackwardArgs<T> a,
        float* dc,
        unsigned* arrivals) {
  prefetching_steps<P, BackwardEpilogueInputs<T>>(
      a,
      true,
      arrivals,
      [dc](const StepBackwardArgs<T>& step, int64_t b, int j) {
        return load_backward_epilogue(step, dc, b, j);
      },
      [dc](const StepBackwardArgs<T>& step, auto&& inputs) {
        backward_tile<T, P, V>(step, dc, inputs);
      });
}

// The tiles, from small to large: <16-row tiles, 16-column tiles, groups
// over k, chunk>. As in held.cu, a launch takes the largest that still
// fills every multiprocessor, or the smallest. At the small batches that
// take it a step is a chain of round trips to memory, one per round of
// chunks, so the smallest splits k the most: 8 groups in the forward (a
// round per 256 of state_size), 16 in the backward (per 512 / 3).
using Forward0 = MmaTile<1, 1, 8, 32>;
using Forward1 = MmaTile<2, 2, 2, 32>;
using Forward2 = MmaTile<4, 2, 1, 64>;
using Backward0 = MmaTile<1, 1, 16, 32>;
using Backward1 = MmaTile<2, 2, 2, 32>;
using Backward2 = MmaTile<4, 2, 1, 64>;

// Whether a launch takes tile P over the next smaller tile Q: where P fills
// every multiprocessor, or where P leaves at most one in sixteen idle and
// Q's grid is too large for one cooperative launch (more than Q::resident
// blocks per multiprocessor). Then a few idle multiprocessors cost less
// than a launch per step; where Q's grid fits at once, Q stays faster
// (docs/performance.md, "Why these thresholds").
template <typename P, typename Q>
bool takes(int64_t batch, int64_t state, int64_t sms) {
  const dim3 p = grid_of<P>(batch, state);
  const dim3 q = grid_of<Q>(batch, state);
  const int64_t blocks = int64_t(p.x) * p.y;
  return blocks >= sms ||
      (16 * blocks >= 15 * sms && int64_t(q.x) * q.y > Q::resident * sms);
}

// The tensor-core kernels of tile P with loads of V elements.
template <typename T, typename P, int V, bool Backward>
constexpr auto fused_mma_kernel() {
  if constexpr (Backward) {
    return &fused_backward_mma_kernel<T, P, V>;
  } else {
    return &fused_forward_mma_kernel<T, P, V>;
  }
}

template <typename T, bool Backward, typename P>
bool mma_cooperative(
    int vector,
    const FusedShape& shape,
    const DeviceLimits& limits) {
  return vector == 8
      ? cooperative<fused_mma_kernel<T, P, 8, Backward>(), P>(shape, limits)
      : cooperative<fused_mma_kernel<T, P, 1, Backward>(), P>(shape, limits);
}

template <
    typename T,
    bool Backward,
    typename Large,
    typename Middle,
    typename Small>
void plan_tiles(
    const FusedShape& shape,
    const DeviceLimits& limits,
    SequencePlan* out) {
  const int64_t sms = limits.multiprocessors;
  const int index = fills<Large>(shape.batch, shape.state, sms)
      ? 0
      : (takes<Middle, Small>(shape.batch, shape.state, sms) ? 1 : 2);
  // 16-byte loads where the state and W_h's rows are whole vectors of 8
  // (the caller then aligns the operands, and every step's rows start
  // aligned too).
  out->kernel = SequenceKernel::kFusedMma;
  out->vector = shape.state % 8 == 0 && shape.ld_w % 8 == 0 ? 8 : 1;
  with_tile<Large, Middle, Small>(index, [&](auto tile) {
    using P = decltype(tile);
    set_tile<P>(out, index);
    out->cooperative =
        mma_cooperative<T, Backward, P>(out->vector, shape, limits);
    return cudaSuccess;
  });
}

// Whether the operands are as a plan of 16-byte loads needs them.
template <typename T>
bool vectors_fit(
    const SequencePlan& plan,
    std::initializer_list<const void*> rows,
    const T* w,
    int64_t ld_w,
    int64_t state) {
  if (plan.vector != 8) {
    return true;
  }
  return aligned16(rows) && aligned16({w}) && state % 8 == 0 && ld_w % 8 == 0;
}

// Every block, where the type runs on this GPU's tensor cores.
template <typename T>
bool plan_mma(
    const FusedShape& shape,
    const DeviceLimits& limits,
    bool backward,
    SequencePlan* out) {
  if (!step_mma_runs<T>(limits)) {
    return false;
  }
  backward
      ? plan_tiles<T, true, Backward2, Backward1, Backward0>(shape, limits, out)
      : plan_tiles<T, false, Forward2, Forward1, Forward0>(shape, limits, out);
  return true;
}

template <typename T>
cudaError_t launch_mma_forward(
    const FusedForwardArgs<T>& a,
    const SequencePlan& plan,
    unsigned* arrivals,
    cudaStream_t stream) {
  if (!vectors_fit(plan, {a.h0, a.output}, a.w, a.ld_w, a.state)) {
    return cudaErrorInvalidValue;
  }
  return with_tile<Forward2, Forward1, Forward0>(plan.tile, [&](auto tile) {
    using P = decltype(tile);
    static_assert(P::BM >= kArrivalRows);
    return plan.vector == 8
        ? run_steps<
              &fused_forward_mma_kernel<T, P, 8>,
              &step_forward_mma_kernel<T, P, 8>,
              P>(a, false, plan.cooperative, arrivals, stream)
        : run_steps<
              &fused_forward_mma_kernel<T, P, 1>,
              &step_forward_mma_kernel<T, P, 1>,
              P>(a, false, plan.cooperative, arrivals, stream);
  });
}

template <typename T>
cudaError_t launch_mma_backward(
    const FusedBackwardArgs<T>& a,
    const SequencePlan& plan,
    float* dc,
    unsigned* arrivals,
    cudaStream_t stream) {
  if (!vectors_fit(plan, {a.d_gates}, a.w, a.ld_w, a.state)) {
    return cudaErrorInvalidValue;
  }
  return with_tile<Backward2, Backward1, Backward0>(plan.tile, [&](auto tile) {
    using P = decltype(tile);
    static_assert(P::BM >= kArrivalRows);
    return plan.vector == 8
        ? run_steps<
              &fused_backward_mma_kernel<T, P, 8>,
              &step_backward_mma_kernel<T, P, 8>,
              P>(a, true, plan.cooperative, arrivals, stream, dc)
        : run_steps<
              &fused_backward_mma_kernel<T, P, 1>,
              &step_backward_mma_kernel<T, P, 1>,
              P>(a, true, plan.cooperative, arrivals, stream, dc);
  });
}

} // namespace

template <typename T>
const FusedKernel<T>& mma_kernel() {
  static constexpr FusedKernel<T> kKernel{
      &plan_mma<T>, &launch_mma_forward<T>, &launch_mma_backward<T>};
  return kKernel;
}

template const FusedKernel<__half>& mma_kernel<__half>();
template const FusedKernel<__nv_bfloat16>& mma_kernel<__nv_bfloat16>();

} // namespace lltm::cuda::detail
