// The arguments of the cell's pointwise kernels, for both devices: CUDA's
// (cuda/cell/) and the CPU's (cpp/cpu_kernels/). Plain C++: raw pointers and
// sizes, no CUDA and no ATen. Rows are addressed as row * ld + column:
// element (b, s) of new_h is new_h[b * state + s].
#pragma once

#include <cstdint>

namespace lltm::kernels {

// The forward pass over a [batch, state] problem.
template <typename T>
struct ForwardArgs {
  // Pre-activations [batch, 3 * state] = [Z_i | Z_o | Z_c], with row stride
  // ld_z, without the bias unless `bias` is nullptr.
  const T* z;
  int64_t ld_z;
  const T* bias; // [3 * state], or nullptr
  const T* old_cell; // [batch, state], dense
  T* new_h; // [batch, state], dense
  T* new_cell; // [batch, state], dense
  // The activations i, o and g, with row stride ld_act, or all nullptr when
  // nothing is saved for a backward. They may alias z element for element:
  // each pre-activation is read before its activation is written.
  T* input_gate;
  T* output_gate;
  T* candidate_cell;
  int64_t ld_act;
  // z + bias written back in place (the tutorial's gate_weights), or nullptr.
  T* z_with_bias;
  // The CUDA kernels' rows; the CPU's take a range of rows instead.
  int64_t batch;
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

// The backward pass; Sum is the type of the bias gradient's sums.
template <typename T, typename Sum = T>
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
  // [3 * state]: the column sums of d_gates (CUDA's kernels write them; the
  // CPU's add those of their rows, in the math type), or nullptr.
  Sum* d_bias;
  // The CUDA kernels' rows; the CPU's take a range of rows instead.
  int64_t batch;
  int64_t state;
  // A second addend of grad_h, dense rows with row stride ld_grad_h_add (a
  // sequence's recurrent gradient, dZ_{t+1} W_h), or nullptr.
  const T* grad_h_add = nullptr;
  int64_t ld_grad_h_add = 0;
};

} // namespace lltm::kernels
