// The LLTM sequence kernels' host API: how a block of steps (a layer over
// T steps, forward or backward) is planned and launched. Two families:
//   persistent  one launch runs every step with W_h kept in shared memory
//               (persistent/): a cooperative grid (grid.cu), or one
//               thread-block cluster on CUDA cores (cluster.cu) or on
//               tensor cores (cluster_mma.cu)
//   fused       per step the recurrent GEMM with the cell in its epilogue
//               (fused/): on CUDA cores with W_h read in chunks (chunked.cu)
//               or held in shared memory (held.cu), or on tensor cores
//               (mma.cu); every step in one cooperative launch where the
//               grid fits at once, else a launch per step
// A plan_* function decides everything about a launch once (SequencePlan);
// the launch_* functions execute that plan and choose nothing.
//
// Plain CUDA C++ like cuda/cell/cell.h: raw pointers, sizes and a stream in,
// cudaError_t out. cpp/sequence/cuda/ runs the GEMMs around them (the input
// projection before the forward; d_weights, d_input and d_bias after the
// backward) through ATen. T is float, double, __half or __nv_bfloat16.
#pragma once

#include "cuda/cell/cell.h"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

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

// The fused steps' operands are row-major with unit column stride and the
// row lengths their shapes give.

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

// --- plans -----------------------------------------------------------------

// What a plan launches.
enum class SequenceKernel : uint8_t {
  kNone, // nothing can: SequencePlan::why_not says why
  kGrid, // a cooperative grid, h_t through L2 after a grid-wide barrier
  kClusterSimt, // one cluster on CUDA cores, h_t through distributed shared
                // memory, a cluster per tile of the batch's rows
  kClusterMma, // one cluster on tensor cores (float16, bfloat16), the batch
               // whole
  kFusedChunked, // per step a GEMM on CUDA cores, W_h read in chunks
  kFusedHeld, // per step a GEMM in float, W_h held in shared memory
  kFusedMma, // per step a GEMM on tensor cores (float16, bfloat16)
};

// How the grid's kernels cut a problem: `columns` (J) state columns per
// block, tiles of `rows` rows of `ld` elements after W_h's 3 J S, `lanes`
// threads per (row, column) item.
struct GridTiling {
  int columns;
  int rows;
  int ld;
  int lanes;
};

// How a CUDA-core cluster cuts a problem: `rows` rows of the batch a tile
// (a cluster each); lengths in elements of the math type: `padded` is S in
// whole packs, `ld_w` the row length of W_h's slice, `ld` the tile's.
struct ClusterTiling {
  int columns;
  int rows;
  int padded;
  int ld_w;
  int ld;
  int lanes;
};

// How a tensor-core cluster cuts a problem. Lengths are in elements of T.
struct MmaTiling {
  int columns; // J: state columns per block, a power of two from 8
  int shift; // log2(J)
  int rows; // the batch, rounded up to 16
  int kp; // a segment of k: blocks * J (zeros past S)
  int ld_w; // the row length of W_h's slice: kp + 8, or 3 kp + 8
  int splits; // P: the warps that share a 16 x 8 tile's k, a power of two
};

// Everything about the launch of one block of steps, decided once.
struct SequencePlan {
  SequenceKernel kernel = SequenceKernel::kNone;
  bool backward = false;
  // The persistent kernels: blocks of the grid, or of a cluster; clusters,
  // a tile of rows each; dynamic shared memory a block; their cut.
  int blocks = 0;
  int tiles = 1;
  size_t shared_bytes = 0;
  GridTiling grid{};
  ClusterTiling cluster{};
  MmaTiling mma{};
  // The fused steps: the tile (an index in the kernel's tiles, largest
  // first: fused/tiles.h), the elements a load takes (8: whole 16-byte
  // vectors of float16 or bfloat16, which the operands must then be
  // aligned for), and whether every step runs in one cooperative launch.
  int tile = 0;
  int tile_rows = 0;
  int tile_columns = 0;
  int vector = 1;
  bool cooperative = false;
  // The scratch memory the launch takes from the caller, 16-byte aligned.
  size_t workspace_bytes = 0;
  // Where kernel is kNone.
  const char* why_not = nullptr;
};

