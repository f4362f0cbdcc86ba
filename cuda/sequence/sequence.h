// Launchers of the LLTM sequence kernels: the persistent ones
// (lltm_sequence.cu), where one launch (a cooperative grid, or one
// thread-block cluster) runs every time step of a layer, forward or
// backward, with W_h kept in shared memory across the steps; and the fused
// steps (lltm_step.cu), a GEMM with the cell in its epilogue per step.
//
// Plain CUDA C++ like lltm_kernel.h: raw pointers, sizes and a stream in,
// cudaError_t out. cpp/sequence_cuda.cpp runs the GEMMs around them (the
// input projection before the forward; d_weights, d_input and d_bias after
// the backward) through ATen, and falls back to a per-step loop of cuBLAS
// GEMMs and the cell's pointwise kernels when sequence_persistent_fits says
// no. T is float, double, __half or __nv_bfloat16.
#pragma once

#include "cuda/cell/cell.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace lltm::cuda {

// A [steps, batch, state] operand read through its strides, which may be 0
// (an expanded upstream gradient); nullptr reads as zeros.
template <typename T>
struct Strided3 {
  const T* data;
  int64_t step_stride;
  int64_t row_stride;
  int64_t col_stride;
};

// Dense tensors are addressed as [steps, batch, columns] in row-major order.
template <typename T>
struct SequenceForwardArgs {
  // [steps, batch, 3 * state]: the input projection input W_x^T (without
  // the bias) on entry; when `cells` is given, the activations [i | o | g]
  // on exit, written over it.
  T* gates;
  // W_h = weights[:, :state]: row r, column k at w[r * ld_w + k].
  const T* w;
  int64_t ld_w;
  const T* bias; // [3 * state]
  const T* h0; // [batch, state]
  const T* c0; // [batch, state]
  T* output; // [steps, batch, state]: h_t
  // [steps, batch, state]: c_t, saved for the backward; or nullptr, and
  // then neither c_t nor the activations are saved.
  T* cells;
  T* h_n; // [batch, state]
  T* c_n; // [batch, state]
  int64_t steps;
  int64_t batch;
  int64_t state;
};

template <typename T>
struct SequenceBackwardArgs {
  Strided3<T> grad_output; // of output, or nullptr
  Strided<T> grad_h_n; // or nullptr
  Strided<T> grad_c_n; // or nullptr
  const T* w; // W_h, as in SequenceForwardArgs
  int64_t ld_w;
  const T* cells; // [steps, batch, state], from the forward
  const T* gates; // [steps, batch, 3 * state]: the activations
  T* d_gates; // [steps, batch, 3 * state]: dZ of every step
  T* d_h0; // [batch, state], or nullptr
  T* d_c0; // [batch, state], or nullptr
  int64_t steps;
  int64_t batch;
  int64_t state;
};

// How the blocks of a persistent kernel pass h_t (dZ_t) from step to step.
enum class Exchange {
  // A cooperative grid of up to a block per multiprocessor: each block
  // writes its part to global memory, and after a grid-wide barrier every
  // block reads what it needs back from L2.
  kGrid,
  // One thread-block cluster (sm_90 on; up to 16 blocks): each block writes
  // its part into the shared memory of every block, which waits for the
  // bytes of a whole tile on a barrier of its own (lltm_cluster.h). On CUDA
  // cores in every type; in float16 and bfloat16 from batch 2 on tensor
  // cores (lltm_cluster_mma.cu), where that fits.
  kCluster,
};

// Whether the persistent kernel of the forward (or the backward) can run a
// [batch, state] problem on the current device with `exchange`: the device
// supports cooperative launches (clusters), and its blocks, each holding its
// slice of W_h and a tile of rows in shared memory, can all be resident at
// once. False for an empty problem.
template <typename T>
bool sequence_persistent_fits(
    int64_t batch,
    int64_t state,
    bool backward,
    Exchange exchange);

// The (row, column) items a block of the cluster on CUDA cores takes: the
// cluster's blocks split the state, and clusters the batch, in tiles of
// rows; 0 where the cluster does not fit.
template <typename T>
int64_t sequence_cluster_items(int64_t batch, int64_t state, bool backward);

// Whether the cluster on CUDA cores takes at most 160 items a block in both
// directions: where the cluster in float16 and bfloat16 leaves tensor cores
// for CUDA cores (past kClusterMmaFirst fragments), and how far auto takes it
// there.
template <typename T>
bool sequence_cluster_small_tiles(int64_t batch, int64_t state);

