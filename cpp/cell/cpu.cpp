// LLTM on the CPU: the kernels of every lltm op for the CPU dispatch key.
//
// Each op is GEMMs in ATen (BLAS) around one fused, vectorized pointwise
// pass (cpp/cpu_kernels/kernels.cpp, which states the math), split over threads
// by rows with at::parallel_for:
//
//   cell           X = [old_h | input], Z = X W^T, pointwise
//   cell_forward   X = [old_h | input] when saved, Z = X W^T, pointwise
//                  that also saves the gate activations (in place of Z)
//   cell_backward  pointwise (dZ, d_old_cell, d_bias), then the GEMMs of
//                  the gradients asked for (one for both input gradients)
//   forward        the tutorial's: X, Z = X W^T, pointwise (writes Z + b)
//   backward       the tutorial's: pointwise, then 3 GEMMs
//
// The bias is added in the pointwise pass, and its gradient summed there.
#include "cpp/cell/backend.h"
#include "cpp/cell/cell.h"
#include "cpp/cpu_kernels/kernels.h"
#include "cpp/cpu_kernels/tensors.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <utility>

namespace lltm {
namespace {

// The CPU backend of the cell ops (cell_backend.h).
struct Cpu {
  using Guard = backend::NoGuard;
  static CellResult run(ops::Cell, const Sizes&, const backend::CellInputs&);
  static CellForwardResult run(
      ops::CellForward,
      const Sizes&,
      const backend::CellInputs&,
      bool save_X);
  static ForwardResult run(
      ops::Forward,
      const Sizes&,
      const backend::CellInputs&);
  static at::Tensor pointwise_backward(const backend::BackwardTensors& t);
  static void gemms_backward(
      const at::Tensor& d_gates,
      const std::optional<at::Tensor>& X,
      const at::Tensor& weights,
      OutputMask mask,
      CellBackwardResult& result);
};

using cpu::best_kernels;
using cpu::rows_per_task;

template <typename T>
void run_forward(const cpu::ForwardArgs<T>& args, int64_t batch) {
  const auto& k = best_kernels<T>();
  at::parallel_for(
      0, batch, rows_per_task(args.state), [&](int64_t begin, int64_t end) {
        k.forward(args, begin, end);
      });
}

// Runs the backward kernel and returns d_bias ([3 * state], or undefined
// when not wanted). The rows are cut into fixed chunks, each chunk sums its
// columns of dZ into its own row of `sums`, and those rows are added in
// order: the same bits for any number of threads.
template <typename T>
at::Tensor run_backward(
    cpu::BackwardArgs<T> args,
    int64_t batch,
    bool want_bias,
    const at::TensorOptions& options) {
  using acc_t = at::opmath_type<T>;
  const auto& k = best_kernels<T>();
  const int64_t S = args.state;
  const int64_t chunk = rows_per_task(S);
  const int64_t chunks = (batch + chunk - 1) / chunk;
  at::Tensor sums;
  if (want_bias) {
    sums = at::zeros(
        {std::max<int64_t>(chunks, 1), 3 * S},
        options.dtype(c10::CppTypeToScalarType<acc_t>::value));
  }
  acc_t* sums_data = want_bias ? sums.mutable_data_ptr<acc_t>() : nullptr;
  at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      cpu::BackwardArgs<T> part = args;
      part.d_bias = want_bias ? sums_data + c * 3 * S : nullptr;
      k.backward(part, c * chunk, std::min(batch, (c + 1) * chunk));
    }
  });
  if (!want_bias) {
    return {};
  }
  at::Tensor d_bias = at::empty({3 * S}, options);
  T* out = d_bias.mutable_data_ptr<T>();
  for (int64_t j = 0; j < 3 * S; ++j) {
    acc_t total = sums_data[j];
    for (int64_t c = 1; c < chunks; ++c) {
      total += sums_data[c * 3 * S + j];
    }
    out[j] = static_cast<T>(total);
  }
  return d_bias;
}

void pointwise_forward(const backend::ForwardTensors& t) {
  const int64_t B = t.new_h.size(0);
  const int64_t S = t.new_h.size(1);
  const at::Tensor bias = t.bias.contiguous();
  const at::Tensor old_cell = t.old_cell.contiguous();
  at::Tensor z = t.z; // dense, written in place when asked
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, z.scalar_type(), "lltm_forward_cpu", [&] {
        cpu::ForwardArgs<scalar_t> args{};
        args.z = z.const_data_ptr<scalar_t>();
        args.ld_z = z.stride(0);
        args.bias = bias.const_data_ptr<scalar_t>();
        args.old_cell = old_cell.const_data_ptr<scalar_t>();
        args.new_h = t.new_h.mutable_data_ptr<scalar_t>();
        args.new_cell = t.new_cell.mutable_data_ptr<scalar_t>();
        if (t.input_gate != nullptr) {
          scalar_t* i = t.input_gate->mutable_data_ptr<scalar_t>();
          const bool packed = t.output_gate == nullptr;
          args.input_gate = i;
          args.output_gate =
              packed ? i + S : t.output_gate->mutable_data_ptr<scalar_t>();
          args.candidate_cell = packed
              ? i + 2 * S
              : t.candidate_cell->mutable_data_ptr<scalar_t>();
          args.ld_act = t.input_gate->stride(0);
        }
        if (t.write_z_with_bias) {
          args.z_with_bias = z.mutable_data_ptr<scalar_t>();
        }
        args.state = S;
        run_forward(args, B);
      });
}

