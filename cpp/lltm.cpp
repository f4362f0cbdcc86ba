// Schemas of the LLTM operators, the input checks shared by every backend,
// and the C++ API that calls through the dispatcher.
#include "lltm.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <c10/core/GradMode.h>
#include <c10/util/ArrayRef.h>
#include <torch/library.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

namespace lltm {
namespace {

struct Arg {
  const at::Tensor& tensor;
  const char* name;
};

// torch's Python name for a dtype ("float32"), which is what users write.
// A copy: some torch releases return the names by value.
std::string dtype_name(at::ScalarType dtype) {
  return std::string(c10::getDtypeNames(dtype).first);
}

// "[4, 5]". Numbers are formatted with std::to_string rather than streamed:
// on some machines (seen with torch 2.11 on Ubuntu 24.04), streaming an
// integer into an ostringstream from an extension crashes the process, and
// an error message must never do that.
std::string shape_str(c10::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    out += (i == 0 ? "" : ", ") + std::to_string(sizes[i]);
  }
  return out + "]";
}

bool is_supported_dtype(at::ScalarType dtype) {
  const auto dtypes = supported_dtypes();
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

// Every tensor is defined, of a supported floating dtype, and has the dtype
// and device of the first one.
void check_dtypes_and_devices(const char* op, std::initializer_list<Arg> args) {
  const Arg& first = *args.begin();
  for (const Arg& arg : args) {
    TORCH_CHECK(
        arg.tensor.defined(),
        op,
        ": expected ",
        arg.name,
        " to be a tensor, but got an undefined tensor");
    TORCH_CHECK_TYPE(
        is_supported_dtype(arg.tensor.scalar_type()),
        op,
        ": expected ",
        arg.name,
        " to have a floating-point dtype (float16, bfloat16, float32 or "
        "float64), but got ",
        dtype_name(arg.tensor.scalar_type()));
    TORCH_CHECK_TYPE(
        arg.tensor.scalar_type() == first.tensor.scalar_type(),
        op,
        ": expected ",
        arg.name,
        " to have the same dtype as ",
        first.name,
        " (",
        dtype_name(first.tensor.scalar_type()),
        "), but got ",
        dtype_name(arg.tensor.scalar_type()));
    TORCH_CHECK(
        arg.tensor.device() == first.tensor.device(),
        op,
        ": expected ",
        arg.name,
        " to be on the same device as ",
        first.name,
        " (",
        first.tensor.device().str(),
        "), but got ",
        arg.tensor.device().str());
  }
}

void check_2d(const char* op, const Arg& arg, const char* layout) {
  TORCH_CHECK_VALUE(
      arg.tensor.dim() == 2,
      op,
      ": expected ",
      arg.name,
      " to be a 2-D tensor ",
      layout,
      ", but got a ",
      std::to_string(arg.tensor.dim()),
      "-D tensor of shape ",
      shape_str(arg.tensor.sizes()));
}

void check_shape(
    const char* op,
    const Arg& arg,
    c10::IntArrayRef expected,
    const char* layout) {
  TORCH_CHECK_VALUE(
      arg.tensor.sizes() == expected,
      op,
      ": expected ",
      arg.name,
      " to have shape ",
      layout,
      " = ",
      shape_str(expected),
      ", but got ",
      shape_str(arg.tensor.sizes()));
}

// Whether a call can record an autograd graph. When it cannot, the C++ API
// skips the autograd kernel: it would only redispatch, and the one
// registered from Python (torch.library.register_autograd) costs tens of
// microseconds to do so. This is the tutorial's case: _C.forward called
// inside an autograd.Function, where grad mode is off.
bool needs_autograd(std::initializer_list<at::Tensor> tensors) {
  if (!c10::GradMode::is_enabled()) {
    return false;
  }
  return std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) {
    return t.defined() && t.requires_grad();
  });
}

} // namespace