// The work of a block of the tensor-core cluster, in 16 x 16 fragments of
// batch x state / 16 (a block's columns when the cluster has 16 blocks).
// The tensor-core cluster is the cluster of float16 and bfloat16 up to
// kClusterMmaFirst fragments (on_tensor_cores in lltm_sequence.cu), and auto
// takes it up to kClusterMmaMost (cluster_size in cpp/sequence_cuda.cpp);
// both apart from small tiles. docs/performance.md has the measurements.
constexpr int64_t kClusterMmaFirst = 256;
constexpr int64_t kClusterMmaMost = 512;
constexpr int64_t cluster_mma_fragments(int64_t batch, int64_t state) {
  return batch * ((state + 15) / 16);
}

// Runs every step of the forward in one launch. Nothing is launched for
// zero steps, rows or columns; cudaErrorNotSupported when
// sequence_persistent_fits is false.
template <typename T>
cudaError_t launch_sequence_forward(
    const SequenceForwardArgs<T>& args,
    Exchange exchange,
    cudaStream_t stream);

// The bytes of scratch memory launch_sequence_backward needs: dc, the
// running cell gradient, in the math type, for the grid; none for the
// cluster, which keeps it in registers.
template <typename T>
size_t sequence_backward_workspace_size(
    const SequenceBackwardArgs<T>& args,
    Exchange exchange);

// Runs every step of the backward, in reverse, in one launch: writes
// d_gates, and d_h0 = dZ_0 W_h and d_c0 when given. `workspace` holds
// sequence_backward_workspace_size(args, exchange) bytes, aligned to 16.
template <typename T>
cudaError_t launch_sequence_backward(
    const SequenceBackwardArgs<T>& args,
    Exchange exchange,
    void* workspace,
    cudaStream_t stream);

// --- the fused steps (lltm_step.cu, lltm_step_mma.cu) -----------------------
// Per step the recurrent GEMM with the cell's pointwise math in its
// epilogue: one launch per step and direction, or, where the tiles of every
// step fit on the GPU at once (the tensor-core kernels), one cooperative
// launch per direction for all steps, with a grid barrier between them.
// Dense operands are row-major with unit column stride and the row lengths
// their shapes give.

// The forward over all steps.
template <typename T>
struct FusedForwardArgs {
  const T* w; // W_h, as in SequenceForwardArgs
  int64_t ld_w;
  const T* bias; // [3 * state]
  const T* h0; // [batch, state], dense
  const T* c0; // [batch, state], dense
  T* output; // h_t of every step: [steps, batch, state], dense
  // [steps, batch, 3 * state], dense: P = input W_x^T on entry; the
  // activations [i | o | g] on exit when `save`, else unchanged.
  T* gates;
  // c_t of every step ([steps, batch, state], dense) when `save`; else
  // c_n, written over at every step.
  T* cells;
  T* h_n; // [batch, state], dense
  T* c_n; // [batch, state], dense; written when `save` (else it is `cells`)
  bool save;
  int64_t steps;
  int64_t batch;
  int64_t state;
};

// The backward over all steps, from the last to the first.
template <typename T>
struct FusedBackwardArgs {
  Strided3<T> grad_output; // or none
  Strided<T> grad_h_n; // or none
  Strided<T> grad_c_n; // or none
  const T* w; // W_h, as in SequenceForwardArgs
  int64_t ld_w;
  const T* cells; // c_t of every step: [steps, batch, state], dense
  const T* gates; // the activations: [steps, batch, 3 * state], dense
  T* d_gates; // dZ of every step: [steps, batch, 3 * state], dense
  T* d_c0; // [batch, state], dense
  int64_t steps;
  int64_t batch;
  int64_t state;
};

// The bytes of the workspace of launch_fused_forward: the counters of the
// held steps' barriers (float32), or none.
template <typename T>
size_t fused_forward_workspace_size(const FusedForwardArgs<T>& args);

template <typename T>
cudaError_t launch_fused_forward(
    const FusedForwardArgs<T>& args,
    void* workspace,
    cudaStream_t stream);

// The bytes of the workspace of launch_fused_backward: the running cell
// gradient, in the math type, and the held steps' counters (float32).
template <typename T>
size_t fused_backward_workspace_size(const FusedBackwardArgs<T>& args);

template <typename T>
cudaError_t launch_fused_backward(
    const FusedBackwardArgs<T>& args,
    void* workspace,
    cudaStream_t stream);

// Whether the fused steps of T run on the current device's tensor cores
// (lltm_step_mma.cu: float16 from sm_70, bfloat16 from sm_80), which makes
// them faster than the other paths at more sizes; false if the device
// cannot be asked.
template <typename T>
bool steps_on_tensor_cores();

} // namespace lltm::cuda