// The plan's variant, as lltm.paths_that_ran names it: "grid" (or "block",
// one block), "simt/8x16" (rows x columns a block of each cluster), "mma",
// "chunked/64x64/coop" (or ".../step": a launch per step), "held",
// "mma/16x64/coop".
inline std::string variant_of(const SequencePlan& plan) {
  const auto tiled = [&](const char* kernel) {
    return std::string(kernel) + "/" + std::to_string(plan.tile_rows) + "x" +
        std::to_string(plan.tile_columns) +
        (plan.cooperative ? "/coop" : "/step");
  };
  switch (plan.kernel) {
    case SequenceKernel::kGrid:
      return plan.blocks == 1 ? "block" : "grid";
    case SequenceKernel::kClusterSimt:
      return "simt/" + std::to_string(plan.cluster.rows) + "x" +
          std::to_string(plan.cluster.columns);
    case SequenceKernel::kClusterMma:
      return "mma";
    case SequenceKernel::kFusedChunked:
      return tiled("chunked");
    case SequenceKernel::kFusedHeld:
      return "held";
    case SequenceKernel::kFusedMma:
      return tiled("mma");
    default:
      return "none";
  }
}

// The plans of the current device for a [batch, state] block. A plan whose
// kernel is kNone says why not; the persistent planners read a failed query
// of the device as a "no" (and clear it), the fused planner returns it.

// The cooperative grid.
template <typename T>
cudaError_t plan_grid(
    int64_t batch,
    int64_t state,
    bool backward,
    SequencePlan* out);

// One thread-block cluster (sm_90 on): on tensor cores in float16 and
// bfloat16 where those kernels fit, but on CUDA cores where those fit at
// batch 1, and past kClusterMmaFirst fragments where the CUDA cores' tiles
// are small in both directions (cluster_small_tiles): their exchange is the
// faster one there (docs/performance.md, "Why these thresholds").
template <typename T>
cudaError_t plan_cluster(
    int64_t batch,
    int64_t state,
    bool backward,
    SequencePlan* out);

// The fused steps of `steps` steps, with W_h's rows `ld_w` elements apart.
template <typename T>
cudaError_t plan_fused(
    int64_t steps,
    int64_t batch,
    int64_t state,
    int64_t ld_w,
    bool backward,
    SequencePlan* out);

// The (row, column) items a block of the CUDA-core cluster takes; 0 where
// it does not fit.
template <typename T>
int64_t cluster_simt_items(int64_t batch, int64_t state, bool backward);

// Whether the CUDA-core cluster takes at most kClusterSmallTile items a
// block in both directions.
constexpr int64_t kClusterSmallTile = 160;
template <typename T>
bool cluster_small_tiles(int64_t batch, int64_t state);

// The work of a block of the tensor-core cluster, in 16 x 16 fragments of
// batch x state / 16 (a block's columns when the cluster has 16 blocks). The
// tensor-core cluster takes float16 and bfloat16 up to kClusterMmaFirst
// fragments, and beyond where the CUDA cores' tiles are not small.
constexpr int64_t kClusterMmaFirst = 256;
constexpr int64_t cluster_mma_fragments(int64_t batch, int64_t state) {
  return batch * ((state + 15) / 16);
}

// Whether the fused steps of T run on the current device's tensor cores
// (float16 from sm_70, bfloat16 from sm_80); false if the device cannot be
// asked.
template <typename T>
bool steps_on_tensor_cores();

// --- launches ----------------------------------------------------------------
// Each executes its plan, made for these sizes, on `stream`, and launches
// nothing for zero steps, rows or columns; cudaErrorInvalidValue where the
// plan is of another family or the operands are not aligned as it needs.
// `workspace` holds plan.workspace_bytes bytes, 16-byte aligned.

// A persistent plan (kGrid, kClusterSimt, kClusterMma).
template <typename T>
cudaError_t launch_sequence_forward(
    const SequenceForwardArgs<T>& args,
    const SequencePlan& plan,
    cudaStream_t stream);

// Every step of the backward, in reverse: writes d_gates, and d_h0 = dZ_0
// W_h and d_c0 when given.
template <typename T>
cudaError_t launch_sequence_backward(
    const SequenceBackwardArgs<T>& args,
    const SequencePlan& plan,
    void* workspace,
    cudaStream_t stream);

// A fused plan (kFusedChunked, kFusedHeld, kFusedMma).
template <typename T>
cudaError_t launch_fused_forward(
    const FusedForwardArgs<T>& args,
    const SequencePlan& plan,
    void* workspace,
    cudaStream_t stream);

template <typename T>
cudaError_t launch_fused_backward(
    const FusedBackwardArgs<T>& args,
    const SequencePlan& plan,
    void* workspace,
    cudaStream_t stream);

} // namespace lltm::cuda
