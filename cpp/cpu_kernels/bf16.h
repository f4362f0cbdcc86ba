// The CPU's bfloat16 sequence steps on AVX-512 BF16 (VDPBF16PS): what the
// dpbf16 path (cpp/sequence/cpu/dpbf16.cpp) runs. bf16.cpp states the math.
//
// W_h is packed once a call into panels of kPanelWidth state units whose
// rows come in pairs along the dot product's k, the layout VDPBF16PS reads:
// the pair (k, k + 1) of a unit is one 32-bit lane. The work of a step is
// (panel, block of rows) tasks, numbered as cpu::FusedStepArgs says.
#pragma once

#include "cuda/common/cell_args.h"

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace lltm::cpu::bf16 {

using c10::BFloat16;

// State units of a panel: one vector of 16 floats.
constexpr int64_t kPanelWidth = 16;
// Rows of a forward task (three accumulators a row in registers), and of a
// backward task (one a row).
constexpr int64_t kBlockRows = 8;
constexpr int64_t kBackwardBlockRows = 16;

struct StepArgs;
struct BackwardStepArgs;

// The kernels, reached only through this table (as each capability's
// kernels are, cpp/cpu_kernels/dispatch.cpp): no code of the default
// target calls AVX-512 code directly.
struct Kernels {
  // Tasks [begin, end) of a forward step, of a backward step.
  void (*step)(const StepArgs& args, int64_t begin, int64_t end);
  void (
      *backward_step)(const BackwardStepArgs& args, int64_t begin, int64_t end);
};

// The kernels where this processor runs them (AVX-512 BF16, and ATen's
// capability AVX512: ATEN_CPU_CAPABILITY can lower it) and the build has
// them (x86-64 with GCC or Clang); else nullptr.
const Kernels* kernels();

// The forward's panels of W_h^T: [panels, ceil(state / 2), 3, 16, 2], the
// pair (k, k + 1) of unit j of gate g at [p, k / 2, g, j], zeros past the
// state's end. `w` is W_h, [3 * state, state] through its strides. With
// features, W_x^T's pairs follow W_h^T's in each panel, [panels,
// ceil(state / 2) + ceil(features / 2), 3, 16, 2], from W's next columns.
void pack_forward(
    const BFloat16* w,
    int64_t row_stride,
    int64_t col_stride,
    int64_t state,
    int64_t features,
    BFloat16* out,
    int64_t panel_begin,
    int64_t panel_end);
int64_t forward_panels_numel(int64_t state, int64_t features);

// The backward's panels of W_h: [panels, ceil(3 * state / 2), 16, 2], the
// pair (k, k + 1) of W_h's rows for unit j at [p, k / 2, j].
void pack_backward(
    const BFloat16* w,
    int64_t row_stride,
    int64_t col_stride,
    int64_t state,
    BFloat16* out,
    int64_t panel_begin,
    int64_t panel_end);
int64_t backward_panels_numel(int64_t state);

// One forward step: Z = z + h W_h^T + bias, or without z Z = [h | x] W^T +
// bias, the cell's forward on Z, with the cell kept in float32 between
// steps.
struct StepArgs {
  const BFloat16* h; // h_{t-1}: [batch, state], dense
  const BFloat16* w; // pack_forward's panels (with x's features)
  // The input projection, [batch, 3 * state], dense: in float32 where
  // z_f32 is given (z is then unread), else rounded in z; where neither
  // is, the step adds x_t's, x: [batch, features], dense (features may
  // be 0).
  const BFloat16* z;
  const float* z_f32;
  const BFloat16* x;
  int64_t features;
  const BFloat16* bias; // [3 * state]
  float* cell; // c_{t-1} in, c_t out: [batch, state], dense
  BFloat16* new_h; // [batch, state], dense
  BFloat16* new_cell; // c_t rounded, [batch, state], dense, or nullptr
  // [i | o | g], [batch, 3 * state], dense (may be z: read first), or
  // nullptr when nothing is saved.
  BFloat16* activations;
  int64_t batch;
  int64_t state;
};

// A [batch, state] operand through its strides, as the cell's kernels read
// it (nullptr reads as zeros).
using Strided = kernels::Strided<BFloat16>;

// One backward step: gh = grad_h + grad_h_add + dz_next W_h (nullptr at the
// last step), gc = grad_cell (or grad_cell_f, float32, when given), then
// the cell's backward; dc stays float32 between steps.
struct BackwardStepArgs {
  const BFloat16* dz_next; // [batch, 3 * state], dense, or nullptr
  const BFloat16* w; // pack_backward's panels
  Strided grad_h;
  const BFloat16* grad_h_add; // [batch, state], dense, or nullptr
  Strided grad_cell;
  const float* grad_cell_f; // [batch, state], dense, or nullptr
  const BFloat16* new_cell; // [batch, state], dense
  const BFloat16* activations; // [i | o | g], [batch, 3 * state], dense
  BFloat16* d_gates; // [batch, 3 * state], dense
  float* d_old_cell; // [batch, state], dense
  int64_t batch;
  int64_t state;
};

} // namespace lltm::cpu::bf16