// The GEMMs of the backward. When both input gradients are wanted: one
// GEMM, dZ W = [d_old_h | d_input], then two copies, which cost less than a
// second BLAS call on the CPU (on the GPU the copies would be launches).
void Cpu::gemms_backward(
    const at::Tensor& d_gates,
    const std::optional<at::Tensor>& X,
    const at::Tensor& weights,
    OutputMask mask,
    CellBackwardResult& result) {
  if (mask[0] && mask[3]) {
    const int64_t S = d_gates.size(1) / 3;
    const at::Tensor d_X = at::mm(d_gates, weights);
    std::get<3>(result) =
        d_X.narrow(1, 0, S).clone(at::MemoryFormat::Contiguous);
    std::get<0>(result) =
        d_X.narrow(1, S, d_X.size(1) - S).clone(at::MemoryFormat::Contiguous);
    mask[0] = mask[3] = false;
  }
  backward_gemms(d_gates, X, weights, mask, result);
}

CellResult Cpu::run(
    ops::Cell /*op*/,
    const Sizes& sizes,
    const backend::CellInputs& inputs) {
  const auto& [input, weights, bias, old_h, old_cell] = inputs;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const auto options = old_cell.options();
  // One GEMM over X = [old_h | input]: on the CPU a copy costs less than a
  // second BLAS call.
  const at::Tensor X = at::cat({old_h, input}, /*dim=*/1);
  at::Tensor z = at::empty({B, 3 * S}, options);
  gate_preactivations(z, input, weights, old_h, X);
  at::Tensor new_h = at::empty({B, S}, options);
  at::Tensor new_cell = at::empty({B, S}, options);
  pointwise_forward({z, bias, old_cell, new_h, new_cell});
  return {new_h, new_cell};
}

CellForwardResult Cpu::run(
    ops::CellForward /*op*/,
    const Sizes& sizes,
    const backend::CellInputs& inputs,
    bool save_X) {
  const auto& [input, weights, bias, old_h, old_cell] = inputs;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const auto options = old_cell.options();
  std::optional<at::Tensor> X;
  if (save_X) {
    X = at::cat({old_h, input}, /*dim=*/1);
  }
  // Z, then the activations over it: gates = [i | o | g].
  at::Tensor gates = at::empty({B, 3 * S}, options);
  gate_preactivations(gates, input, weights, old_h, X);
  at::Tensor new_h = at::empty({B, S}, options);
  at::Tensor new_cell = at::empty({B, S}, options);
  pointwise_forward({gates, bias, old_cell, new_h, new_cell, &gates});
  return {new_h, new_cell, gates, X};
}

// The pointwise backward (cell_backend.h).
at::Tensor Cpu::pointwise_backward(const backend::BackwardTensors& t) {
  const int64_t B = t.new_cell.size(0);
  const int64_t S = t.new_cell.size(1);
  const at::Tensor new_cell_c = t.new_cell.contiguous();
  at::Tensor d_bias;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      t.new_cell.scalar_type(),
      "lltm_backward_cpu",
      [&] {
        cpu::BackwardArgs<scalar_t> args{};
        args.grad_h = cpu::strided<scalar_t>(t.grad_h);
        args.grad_cell = cpu::strided<scalar_t>(t.grad_cell);
        args.new_cell = new_cell_c.const_data_ptr<scalar_t>();
        args.input_gate = t.input_gate.const_data_ptr<scalar_t>();
        args.output_gate = t.output_gate != nullptr
            ? t.output_gate->const_data_ptr<scalar_t>()
            : args.input_gate + S;
        args.candidate_cell = t.candidate_cell != nullptr
            ? t.candidate_cell->const_data_ptr<scalar_t>()
            : args.input_gate + 2 * S;
        args.ld_act = t.input_gate.stride(0);
        args.d_gates = t.d_gates.mutable_data_ptr<scalar_t>();
        args.d_old_cell = t.d_old_cell != nullptr
            ? t.d_old_cell->mutable_data_ptr<scalar_t>()
            : nullptr;
        args.state = S;
        d_bias = run_backward(args, B, t.want_bias, t.new_cell.options());
      });
  return d_bias;
}

ForwardResult Cpu::run(
    ops::Forward /*op*/,
    const Sizes& sizes,
    const backend::CellInputs& inputs) {
  const auto& [input, weights, bias, old_h, old_cell] = inputs;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const auto options = old_cell.options();
  at::Tensor X = at::cat({old_h, input}, /*dim=*/1);
  at::Tensor gate_weights = at::empty({B, 3 * S}, options);
  gate_preactivations(gate_weights, input, weights, old_h, X);
  backend::TutorialOutputs outputs(B, S, options);
  pointwise_forward(outputs.over(gate_weights, bias, old_cell));
  return std::move(outputs).result(X, gate_weights);
}

} // namespace
} // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CPU, m) {
  using lltm::Cpu;
  using Forward = lltm::backend::ForwardKernel<Cpu>;
  m.impl("forward", &lltm::ops::Forward::kernel<Forward>);
  m.impl("backward", &lltm::backend::backward<Cpu>);
  m.impl("cell", &lltm::ops::Cell::kernel<Forward>);
  m.impl("cell_forward", &lltm::ops::CellForward::kernel<Forward>);
  m.impl("cell_backward", &lltm::backend::cell_backward<Cpu>);
}