c10::ArrayRef<at::ScalarType> supported_dtypes() {
  static constexpr at::ScalarType dtypes[] = {
      at::kFloat, at::kDouble, at::kHalf, at::kBFloat16};
  return dtypes;
}

Sizes check_forward_args(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell) {
  constexpr const char* op = "lltm::forward";
  const Arg input_arg{input, "input"};
  const Arg weights_arg{weights, "weights"};
  const Arg bias_arg{bias, "bias"};
  const Arg old_h_arg{old_h, "old_h"};
  const Arg old_cell_arg{old_cell, "old_cell"};
  check_dtypes_and_devices(
      op, {input_arg, weights_arg, bias_arg, old_h_arg, old_cell_arg});

  check_2d(op, input_arg, "[batch, input_features]");
  check_2d(op, old_h_arg, "[batch, state_size]");
  check_2d(op, old_cell_arg, "[batch, state_size]");
  check_2d(op, weights_arg, "[3 * state_size, state_size + input_features]");

  // The batch comes from input, the state size from old_h.
  const Sizes sizes{input.size(0), input.size(1), old_h.size(1)};
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t F = sizes.input_features;
  check_shape(op, old_h_arg, {B, S}, "[batch, state_size]");
  check_shape(op, old_cell_arg, {B, S}, "[batch, state_size]");
  check_shape(
      op,
      weights_arg,
      {3 * S, S + F},
      "[3 * state_size, state_size + input_features]");
  const bool bias_ok = (bias.dim() == 1 && bias.size(0) == 3 * S) ||
      (bias.dim() == 2 && bias.size(0) == 1 && bias.size(1) == 3 * S);
  TORCH_CHECK_VALUE(
      bias_ok,
      op,
      ": expected bias to have shape [3 * state_size] = ",
      shape_str({3 * S}),
      " or [1, 3 * state_size] = ",
      shape_str({1, 3 * S}),
      ", but got ",
      shape_str(bias.sizes()));
  return sizes;
}

Sizes check_backward_args(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& input_gate,
    const at::Tensor& output_gate,
    const at::Tensor& candidate_cell,
    const at::Tensor& X,
    const at::Tensor& gate_weights,
    const at::Tensor& weights) {
  constexpr const char* op = "lltm::backward";
  const Arg grad_h_arg{grad_h, "grad_h"};
  const Arg grad_cell_arg{grad_cell, "grad_cell"};
  const Arg new_cell_arg{new_cell, "new_cell"};
  const Arg input_gate_arg{input_gate, "input_gate"};
  const Arg output_gate_arg{output_gate, "output_gate"};
  const Arg candidate_cell_arg{candidate_cell, "candidate_cell"};
  const Arg X_arg{X, "X"};
  const Arg gate_weights_arg{gate_weights, "gate_weights"};
  const Arg weights_arg{weights, "weights"};
  check_dtypes_and_devices(
      op,
      {grad_h_arg,
       grad_cell_arg,
       new_cell_arg,
       input_gate_arg,
       output_gate_arg,
       candidate_cell_arg,
       X_arg,
       gate_weights_arg,
       weights_arg});

  for (const Arg& arg :
       {grad_h_arg,
        grad_cell_arg,
        new_cell_arg,
        input_gate_arg,
        output_gate_arg,
        candidate_cell_arg}) {
    check_2d(op, arg, "[batch, state_size]");
  }
  check_2d(op, X_arg, "[batch, state_size + input_features]");
  check_2d(op, gate_weights_arg, "[batch, 3 * state_size]");
  check_2d(op, weights_arg, "[3 * state_size, state_size + input_features]");

  // The batch and state size come from grad_h, the input features from X.
  const int64_t B = grad_h.size(0);
  const int64_t S = grad_h.size(1);
  const int64_t F = X.size(1) - S;
  TORCH_CHECK_VALUE(
      F >= 0,
      op,
      ": expected X to have shape [batch, state_size + input_features] with "
      "at least state_size = ",
      std::to_string(S),
      " columns, but got ",
      shape_str(X.sizes()));
  for (const Arg& arg :
       {grad_cell_arg,
        new_cell_arg,
        input_gate_arg,
        output_gate_arg,
        candidate_cell_arg}) {
    check_shape(op, arg, {B, S}, "[batch, state_size]");
  }
  check_shape(op, X_arg, {B, S + F}, "[batch, state_size + input_features]");
  check_shape(op, gate_weights_arg, {B, 3 * S}, "[batch, 3 * state_size]");
  check_shape(
      op,
      weights_arg,
      {3 * S, S + F},
      "[3 * state_size, state_size + input_features]");
  return Sizes{B, F, S};
}

