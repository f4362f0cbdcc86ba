// The LLTM pointwise CPU kernels: what lltm_cpu.cpp and sequence_cpu.cpp
// call.
//
// Each kernel works on a range of batch rows, so that the callers can split
// the batch over threads with at::parallel_for. lltm_cpu_kernel.cpp is
// compiled once per CPU capability, each object with its own flags, and
// cpu_dispatch.cpp picks the table of the best one the processor runs, as
// ATen's own kernels do.
#pragma once

#include <ATen/OpMathType.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <tuple>

namespace lltm::cpu {

// Pointers of the forward pass over rows [0, batch), each [batch, ...] and
// addressed by row: element (b, s) of new_h is new_h[b * state + s].
template <typename T>
struct ForwardArgs {
  // Pre-activations [batch, 3 * state], [Z_i | Z_o | Z_c], with row stride
  // ld_z, without the bias unless `bias` is nullptr.
  const T* z;
  int64_t ld_z;
  const T* bias; // [3 * state], or nullptr
  const T* old_cell; // [batch, state], dense
  T* new_h; // [batch, state], dense
  T* new_cell; // [batch, state], dense
  // The activations i, o and g, with row stride ld_act; all nullptr when
  // nothing is saved for a backward. They may alias z element for element:
  // each pre-activation is read before its activation is written.
  T* input_gate;
  T* output_gate;
  T* candidate_cell;
  int64_t ld_act;
  // z + bias written back in place (the tutorial's gate_weights), or nullptr.
  T* z_with_bias;
  int64_t state;
};

// A [batch, state] operand read through its strides, which may be 0 (an
// expanded upstream gradient); nullptr reads as zeros (no gradient).
template <typename T>
struct Strided {
  const T* data;
  int64_t row_stride;
  int64_t col_stride;
};

template <typename T>
struct BackwardArgs {
  Strided<T> grad_h;
  Strided<T> grad_cell;
  const T* new_cell; // [batch, state], dense
  // The saved activations, with row stride ld_act.
  const T* input_gate;
  const T* output_gate;
  const T* candidate_cell;
  int64_t ld_act;
  T* d_gates; // [batch, 3 * state], dense: [dZ_i | dZ_o | dZ_c]
  T* d_old_cell; // [batch, state], dense, or nullptr
  // [3 * state]: the kernel adds the column sums of d_gates over its rows
  // (the bias gradient of those rows), or nullptr.
  at::opmath_type<T>* d_bias_sum;
  int64_t state;
  // A second addend of grad_h, dense rows with row stride ld_grad_h_add (a
  // sequence's recurrent gradient, dZ_{t+1} W_h), or nullptr.
  const T* grad_h_add = nullptr;
  int64_t ld_grad_h_add = 0;
};

// One step of a sequence's forward with its recurrent GEMM fused in:
// Z = z + h W_h^T + bias, then the forward's math on Z, without Z ever
// leaving registers. W_h^T comes in panels of `panel_width` state units (the
// kernel's vector width): panel p holds, for k in [0, state), the rows k of
// the three gates' columns of its units, [panels, state, 3, panel_width]
// (zeros past the state's end), so that a panel's units are one vector of
// each gate. The work is (panel, block of `block_rows` rows) tasks, task i
// being panel i / row_blocks, rows block i % row_blocks: a thread that runs
// the same range of tasks at every step keeps its panels in its cache.
template <typename T>
struct FusedStepArgs {
  const T* h; // h_{t-1}: [batch, state], dense
  const T* w; // W_h^T's panels
  const T* z; // the input projection: [batch, 3 * state], dense
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
