// Autograd for the lltm ops, in C++: TORCH_LIBRARY_IMPL(lltm, Autograd), the
// pattern of torchvision's csrc/ops/autograd. A training step makes one call
// from Python, and its backward never enters Python.
//
// Each autograd kernel either records a node (a torch::autograd::Function)
// and calls the op below autograd, or, when no graph is recorded, calls the
// op below autograd straight away. torch.compile traces through these
// kernels to the ops below, whose fake kernels live in lltm/ops.py.
//
//   cell          -> cell_forward (saves the activations, and X when the
//                    weights need a gradient), backward: cell_backward with
//                    the output_mask of the inputs that need a gradient
//   forward       -> forward (the tutorial's 7 outputs), backward: backward
//   cell_backward, backward: not differentiable again; a double backward
//                    raises a clear error
//   sequence      -> sequence_forward (saves output, cells and gates, the
//                    per-step state the backward reads), backward:
//                    sequence_backward with the output_mask of the inputs
//                    that need a gradient
//   sequence_backward: not differentiable again, like cell_backward
#include "lltm.h"
#include "sequence.h"

#include <c10/core/GradMode.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <optional>
#include <string>

namespace lltm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The ops' signatures, as their kernels take them.
using CellSignature = CellResult(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&);
using CellForwardSignature = CellForwardResult(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    bool);
using CellBackwardSignature = CellBackwardResult(
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    const at::Tensor&,
    const at::Tensor&,
    const std::optional<at::Tensor>&,
    const at::Tensor&,
    OutputMask);
using ForwardSignature = ForwardResult(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&);
using BackwardSignature = BackwardResult(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&);

bool records_graph(std::initializer_list<const at::Tensor*> tensors) {
  return c10::GradMode::is_enabled() &&
      std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor* t) {
           return t->defined() && t->requires_grad();
         });
}

std::optional<at::Tensor> optional(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

at::Tensor value(const std::optional<at::Tensor>& t) {
  return t.value_or(at::Tensor());
}

// A node's outputs must be defined: a masked backward op's node returns the
// gradients in its output_mask, in order, and by_mask puts them back.
variable_list defined_outputs(
    std::initializer_list<std::optional<at::Tensor>> grads) {
  variable_list out;
  for (const auto& grad : grads) {
    if (grad) {
      out.push_back(*grad);
    }
  }
  return out;
}

CellBackwardResult by_mask(const variable_list& out, const OutputMask& mask) {
  std::array<std::optional<at::Tensor>, 5> grads;
  auto next = out.begin();
  for (size_t k = 0; k < grads.size(); ++k) {
    if (mask[k]) {
      grads[k] = *next++;
    }
  }
  return {grads[0], grads[1], grads[2], grads[3], grads[4]};
}

constexpr const char* kFirstOrderOnly =
    " is not differentiable: lltm supports first-order gradients only";

// lltm::cell and lltm::cell_forward. Outputs: new_h, new_cell, and the
// non-differentiable gates and X (undefined unless saved).
class CellFunction : public torch::autograd::Function<CellFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weights,
      const at::Tensor& bias,
      const at::Tensor& old_h,
      const at::Tensor& old_cell,
      bool save_X) {
    TORCH_CHECK_VALUE(
        save_X || !weights.requires_grad(),
        "lltm::cell_forward: the gradient of weights needs X = [old_h | "
        "input]: call it with save_X=True");
    // An output that does not reach the loss gets no gradient (undefined),
    // rather than zeros the backward would have to read.
    ctx->set_materialize_grads(false);
    static const auto op = find_op<CellForwardSignature>("lltm::cell_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [new_h, new_cell, gates, X] =
        op.call(input, weights, bias, old_h, old_cell, save_X);
    ctx->save_for_backward({new_cell, gates, value(X), weights});
    ctx->saved_data["bias_is_2d"] = bias.dim() == 2;
    // A node's outputs must be defined: X is one only when saved.
    if (!X) {
      ctx->mark_non_differentiable({gates});
      return {new_h, new_cell, gates};
    }
    ctx->mark_non_differentiable({gates, *X});
    return {new_h, new_cell, gates, *X};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const OutputMask mask{
        ctx->needs_input_grad(0),
        ctx->needs_input_grad(1),
        ctx->needs_input_grad(2),
        ctx->needs_input_grad(3),
        ctx->needs_input_grad(4)};
    static const auto op =
        find_op<CellBackwardSignature>("lltm::cell_backward");
    auto [d_input, d_weights, d_bias, d_old_h, d_old_cell] = op.call(
        optional(grads[0]),
        optional(grads[1]),
        saved[0],
        saved[1],
        optional(saved[2]),
        saved[3],
        mask);
    if (d_bias && ctx->saved_data["bias_is_2d"].toBool()) {
      d_bias = d_bias->unsqueeze(0);
    }
    return {
        value(d_input),
        value(d_weights),
        value(d_bias),
        value(d_old_h),
        value(d_old_cell),
        /*save_X=*/at::Tensor()};
  }
};

