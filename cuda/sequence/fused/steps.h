// What the kernels of the fused steps share: chunked.cu and held.cu (the
// GEMM on CUDA cores) and mma.cu (on tensor cores, float16 and bfloat16).
// The arguments of one step and how a sequence's give them, the barriers of
// a cooperative launch, the launches of a plan (one cooperative launch, or
// one per step), the tile pickers, and each kernel's planner and launchers,
// which plan.cu calls. The kernels' device code shares epilogue.h.
#pragma once

#include "cuda/common/device.h"
#include "cuda/sequence/sequence.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace lltm::cuda::detail {

// Step t of the forward.
template <typename T>
struct StepForwardArgs {
  const T* h; // h_{t-1}: [batch, state], dense
  const T* w; // W_h, as in SequenceForwardArgs
  int64_t ld_w;
  // [batch, 3 * state], dense: P_t on entry; the activations [i | o | g]
  // on exit when `save`, else unchanged.
  T* z;
  const T* bias; // [3 * state]
  const T* c; // c_{t-1}: [batch, state], dense; may equal c_out
  T* h_out; // h_t: [batch, state], dense
  T* c_out; // c_t: [batch, state], dense
  T* h_n; // a second copy of h_t (the last step), or nullptr
  T* c_n; // of c_t, with h_n
  bool save;
  int64_t batch;
  int64_t state;
};

template <typename T>
__host__ __device__ __forceinline__ StepForwardArgs<T> step_of(
    const FusedForwardArgs<T>& a,
    int64_t t) {
  const int64_t BS = a.batch * a.state;
  const int64_t cell_step = a.save ? BS : 0; // else c_n, written over
  const bool last = t == a.steps - 1;
  StepForwardArgs<T> s{};
  s.h = t == 0 ? a.h0 : a.output + (t - 1) * BS;
  s.w = a.w;
  s.ld_w = a.ld_w;
  s.z = a.gates + t * 3 * BS;
  s.bias = a.bias;
  s.c = t == 0 ? a.c0 : a.cells + (t - 1) * cell_step;
  s.h_out = a.output + t * BS;
  s.c_out = a.cells + t * cell_step;
  s.h_n = last ? a.h_n : nullptr;
  s.c_n = last && a.save ? a.c_n : nullptr;
  s.save = a.save;
  s.batch = a.batch;
  s.state = a.state;
  return s;
}

// Step t of the backward. dc, the running cell gradient, is in the
// workspace, updated in place.
template <typename T>
struct StepBackwardArgs {
  Strided<T> grad_h; // grad_output[t], or none
  // dZ_{t+1}: [batch, 3 * state], dense; nullptr at t = T - 1, where
  // grad_h_n takes the place of dZ_{t+1} W_h and grad_c_n that of dc_t.
  const T* dz_next;
  Strided<T> grad_h_n;
  Strided<T> grad_c_n;
  const T* w; // W_h, as in SequenceForwardArgs
  int64_t ld_w;
  const T* cell; // c_t: [batch, state], dense
  const T* gates; // the activations of step t: [batch, 3 * state], dense
  T* dz; // dZ_t: [batch, 3 * state], dense
  T* d_c0; // dc_{t-1} once more (t = 0), or nullptr
  int64_t batch;
  int64_t state;
};

template <typename T>
__host__ __device__ __forceinline__ StepBackwardArgs<T> step_of(
    const FusedBackwardArgs<T>& a,
    int64_t t) {
  const int64_t BS = a.batch * a.state;
  const Strided3<T>& g = a.grad_output;
  StepBackwardArgs<T> s{};
  s.grad_h = {
      g.data == nullptr ? nullptr : g.data + t * g.step_stride,
      g.row_stride,
      g.col_stride};
  s.dz_next = t == a.steps - 1 ? nullptr : a.d_gates + (t + 1) * 3 * BS;
  s.grad_h_n = a.grad_h_n;
  s.grad_c_n = a.grad_c_n;
  s.w = a.w;
  s.ld_w = a.ld_w;
  s.cell = a.cells + t * BS;
  s.gates = a.gates + t * 3 * BS;
  s.dz = a.d_gates + t * 3 * BS;
  s.d_c0 = t == 0 ? a.d_c0 : nullptr;
  s.batch = a.batch;
  s.state = a.state;
  return s;
}

// One launch per step: launch(step_of(a, t)) for t from the first step of
// the direction to the last (the forward from 0, the backward from T - 1),
// up to the first error.
template <typename Args, typename Launch>
cudaError_t each_step(const Args& a, bool backward, Launch&& launch) {
  for (int64_t i = 0; i < a.steps; ++i) {
    const int64_t t = backward ? a.steps - 1 - i : i;
    if (const cudaError_t status = launch(step_of(a, t));
        status != cudaSuccess) {
      return status;
    }
  }
  return cudaSuccess;
}

