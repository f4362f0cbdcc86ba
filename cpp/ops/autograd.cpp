// Autograd for the lltm ops, in C++: TORCH_LIBRARY_IMPL(lltm, Autograd), the
// pattern of torchvision's csrc/ops/autograd. A training step makes one call
// from Python, and its backward never enters Python.
//
// Every op has the same autograd kernel: when a graph is recorded, its node
// (a torch::autograd::Function) records it and calls the op below autograd;
// else the kernel calls the op below autograd straight away. torch.compile
// traces through these kernels to the ops below, whose fake kernels live in
// lltm/ops.py.
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
#include "cpp/cell/cell.h"
#include "cpp/ops/ops.h"
#include "cpp/sequence/sequence.h"

#include <c10/core/GradMode.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <cstddef>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace lltm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool requires_grad(const at::Tensor& t) {
  return t.defined() && t.requires_grad();
}

bool requires_grad(const std::optional<at::Tensor>& t) {
  return t && requires_grad(*t);
}

// save_X and output_mask.
template <typename NotATensor>
bool requires_grad(const NotATensor& /*arg*/) {
  return false;
}

template <typename... Args>
bool records_graph(const Args&... args) {
  return c10::GradMode::is_enabled() && (requires_grad(args) || ...);
}

template <typename Op, typename... Args>
typename Op::Result call_below_autograd(const Args&... args) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return Op::call(args...);
}

std::optional<at::Tensor> optional(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

at::Tensor value(const std::optional<at::Tensor>& t) {
  return t.value_or(at::Tensor());
}

// A node's outputs must be defined: a masked backward op's node returns the
// gradients in its output_mask, in order, and by_mask puts them back.
void append_defined(variable_list& out, at::Tensor t) {
  out.push_back(std::move(t));
}

void append_defined(variable_list& out, std::optional<at::Tensor> t) {
  if (t) {
    out.push_back(std::move(*t));
  }
}

template <typename Outputs>
variable_list defined_outputs(Outputs outputs) {
  variable_list out;
  out.reserve(std::tuple_size_v<Outputs>);
  std::apply(
      [&](auto&... o) { (append_defined(out, std::move(o)), ...); }, outputs);
  return out;
}

CellBackwardResult by_mask(variable_list& out, const OutputMask& mask) {
  std::array<std::optional<at::Tensor>, 5> grads;
  auto next = out.begin();
  for (size_t k = 0; k < grads.size(); ++k) {
    if (mask[k]) {
      grads[k] = std::move(*next++);
    }
  }
  return {grads[0], grads[1], grads[2], grads[3], grads[4]};
}

// Output k of an op from its node's outputs: an optional one is absent where
// the node has none (cell_forward's X, when not saved).
template <typename Output>
Output output(variable_list& out, size_t k) {
  if constexpr (std::is_same_v<Output, at::Tensor>) {
    return std::move(out[k]);
  } else {
    return k < out.size() ? Output(std::move(out[k])) : std::nullopt;
  }
}

template <typename Result, size_t... k>
Result from_outputs(variable_list& out, std::index_sequence<k...> /*ks*/) {
  return {output<std::tuple_element_t<k, Result>>(out, k)...};
}

// The ops with an output_mask, their last argument, return only the
// gradients in it.
template <typename... Args>
constexpr bool has_output_mask = std::is_same_v<
    std::tuple_element_t<sizeof...(Args) - 1, std::tuple<Args...>>,
    OutputMask>;

// The autograd kernel of every op, with Function the one that records it.
template <typename Function>
struct Autograd {
  template <typename Op, typename... Args>
  static typename Op::Result call(const Args&... args) {
    using Result = typename Op::Result;
    if (!records_graph(args...)) {
      return call_below_autograd<Op>(args...);
    }
    variable_list out = Function::apply(args...);
    if constexpr (has_output_mask<Args...>) {
      return by_mask(out, std::get<sizeof...(Args) - 1>(std::tie(args...)));
    } else {
      return from_outputs<Result>(
          out, std::make_index_sequence<std::tuple_size_v<Result>>());
    }
  }
};

// The output_mask of a node's masked backward op: which of the node's first
// five inputs (input, weights, bias, then the state) need a gradient.
OutputMask needs_input_grad(AutogradContext* ctx) {
  OutputMask mask{};
  for (size_t k = 0; k < mask.size(); ++k) {
    mask[k] = ctx->needs_input_grad(k);
  }
  return mask;
}

// bias is [3 * state_size] or [1, 3 * state_size] (a sequence's may have a
// direction dimension in front), and its gradient the same.
void save_bias_shape(AutogradContext* ctx, const at::Tensor& bias) {
  ctx->saved_data["bias_shape"] = bias.sizes().vec();
}

std::vector<int64_t> bias_shape(AutogradContext* ctx) {
  return ctx->saved_data["bias_shape"].toIntVector();
}

// What a node returns for its inputs from its masked backward op's
// gradients: undefined where masked out, d_bias in the shape of bias, then
// `none` for the inputs no gradient reaches.
template <typename... None>
variable_list input_grads(
    AutogradContext* ctx,
    CellBackwardResult grads,
    const None&... none) {
  auto& d_bias = std::get<2>(grads);
  if (d_bias) {
    d_bias = d_bias->view(bias_shape(ctx));
  }
  return std::apply(
      [&](const auto&... grad) {
        return variable_list{value(grad)..., none...};
      },
      grads);
}

constexpr const char* kFirstOrderOnly =
    " is not differentiable: lltm supports first-order gradients only";

// lltm::cell and lltm::cell_forward. Outputs: new_h, new_cell, and the
// non-differentiable gates and X (undefined unless saved). lltm::cell has
// no save_X: X is saved when the weights need a gradient.
class CellFunction : public torch::autograd::Function<CellFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weights,
      const at::Tensor& bias,
      const at::Tensor& old_h,
      const at::Tensor& old_cell,
      std::optional<bool> save_X = std::nullopt) {
    const bool save = save_X.value_or(weights.requires_grad());
    TORCH_CHECK_VALUE(
        save || !weights.requires_grad(),
        "lltm::cell_forward: the gradient of weights needs X = [old_h | "
        "input]: call it with save_X=True");
    // An output that does not reach the loss gets no gradient (undefined),
    // rather than zeros the backward would have to read.
    ctx->set_materialize_grads(false);
    auto [new_h, new_cell, gates, X] = call_below_autograd<ops::CellForward>(
        input, weights, bias, old_h, old_cell, save);
    ctx->save_for_backward({new_cell, gates, value(X), weights});
    save_bias_shape(ctx, bias);
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
    return input_grads(
        ctx,
        ops::CellBackward::call(
            optional(grads[0]),
            optional(grads[1]),
            saved[0],
            saved[1],
            optional(saved[2]),
            saved[3],
            needs_input_grad(ctx)),
        /*save_X=*/at::Tensor());
  }
};

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
    auto [new_h, new_cell, i, o, g, X, gate_weights] =
        call_below_autograd<ops::Forward>(
            input, weights, bias, old_h, old_cell);
    ctx->save_for_backward({new_cell, i, o, g, X, gate_weights, weights});
    save_bias_shape(ctx, bias);
    ctx->mark_non_differentiable({i, o, g, X, gate_weights});
    return {new_h, new_cell, i, o, g, X, gate_weights};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    auto [d_old_h, d_input, d_weights, d_bias, d_old_cell] =
        ops::Backward::call(
            grads[0], grads[1], s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
    d_bias = d_bias.view(bias_shape(ctx));
    return {d_input, d_weights, d_bias, d_old_h, d_old_cell};
  }
};

