// LLTM pointwise kernels, one fused kernel per direction.
//
// Forward, per (b, s), with the pre-activations Z = [Z_i | Z_o | Z_c] from
// cuBLAS and the bias b (added here, not in the GEMM):
//   i = sigmoid(Z_i + b_i)    o = sigmoid(Z_o + b_o)    g = elu(Z_c + b_c)
//   new_cell = old_cell + g * i
//   new_h    = tanh(new_cell) * o
//
// Backward, from the saved activations i, o, g and new_cell, with
// t = tanh(new_cell) and upstream gradients gh (the sum of grad_h and, when
// given, grad_h_add), gc:
//   d_old_cell = dc = (1 - t^2) * o * gh + gc
//   dZ_i = dc * g * i * (1 - i)
//   dZ_o = gh * t * o * (1 - o)
//   dZ_c = dc * i * elu'(Z_c),  elu'(z) = 1 if z > 0 else e^z = g + 1
//   d_bias = the column sums of dZ
// (the GEMMs for d_weights, d_old_h and d_input follow in cuBLAS). The
// cell's math of one element is cell_forward and cell_backward
// (cuda/common/device.h), shared by every kernel that runs it.
//
// Each thread handles V adjacent columns of a row, with 16-byte loads and
// stores where the sizes and the alignment allow (V = 16 / sizeof(T)), else
// V = 1. The forward is a grid-stride loop over (row, column group). The
// backward's blocks each own a slab of columns and of rows, so that the bias
// gradient is summed in the block, in a fixed order: straight into d_bias
// when one block row covers the batch, else into per-slab partial sums that
// a second kernel adds, again in a fixed order. The results are the same
// bits on every run.
//
// float16 and bfloat16 are computed in float. Indices are 32-bit when every
// offset fits, else 64-bit.
#include "cuda/cell/cell.h"

#include "cuda/common/device.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace lltm::cuda {
namespace {

using namespace detail; // NOLINT(google-build-using-namespace)

template <typename T, int V, typename I>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const ForwardArgs<T> a, const I groups_per_row) {
  using A = acc_t<T>;
  const I S = static_cast<I>(a.state);
  const I groups = static_cast<I>(a.batch) * groups_per_row;
  const I stride = static_cast<I>(gridDim.x) * blockDim.x;
  for (I k = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; k < groups;
       k += stride) {
    const I b = k / groups_per_row;
    const I s = (k - b * groups_per_row) * V;
    const I z_row = b * static_cast<I>(a.ld_z);
    A zi[V], zo[V], zc[V], c[V];
    load<V>(a.z + z_row + s, zi);
    load<V>(a.z + z_row + S + s, zo);
    load<V>(a.z + z_row + 2 * S + s, zc);
    load<V>(a.old_cell + b * S + s, c);
    if (a.bias != nullptr) {
      A bi[V], bo[V], bc[V];
      load<V>(a.bias + s, bi);
      load<V>(a.bias + S + s, bo);
      load<V>(a.bias + 2 * S + s, bc);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        zi[j] += bi[j];
        zo[j] += bo[j];
        zc[j] += bc[j];
      }
    }
    if (a.z_with_bias != nullptr) {
      store<V>(a.z_with_bias + z_row + s, zi);
      store<V>(a.z_with_bias + z_row + S + s, zo);
      store<V>(a.z_with_bias + z_row + 2 * S + s, zc);
    }
    // The activations i, o and g in place of the pre-activations.
    A h[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const CellForward<A> f = cell_forward(zi[j], zo[j], zc[j], c[j]);
      zi[j] = f.i;
      zo[j] = f.o;
      zc[j] = f.g;
      c[j] = f.cell;
      h[j] = f.h;
    }
    store<V>(a.new_cell + b * S + s, c);
    store<V>(a.new_h + b * S + s, h);
    if (a.input_gate != nullptr) {
      const I act_row = b * static_cast<I>(a.ld_act);
      store<V>(a.input_gate + act_row + s, zi);
      store<V>(a.output_gate + act_row + s, zo);
      store<V>(a.candidate_cell + act_row + s, zc);
    }
  }
}