// Where every step's grid fits on the GPU at once, one cooperative launch
// per direction runs them all instead: no launch and no host time per step.
// Each (row, column) of a step's epilogue stays with the same thread from
// step to step, so c and dc are still read and written by one thread; what
// other blocks wrote (h_{t-1}, dZ_{t+1}) is read with load_shared.
//
// Between steps a block waits only for the blocks of its own row tile
// (blockIdx.x): batch rows are independent recurrences, and a step reads
// the rows of h_{t-1} (or dZ_{t+1}) that those blocks wrote, whole. Each
// block counts its arrival on its row tile's counter (release) and waits
// for the count of the step (acquire). A grid barrier made every block
// wait for the slowest of the grid, through one counter that all of them
// increment (docs/performance.md, "Why these thresholds").
//
// The counters, one per row tile of the smallest tile (kArrivalRows rows),
// are the caller's workspace (arrivals_size); the kernel clears them.
constexpr int64_t kArrivalRows = 16;

inline size_t arrivals_size(int64_t batch) {
  return static_cast<size_t>((batch + kArrivalRows - 1) / kArrivalRows) *
      sizeof(unsigned);
}

__device__ __forceinline__ void arrive(unsigned* count) {
  __syncthreads(); // every thread's stores of the step are made
  if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count)
                 : "memory");
#endif
  }
}

__device__ __forceinline__ void wait_for(const unsigned* count, unsigned n) {
  if (threadIdx.x == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                   : "=r"(seen)
                   : "l"(count)
                   : "memory");
    } while (seen < n);
#endif
  }
  __syncthreads();
}

// Block (x, 0) clears row tile x's counter, and one grid barrier, before
// the first step, orders that before any arrival.
__device__ __forceinline__ void clear_arrivals(unsigned* arrivals) {
  if (blockIdx.y == 0 && threadIdx.x == 0) {
    arrivals[blockIdx.x] = 0;
  }
  cooperative_groups::this_grid().sync();
}

// The barrier before step i (i > 0) of a launch.
__device__ __forceinline__ void wait_for_step(
    const unsigned* arrivals,
    int64_t i) {
  wait_for(arrivals + blockIdx.x, static_cast<unsigned>(i) * gridDim.y);
}

// Whether the blocks of a cooperative launch can count the arrivals of
// `steps` steps of `grid` in 32 bits.
inline bool counts_fit(int64_t steps, dim3 grid) {
  return steps * grid.y <= int64_t(UINT32_MAX);
}

// The grid of a tile P (P::BM rows by P::BN state columns per block), and
// whether it has a block for every multiprocessor.
template <typename P>
dim3 grid_of(int64_t batch, int64_t state) {
  return dim3(
      static_cast<unsigned int>((batch + P::BM - 1) / P::BM),
      static_cast<unsigned int>((state + P::BN - 1) / P::BN));
}

template <typename P>
bool fills(int64_t batch, int64_t state, int64_t sms) {
  const dim3 g = grid_of<P>(batch, state);
  return int64_t(g.x) * g.y >= sms;
}

// Whether a grid of `blocks` blocks of Kernel (of `threads` threads) can be
// resident at once on this device, for a cooperative launch. The occupancy
// is asked once per kernel and device: kernels of the same tile differ in
// their registers, so each keeps its own answer.
template <auto Kernel>
bool resident(int threads, int64_t blocks, const DeviceLimits& limits) {
  if (!limits.cooperative) {
    return false;
  }
  static std::array<std::atomic<int>, 64> per_sm{}; // + 1, 0: not asked yet
  std::atomic<int>& slot = per_sm[device_slot(limits.device)];
  int known = slot.load(std::memory_order_acquire);
  if (known == 0) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, Kernel, threads, 0) !=
        cudaSuccess) {
      (void)cudaGetLastError(); // not sticky: the steps run one per launch
      return false;
    }
    known = n + 1;
    slot.store(known, std::memory_order_release);
  }
  return int64_t(known - 1) * limits.multiprocessors >= blocks;
}

// Every step of a direction (the backward's when `backward`), on tile P's
// grid: Fused(a, extra..., arrivals) in one cooperative launch where the
// plan says so, else Step(step_of(a, t), extra...) once per step.
template <auto Fused, auto Step, typename P, typename Args, typename... Extra>
cudaError_t run_steps(
    const Args& a,
    bool backward,
    bool cooperative,
    unsigned* arrivals,
    cudaStream_t stream,
    Extra... extra) {
  const dim3 grid = grid_of<P>(a.batch, a.state);
  constexpr int threads = P::threads;
  if constexpr (!std::is_same_v<decltype(Fused), std::nullptr_t>) {
    if (cooperative) {
      Args args = a;
      void* params[] = {&args, &extra..., &arrivals};
      const cudaError_t launched = cudaLaunchCooperativeKernel(
          reinterpret_cast<const void*>(Fused),
          grid,
          dim3(threads),
          params,
          0,
          stream);
      return launched != cudaSuccess ? launched : cudaGetLastError();
    }
  }
  if (cooperative) {
    return cudaErrorInvalidValue; // a type without cooperative kernels
  }
  return each_step(a, backward, [&](const auto& step) {
    Step<<<grid, threads, 0, stream>>>(step, extra...);
    return cudaGetLastError();
  });
}

