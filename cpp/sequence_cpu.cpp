// The sequence ops on the CPU: the step loops of sequence.cpp (ATen GEMMs,
// one per step) over the cell's vectorized pointwise kernels
// (lltm_cpu_kernel_impl.h states their math), split over threads by rows.
#include "lltm_cpu_kernel.h"
#include "sequence.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

namespace lltm::sequence {
namespace {

template <typename T>
cpu::Strided<T> strided(const std::optional<at::Tensor>& t) {
  if (!t) {
    return {nullptr, 0, 0};
  }
  return {t->const_data_ptr<T>(), t->stride(0), t->stride(1)};
}

void step_forward(
    at::Tensor& z,
    const at::Tensor& bias,
    const at::Tensor& old_cell,
    at::Tensor& new_h,
    at::Tensor& new_cell,
    bool save) {
  const int64_t B = new_h.size(0);
  const int64_t S = new_h.size(1);
  const at::Tensor bias_c = bias.contiguous();
  const at::Tensor old_cell_c = old_cell.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, z.scalar_type(), "lltm_sequence_cpu", [&] {
        cpu::ForwardArgs<scalar_t> args{};
        args.z = z.const_data_ptr<scalar_t>();
        args.ld_z = z.stride(0);
        args.bias = bias_c.const_data_ptr<scalar_t>();
        args.old_cell = old_cell_c.const_data_ptr<scalar_t>();
        args.new_h = new_h.mutable_data_ptr<scalar_t>();
        args.new_cell = new_cell.mutable_data_ptr<scalar_t>();
        if (save) {
          // [i | o | g] over [Z_i | Z_o | Z_c], element for element.
          scalar_t* act = z.mutable_data_ptr<scalar_t>();
          args.input_gate = act;
          args.output_gate = act + S;
          args.candidate_cell = act + 2 * S;
          args.ld_act = z.stride(0);
        }
        args.state = S;
        const auto& k = cpu::best_kernels<scalar_t>();
        at::parallel_for(
            0, B, cpu::rows_per_task(S), [&](int64_t begin, int64_t end) {
              k.forward(args, begin, end);
            });
      });
}

void step_backward(
    const std::optional<at::Tensor>& grad_h,
    const std::optional<at::Tensor>& grad_h_add,
    const std::optional<at::Tensor>& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& gates,
    at::Tensor& d_gates,
    at::Tensor& d_old_cell) {
  const int64_t B = new_cell.size(0);
  const int64_t S = new_cell.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      new_cell.scalar_type(),
      "lltm_sequence_backward_cpu",
      [&] {
        cpu::BackwardArgs<scalar_t> args{};
        args.grad_h = strided<scalar_t>(grad_h);
        args.grad_cell = strided<scalar_t>(grad_cell);
        args.new_cell = new_cell.const_data_ptr<scalar_t>();
        const scalar_t* act = gates.const_data_ptr<scalar_t>();
        args.input_gate = act;
        args.output_gate = act + S;
        args.candidate_cell = act + 2 * S;
        args.ld_act = gates.stride(0);
        args.d_gates = d_gates.mutable_data_ptr<scalar_t>();
        args.d_old_cell = d_old_cell.mutable_data_ptr<scalar_t>();
        args.d_bias_sum = nullptr; // summed over all steps at the end
        args.state = S;
        if (grad_h_add) {
          args.grad_h_add = grad_h_add->const_data_ptr<scalar_t>();
          args.ld_grad_h_add = grad_h_add->stride(0);
        }
        const auto& k = cpu::best_kernels<scalar_t>();
        at::parallel_for(
            0, B, cpu::rows_per_task(S), [&](int64_t begin, int64_t end) {
              k.backward(args, begin, end);
            });
      });
}

constexpr StepKernels kCpuKernels{&step_forward, &step_backward};

Result sequence_cpu(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0) {
  const Sizes sizes =
      check_forward_args(input, weights, bias, h0, c0, "lltm::sequence");
  return sequence_steps(sizes, input, weights, bias, h0, c0, kCpuKernels);
}

ForwardResult sequence_forward_cpu(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0) {
  const Sizes sizes = check_forward_args(
      input, weights, bias, h0, c0, "lltm::sequence_forward");
  return sequence_forward_steps(
      sizes, input, weights, bias, h0, c0, kCpuKernels);
}

BackwardResult sequence_backward_cpu(
    const std::optional<at::Tensor>& grad_output,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const at::Tensor& output,
    const at::Tensor& cells,
    const at::Tensor& gates,
    OutputMask mask) {
  const Sizes sizes = check_backward_args(
      grad_output,
      grad_h_n,
      grad_c_n,
      input,
      weights,
      h0,
      output,
      cells,
      gates);
  return sequence_backward_steps(
      sizes,
      grad_output,
      grad_h_n,
      grad_c_n,
      input,
      weights,
      h0,
      output,
      cells.contiguous(),
      gates.contiguous(),
      mask,
      kCpuKernels);
}

} // namespace
} // namespace lltm::sequence

TORCH_LIBRARY_IMPL(lltm, CPU, m) {
  m.impl("sequence", &lltm::sequence::sequence_cpu);
  m.impl("sequence_forward", &lltm::sequence::sequence_forward_cpu);
  m.impl("sequence_backward", &lltm::sequence::sequence_backward_cpu);
}
