// Schemas of the LLTM operators, the input checks shared by every backend,
// and the GEMMs every backend runs through ATen.
#include "cpp/cell/cell.h"

#include <ATen/ops/mm.h>
#include <c10/util/ArrayRef.h>
#include <torch/library.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

namespace lltm {
namespace checks {
namespace {

// torch's Python name for a dtype ("float32"), which is what users write.
// A copy: some torch releases return the names by value.
std::string dtype_name(at::ScalarType dtype) {
  return std::string(c10::getDtypeNames(dtype).first);
}

bool is_supported_dtype(at::ScalarType dtype) {
  const auto dtypes = supported_dtypes();
  return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end();
}

} // namespace

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

void check_dim(
    const char* op,
    const Arg& arg,
    int64_t dim,
    const char* layout) {
  TORCH_CHECK_VALUE(
      arg.tensor.dim() == dim,
      op,
      ": expected ",
      arg.name,
      " to be a ",
      std::to_string(dim),
      "-D tensor ",
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

Arg optional_arg(const std::optional<at::Tensor>& t, const char* name) {
  static const at::Tensor none;
  return {t ? *t : none, name};
}

void check_given_like(
    const char* op,
    const Arg& like,
    std::initializer_list<Arg> args) {
  for (const Arg& arg : args) {
    if (arg.tensor.defined()) {
      check_dtypes_and_devices(op, {like, arg});
    }
  }
}

void check_dims(
    const char* op,
    std::initializer_list<Arg> args,
    int64_t dim,
    const char* layout) {
  for (const Arg& arg : args) {
    if (arg.tensor.defined()) {
      check_dim(op, arg, dim, layout);
    }
  }
}

void check_shapes(
    const char* op,
    std::initializer_list<Arg> args,
    c10::IntArrayRef expected,
    const char* layout) {
  for (const Arg& arg : args) {
    if (arg.tensor.defined()) {
      check_shape(op, arg, expected, layout);
    }
  }
}

void check_bias(const char* op, const at::Tensor& bias, int64_t state_size) {
  const int64_t G = 3 * state_size;
  const bool bias_ok = (bias.dim() == 1 && bias.size(0) == G) ||
      (bias.dim() == 2 && bias.size(0) == 1 && bias.size(1) == G);
  TORCH_CHECK_VALUE(
      bias_ok,
      op,
      ": expected bias to have shape [3 * state_size] = ",
      shape_str({G}),
      " or [1, 3 * state_size] = ",
      shape_str({1, G}),
      ", but got ",
      shape_str(bias.sizes()));
}

} // namespace checks

namespace {

using checks::Arg;
using checks::check_bias;
using checks::check_dtypes_and_devices;
using checks::check_shape;
using checks::shape_str;

void check_2d(const char* op, const Arg& arg, const char* layout) {
  checks::check_dim(op, arg, 2, layout);
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
    const at::Tensor& old_cell,
    const char* op) {
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
  check_bias(op, bias, S);
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

  checks::check_dims(
      op,
      {grad_h_arg,
       grad_cell_arg,
       new_cell_arg,
       input_gate_arg,
       output_gate_arg,
       candidate_cell_arg},
      2,
      "[batch, state_size]");
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
  checks::check_shapes(
      op,
      {grad_cell_arg,
       new_cell_arg,
       input_gate_arg,
       output_gate_arg,
       candidate_cell_arg},
      {B, S},
      "[batch, state_size]");
  check_shape(op, X_arg, {B, S + F}, "[batch, state_size + input_features]");
  check_shape(op, gate_weights_arg, {B, 3 * S}, "[batch, 3 * state_size]");
  check_shape(
      op,
      weights_arg,
      {3 * S, S + F},
      "[3 * state_size, state_size + input_features]");
  return Sizes{B, F, S};
}

Sizes check_cell_backward_args(
    const std::optional<at::Tensor>& grad_h,
    const std::optional<at::Tensor>& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& gates,
    const std::optional<at::Tensor>& X,
    const at::Tensor& weights,
    const OutputMask& output_mask) {
  constexpr const char* op = "lltm::cell_backward";
  const Arg new_cell_arg{new_cell, "new_cell"};
  const Arg gates_arg{gates, "gates"};
  const Arg weights_arg{weights, "weights"};
  const Arg grad_h_arg = checks::optional_arg(grad_h, "grad_h");
  const Arg grad_cell_arg = checks::optional_arg(grad_cell, "grad_cell");
  const Arg X_arg = checks::optional_arg(X, "X");
  check_dtypes_and_devices(op, {new_cell_arg, gates_arg, weights_arg});
  checks::check_given_like(
      op, new_cell_arg, {grad_h_arg, grad_cell_arg, X_arg});
  TORCH_CHECK_VALUE(
      !output_mask[1] || X_arg.tensor.defined(),
      op,
      ": expected X = [old_h | input] to be a tensor when the weights need a "
      "gradient (output_mask[1]), but got None");

  check_2d(op, new_cell_arg, "[batch, state_size]");
  check_2d(op, gates_arg, "[batch, 3 * state_size]");
  check_2d(op, weights_arg, "[3 * state_size, state_size + input_features]");
  // The batch and state size come from new_cell, the input features from
  // the weights.
  const int64_t B = new_cell.size(0);
  const int64_t S = new_cell.size(1);
  const int64_t F = weights.size(1) - S;
  TORCH_CHECK_VALUE(
      weights.size(0) == 3 * S && F >= 0,
      op,
      ": expected weights to have shape [3 * state_size, state_size + "
      "input_features] with 3 * state_size = ",
      std::to_string(3 * S),
      " rows and at least state_size = ",
      std::to_string(S),
      " columns, but got ",
      shape_str(weights.sizes()));
  checks::check_dims(op, {grad_h_arg, grad_cell_arg}, 2, "[batch, state_size]");
  checks::check_shapes(
      op, {grad_h_arg, grad_cell_arg}, {B, S}, "[batch, state_size]");
  check_shape(op, gates_arg, {B, 3 * S}, "[batch, 3 * state_size]");
  checks::check_dims(op, {X_arg}, 2, "[batch, state_size + input_features]");
  checks::check_shapes(
      op, {X_arg}, {B, S + F}, "[batch, state_size + input_features]");
  return Sizes{B, F, S};
}

at::Tensor weights_h(const at::Tensor& weights, int64_t state_size) {
  return weights.narrow(1, 0, state_size);
}

at::Tensor weights_x(const at::Tensor& weights, int64_t state_size) {
  return weights.narrow(1, state_size, weights.size(1) - state_size);
}

void gate_preactivations(
    at::Tensor& out,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& old_h,
    const std::optional<at::Tensor>& X) {
  if (X) {
    at::mm_out(out, *X, weights.t());
    return;
  }
  const int64_t S = old_h.size(1);
  // Two GEMMs into one output: Z = old_h W_h^T, then Z += input W_x^T. The
  // column blocks of W are read in place (their row stride is S + F).
  at::mm_out(out, old_h, weights_h(weights, S).t());
  out.addmm_(input, weights_x(weights, S).t());
}

void backward_gemms(
    const at::Tensor& d_gates,
    const std::optional<at::Tensor>& X,
    const at::Tensor& weights,
    const OutputMask& output_mask,
    CellBackwardResult& result) {
  const int64_t S = d_gates.size(1) / 3;
  if (output_mask[1]) {
    std::get<1>(result) = at::mm(d_gates.t(), *X);
  }
  if (output_mask[3]) {
    std::get<3>(result) = at::mm(d_gates, weights_h(weights, S));
  }
  if (output_mask[0]) {
    std::get<0>(result) = at::mm(d_gates, weights_x(weights, S));
  }
}

} // namespace lltm

TORCH_LIBRARY(lltm, m) {
  // The fake kernels, which torch.compile traces with, are registered from
  // Python, in lltm/_cell_fakes.py; this tells torch where to find them.
  // Autograd is in C++ (autograd.cpp).
  m.set_python_module("lltm._cell_fakes");
  // The tutorial's contract.
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
  // The cell of lltm.lltm: one step, then what its backward needs, then a
  // backward that computes only the gradients in output_mask, the order of
  // the forward's inputs.
  m.def(
      "cell(Tensor input, Tensor weights, Tensor bias, Tensor old_h, "
      "Tensor old_cell) -> (Tensor new_h, Tensor new_cell)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "cell_forward(Tensor input, Tensor weights, Tensor bias, Tensor old_h, "
      "Tensor old_cell, bool save_X) -> (Tensor new_h, Tensor new_cell, "
      "Tensor gates, Tensor? X)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "cell_backward(Tensor? grad_h, Tensor? grad_cell, Tensor new_cell, "
      "Tensor gates, Tensor? X, Tensor weights, bool[5] output_mask) -> "
      "(Tensor? d_input, Tensor? d_weights, Tensor? d_bias, Tensor? d_old_h, "
      "Tensor? d_old_cell)",
      {at::Tag::pt2_compliant_tag});
}