std::tuple<at::Tensor, at::Tensor> gate_preactivations(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h) {
  at::Tensor X = at::cat({old_h, input}, /*dim=*/1);
  at::Tensor gate_weights =
      at::addmm(bias.reshape({1, weights.size(0)}), X, weights.t());
  return {X, gate_weights};
}

BackwardResult backward_gemms(
    const at::Tensor& d_gates,
    const at::Tensor& X,
    const at::Tensor& weights,
    at::Tensor d_old_cell) {
  const int64_t S = d_old_cell.size(1);
  at::Tensor d_weights = at::mm(d_gates.t(), X);
  at::Tensor d_bias = at::sum(d_gates, /*dim=*/0, /*keepdim=*/true);
  // One GEMM for [d_old_h | d_input], then dense copies of its two column
  // blocks: outputs of an op must not share storage, and two copies cost
  // less than a second GEMM.
  const at::Tensor d_X = at::mm(d_gates, weights);
  at::Tensor d_old_h = d_X.narrow(1, 0, S).clone(at::MemoryFormat::Contiguous);
  at::Tensor d_input =
      d_X.narrow(1, S, d_X.size(1) - S).clone(at::MemoryFormat::Contiguous);
  return {d_old_h, d_input, d_weights, d_bias, std::move(d_old_cell)};
}

ForwardResult forward(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lltm::forward", "")
                             .typed<decltype(forward)>();
  std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
  if (!needs_autograd({input, weights, bias, old_h, old_cell})) {
    below_autograd.emplace();
  }
  return op.call(input, weights, bias, old_h, old_cell);
}

BackwardResult backward(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& input_gate,
    const at::Tensor& output_gate,
    const at::Tensor& candidate_cell,
    const at::Tensor& X,
    const at::Tensor& gate_weights,
    const at::Tensor& weights) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lltm::backward", "")
                             .typed<decltype(backward)>();
  std::optional<at::AutoDispatchBelowADInplaceOrView> below_autograd;
  if (!needs_autograd(
          {grad_h,
           grad_cell,
           new_cell,
           input_gate,
           output_gate,
           candidate_cell,
           X,
           gate_weights,
           weights})) {
    below_autograd.emplace();
  }
  return op.call(
      grad_h,
      grad_cell,
      new_cell,
      input_gate,
      output_gate,
      candidate_cell,
      X,
      gate_weights,
      weights);
}

} // namespace lltm

TORCH_LIBRARY(lltm, m) {
  // The fake (meta) kernels and the autograd formula are registered from
  // Python, in lltm/ops.py; this tells torch where to find them.
  m.set_python_module("lltm.ops");
  m.def(
      "forward(Tensor input, Tensor weights, Tensor bias, Tensor old_h, "
      "Tensor old_cell) -> (Tensor new_h, Tensor new_cell, Tensor input_gate, "
      "Tensor output_gate, Tensor candidate_cell, Tensor X, "
      "Tensor gate_weights)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "backward(Tensor grad_h, Tensor grad_cell, Tensor new_cell, "
      "Tensor input_gate, Tensor output_gate, Tensor candidate_cell, "
      "Tensor X, Tensor gate_weights, Tensor weights) -> (Tensor d_old_h, "
      "Tensor d_input, Tensor d_weights, Tensor d_bias, Tensor d_old_cell)",
      {at::Tag::pt2_compliant_tag});
}