// The backward ops record a node whose own backward raises: a second
// derivative would otherwise be silently wrong (zero).
class CellBackwardFunction
    : public torch::autograd::Function<CellBackwardFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx,
      const std::optional<at::Tensor>& grad_h,
      const std::optional<at::Tensor>& grad_cell,
      const at::Tensor& new_cell,
      const at::Tensor& gates,
      const std::optional<at::Tensor>& X,
      const at::Tensor& weights,
      OutputMask output_mask) {
    // Masked-out outputs are undefined: no zeros to make for them.
    ctx->set_materialize_grads(false);
    static const auto op =
        find_op<CellBackwardSignature>("lltm::cell_backward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [a, b, c, d, e] =
        op.call(grad_h, grad_cell, new_cell, gates, X, weights, output_mask);
    return defined_outputs({a, b, c, d, e});
  }

  static variable_list backward(
      AutogradContext* /*ctx*/,
      variable_list /*grads*/) {
    TORCH_CHECK(false, "lltm::cell_backward", kFirstOrderOnly);
    return {};
  }
};

class BackwardFunction : public torch::autograd::Function<BackwardFunction> {
 public:
  static variable_list forward(
      AutogradContext* /*ctx*/,
      const at::Tensor& grad_h,
      const at::Tensor& grad_cell,
      const at::Tensor& new_cell,
      const at::Tensor& input_gate,
      const at::Tensor& output_gate,
      const at::Tensor& candidate_cell,
      const at::Tensor& X,
      const at::Tensor& gate_weights,
      const at::Tensor& weights) {
    static const auto op = find_op<BackwardSignature>("lltm::backward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [a, b, c, d, e] = op.call(
        grad_h,
        grad_cell,
        new_cell,
        input_gate,
        output_gate,
        candidate_cell,
        X,
        gate_weights,
        weights);
    return {a, b, c, d, e};
  }

  static variable_list backward(
      AutogradContext* /*ctx*/,
      variable_list /*grads*/) {
    TORCH_CHECK(false, "lltm::backward", kFirstOrderOnly);
    return {};
  }
};

CellResult cell_autograd(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell) {
  if (!records_graph({&input, &weights, &bias, &old_h, &old_cell})) {
    static const auto op = find_op<CellSignature>("lltm::cell");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, weights, bias, old_h, old_cell);
  }
  variable_list out = CellFunction::apply(
      input, weights, bias, old_h, old_cell, weights.requires_grad());
  return {out[0], out[1]};
}

