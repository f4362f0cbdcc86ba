// The fused steps in float with W_h held in shared memory, from sm_80: the
// math and epilogues of chunked.cu's steps, every step in one cooperative
// launch.
//
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
// 4 (rows of 16 bytes) and the operands are 16-byte aligned (plan_held).
#include "cuda/sequence/fused/epilogue.h"
#include "cuda/sequence/fused/steps.h"
#include "cuda/sequence/fused/tiles.h"

#include "cuda/common/device.h"
#include "cuda/sequence/sequence.h"

#include <array>
#include <atomic>
#include <cstdint>

namespace lltm::cuda::detail {
namespace {

// 16 bytes from global `from` to shared `to`, or zeros where !inside, past
// L1 (.cg: the rows were written by other blocks before the barrier).
[[maybe_unused]] __device__ __forceinline__ void copy_16(
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

[[maybe_unused]] __device__ __forceinline__ float4 quad_at(const float* p) {
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
[[maybe_unused]] __device__ __forceinline__ float dot4(
    float acc,
    float4 x,
    float4 w) {
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

// The tiles held: the smallest, at batches whose grid of the next larger
// tile does not fill the GPU.
using HeldForward = Forward0;
using HeldBackward = Backward0;

template <bool Backward>
const void* held_kernel() {
  return Backward
      ? reinterpret_cast<const void*>(&held_backward_kernel<HeldBackward>)
      : reinterpret_cast<const void*>(&held_forward_kernel<HeldForward>);
}

template <typename Args, typename... Extra>
cudaError_t launch_held(
    const Args& a,
    const SequencePlan& plan,
    const void* kernel,
    dim3 grid,
    int threads,
    unsigned* arrivals,
    cudaStream_t stream,
    Extra... extra) {
  Args args = a;
  void* params[] = {&args, &extra..., &arrivals};
  const cudaError_t launched = cudaLaunchCooperativeKernel(
      kernel, grid, dim3(threads), params, plan.shared_bytes, stream);
  return launched != cudaSuccess ? launched : cudaGetLastError();
}

// W_h is held where the next larger tile's grid does not fill the GPU, on
// sm_80 on with cooperative launches, for two steps or more, a state of a
// multiple of 4 (the caller's rows operands then 16-byte aligned), and the
// smallest tile's grid resident at once with its shared memory. A failed
// query is a "no", and is cleared.
template <bool Backward>
bool plan_held_of(
    const FusedShape& shape,
    const DeviceLimits& limits,
    SequencePlan* out) {
  using P = std::conditional_t<Backward, HeldBackward, HeldForward>;
  using Next = std::conditional_t<Backward, Backward1, Forward1>;
  const size_t bytes = held_floats<P, Backward>(shape.state) * sizeof(float);
  if (fills<Next>(shape.batch, shape.state, limits.multiprocessors) ||
      limits.capability < 80 || !limits.cooperative || shape.steps < 2 ||
      shape.state % 4 != 0 ||
      bytes > static_cast<size_t>(limits.shared_bytes)) {
    return false;
  }
  const void* kernel = held_kernel<Backward>();
  // The opt-in to the most shared memory, once per device.
  static std::array<std::atomic<bool>, 64> raised{};
  std::atomic<bool>& here = raised[device_slot(limits.device)];
  if (!here.load(std::memory_order_acquire)) {
    if (cudaFuncSetAttribute(
            kernel,
            cudaFuncAttributeMaxDynamicSharedMemorySize,
            limits.shared_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    here.store(true, std::memory_order_release);
  }
  const dim3 grid = grid_of<P>(shape.batch, shape.state);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, kernel, P::threads, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  // The counters of arrivals reach steps * grid.y, in 32 bits.
  if (int64_t(per_sm) * limits.multiprocessors < int64_t(grid.x) * grid.y ||
      !counts_fit(shape.steps, grid)) {
    return false;
  }
  out->kernel = SequenceKernel::kFusedHeld;
  set_tile<P>(out, 0);
  out->cooperative = true;
  out->shared_bytes = bytes;
  return true;
}

cudaError_t launch_held_forward(
    const FusedForwardArgs<float>& a,
    const SequencePlan& plan,
    unsigned* arrivals,
    cudaStream_t stream) {
  if (!aligned16({a.h0, a.output})) {
    return cudaErrorInvalidValue;
  }
  return launch_held(
      a,
      plan,
      held_kernel<false>(),
      grid_of<HeldForward>(a.batch, a.state),
      HeldForward::threads,
      arrivals,
      stream);
}

cudaError_t launch_held_backward(
    const FusedBackwardArgs<float>& a,
    const SequencePlan& plan,
    float* dc,
    unsigned* arrivals,
    cudaStream_t stream) {
  if (!aligned16({a.d_gates})) {
    return cudaErrorInvalidValue;
  }
  return launch_held(
      a,
      plan,
      held_kernel<true>(),
      grid_of<HeldBackward>(a.batch, a.state),
      HeldBackward::threads,
      arrivals,
      stream,
      dc);
}

bool plan_held(
    const FusedShape& shape,
    const DeviceLimits& limits,
    bool backward,
    SequencePlan* out) {
  return backward ? plan_held_of<true>(shape, limits, out)
                  : plan_held_of<false>(shape, limits, out);
}

} // namespace

const FusedKernel<float>& held_kernel() {
  static constexpr FusedKernel<float> kKernel{
      &plan_held, &launch_held_forward, &launch_held_backward};
  return kKernel;
}

} // namespace lltm::cuda::detail
