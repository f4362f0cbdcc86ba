// CUDA's steps path: per step one cuBLAS GEMM and the cell's pointwise
// kernel (cuda/cell/pointwise.cu states the math), in ATen loops. It runs
// every block, and auto takes it where no other path's window holds.
#include "cpp/sequence/cuda/operands.h"
#include "cpp/sequence/path.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/cuda/CUDAStream.h>

#include <array>

namespace lltm::sequence::cuda_paths {
namespace {

// The cell's pointwise forward over z ([B, 3S] pre-activations without the
// bias, row stride z.stride(0)): writes new_h and new_cell (dense), and the
// activations [i | o | g] in place over z when save is set.
void step_forward(
    at::Tensor& z,
    const at::Tensor& bias,
    const at::Tensor& old_cell,
    at::Tensor& new_h,
    at::Tensor& new_cell,
    bool save) {
  const int64_t S = new_h.size(1);
  const at::Tensor bias_c = bias.contiguous();
  const at::Tensor old_cell_c = old_cell.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, z.scalar_type(), "lltm_sequence_cuda", [&] {
        cuda::ForwardArgs<kernel_t<scalar_t>> args{};
        args.z = in<scalar_t>(z);
        args.ld_z = z.stride(0);
        args.bias = in<scalar_t>(bias_c);
        args.old_cell = in<scalar_t>(old_cell_c);
        args.new_h = out<scalar_t>(new_h);
        args.new_cell = out<scalar_t>(new_cell);
        if (save) {
          // [i | o | g] over [Z_i | Z_o | Z_c], element for element.
          kernel_t<scalar_t>* act = out<scalar_t>(z);
          args.input_gate = act;
          args.output_gate = act + S;
          args.candidate_cell = act + 2 * S;
          args.ld_act = z.stride(0);
        }
        args.batch = new_h.size(0);
        args.state = S;
        C10_CUDA_CHECK(cuda::launch_forward(args, stream));
      });
}

// The cell's pointwise backward: dZ into d_gates ([B, 3S], dense) and dc
// into d_old_cell, from gh = grad_h (strided, or none) + grad_h_add (dense,
// or none) and gc = grad_cell (strided, or none).
void step_backward(
    const std::optional<at::Tensor>& grad_h,
    const std::optional<at::Tensor>& grad_h_add,
    const std::optional<at::Tensor>& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& gates,
    at::Tensor& d_gates,
    at::Tensor& d_old_cell) {
  const int64_t S = new_cell.size(1);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      new_cell.scalar_type(),
      "lltm_sequence_backward_cuda",
      [&] {
        cuda::BackwardArgs<kernel_t<scalar_t>> args{};
        args.grad_h = strided<scalar_t>(grad_h);
        args.grad_cell = strided<scalar_t>(grad_cell);
        args.new_cell = in<scalar_t>(new_cell);
        const kernel_t<scalar_t>* act = in<scalar_t>(gates);
        args.input_gate = act;
        args.output_gate = act + S;
        args.candidate_cell = act + 2 * S;
        args.ld_act = gates.stride(0);
        args.d_gates = out<scalar_t>(d_gates);
        args.d_old_cell = out<scalar_t>(d_old_cell);
        args.d_bias = nullptr; // summed over all steps at the end
        args.batch = new_cell.size(0);
        args.state = S;
        if (grad_h_add) {
          args.grad_h_add = in<scalar_t>(*grad_h_add);
          args.ld_grad_h_add = grad_h_add->stride(0);
        }
        // Without d_bias the kernel needs no workspace.
        C10_CUDA_CHECK(cuda::launch_backward(args, nullptr, stream));
      });
}

std::optional<at::Tensor> step_of(
    const std::optional<at::Tensor>& t,
    int64_t index) {
  return t ? std::optional<at::Tensor>(t->select(0, index)) : std::nullopt;
}

// Per step one GEMM and one pointwise kernel, then h_n and c_n.
void steps_forward(
    const Plan& /*plan*/,
    const Sizes& sizes,
    const ForwardInputs& inputs,
    ForwardBuffers& b) {
  const int64_t T = sizes.steps;
  const bool save = b.cells.defined();
  // W_h^T packed once: every step's GEMM reads a dense operand rather than
  // the strided column block of the weights.
  const at::Tensor w_h_t =
      packed_w_h_t(inputs.weights, sizes.state_size, inputs.packed);
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor z = b.gates.select(0, t);
    z.addmm_(t == 0 ? inputs.h0 : b.output.select(0, t - 1), w_h_t);
    at::Tensor new_h = b.output.select(0, t);
    // Without saving, c_t is written over c_{t-1} in c_n: the kernels read
    // each element of old_cell before they write it in new_cell.
    at::Tensor new_cell = save ? b.cells.select(0, t) : b.c_n;
    const at::Tensor old_cell =
        t == 0 ? inputs.c0 : (save ? b.cells.select(0, t - 1) : b.c_n);
    step_forward(z, inputs.bias, old_cell, new_h, new_cell, save);
  }
  b.h_n.copy_(b.output.select(0, T - 1));
  if (save) {
    b.c_n.copy_(b.cells.select(0, T - 1));
  }
}

// The reverse loop, per step the pointwise kernel and one GEMM.
StateGrads steps_backward(
    const Plan& /*plan*/,
    const Sizes& sizes,
    const BackwardInputs& inputs,
    const OutputMask& /*output_mask*/,
    at::Tensor& d_gates) {
  const int64_t T = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const at::Tensor w_h =
      packed_w_h(inputs.weights, S, inputs.packed); // as above
  const auto options = inputs.gates.options();
  // dc_t, in turns: step t reads dc_t and writes dc_{t-1}.
  std::array<at::Tensor, 2> dc{
      at::empty({B, S}, options), at::empty({B, S}, options)};
  at::Tensor recurrent = at::empty({B, S}, options); // dZ_{t+1} W_h
  for (int64_t t = T - 1; t >= 0; --t) {
    std::optional<at::Tensor> grad_h = step_of(inputs.grad_output, t);
    std::optional<at::Tensor> grad_h_add;
    std::optional<at::Tensor> grad_cell;
    if (t == T - 1) {
      // grad_h_n takes the place of the recurrent term; the second addend
      // is read densely.
      if (!grad_h) {
        grad_h = inputs.grad_h_n;
      } else if (inputs.grad_h_n) {
        grad_h_add = inputs.grad_h_n->contiguous();
      }
      grad_cell = inputs.grad_c_n;
    } else {
      grad_h_add = recurrent;
      grad_cell = dc[(t + 1) % 2];
    }
    at::Tensor d_gates_t = d_gates.select(0, t);
    step_backward(
        grad_h,
        grad_h_add,
        grad_cell,
        inputs.cells.select(0, t),
        inputs.gates.select(0, t),
        d_gates_t,
        dc[t % 2]);
    if (t > 0) {
      at::mm_out(recurrent, d_gates_t, w_h);
    }
  }
  return {dc[0], std::nullopt};
}

std::optional<Plan> plan(const Block& /*block*/, std::string* /*why_not*/) {
  return Plan{};
}

const Path kSteps{
    "steps",
    c10::DeviceType::CUDA,
    40,
    &plan,
    nullptr,
    nullptr,
    &steps_forward,
    &steps_backward};

} // namespace

LLTM_REGISTER_SEQUENCE_PATH(kSteps);

} // namespace lltm::sequence::cuda_paths