CellForwardResult cell_forward_autograd(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell,
    bool save_X) {
  if (!records_graph({&input, &weights, &bias, &old_h, &old_cell})) {
    static const auto op = find_op<CellForwardSignature>("lltm::cell_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, weights, bias, old_h, old_cell, save_X);
  }
  variable_list out =
      CellFunction::apply(input, weights, bias, old_h, old_cell, save_X);
  return {
      out[0],
      out[1],
      out[2],
      out.size() > 3 ? std::optional<at::Tensor>(out[3]) : std::nullopt};
}

// Tutorial's lltm::forward: new_h and new_cell are differentiable, the five
// saved activations are not (a loss built on them would get a gradient
// that ignores that path).
class ForwardFunction : public torch::autograd::Function<ForwardFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weights,
      const at::Tensor& bias,
      const at::Tensor& old_h,
      const at::Tensor& old_cell) {
    static const auto op = find_op<ForwardSignature>("lltm::forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [new_h, new_cell, i, o, g, X, gate_weights] =
        op.call(input, weights, bias, old_h, old_cell);
    ctx->save_for_backward({new_cell, i, o, g, X, gate_weights, weights});
    ctx->saved_data["bias_is_2d"] = bias.dim() == 2;
    ctx->mark_non_differentiable({i, o, g, X, gate_weights});
    return {new_h, new_cell, i, o, g, X, gate_weights};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    static const auto op = find_op<BackwardSignature>("lltm::backward");
    auto [d_old_h, d_input, d_weights, d_bias, d_old_cell] =
        op.call(grads[0], grads[1], s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
    if (!ctx->saved_data["bias_is_2d"].toBool()) {
      d_bias = d_bias.squeeze(0);
    }
    return {d_input, d_weights, d_bias, d_old_h, d_old_cell};
  }
};

ForwardResult forward_autograd(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell) {
  if (!records_graph({&input, &weights, &bias, &old_h, &old_cell})) {
    static const auto op = find_op<ForwardSignature>("lltm::forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, weights, bias, old_h, old_cell);
  }
  variable_list o =
      ForwardFunction::apply(input, weights, bias, old_h, old_cell);
  return {o[0], o[1], o[2], o[3], o[4], o[5], o[6]};
}

CellBackwardResult cell_backward_autograd(
    const std::optional<at::Tensor>& grad_h,
    const std::optional<at::Tensor>& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& gates,
    const std::optional<at::Tensor>& X,
    const at::Tensor& weights,
    OutputMask output_mask) {
  const at::Tensor gh = value(grad_h);
  const at::Tensor gc = value(grad_cell);
  const at::Tensor x = value(X);
  if (!records_graph({&gh, &gc, &new_cell, &gates, &x, &weights})) {
    static const auto op =
        find_op<CellBackwardSignature>("lltm::cell_backward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(grad_h, grad_cell, new_cell, gates, X, weights, output_mask);
  }
  // Optional tensors: an undefined one is no input of the node.
  const variable_list out = CellBackwardFunction::apply(
      grad_h, grad_cell, new_cell, gates, X, weights, output_mask);
  return by_mask(out, output_mask);
}

BackwardResult backward_autograd(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& input_gate,
    const at::Tensor& output_gate,
    const at::Tensor& candidate_cell,
    const at::Tensor& X,
    const at::Tensor& gate_weights,
    const at::Tensor& weights) {
  if (!records_graph(
          {&grad_h,
           &grad_cell,
           &new_cell,
           &input_gate,
           &output_gate,
           &candidate_cell,
           &X,
           &gate_weights,
           &weights})) {
    static const auto op = find_op<BackwardSignature>("lltm::backward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
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
  variable_list o = BackwardFunction::apply(
      grad_h,
      grad_cell,
      new_cell,
      input_gate,
      output_gate,
      candidate_cell,
      X,
      gate_weights,
      weights);
  return {o[0], o[1], o[2], o[3], o[4]};
}

// --- sequences ---------------------------------------------------------------

using SequenceSignature = sequence::Result(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&);
using SequenceForwardSignature = sequence::ForwardResult(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&);
using SequenceBackwardSignature = sequence::BackwardResult(
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    OutputMask);

// lltm::sequence and lltm::sequence_forward. Outputs: output, h_n, c_n, and
// the non-differentiable cells and gates.
class SequenceFunction : public torch::autograd::Function<SequenceFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weights,
      const at::Tensor& bias,
      const at::Tensor& h0,
      const at::Tensor& c0) {
    // An output that does not reach the loss gets no gradient (undefined),
    // which the backward reads as zeros without making them.
    ctx->set_materialize_grads(false);
    static const auto op =
        find_op<SequenceForwardSignature>("lltm::sequence_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [output, h_n, c_n, cells, gates] =
        op.call(input, weights, bias, h0, c0);
    ctx->save_for_backward({input, weights, h0, output, cells, gates});
    ctx->saved_data["bias_is_2d"] = bias.dim() == 2;
    ctx->mark_non_differentiable({cells, gates});
    return {output, h_n, c_n, cells, gates};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const OutputMask mask{
        ctx->needs_input_grad(0),
        ctx->needs_input_grad(1),
        ctx->needs_input_grad(2),
        ctx->needs_input_grad(3),
        ctx->needs_input_grad(4)};
    static const auto op =
        find_op<SequenceBackwardSignature>("lltm::sequence_backward");
    auto [d_input, d_weights, d_bias, d_h0, d_c0] = op.call(
        optional(grads[0]),
        optional(grads[1]),
        optional(grads[2]),
        s[0],
        s[1],
        s[2],
        s[3],
        s[4],
        s[5],
        mask);
    if (d_bias && ctx->saved_data["bias_is_2d"].toBool()) {
      d_bias = d_bias->unsqueeze(0);
    }
    return {
        value(d_input),
        value(d_weights),
        value(d_bias),
        value(d_h0),
        value(d_c0)};
  }
};

class SequenceBackwardFunction
    : public torch::autograd::Function<SequenceBackwardFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx,
      const std::optional<at::Tensor>& grad_output,
      const std::optional<at::Tensor>& grad_h_n,
      const std::optional<at::Tensor>& grad_c_n,
      const at::Tensor& input,
      const at::Tensor& weights,
      const at::Tensor& h0,
      const at::Tensor& output,
      const at::Tensor& cells,
      const at::Tensor& gates,
      OutputMask output_mask) {
    ctx->set_materialize_grads(false);
    static const auto op =
        find_op<SequenceBackwardSignature>("lltm::sequence_backward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [a, b, c, d, e] = op.call(
        grad_output,
        grad_h_n,
        grad_c_n,
        input,
        weights,
        h0,
        output,
        cells,
        gates,
        output_mask);
    return defined_outputs({a, b, c, d, e});
  }

  static variable_list backward(
      AutogradContext* /*ctx*/,
      variable_list /*grads*/) {
    TORCH_CHECK(false, "lltm::sequence_backward", kFirstOrderOnly);
    return {};
  }
};

sequence::Result sequence_autograd(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0) {
  if (!records_graph({&input, &weights, &bias, &h0, &c0})) {
    // Nothing to save: the op that keeps only the running state.
    static const auto op = find_op<SequenceSignature>("lltm::sequence");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, weights, bias, h0, c0);
  }
  variable_list out = SequenceFunction::apply(input, weights, bias, h0, c0);
  return {out[0], out[1], out[2]};
}

sequence::ForwardResult sequence_forward_autograd(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0) {
  if (!records_graph({&input, &weights, &bias, &h0, &c0})) {
    static const auto op =
        find_op<SequenceForwardSignature>("lltm::sequence_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, weights, bias, h0, c0);
  }
  variable_list out = SequenceFunction::apply(input, weights, bias, h0, c0);
  return {out[0], out[1], out[2], out[3], out[4]};
}

sequence::BackwardResult sequence_backward_autograd(
    const std::optional<at::Tensor>& grad_output,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const at::Tensor& output,
    const at::Tensor& cells,
    const at::Tensor& gates,
    OutputMask output_mask) {
  const at::Tensor go = value(grad_output);
  const at::Tensor gh = value(grad_h_n);
  const at::Tensor gc = value(grad_c_n);
  if (!records_graph(
          {&go, &gh, &gc, &input, &weights, &h0, &output, &cells, &gates})) {
    static const auto op =
        find_op<SequenceBackwardSignature>("lltm::sequence_backward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(
        grad_output,
        grad_h_n,
        grad_c_n,
        input,
        weights,
        h0,
        output,
        cells,
        gates,
        output_mask);
  }
  const variable_list out = SequenceBackwardFunction::apply(
      grad_output,
      grad_h_n,
      grad_c_n,
      input,
      weights,
      h0,
      output,
      cells,
      gates,
      output_mask);
  return by_mask(out, output_mask);
}

} // namespace
} // namespace lltm

TORCH_LIBRARY_IMPL(lltm, Autograd, m) {
  m.impl("cell", &lltm::cell_autograd);
  m.impl("cell_forward", &lltm::cell_forward_autograd);
  m.impl("cell_backward", &lltm::cell_backward_autograd);
  m.impl("forward", &lltm::forward_autograd);
  m.impl("backward", &lltm::backward_autograd);
  m.impl("sequence", &lltm::sequence_autograd);
  m.impl("sequence_forward", &lltm::sequence_forward_autograd);
  m.impl("sequence_backward", &lltm::sequence_backward_autograd);
}
