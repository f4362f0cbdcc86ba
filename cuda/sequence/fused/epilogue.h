// What the fused steps' kernels share on the device (tiles.h, held.cu,
// mma.cu): loads of what other blocks wrote, the loop over chunks of k, and
// the two epilogues, the cell's math of one (row, column) once its sum over
// k is known (cuda/common/device.h states it).
#pragma once

#include "cuda/common/device.h"
#include "cuda/sequence/fused/steps.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace lltm::cuda::detail {

// A load of what other blocks of this launch wrote before its last grid
// barrier: past L1, which is not coherent across multiprocessors.
template <typename T>
__device__ __forceinline__ T load_shared(const T* p) {
  if constexpr (std::is_same_v<T, __half>) {
    return __ushort_as_half(__ldcg(reinterpret_cast<const unsigned short*>(p)));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __ushort_as_bfloat16(
        __ldcg(reinterpret_cast<const unsigned short*>(p)));
  } else {
    return __ldcg(p);
  }
}

// Whether this compilation pass has the WMMA fragments of T (float16's from
// sm_70, bfloat16's from sm_80), as step_mma_runs asks of the device: where
// it has, the steps of 16-bit types run on tensor cores, and their CUDA-core
// kernels are never launched. The host pass compiles no kernel body.
template <typename T>
__host__ __device__ constexpr bool has_fragments() {
  if constexpr (
      !std::is_same_v<T, __half> && !std::is_same_v<T, __nv_bfloat16>) {
    return false;
  } else {
#if defined(__CUDA_ARCH__)
    return __CUDA_ARCH__ >= (std::is_same_v<T, __nv_bfloat16> ? 800 : 700);
#else
    return true;
#endif
  }
}

// The loop over k in [0, K), by chunks of C: group grp of KS takes chunks
// grp, grp + KS, ..., and every group runs the same number of rounds (a
// barrier ends each), past the end on zeros. A round stashes the chunk
// fetched before it, fetches the next (in flight during this chunk's
// products), and runs multiply(kk) for kk = 0, Step, 2 Step, ... of the
// chunk. It ends on a barrier: the shared tiles may then be reused.
template <
    int KS,
    int C,
    int Step,
    typename Fetch,
    typename Stash,
    typename Multiply>
__device__ __forceinline__ void over_chunks(
    int K,
    int grp,
    Fetch&& fetch,
    Stash&& stash,
    Multiply&& multiply) {
  const int rounds = ((K + C - 1) / C + KS - 1) / KS;
  fetch(grp * C);
  for (int round = 0; round < rounds; ++round) {
    stash();
    __syncthreads();
    if (round + 1 < rounds) {
      fetch(((round + 1) * KS + grp) * C);
    }
#pragma unroll 16
    for (int kk = 0; kk < C; kk += Step) {
      multiply(kk);
    }
    __syncthreads();
  }
}

// What the forward's epilogue at row b, state column j reads besides the
// sums: P_t and the bias of the three gates, and c_{t-1}. No other block
// writes them, so the cooperative kernels load them before the barrier
// between steps, and keep them as stored until the epilogue widens them
// (stored_element in cuda/common/device.h says why).
template <typename T>
struct ForwardEpilogueInputs {
  T p[3], bias[3], c;
};

template <typename T>
__device__ __forceinline__ ForwardEpilogueInputs<T> load_forward_epilogue(
    const StepForwardArgs<T>& a,
    int64_t b,
    int j) {
  const int S = static_cast<int>(a.state);
  const T* z = a.z + b * 3 * S;
  ForwardEpilogueInputs<T> in;
#pragma unroll
  for (int g = 0; g < 3; ++g) {
    in.p[g] = z[g * S + j];
    in.bias[g] = a.bias[g * S + j];
  }
  in.c = a.c[b * S + j];
  return in;
}

