// Fused LLTM sequence steps: one launch per step and direction, the
// recurrent GEMM with the cell's pointwise math in its epilogue. This is the
// per-step path where W_h does not stay on chip (lltm_sequence.cu): no
// pre-activation tensor makes a round trip through memory between a GEMM and
// a pointwise kernel, and the host issues one plain launch per step.
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
//
// Work split: block (x, y) computes rows [x BM, x BM + BM) and state columns
// [y BN, y BN + BN): of all three gates in the forward (3 BN columns of Z),
// of dZ_{t+1} W_h in the backward. Chunks along k of both operands pass
// through shared memory. Thread (tx, ty) owns rows ty + r BM / TM and
// columns tx + c BN / TN: a warp's epilogue touches adjacent columns, and
// each (row, column) of the cell is computed by one thread, which reads c
// (or dc) before writing it, so these may be updated in place. float16 and
// bfloat16 compute in float.
#include "lltm_sequence.h"

#include "lltm_device.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace lltm::cuda {
namespace {

using namespace detail; // NOLINT(google-build-using-namespace)

template <int BM_, int BN_, int TM_, int TN_>
struct Tile {
  static constexpr int BM = BM_;
  static constexpr int BN = BN_;
  static constexpr int TM = TM_;
  static constexpr int TN = TN_;
  static constexpr int NX = BN / TN; // threads along the columns
  static constexpr int NY = BM / TM; // and along the rows
  static constexpr int threads = NX * NY;
};

// The k extent of a chunk: a chunk is one round trip to memory, and the
// next one is loaded into registers while this one is multiplied, since at
// these sizes a step is bound by the latency of its loads. So as long as
// both operands' tiles fit in 40 KB of static shared memory and a thread
// holds at most 32 elements of the next chunk, up to 64.
template <typename A, typename P, int Operands>
__host__ __device__ constexpr int chunk_of() {
  constexpr int per_k = (P::BM + 1) + Operands * (P::BN + 1);
  constexpr int fit = 40960 / (per_k * static_cast<int>(sizeof(A)));
  constexpr int held = 32 * P::threads / (P::BM + Operands * P::BN);
  constexpr int most = fit < held ? fit : held;
  return most >= 64 ? 64 : (most >= 32 ? 32 : 16);
}

template <typename T, typename P>
__global__ void __launch_bounds__(P::threads)
    step_forward_kernel(const StepForwardArgs<T> a) {
  using A = acc_t<T>;
  constexpr int BM = P::BM, BN = P::BN, TM = P::TM, TN = P::TN;
  constexpr int NX = P::NX, NY = P::NY, NT = P::threads;
  constexpr int C = chunk_of<A, P, 3>();
  // Elements of each operand's chunk per thread.
  constexpr int HL = (BM * C + NT - 1) / NT;
  constexpr int WL = (3 * BN * C + NT - 1) / NT;
  // +1: the stores, which run along k, fall in different banks.
  __shared__ A h_s[C][BM + 1];
  __shared__ A w_s[3][C][BN + 1];
  const int S = static_cast<int>(a.state);
  const int64_t B = a.batch;
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % NX;
  const int ty = tid / NX;
  const int64_t b0 = int64_t(blockIdx.x) * BM;
  const int j0 = static_cast<int>(blockIdx.y) * BN;
  A h_r[HL];
  A w_r[WL];
  auto fetch = [&](int k0) {
#pragma unroll
    for (int l = 0; l < HL; ++l) {
      const int e = tid + l * NT;
      const int r = e / C;
      const int64_t b = b0 + r;
      const int k = k0 + (e - r * C);
      h_r[l] = e < BM * C && b < B && k < S ? widen(a.h[b * S + k]) : A(0);
    }
#pragma unroll
    for (int l = 0; l < WL; ++l) {
      const int e = tid + l * NT;
      const int row = e / C; // g BN + jl
      const int g = row / BN;
      const int j = j0 + (row - g * BN);
      const int k = k0 + (e - row * C);
      w_r[l] = e < 3 * BN * C && j < S && k < S
          ? widen(a.w[(int64_t(g) * S + j) * a.ld_w + k])
          : A(0);
    }
  };
  auto stash = [&]() {
#pragma unroll
    for (int l = 0; l < HL; ++l) {
      const int e = tid + l * NT;
      if (e < BM * C) {
        const int r = e / C;
        h_s[e - r * C][r] = h_r[l];
      }
    }
#pragma unroll
    for (int l = 0; l < WL; ++l) {
      const int e = tid + l * NT;
      if (e < 3 * BN * C) {
        const int row = e / C;
        const int g = row / BN;
        w_s[g][e - row * C][row - g * BN] = w_r[l];
      }
    }
  };
  A acc[3][TM][TN];
#pragma unroll
  for (int g = 0; g < 3; ++g) {
#pragma unroll
    for (int r = 0; r < TM; ++r) {
#pragma unroll
      for (int c = 0; c < TN; ++c) {
        acc[g][r][c] = A(0);
      }
    }
  }
  fetch(0);
  for (int k0 = 0; k0 < S; k0 += C) {
    stash();
    __syncthreads();
    if (k0 + C < S) {
      fetch(k0 + C); // in flight while this chunk is multiplied
    }
#pragma unroll 16
    for (int kk = 0; kk < C; ++kk) {
      A hv[TM];
      A wv[3][TN];
#pragma unroll
      for (int r = 0; r < TM; ++r) {
        hv[r] = h_s[kk][ty + r * NY];
      }
#pragma unroll
      for (int g = 0; g < 3; ++g) {
#pragma unroll
        for (int c = 0; c < TN; ++c) {
          wv[g][c] = w_s[g][kk][tx + c * NX];
        }
      }
#pragma unroll
      for (int g = 0; g < 3; ++g) {
#pragma unroll
        for (int r = 0; r < TM; ++r) {
#pragma unroll
          for (int c = 0; c < TN; ++c) {
            acc[g][r][c] += hv[r] * wv[g][c];
          }
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < TM; ++r) {
    const int64_t b = b0 + ty + r * NY;
#pragma unroll
    for (int c = 0; c < TN; ++c) {
      const int j = j0 + tx + c * NX;
      if (b >= B || j >= S) {
        continue;
      }
      T* z = a.z + b * 3 * S;
      const A i = sigmoid(acc[0][r][c] + widen(z[j]) + widen(a.bias[j]));
      const A o =
          sigmoid(acc[1][r][c] + widen(z[S + j]) + widen(a.bias[S + j]));
      const A g =
          elu(acc[2][r][c] + widen(z[2 * S + j]) + widen(a.bias[2 * S + j]));
      const int64_t at = b * S + j;
      const A cell = widen(a.c[at]) + g * i;
      const A h = tanh_(cell) * o;
      put(a.c_out + at, cell);
      put(a.h_out + at, h);
      if (a.save) {
        put(z + j, i);
        put(z + S + j, o);
        put(z + 2 * S + j, g);
      }
      if (a.h_n != nullptr) {
        put(a.h_n + at, h);
      }
      if (a.c_n != nullptr) {
        put(a.c_n + at, cell);
      }
    }
  }
}

template <typename T, typename P>
__global__ void __launch_bounds__(P::threads) step_backward_kernel(
    const StepBackwardArgs<T> a,
    acc_t<T>* __restrict__ dc) {
  using A = acc_t<T>;
  constexpr int BM = P::BM, BN = P::BN, TM = P::TM, TN = P::TN;
  constexpr int NX = P::NX, NY = P::NY, NT = P::threads;
  constexpr int C = chunk_of<A, P, 1>();
  constexpr int DL = (BM * C + NT - 1) / NT;
  constexpr int WL = (BN * C + NT - 1) / NT;
  __shared__ A dz_s[C][BM + 1];
  __shared__ A w_s[C][BN];
  const int S = static_cast<int>(a.state);
  const int K = 3 * S; // dZ's row length
  const int64_t B = a.batch;
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % NX;
  const int ty = tid / NX;
  const int64_t b0 = int64_t(blockIdx.x) * BM;
  const int j0 = static_cast<int>(blockIdx.y) * BN;
  A acc[TM][TN];
#pragma unroll
  for (int r = 0; r < TM; ++r) {
#pragma unroll
    for (int c = 0; c < TN; ++c) {
      acc[r][c] = A(0);
    }
  }
  const bool recurrent = a.dz_next != nullptr;
  if (recurrent) {
    A d_r[DL];
    A w_r[WL];
    auto fetch = [&](int k0) {
#pragma unroll
      for (int l = 0; l < DL; ++l) {
        const int e = tid + l * NT;
        const int r = e / C;
        const int64_t b = b0 + r;
        const int k = k0 + (e - r * C);
        d_r[l] = e < BM * C && b < B && k < K ? widen(a.dz_next[b * K + k])
                                              : A(0);
      }
      // W_h's rows k, columns [j0, j0 + BN): adjacent threads, adjacent
      // columns.
#pragma unroll
      for (int l = 0; l < WL; ++l) {
        const int e = tid + l * NT;
        const int kk = e / BN;
        const int j = j0 + (e - kk * BN);
        const int k = k0 + kk;
        w_r[l] = e < BN * C && j < S && k < K
            ? widen(a.w[int64_t(k) * a.ld_w + j])
            : A(0);
      }
    };
    auto stash = [&]() {
#pragma unroll
      for (int l = 0; l < DL; ++l) {
        const int e = tid + l * NT;
        if (e < BM * C) {
          const int r = e / C;
          dz_s[e - r * C][r] = d_r[l];
        }
      }
#pragma unroll
      for (int l = 0; l < WL; ++l) {
        const int e = tid + l * NT;
        if (e < BN * C) {
          const int kk = e / BN;
          w_s[kk][e - kk * BN] = w_r[l];
        }
      }
    };
    fetch(0);
    for (int k0 = 0; k0 < K; k0 += C) {
      stash();
      __syncthreads();
      if (k0 + C < K) {
        fetch(k0 + C); // in flight while this chunk is multiplied
      }
#pragma unroll 16
      for (int kk = 0; kk < C; ++kk) {
        A dv[TM];
        A wv[TN];
#pragma unroll
        for (int r = 0; r < TM; ++r) {
          dv[r] = dz_s[kk][ty + r * NY];
        }
#pragma unroll
        for (int c = 0; c < TN; ++c) {
          wv[c] = w_s[kk][tx + c * NX];
        }
#pragma unroll
        for (int r = 0; r < TM; ++r) {
#pragma unroll
          for (int c = 0; c < TN; ++c) {
            acc[r][c] += dv[r] * wv[c];
          }
        }
      }
      __syncthreads();
    }
  }
#pragma unroll
  for (int r = 0; r < TM; ++r) {
    const int64_t b = b0 + ty + r * NY;
#pragma unroll
    for (int c = 0; c < TN; ++c) {
      const int j = j0 + tx + c * NX;
      if (b >= B || j >= S) {
        continue;
      }
      const int64_t at = b * S + j;
      const A gh = load_element(a.grad_h, b, j) +
          (recurrent ? acc[r][c] : load_element(a.grad_h_n, b, j));
      const A gc = recurrent ? dc[at] : load_element(a.grad_c_n, b, j);
      const T* act = a.gates + b * K;
      const A i = widen(act[j]);
      const A o = widen(act[S + j]);
      const A g = widen(act[2 * S + j]);
      const A tc = tanh_(widen(a.cell[at]));
      const A d_cell = (A(1) - tc * tc) * o * gh + gc;
      T* dz = a.dz + b * K;
      put(dz + j, d_cell * g * i * (A(1) - i));
      put(dz + S + j, gh * tc * o * (A(1) - o));
      put(dz + 2 * S + j, d_cell * i * (g > A(0) ? A(1) : g + A(1)));
      dc[at] = d_cell;
      if (a.d_c0 != nullptr) {
        put(a.d_c0 + at, d_cell);
      }
    }
  }
}

// The tiles, from small to large. A launch takes the largest tile that
// still fills every multiprocessor, or the smallest: at the batch sizes of
// this path a step is too short for a partial wave of large tiles.
using Forward0 = Tile<16, 8, 2, 1>;
using Forward1 = Tile<16, 32, 2, 2>;
using Forward2 = Tile<64, 32, 4, 2>;
using Forward3 = Tile<64, 64, 4, 4>;
using Backward0 = Tile<16, 16, 2, 1>;
using Backward1 = Tile<16, 64, 2, 4>;
using Backward2 = Tile<64, 64, 4, 4>;
using Backward3 = Tile<64, 128, 4, 8>;

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

template <typename T, typename P>
cudaError_t forward_with(const StepForwardArgs<T>& a, cudaStream_t stream) {
  step_forward_kernel<T, P>
      <<<grid_of<P>(a.batch, a.state), P::threads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T, typename P>
cudaError_t backward_with(
    const StepBackwardArgs<T>& a,
    acc_t<T>* dc,
    cudaStream_t stream) {
  step_backward_kernel<T, P>
      <<<grid_of<P>(a.batch, a.state), P::threads, 0, stream>>>(a, dc);
  return cudaGetLastError();
}

} // namespace

template <typename T>
cudaError_t launch_step_forward(
    const StepForwardArgs<T>& a,
    cudaStream_t stream) {
  if (a.batch == 0 || a.state == 0) {
    return cudaSuccess;
  }
  const int64_t sms = multiprocessors();
  if (fills<Forward3>(a.batch, a.state, sms)) {
    return forward_with<T, Forward3>(a, stream);
  }
  if (fills<Forward2>(a.batch, a.state, sms)) {
    return forward_with<T, Forward2>(a, stream);
  }
  if (fills<Forward1>(a.batch, a.state, sms)) {
    return forward_with<T, Forward1>(a, stream);
  }
  return forward_with<T, Forward0>(a, stream);
}

template <typename T>
size_t step_backward_workspace_size(const StepBackwardArgs<T>& a) {
  return static_cast<size_t>(a.batch * a.state) * sizeof(acc_t<T>);
}

template <typename T>
cudaError_t launch_step_backward(
    const StepBackwardArgs<T>& a,
    void* workspace,
    cudaStream_t stream) {
  if (a.batch == 0 || a.state == 0) {
    return cudaSuccess;
  }
  auto* dc = static_cast<acc_t<T>*>(workspace);
  const int64_t sms = multiprocessors();
  if (fills<Backward3>(a.batch, a.state, sms)) {
    return backward_with<T, Backward3>(a, dc, stream);
  }
  if (fills<Backward2>(a.batch, a.state, sms)) {
    return backward_with<T, Backward2>(a, dc, stream);
  }
  if (fills<Backward1>(a.batch, a.state, sms)) {
    return backward_with<T, Backward1>(a, dc, stream);
  }
  return backward_with<T, Backward0>(a, dc, stream);
}

#define LLTM_INSTANTIATE(T)                                  \
  template cudaError_t launch_step_forward<T>(               \
      const StepForwardArgs<T>&, cudaStream_t);              \
  template size_t step_backward_workspace_size<T>(           \
      const StepBackwardArgs<T>&);                           \
  template cudaError_t launch_step_backward<T>(              \
      const StepBackwardArgs<T>&, void*, cudaStream_t);

LLTM_INSTANTIATE(float)
LLTM_INSTANTIATE(double)
LLTM_INSTANTIATE(__half)
LLTM_INSTANTIATE(__nv_bfloat16)

#undef LLTM_INSTANTIATE

} // namespace lltm::cuda