// blockDim = (column threads, row lanes); block (x, y) owns V * blockDim.x
// columns and rows [y * rows_per_block, (y + 1) * rows_per_block).
template <typename T, int V, typename I>
__global__ void __launch_bounds__(kThreads) backward_kernel(
    const BackwardArgs<T> a,
    const bool grad_h_packed,
    const bool grad_cell_packed,
    const I rows_per_block,
    acc_t<T>* __restrict__ bias_partials) {
  using A = acc_t<T>;
  const I S = static_cast<I>(a.state);
  const I B = static_cast<I>(a.batch);
  const I s = (static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const I first_row = static_cast<I>(blockIdx.y) * rows_per_block;
  const I end_row =
      B - first_row < rows_per_block ? B : first_row + rows_per_block;
  const bool want_bias = a.d_bias != nullptr;
  A sum_i[V] = {}, sum_o[V] = {}, sum_c[V] = {};
  if (s < S) {
    for (I b = first_row + threadIdx.y; b < end_row; b += blockDim.y) {
      A gh[V], gc[V], i[V], o[V], g[V], cell[V];
      load<V>(a.grad_h, grad_h_packed, b, s, gh);
      load<V>(a.grad_cell, grad_cell_packed, b, s, gc);
      if (a.grad_h_add != nullptr) {
        A more[V];
        load<V>(a.grad_h_add + b * static_cast<I>(a.ld_grad_h_add) + s, more);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          gh[j] += more[j];
        }
      }
      const I act_row = b * static_cast<I>(a.ld_act);
      load<V>(a.input_gate + act_row + s, i);
      load<V>(a.output_gate + act_row + s, o);
      load<V>(a.candidate_cell + act_row + s, g);
      load<V>(a.new_cell + b * S + s, cell);
      A dc[V], dz_i[V], dz_o[V], dz_c[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const CellBackward<A> d =
            cell_backward(i[j], o[j], g[j], tanh_(cell[j]), gh[j], gc[j]);
        dc[j] = d.d_cell;
        dz_i[j] = d.dz_i;
        dz_o[j] = d.dz_o;
        dz_c[j] = d.dz_c;
        sum_i[j] += dz_i[j];
        sum_o[j] += dz_o[j];
        sum_c[j] += dz_c[j];
      }
      T* dz = a.d_gates + b * 3 * S;
      store<V>(dz + s, dz_i);
      store<V>(dz + S + s, dz_o);
      store<V>(dz + 2 * S + s, dz_c);
      if (a.d_old_cell != nullptr) {
        store<V>(a.d_old_cell + b * S + s, dc);
      }
    }
  }
  if (!want_bias) {
    return; // uniform over the launch: no thread reaches the barrier
  }
  // The row lanes' sums, added by lane 0 in order of the lane.
  extern __shared__ __align__(16) unsigned char shared[];
  A* lanes = reinterpret_cast<A*>(shared);
  A* mine = lanes + (threadIdx.y * blockDim.x + threadIdx.x) * 3 * V;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    mine[j] = sum_i[j];
    mine[V + j] = sum_o[j];
    mine[2 * V + j] = sum_c[j];
  }
  __syncthreads();
  if (threadIdx.y != 0 || s >= S) {
    return;
  }
  for (unsigned int y = 1; y < blockDim.y; ++y) {
    const A* other = lanes + (y * blockDim.x + threadIdx.x) * 3 * V;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      sum_i[j] += other[j];
      sum_o[j] += other[V + j];
      sum_c[j] += other[2 * V + j];
    }
  }
  if (bias_partials == nullptr) {
    store<V>(a.d_bias + s, sum_i);
    store<V>(a.d_bias + S + s, sum_o);
    store<V>(a.d_bias + 2 * S + s, sum_c);
    return;
  }
  A* row = bias_partials + static_cast<I>(blockIdx.y) * 3 * S;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    row[s + j] = sum_i[j];
    row[S + s + j] = sum_o[j];
    row[2 * S + s + j] = sum_c[j];
  }
}

// d_bias[j] = the sum over the slabs of partials[slab][j], in slab order.
template <typename T>
__global__ void __launch_bounds__(kThreads) sum_bias_partials_kernel(
    const acc_t<T>* __restrict__ partials,
    int64_t slabs,
    int64_t columns,
    T* __restrict__ d_bias) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < columns;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc_t<T> total = 0;
    for (int64_t r = 0; r < slabs; ++r) {
      total += partials[r * columns + j];
    }
    put(d_bias + j, total);
  }
}