// The forward's epilogue at row b, state column j < state, from the three
// gates' sums of h_{t-1} W_h^T: Z = P_t + sum + b, the cell, and its
// outputs (the activations over P_t when saving).
template <typename T>
__device__ __forceinline__ void finish_forward_epilogue(
    const StepForwardArgs<T>& a,
    int64_t b,
    int j,
    const ForwardEpilogueInputs<T>& in,
    acc_t<T> sum_i,
    acc_t<T> sum_o,
    acc_t<T> sum_c) {
  using A = acc_t<T>;
  const int S = static_cast<int>(a.state);
  T* z = a.z + b * 3 * S;
  const A zi = sum_i + widen(in.p[0]) + widen(in.bias[0]);
  const A zo = sum_o + widen(in.p[1]) + widen(in.bias[1]);
  const A zc = sum_c + widen(in.p[2]) + widen(in.bias[2]);
  const int64_t at = b * S + j;
  const CellForward<A> f = cell_forward(zi, zo, zc, widen(in.c));
  put(a.c_out + at, f.cell);
  put(a.h_out + at, f.h);
  if (a.save) {
    put(z + j, f.i);
    put(z + S + j, f.o);
    put(z + 2 * S + j, f.g);
  }
  if (a.h_n != nullptr) {
    put(a.h_n + at, f.h);
  }
  if (a.c_n != nullptr) {
    put(a.c_n + at, f.cell);
  }
}

template <typename T>
__device__ __forceinline__ void step_forward_epilogue(
    const StepForwardArgs<T>& a,
    int64_t b,
    int j,
    acc_t<T> sum_i,
    acc_t<T> sum_o,
    acc_t<T> sum_c) {
  finish_forward_epilogue(
      a, b, j, load_forward_epilogue(a, b, j), sum_i, sum_o, sum_c);
}

// What the backward's epilogue at row b, state column j reads besides the
// sum: grad_h (and grad_h_n at t = T - 1), the activations and c_t, as
// stored (as the forward's), and the running cell gradient. None of it
// comes from another block.
template <typename T>
struct BackwardEpilogueInputs {
  T grad_h, grad_h_n, i, o, g, cell;
  acc_t<T> gc;
};

template <typename T>
__device__ __forceinline__ BackwardEpilogueInputs<T> load_backward_epilogue(
    const StepBackwardArgs<T>& a,
    const acc_t<T>* dc,
    int64_t b,
    int j) {
  const int S = static_cast<int>(a.state);
  const bool recurrent = a.dz_next != nullptr;
  const int64_t at = b * S + j;
  const T* act = a.gates + b * 3 * S;
  BackwardEpilogueInputs<T> in;
  in.grad_h = stored_element(a.grad_h, b, j);
  in.grad_h_n = recurrent ? zero_bits<T>() : stored_element(a.grad_h_n, b, j);
  in.gc = recurrent ? dc[at] : load_element(a.grad_c_n, b, j);
  in.i = act[j];
  in.o = act[S + j];
  in.g = act[2 * S + j];
  in.cell = a.cell[at];
  return in;
}

// The backward's epilogue at row b, state column j < state, from the sum of
// dZ_{t+1} W_h (unused at t = T - 1, where there is no dZ_{t+1}): dZ_t, and
// dc updated in place.
template <typename T>
__device__ __forceinline__ void finish_backward_epilogue(
    const StepBackwardArgs<T>& a,
    acc_t<T>* dc,
    int64_t b,
    int j,
    const BackwardEpilogueInputs<T>& in,
    acc_t<T> sum) {
  using A = acc_t<T>;
  const int S = static_cast<int>(a.state);
  const bool recurrent = a.dz_next != nullptr;
  const int64_t at = b * S + j;
  const A gh = widen(in.grad_h) + (recurrent ? sum : widen(in.grad_h_n));
  const CellBackward<A> d = cell_backward(
      widen(in.i), widen(in.o), widen(in.g), tanh_(widen(in.cell)), gh, in.gc);
  T* dz = a.dz + b * 3 * S;
  put(dz + j, d.dz_i);
  put(dz + S + j, d.dz_o);
  put(dz + 2 * S + j, d.dz_c);
  dc[at] = d.d_cell;
  if (a.d_c0 != nullptr) {
    put(a.d_c0 + at, d.d_cell);
  }
}

template <typename T>
__device__ __forceinline__ void step_backward_epilogue(
    const StepBackwardArgs<T>& a,
    acc_t<T>* dc,
    int64_t b,
    int j,
    acc_t<T> sum) {
  finish_backward_epilogue(
      a, dc, b, j, load_backward_epilogue(a, dc, b, j), sum);
}

} // namespace lltm::cuda::detail