// A fused block as the planners see it.
struct FusedShape {
  int64_t steps;
  int64_t batch;
  int64_t state;
  int64_t ld_w;
};

// Whether every step of tile P's grid runs in one cooperative launch of
// Fused: two steps or more, a barrier's counts in 32 bits, and the grid
// resident at once.
template <auto Fused, typename P>
bool cooperative(const FusedShape& s, const DeviceLimits& limits) {
  const dim3 grid = grid_of<P>(s.batch, s.state);
  return s.steps > 1 && counts_fit(s.steps, grid) &&
      resident<Fused>(P::threads, int64_t(grid.x) * grid.y, limits);
}

// The index, largest first, of the first of Tiles whose grid fills every
// multiprocessor; the smallest's where none does. A step at these sizes is
// too short for a partial wave of large tiles, and small tiles split k over
// groups of threads to keep enough of them busy.
template <typename... Tiles>
int largest_filling(int64_t batch, int64_t state, int64_t sms) {
  int index = 0;
  const bool found =
      ((fills<Tiles>(batch, state, sms) || (++index, false)) || ...);
  return found ? index : static_cast<int>(sizeof...(Tiles)) - 1;
}

// f(Tile{}) for the tile at `index` of Tiles, largest first: a plan's tile
// as a type. cudaErrorInvalidValue for an index past them.
template <typename... Tiles, typename F>
cudaError_t with_tile(int index, F&& f) {
  int i = 0;
  cudaError_t status = cudaErrorInvalidValue;
  (void)((i++ == index && ((status = f(Tiles{})), true)) || ...);
  return status;
}

// A plan's tile: its index and its extent, for the variant's name.
template <typename P>
void set_tile(SequencePlan* out, int index) {
  out->tile = index;
  out->tile_rows = P::BM;
  out->tile_columns = P::BN;
}

// The steps of a direction inside Fused: for every step s = step_of(a, t)
// in order, before(s), the barrier of the block's row tile, and tile(s).
// before reads nothing that other blocks write during the launch.
template <typename Args, typename Before, typename Tile>
__device__ __forceinline__ void every_step(
    const Args& a,
    bool backward,
    unsigned* arrivals,
    Before&& before,
    Tile&& tile) {
  clear_arrivals(arrivals);
  for (int64_t i = 0; i < a.steps; ++i) {
    const auto step = step_of(a, backward ? a.steps - 1 - i : i);
    before(step);
    if (i > 0) {
      wait_for_step(arrivals, i);
    }
    tile(step);
    if (i + 1 < a.steps) {
      arrive(arrivals + blockIdx.x);
    }
  }
}

// Whether the steps of T run on this device's tensor cores
// (mma.cu): float16 from sm_70, bfloat16 from sm_80.
template <typename T>
bool step_mma_runs(const DeviceLimits& limits) {
  if constexpr (std::is_same_v<T, __half>) {
    return limits.capability >= 70;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return limits.capability >= 80;
  } else {
    return false;
  }
}

// What each kernel of the fused steps brings to plan.cu: its plan of a
// block, where it takes the block (false: it does not), and its launches of
// a plan. `arrivals`: the counters of a cooperative launch's barriers
// (arrivals_size); `dc`: the backward's running cell gradient.
template <typename T>
struct FusedKernel {
  bool (*plan)(
      const FusedShape& shape,
      const DeviceLimits& limits,
      bool backward,
      SequencePlan* out);
  cudaError_t (*forward)(
      const FusedForwardArgs<T>& args,
      const SequencePlan& plan,
      unsigned* arrivals,
      cudaStream_t stream);
  cudaError_t (*backward)(
      const FusedBackwardArgs<T>& args,
      const SequencePlan& plan,
      acc_t<T>* dc,
      unsigned* arrivals,
      cudaStream_t stream);
};

// W_h in chunks (chunked.cu: every type), held (held.cu: float alone) and
// on tensor cores (mma.cu: float16 and bfloat16 alone).
template <typename T>
const FusedKernel<T>& chunked_kernel();
const FusedKernel<float>& held_kernel();
template <typename T>
const FusedKernel<T>& mma_kernel();

// Whether the pointers are 16-byte aligned, as a plan's vectors need.
inline bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return false;
    }
  }
  return true;
}

} // namespace lltm::cuda::detail
