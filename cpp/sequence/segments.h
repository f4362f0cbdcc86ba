// How a call's steps lie in the buffers: the directions, and the segments
// of a packed batch, each a dense block for the paths.
//
// Each direction runs its steps over "work" buffers of rows: the input's
// rows in the order that direction takes them, and as many rows per step as
// its segment's batch. A dense input is one segment of T steps of B rows,
// and direction 1 takes its steps in reverse (a flip of the steps).
//
// Packed batches. Step t has batch_sizes[t] rows, the first ones of the
// batch: a sequence that has ended drops out, and rows never come back. The
// steps run in segments of a constant batch, so that each segment is one
// dense block for the paths, which know nothing of lengths: a segment
// starts from the first rows of the state its previous segment ended with.
// Where the batch shrinks every few steps, a segment per change would cost
// a launch each on CUDA; there a segment lasts at least
// Engine::min_segment_steps steps and keeps its first step's batch, so that
// sequences that end inside it run on, as padding rows (of zero input), to
// the segment's end. Rows are independent in every kernel (W_h mixes a
// row's own columns only), so padding rows change nothing of the others:
// each sequence's h_n and c_n are read from its own last step (cells are
// always kept), and the backward gives padding rows zero upstream gradient
// and reads dZ of the real rows alone. Each direction runs over the same
// segments: direction 1 takes each sequence from its own end, and at its
// step t the same first batch_sizes[t] sequences are running.
#pragma once

#include "cpp/sequence/sequence.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace lltm::sequence {

struct Segment {
  int64_t first_step;
  int64_t steps;
  int64_t batch;
  int64_t row; // the first row of its block in the work buffers
};

class Steps {
 public:
  // A dense input: one segment.
  Steps(int64_t steps, int64_t batch)
      : work_rows_(steps * batch), segments_{{0, steps, batch, 0}} {}

  // A packed input, in segments of at least `min_steps` steps where the
  // batch shrinks inside one.
  Steps(const std::vector<int64_t>& batch_sizes, int64_t min_steps);

  int64_t work_rows() const {
    return work_rows_;
  }
  const std::vector<Segment>& segments() const {
    return segments_;
  }
  // Direction 0's work rows are the input's own rows.
  bool identity() const {
    return identity_;
  }
  // How many sequences run at step t (0 past the last step).
  int64_t batch_at(int64_t t) const {
    return t < static_cast<int64_t>(batch_sizes_.size()) ? batch_sizes_[t] : 0;
  }

  // The segments of the backward: with grad_c_n, a segment ends wherever a
  // sequence does, so that its gradient joins at its own last step (the
  // paths take grad_c_n at a block's last step only); grad_h_n joins
  // through grad_output instead, which any step takes.
  std::vector<Segment> backward_segments(bool split) const;

  // Packed only. For each row of the packed input (step t, sequence r), its
  // work row in direction d: step t of direction 0, step length_r - 1 - t
  // of direction 1.
  std::vector<int64_t> work_of_packed(int64_t d) const;

  // For each sequence, the work row of its last step (in either direction).
  std::vector<int64_t> last_work() const;

  // For each row of the packed input, where h_{t-1} of direction d is in
  // [h0_d; the packed output's columns of d]: h0's row r at the direction's
  // first step, else the row of the step before (after, for direction 1).
  std::vector<int64_t> previous_of_packed(int64_t d) const;

 private:
  bool identity_ = true;
  int64_t work_rows_ = 0;
  std::vector<Segment> segments_;
  std::vector<int64_t> batch_sizes_; // empty for a dense input
  std::vector<int64_t> offset_; // the packed input's first row of each step
  std::vector<int64_t> length_; // each sequence's
  std::vector<int64_t> work_offset_; // the work buffers' first row of each step
};

// A packed call's row indices on the device, made before the directions
// fork (the CPU's run on threads of their own).
struct Indices {
  std::array<at::Tensor, 2> work_of_packed; // undefined where identity
  std::array<at::Tensor, 2> previous_of_packed; // the backward's, for d_W_h
  at::Tensor last_work;

  Indices(
      const Steps& steps,
      int64_t directions,
      const Engine& engine,
      c10::Device device,
      bool previous);
};

// The shape of a per-direction tensor: `shape` with the direction dimension
// in front when the arguments carry one.
std::vector<int64_t> directed(
    bool stacked,
    int64_t directions,
    std::initializer_list<int64_t> shape);

// One direction's view of an argument that may carry a direction dimension.
at::Tensor direction_of(const at::Tensor& t, int64_t d, bool stacked);

// Rows [row, row + steps * batch) of a work buffer ([rows, width]) as the
// segment's dense block [steps, batch, width].
at::Tensor block(const at::Tensor& work, const Segment& s);

// The first `rows` rows of the last step before segment s (the previous
// segment's last step): where s starts from.
at::Tensor state_before(
    const at::Tensor& work,
    const Segment& previous,
    int64_t rows);

// A packed tensor ([N, X]) in direction d's work rows ([W, X]); padding rows
// are zero. Direction 0 of an identity layout is the tensor itself.
at::Tensor to_work(
    const at::Tensor& packed,
    const Steps& steps,
    const Indices& idx,
    int64_t d);

// Direction d's work rows back in the packed order.
at::Tensor from_work(
    const at::Tensor& work,
    const Steps& steps,
    const Indices& idx,
    int64_t d);

// A [rows, S] tensor whose first rows are `first` and the rest zero.
at::Tensor padded(const at::Tensor& first, int64_t rows);

// Direction d's columns of the output ([..., D * S]).
at::Tensor output_of(const at::Tensor& output, int64_t d, int64_t S);

// The fewest steps of a packed batch's segment (Steps): LLTM_SEGMENT_STEPS
// where set (the tests run the CUDA layout on the CPU with it), else the
// engine's.
int64_t min_segment_steps(const Engine& engine, int64_t steps);

} // namespace lltm::sequence