// lltm::sequence and lltm::sequence_forward. Outputs: output, h_n, c_n, and
// the non-differentiable cells and gates. batch_sizes (a packed input's)
// is saved too; it gets no gradient.
class SequenceFunction : public torch::autograd::Function<SequenceFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx,
      const at::Tensor& input,
      const at::Tensor& weights,
      const at::Tensor& bias,
      const at::Tensor& h0,
      const at::Tensor& c0,
      const std::optional<at::Tensor>& batch_sizes) {
    // An output that does not reach the loss gets no gradient (undefined),
    // which the backward reads as zeros without making them.
    ctx->set_materialize_grads(false);
    auto [output, h_n, c_n, cells, gates] =
        call_below_autograd<ops::SequenceForward>(
            input, weights, bias, h0, c0, batch_sizes);
    ctx->save_for_backward(
        {input, weights, h0, output, cells, gates, value(batch_sizes)});
    save_bias_shape(ctx, bias);
    ctx->mark_non_differentiable({cells, gates});
    return {output, h_n, c_n, cells, gates};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    return input_grads(
        ctx,
        ops::SequenceBackward::call(
            optional(grads[0]),
            optional(grads[1]),
            optional(grads[2]),
            s[0],
            s[1],
            s[2],
            s[3],
            s[4],
            s[5],
            optional(s[6]),
            needs_input_grad(ctx)),
        /*batch_sizes=*/at::Tensor());
  }
};

// The node of a backward op, whose own backward raises: a second derivative
// would otherwise be silently wrong (zero).
template <typename Op>
class BackwardFunction
    : public torch::autograd::Function<BackwardFunction<Op>> {
 public:
  template <typename... Args>
  static variable_list forward(AutogradContext* ctx, const Args&... args) {
    // Masked-out outputs are undefined: no zeros to make for them.
    ctx->set_materialize_grads(false);
    return defined_outputs(call_below_autograd<Op>(args...));
  }

  static variable_list backward(
      AutogradContext* /*ctx*/,
      variable_list /*grads*/) {
    TORCH_CHECK(false, Op::name, kFirstOrderOnly);
    return {};
  }
};

template <typename Function, typename... Ops>
void impl(torch::Library& m) {
  (m.impl(Ops::name, &Ops::template kernel<Autograd<Function>>), ...);
}

template <typename... Ops>
void impl_backward(torch::Library& m) {
  (impl<BackwardFunction<Ops>, Ops>(m), ...);
}

void register_autograd(torch::Library& m) {
  impl<CellFunction, ops::Cell, ops::CellForward>(m);
  impl<ForwardFunction, ops::Forward>(m);
  impl<SequenceFunction, ops::Sequence, ops::SequenceForward>(m);
  impl_backward<ops::CellBackward, ops::Backward, ops::SequenceBackward>(m);
}

} // namespace
} // namespace lltm

TORCH_LIBRARY_IMPL(lltm, Autograd, m) {
  lltm::register_autograd(m);
}