// Runs f(std::integral_constant<int, V>, I{}) with V = kPack<T> when
// `packed`, else 1, and I = int32_t when `small`, else int64_t.
template <typename T, typename F>
cudaError_t with_config(bool packed, bool small, F&& f) {
  using Packed = std::integral_constant<int, kPack<T>>;
  using Single = std::integral_constant<int, 1>;
  if (packed) {
    return small ? f(Packed{}, int32_t{}) : f(Packed{}, int64_t{});
  }
  return small ? f(Single{}, int32_t{}) : f(Single{}, int64_t{});
}

bool fits_int32(int64_t largest_offset) {
  return largest_offset < std::numeric_limits<int32_t>::max();
}

template <typename T>
bool forward_packed(const ForwardArgs<T>& a) {
  constexpr int V = kPack<T>;
  const bool has_act = a.input_gate != nullptr;
  return a.state % V == 0 && a.ld_z % V == 0 &&
      (!has_act || a.ld_act % V == 0) && aligned16(a.z) && aligned16(a.bias) &&
      aligned16(a.old_cell) && aligned16(a.new_h) && aligned16(a.new_cell) &&
      aligned16(a.input_gate) && aligned16(a.output_gate) &&
      aligned16(a.candidate_cell) && aligned16(a.z_with_bias);
}

template <typename T>
bool strided_packed(const Strided<T>& m) {
  constexpr int V = kPack<T>;
  return m.data != nullptr && m.col_stride == 1 && m.row_stride % V == 0 &&
      aligned16(m.data);
}

template <typename T>
int64_t largest_offset(const Strided<T>& m, int64_t batch, int64_t state) {
  return m.data == nullptr
      ? 0
      : (batch - 1) * m.row_stride + (state - 1) * m.col_stride + 1;
}

// How the backward is cut into blocks.
struct BackwardPlan {
  bool packed;
  dim3 block;
  dim3 grid;
  int64_t rows_per_block;
  size_t shared_bytes;
  size_t workspace_bytes; // the partial sums, when several block rows
};

// `sms`: the multiprocessor count.
template <typename T>
BackwardPlan plan_backward(const BackwardArgs<T>& a, int64_t sms) {
  constexpr int Vp = kPack<T>;
  BackwardPlan plan{};
  plan.packed = a.state % Vp == 0 && a.ld_act % Vp == 0 &&
      aligned16(a.new_cell) && aligned16(a.input_gate) &&
      aligned16(a.output_gate) && aligned16(a.candidate_cell) &&
      aligned16(a.d_gates) && aligned16(a.d_old_cell) && aligned16(a.d_bias) &&
      aligned16(a.grad_h_add) && a.ld_grad_h_add % Vp == 0;
  const int V = plan.packed ? Vp : 1;
  const int64_t column_threads = (a.state + V - 1) / V;
  // Column threads: up to a warp, a power of two; the rest are row lanes.
  unsigned int tx = 1;
  while (tx < 32 && tx < column_threads) {
    tx *= 2;
  }
  const unsigned int ty = kThreads / tx;
  plan.block = dim3(tx, ty);
  const int64_t column_blocks = (column_threads + tx - 1) / tx;
  // One block row when each lane has at most 16 rows: one launch, no
  // partial sums. Else enough block rows for two blocks per multiprocessor,
  // with at least 4 rows per lane.
  int64_t row_blocks = 1;
  if (a.batch > 16 * static_cast<int64_t>(ty)) {
    const int64_t wanted = (2 * sms + column_blocks - 1) / column_blocks;
    const int64_t most = (a.batch + 4 * ty - 1) / (4 * ty);
    row_blocks = std::max<int64_t>(1, std::min(wanted, most));
  }
  row_blocks = std::min<int64_t>(row_blocks, 65535);
  plan.rows_per_block = (a.batch + row_blocks - 1) / row_blocks;
  plan.grid = dim3(
      static_cast<unsigned int>(column_blocks),
      static_cast<unsigned int>(row_blocks));
  const bool want_bias = a.d_bias != nullptr;
  plan.shared_bytes =
      want_bias ? size_t(kThreads) * 3 * V * sizeof(acc_t<T>) : 0;
  plan.workspace_bytes = want_bias && row_blocks > 1
      ? size_t(row_blocks) * 3 * size_t(a.state) * sizeof(acc_t<T>)
      : 0;
  return plan;
}

} // namespace

