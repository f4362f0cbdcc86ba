// What the CPU's paths share: steps and onednn run the same loops, per step
// one GEMM and the cell's vectorized pointwise kernel
// (cpp/cpu_kernels/kernels.cpp states its math), split over threads by
// rows; they differ in the step's GEMM, h_{t-1} W_h^T in the forward and
// dZ_t W_h in the backward. A Gemm is constructed from (weights, sizes,
// packed, backward) and has forward(z, h) (Z_t = P_t + h W_h^T, over P_t in
// z) and backward(dz, out) (dZ_t W_h, into `out` or a tensor of its own).
#pragma once

#include "cpp/cpu_kernels/kernels.h"
#include "cpp/cpu_kernels/tensors.h"
#include "cpp/sequence/path.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <array>
#include <optional>

namespace lltm::sequence::cpu_paths {

using cpu::strided;

// Step t of a [T, B, S] operand, read through its strides.
template <typename T>
cpu::Strided<T> strided_step(const std::optional<at::Tensor>& t, int64_t step) {
  if (!t) {
    return {nullptr, 0, 0};
  }
  return {
      t->const_data_ptr<T>() + step * t->stride(0), t->stride(1), t->stride(2)};
}

// Step t of a [T, ...] buffer as one view, moved from step to step: a new
// view per step would cost a dispatcher call and an allocation. The view is
// the loop's own and never escapes it.
class StepView {
 public:
  explicit StepView(const at::Tensor& buffer)
      : view_(buffer.select(0, 0)),
        first_(buffer.storage_offset()),
        stride_(buffer.stride(0)) {}

  at::Tensor& at(int64_t step) {
    view_.unsafeGetTensorImpl()->set_storage_offset(first_ + step * stride_);
    return view_;
  }

 private:
  at::Tensor view_;
  int64_t first_;
  int64_t stride_;
};

template <typename T, typename Gemm>
void forward_loop(
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers) {
  const at::Tensor& h0 = in.h0;
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  const Gemm gemm(in.weights, sizes, in.packed, /*backward=*/false);
  const at::Tensor bias_c = in.bias.contiguous();
  const at::Tensor c0_c = in.c0.contiguous();
  const bool save = buffers.cells.defined();
  T* gates = buffers.gates.mutable_data_ptr<T>();
  T* output = buffers.output.mutable_data_ptr<T>();
  T* cells = save ? buffers.cells.mutable_data_ptr<T>() : nullptr;
  T* c_n = buffers.c_n.mutable_data_ptr<T>();
  const auto& k = cpu::best_kernels<T>();
  const int64_t grain = cpu::rows_per_task(S);
  StepView z_view(buffers.gates);
  StepView h_view(buffers.output);
  for (int64_t t = 0; t < steps; ++t) {
    T* z = gates + t * B * 3 * S;
    const at::Tensor pre =
        gemm.forward(z_view.at(t), t == 0 ? h0 : h_view.at(t - 1));
    cpu::ForwardArgs<T> args{};
    args.z = pre.const_data_ptr<T>();
    args.ld_z = 3 * S;
    args.bias = bias_c.const_data_ptr<T>();
    // Without saving, c_t is written over c_{t-1} in c_n: the kernel reads
    // each element of old_cell before it writes it in new_cell.
    args.old_cell =
        t == 0 ? c0_c.const_data_ptr<T>() : (save ? cells + (t - 1) * BS : c_n);
    args.new_h = output + t * BS;
    args.new_cell = save ? cells + t * BS : c_n;
    if (save) {
      // [i | o | g] over the step's rows of gates (where z may be).
      args.input_gate = z;
      args.output_gate = z + S;
      args.candidate_cell = z + 2 * S;
      args.ld_act = 3 * S;
    }
    args.state = S;
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      k.forward(args, begin, end);
    });
  }
  T* h_n = buffers.h_n.mutable_data_ptr<T>();
  std::copy(output + (steps - 1) * BS, output + steps * BS, h_n);
  if (save) {
    std::copy(cells + (steps - 1) * BS, cells + steps * BS, c_n);
  }
}

