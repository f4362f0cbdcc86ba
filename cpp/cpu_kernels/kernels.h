// The LLTM pointwise CPU kernels: what cpp/cell/cpu.cpp and the CPU's
// sequence paths call.
//
// Each kernel works on a range of batch rows, so that the callers can split
// the batch over threads with at::parallel_for. kernels.cpp is compiled once
// per CPU capability, each object with its own flags, and dispatch.cpp picks
// the table of the best one the processor runs, as ATen's own kernels do.
#pragma once

#include "cuda/common/cell_args.h"

#include <ATen/OpMathType.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <tuple>

namespace lltm::cpu {

// The cell's arguments, shared with CUDA's kernels; the bias gradient's sums
// in the math type.
using kernels::ForwardArgs;
using kernels::Strided;
template <typename T>
using BackwardArgs = kernels::BackwardArgs<T, at::opmath_type<T>>;

// One step of a sequence's forward with its recurrent GEMM fused in:
// Z = z + h W_h^T + bias, or without z Z = [h | x] W^T + bias (the input's
// projection in the step too), then the forward's math on Z, without Z ever
// leaving registers. W^T comes in panels of `panel_width` state units (the
// kernel's vector width): panel p holds, for k in [0, K), the rows k of the
// three gates' columns of its units, [panels, K, 3, panel_width] (zeros past
// the state's end), so that a panel's units are one vector of each gate; K
// is state (W_h^T), or state + features without z (W^T). The work is (panel,
// block of `block_rows` rows) tasks, task i being panel i / row_blocks, rows
// block i % row_blocks: a thread that runs the same range of tasks at every
// step keeps its panels in its cache.
template <typename T>
struct FusedStepArgs {
  const T* h; // h_{t-1}: [batch, state], dense
  const T* w; // W_h^T's or W^T's panels
  // The input projection: [batch, 3 * state], dense; or nullptr, and the
  // step adds x_t's, x: [batch, features], dense (features may be 0).
  const T* z;
  const T* x;
  int64_t features;
  const T* bias; // [3 * state]
  const T* old_cell; // [batch, state], dense
  T* new_h; // [batch, state], dense
  T* new_cell; // [batch, state], dense (may be old_cell: read first)
  // [i | o | g], [batch, 3 * state], dense (may be z: read first), or
  // nullptr when nothing is saved.
  T* activations;
  int64_t batch;
  int64_t state;
};

// One step of a sequence's backward with its recurrent GEMM fused in: gh =
// grad_h + grad_h_add + dz_next W_h (the next step's dZ, [batch, 3 *
// state], or nullptr at the last step), then the backward's math per unit.
// W_h comes in panels of `panel_width` state units, [panels, 3 * state,
// panel_width] (column block k of W_h's rows, zeros past the state's end);
// tasks are (panel, block of `backward_block_rows` rows), as the forward's.
template <typename T>
struct FusedBackwardStepArgs {
  const T* dz_next;
  const T* w;
  Strided<T> grad_h;
  const T* grad_h_add; // [batch, state], dense, or nullptr
  Strided<T> grad_cell;
  const T* new_cell; // [batch, state], dense
  const T* activations; // [i | o | g], [batch, 3 * state], dense
  T* d_gates; // [batch, 3 * state], dense
  T* d_old_cell; // [batch, state], dense
  int64_t batch;
  int64_t state;
};

template <typename T>
struct Kernels {
  // Computes rows [begin, end) of the outputs.
  void (*forward)(const ForwardArgs<T>& args, int64_t begin, int64_t end);
  void (*backward)(const BackwardArgs<T>& args, int64_t begin, int64_t end);
  // Tasks [begin, end) of a fused step (FusedStepArgs), and the task's
  // shape; nullptr where the type has none.
  void (*fused_step)(const FusedStepArgs<T>& args, int64_t begin, int64_t end);
  void (*fused_backward_step)(
      const FusedBackwardStepArgs<T>& args,
      int64_t begin,
      int64_t end);
  // dst[j * ld_dst + i] = src[i * ld_src + j] for i < rows, j < cols: what
  // packs W into a fused step's panels (vectorized where the capability
  // has a transpose); nullptr where the type has no fused step.
  void (*transpose)(
      const T* src,
      int64_t ld_src,
      T* dst,
      int64_t ld_dst,
      int64_t rows,
      int64_t cols);
  int64_t panel_width;
  int64_t block_rows;
  int64_t backward_block_rows;
};

// The kernels of one CPU capability, for every dtype.
using KernelTable = std::tuple<
    Kernels<float>,
    Kernels<double>,
    Kernels<c10::Half>,
    Kernels<c10::BFloat16>>;

// The C name of a capability's table, lltm_cpu_kernels_<capability>: the one
// symbol its object keeps global (cmake/LltmCpuKernels.cmake says why).
#define LLTM_CPU_KERNEL_TABLE(capability) LLTM_CPU_KERNEL_TABLE_(capability)
#define LLTM_CPU_KERNEL_TABLE_(capability) lltm_cpu_kernels_##capability

// The kernels of the best capability this processor runs (cpu_dispatch.cpp
// picks them once), for the cell's ops and the sequence's step loop.
template <typename T>
const Kernels<T>& best_kernels();

// How many rows of a [batch, state] problem make one at::parallel_for task.
int64_t rows_per_task(int64_t state_size);

} // namespace lltm::cpu
