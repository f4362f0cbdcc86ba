// The sequence ops on the CPU: per step one GEMM (BLAS) and the cell's
// vectorized pointwise kernel (lltm_cpu_kernel.cpp states its math),
// split over threads by rows; sequence.cpp does the rest (sequence.h states
// the math).
#include "cell_backend.h"
#include "lltm_cpu.h"
#include "lltm_cpu_kernel.h"
#include "sequence.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <array>

namespace lltm::sequence {
namespace {

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

template <typename T>
void forward_loop(
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers) {
  const at::Tensor& h0 = in.h0;
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  // W_h^T, packed once: [S, 3S].
  const at::Tensor w_h_t = packed_w_h_t(in.weights, S, in.packed);
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
    // The CPU kernel straight, past the dispatcher.
    at::cpu::addmm_(z_view.at(t), t == 0 ? h0 : h_view.at(t - 1), w_h_t);
    cpu::ForwardArgs<T> args{};
    args.z = z;
    args.ld_z = 3 * S;
    args.bias = bias_c.const_data_ptr<T>();
    // Without saving, c_t is written over c_{t-1} in c_n: the kernel reads
    // each element of old_cell before it writes it in new_cell.
    args.old_cell =
        t == 0 ? c0_c.const_data_ptr<T>() : (save ? cells + (t - 1) * BS : c_n);
    args.new_h = output + t * BS;
    args.new_cell = save ? cells + t * BS : c_n;
    if (save) {
      // [i | o | g] over [Z_i | Z_o | Z_c], element for element.
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

template <typename T>
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
  const at::Tensor w_h = packed_w_h(in.weights, S, in.packed); // [3S, S]
  const auto options = in.gates.options();
  // dc_t, in turns: step t reads dc_t and writes dc_{t-1}; and the
  // recurrent term dZ_{t+1} W_h.
  const std::array<at::Tensor, 2> dc{
      at::empty({B, S}, options), at::empty({B, S}, options)};
  at::Tensor recurrent = at::empty({B, S}, options);
  // grad_h_n joins grad_output[T - 1] as the dense second addend.
  std::optional<at::Tensor> grad_h_n_dense;
  if (grad_output && grad_h_n) {
    grad_h_n_dense = grad_h_n->contiguous();
  }
  const std::array<T*, 2> dc_data{
      dc[0].mutable_data_ptr<T>(), dc[1].mutable_data_ptr<T>()};
  T* rec = recurrent.mutable_data_ptr<T>();
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
      args.grad_h_add = rec;
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
    args.d_bias_sum = nullptr; // summed over all steps at the end
    args.state = S;
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      k.backward(args, begin, end);
    });
    if (t > 0) {
      at::cpu::mm_out(recurrent, dz_view.at(t), w_h);
    }
  }
  return dc[0];
}

// The step loops, with raw pointers for the pointwise kernels and the CPU
// GEMM kernels called past the dispatcher: at a small batch a step is a few
// microseconds of work, and each ATen op adds about as much.
void cpu_forward(
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& b) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      in.weights.scalar_type(),
      "lltm_sequence_cpu",
      [&] { forward_loop<scalar_t>(sizes, in, b); });
}

StateGrads cpu_backward(
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
      [&] { state.d_c0 = backward_loop<scalar_t>(sizes, in, d_gates); });
  return state;
}

// One set of loops for every call.
const StepLoops& cpu_loops(
    const Sizes& /*sizes*/,
    at::ScalarType /*dtype*/,
    bool /*backward*/,
    const char* /*op*/) {
  static constexpr StepLoops kLoops{&cpu_forward, &cpu_backward};
  return kLoops;
}

// The two directions on a thread each, where there are threads to spare or
// a step is too small to share: each direction's steps then run on one
// thread, with no barrier between threads at every step. A step of more
// multiply-adds than this (batch x 3 state x state) gains more from all the
// threads than from running beside the other direction.
constexpr int64_t kSharedStepMacs = int64_t(1) << 22;

void cpu_for_each_direction(
    const Sizes& sizes,
    int64_t directions,
    c10::function_ref<void(int64_t)> body) {
  const int64_t S = sizes.state_size;
  const int64_t threads = at::get_num_threads();
  const bool apart = directions > 1 && threads > 1 &&
      !at::in_parallel_region() &&
      (threads <= directions || sizes.batch * 3 * S * S <= kSharedStepMacs);
  if (apart) {
    // The workers take the caller's dispatch state (below autograd, where
    // the op runs), which at::parallel_for leaves behind.
    const at::ThreadLocalState state;
    at::parallel_for(0, directions, 1, [&](int64_t begin, int64_t end) {
      const at::ThreadLocalStateGuard guard(state);
      for (int64_t d = begin; d < end; ++d) {
        body(d);
      }
    });
    return;
  }
  for (int64_t d = 0; d < directions; ++d) {
    body(d);
  }
}

// Every segment of a packed batch costs the CPU a few views and no launch.
int64_t cpu_min_segment_steps(int64_t /*steps*/) {
  return 1;
}

at::Tensor cpu_indices(std::vector<int64_t>&& values, c10::Device /*device*/) {
  at::Tensor out =
      at::empty({static_cast<int64_t>(values.size())}, at::dtype(at::kLong));
  std::copy(values.begin(), values.end(), out.mutable_data_ptr<int64_t>());
  return out;
}

struct Cpu {
  using Guard = backend::NoGuard;
  static const Engine& engine() {
    static constexpr Engine kEngine{
        &cpu_loops,
        &cpu_for_each_direction,
        &cpu_min_segment_steps,
        &cpu_indices};
    return kEngine;
  }
};

} // namespace
} // namespace lltm::sequence

TORCH_LIBRARY_IMPL(lltm, CPU, m) {
  using lltm::sequence::Cpu;
  using lltm::sequence::sequence_forward_kernel;
  m.impl("sequence", &sequence_forward_kernel<Cpu, false>);
  m.impl("sequence_forward", &sequence_forward_kernel<Cpu, true>);
  m.impl("sequence_backward", &lltm::sequence::sequence_backward_kernel<Cpu>);
}