template <typename T, typename Gemm>
at::Tensor backward_loop(
    const Sizes& sizes,
    const BackwardInputs& in,
    at::Tensor& d_gates) {
  const std::optional<at::Tensor>& grad_output = in.grad_output;
  const std::optional<at::Tensor>& grad_h_n = in.grad_h_n;
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  const Gemm gemm(in.weights, sizes, in.packed, /*backward=*/true);
  const auto options = in.gates.options();
  // dc_t, in turns: step t reads dc_t and writes dc_{t-1}; and the
  // recurrent term dZ_{t+1} W_h.
  const std::array<at::Tensor, 2> dc{
      at::empty({B, S}, options), at::empty({B, S}, options)};
  at::Tensor recurrent_buffer = at::empty({B, S}, options);
  at::Tensor recurrent;
  // grad_h_n joins grad_output[T - 1] as the dense second addend.
  std::optional<at::Tensor> grad_h_n_dense;
  if (grad_output && grad_h_n) {
    grad_h_n_dense = grad_h_n->contiguous();
  }
  const std::array<T*, 2> dc_data{
      dc[0].mutable_data_ptr<T>(), dc[1].mutable_data_ptr<T>()};
  T* dz = d_gates.mutable_data_ptr<T>();
  const T* act = in.gates.const_data_ptr<T>();
  const T* cell = in.cells.const_data_ptr<T>();
  const auto& k = cpu::best_kernels<T>();
  const int64_t grain = cpu::rows_per_task(S);
  StepView dz_view(d_gates);
  for (int64_t t = steps - 1; t >= 0; --t) {
    cpu::BackwardArgs<T> args{};
    args.grad_h = strided_step<T>(grad_output, t);
    if (t == steps - 1) {
      if (!grad_output) {
        args.grad_h = strided<T>(grad_h_n);
      } else if (grad_h_n_dense) {
        args.grad_h_add = grad_h_n_dense->const_data_ptr<T>();
        args.ld_grad_h_add = S;
      }
      args.grad_cell = strided<T>(in.grad_c_n);
    } else {
      args.grad_h_add = recurrent.const_data_ptr<T>();
      args.ld_grad_h_add = S;
      args.grad_cell = {dc_data[(t + 1) % 2], S, 1};
    }
    args.new_cell = cell + t * BS;
    args.input_gate = act + t * B * 3 * S;
    args.output_gate = args.input_gate + S;
    args.candidate_cell = args.input_gate + 2 * S;
    args.ld_act = 3 * S;
    args.d_gates = dz + t * B * 3 * S;
    args.d_old_cell = dc_data[t % 2];
    args.d_bias = nullptr; // summed over all steps at the end
    args.state = S;
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      k.backward(args, begin, end);
    });
    if (t > 0) {
      recurrent = gemm.backward(dz_view.at(t), recurrent_buffer);
    }
  }
  return dc[0];
}

// The step loops, with raw pointers for the pointwise kernels: at a small
// batch a step is a few microseconds of work, and each ATen op adds about
// as much.
template <typename Gemm>
void gemm_forward(
    const Plan& /*plan*/,
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& b) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      in.weights.scalar_type(),
      "lltm_sequence_cpu",
      [&] { forward_loop<scalar_t, Gemm>(sizes, in, b); });
}

// One parallel region over a step's tasks of `count` directions, `tasks`
// each, direction d's task i as task d * tasks + i: run(d, begin, end) for
// each direction's share of a thread's range. The fused paths' steps, for
// one direction or both at once (Path::forward_directions).
template <typename Run>
void parallel_directions(
    int64_t count,
    int64_t tasks,
    int64_t grain,
    const Run& run) {
  at::parallel_for(0, count * tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t d = begin / tasks; d < count && d * tasks < end; ++d) {
      run(d,
          std::max(begin, d * tasks) - d * tasks,
          std::min(end, (d + 1) * tasks) - d * tasks);
    }
  });
}

template <typename Gemm>
StateGrads gemm_backward(
    const Plan& /*plan*/,
    const Sizes& sizes,
    const BackwardInputs& in,
    const OutputMask& /*output_mask*/,
    at::Tensor& d_gates) {
  StateGrads state;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      in.weights.scalar_type(),
      "lltm_sequence_backward_cpu",
      [&] { state.d_c0 = backward_loop<scalar_t, Gemm>(sizes, in, d_gates); });
  return state;
}

} // namespace lltm::sequence::cpu_paths