template <typename T>
cudaError_t launch_forward(const ForwardArgs<T>& a, cudaStream_t stream) {
  if (a.batch == 0 || a.state == 0) {
    return cudaSuccess;
  }
  int64_t sms = 0;
  if (const cudaError_t status = multiprocessors(&sms); status != cudaSuccess) {
    return status;
  }
  const bool packed = forward_packed(a);
  const int64_t largest = std::max(
      (a.batch - 1) * a.ld_z + 3 * a.state,
      std::max((a.batch - 1) * a.ld_act + 3 * a.state, a.batch * a.state));
  return with_config<T>(packed, fits_int32(largest), [&](auto v, auto index) {
    constexpr int V = decltype(v)::value;
    using I = decltype(index);
    const int64_t groups_per_row = a.state / V;
    const unsigned int blocks =
        grid_stride_blocks(a.batch * groups_per_row, sms);
    forward_kernel<T, V, I>
        <<<blocks, kThreads, 0, stream>>>(a, static_cast<I>(groups_per_row));
    return cudaGetLastError();
  });
}

template <typename T>
size_t backward_workspace_size(const BackwardArgs<T>& a) {
  if (a.batch == 0 || a.state == 0) {
    return 0;
  }
  int64_t sms = 0;
  if (multiprocessors(&sms) != cudaSuccess) {
    // launch_backward reports the error. As many multiprocessors as a plan
    // could use: the largest workspace any plan of these sizes needs.
    sms = std::numeric_limits<int32_t>::max();
  }
  return plan_backward(a, sms).workspace_bytes;
}

template <typename T>
cudaError_t launch_backward(
    const BackwardArgs<T>& a,
    void* workspace,
    cudaStream_t stream) {
  if (a.state == 0) {
    return cudaSuccess;
  }
  if (a.batch == 0) {
    // No rows: the bias gradient is a sum of nothing.
    return a.d_bias == nullptr
        ? cudaSuccess
        : cudaMemsetAsync(a.d_bias, 0, 3 * a.state * sizeof(T), stream);
  }
  int64_t sms = 0;
  if (const cudaError_t status = multiprocessors(&sms); status != cudaSuccess) {
    return status;
  }
  const BackwardPlan plan = plan_backward(a, sms);
  const bool grad_h_packed = plan.packed && strided_packed(a.grad_h);
  const bool grad_cell_packed = plan.packed && strided_packed(a.grad_cell);
  const int64_t largest = std::max(
      {(a.batch - 1) * a.ld_act + 3 * a.state,
       a.batch * 3 * a.state,
       largest_offset(a.grad_h, a.batch, a.state),
       largest_offset(a.grad_cell, a.batch, a.state),
       (a.batch - 1) * a.ld_grad_h_add + a.state,
       int64_t(plan.grid.y) * 3 * a.state});
  auto* partials =
      plan.workspace_bytes > 0 ? static_cast<acc_t<T>*>(workspace) : nullptr;
  const cudaError_t status =
      with_config<T>(plan.packed, fits_int32(largest), [&](auto v, auto index) {
        constexpr int V = decltype(v)::value;
        using I = decltype(index);
        backward_kernel<T, V, I>
            <<<plan.grid, plan.block, plan.shared_bytes, stream>>>(
                a,
                grad_h_packed,
                grad_cell_packed,
                static_cast<I>(plan.rows_per_block),
                partials);
        return cudaGetLastError();
      });
  if (status != cudaSuccess || partials == nullptr) {
    return status;
  }
  const int64_t columns = 3 * a.state;
  const auto blocks = static_cast<unsigned int>(
      std::min<int64_t>((columns + kThreads - 1) / kThreads, 65535));
  sum_bias_partials_kernel<T><<<blocks, kThreads, 0, stream>>>(
      partials, plan.grid.y, columns, a.d_bias);
  return cudaGetLastError();
}

#define LLTM_INSTANTIATE(T)                                                    \
  template cudaError_t launch_forward<T>(const ForwardArgs<T>&, cudaStream_t); \
  template size_t backward_workspace_size<T>(const BackwardArgs<T>&);          \
  template cudaError_t launch_backward<T>(                                     \
      const BackwardArgs<T>&, void*, cudaStream_t);

LLTM_FOR_EACH_TYPE(LLTM_INSTANTIATE)

#undef LLTM_INSTANTIATE

} // namespace lltm::cuda
