// The backward's driver (sequence.h states the math): the directions and
// segments (segments.h) in reverse, the plan of each block (choice.h), and
// the GEMMs over all steps after the blocks.
#include "cpp/sequence/run.h"

#include "cpp/ops/path_range.h"
#include "cpp/sequence/choice.h"
#include "cpp/sequence/path.h"
#include "cpp/sequence/segments.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

#include <array>
#include <string_view>
#include <utility>
#include <vector>

namespace lltm::sequence {
namespace {

// The gradients of zero steps, where no path runs.
BackwardResult empty_backward(
    const Problem& p,
    const std::optional<at::Tensor>& grad_h_n,
    const std::optional<at::Tensor>& grad_c_n,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& h0,
    const OutputMask& mask) {
  const int64_t S = p.sizes.state_size;
  const auto options = input.options();
  auto state_grad = [&](const std::optional<at::Tensor>& g) {
    return g ? g->clone(at::MemoryFormat::Contiguous)
             : at::zeros(h0.sizes(), options);
  };
  BackwardResult result;
  if (mask[0]) {
    std::get<0>(result) = at::zeros(input.sizes(), options);
  }
  if (mask[1]) {
    std::get<1>(result) = at::zeros(weights.sizes(), options);
  }
  if (mask[2]) {
    std::get<2>(result) =
        at::zeros(directed(p.stacked, p.directions, {3 * S}), options);
  }
  if (mask[3]) {
    std::get<3>(result) = state_grad(grad_h_n);
  }
  if (mask[4]) {
    std::get<4>(result) = state_grad(grad_c_n);
  }
  return result;
}

// A segment's mask: its state gradients feed the segment before it; the
// first segment's are d_h0 and d_c0, computed where asked for.
OutputMask segment_mask(bool first, const OutputMask& mask) {
  return {false, false, false, !first || mask[3], !first || mask[4]};
}

// The backward of one block: planned, recorded and run.
StateGrads backward_block(
    const Engine& engine,
    const Sizes& sizes,
    at::ScalarType dtype,
    const BackwardInputs& inputs,
    const OutputMask& mask,
    at::Tensor& d_gates) {
  if (empty_block(sizes)) {
    return {
        at::empty({sizes.batch, sizes.state_size}, d_gates.options()),
        std::nullopt};
  }
  const Plan plan = choice::plan_block(
      engine, {sizes, dtype, true, true}, "lltm::sequence_backward");
  const PathRange range(
      "lltm::sequence_backward_path::", [&] { return plan.name(); });
  return plan.path->backward(plan, sizes, inputs, mask, d_gates);
}

// Direction d's weight gradients and d_input (in its own order), from
// d_gates ([T, B, 3S], its work rows) of a dense input: d_W_x = dZ^T x,
// d_W_h = dZ_0^T h0 + dZ_{1:}^T output_{:-1}, and d_bias, into the slices
// given.
at::Tensor dense_weight_grads(
    const Engine& engine,
    const Sizes& sizes,
    const at::Tensor& d_gates,
    const at::Tensor& x,
    const at::Tensor& w,
    const at::Tensor& h0,
    const at::Tensor& output,
    const OutputMask& mask,
    at::Tensor& d_weights,
    at::Tensor& d_bias) {
  const auto [T, B, F, S] = sizes;
  const at::Tensor dz = d_gates.view({T * B, 3 * S});
  if (mask[1]) {
    // Into the column blocks of d_weights: [d_W_h | d_W_x].
    at::Tensor d_w_x = d_weights.narrow(1, S, F);
    at::mm_out(d_w_x, dz.t(), x.reshape({T * B, F}));
    at::Tensor d_w_h = d_weights.narrow(1, 0, S);
    at::mm_out(d_w_h, d_gates.select(0, 0).t(), h0);
    if (T > 1) {
      d_w_h.addmm_(
          d_gates.narrow(0, 1, T - 1).view({(T - 1) * B, 3 * S}).t(),
          output.narrow(0, 0, T - 1).reshape({(T - 1) * B, S}));
    }
  }
  if (mask[2]) {
    at::sum_out(d_bias, dz, 0);
  }
  return mask[0] ? engine_mm(engine, dz, weights_x(w, S)).view({T, B, F})
                 : at::Tensor();
}

} // namespace

BackwardResult run_backward(
    const Problem& p,
    const at::Tensor& input,
    const at::Tensor& h0,
    const at::Tensor& output,
    const BackwardInputs& in,
    const OutputMask& mask,
    const Engine& engine) {
  const auto [T, B, F, S] = p.sizes;
  const int64_t D = p.directions;
  const bool stacked = p.stacked;
  const std::string_view directions_wanted = directions_setting();
  if (T == 0) {
    return empty_backward(
        p, in.grad_h_n, in.grad_c_n, input, in.weights, h0, mask);
  }
  const auto options = input.options();
  const at::ScalarType dtype = input.scalar_type();
  const Steps steps = steps_of(engine, p);
  const int64_t W = steps.work_rows();
  const std::optional<Indices> idx =
      indices_of(engine, p, steps, input.device(), mask[1]);
  const std::vector<Segment> segments =
      steps.backward_segments(in.grad_c_n.has_value());

  at::Tensor d_weights;
  at::Tensor d_bias;
  if (mask[1]) {
    d_weights = at::empty(in.weights.sizes(), options);
  }
  if (mask[2]) {
    d_bias = at::empty(directed(stacked, D, {3 * S}), options);
  }
  // Each direction's d_input (in the packed or the steps' order), d_h0 and
  // d_c0.
  std::array<at::Tensor, 2> d_inputs;
  std::array<at::Tensor, 2> d_h0s;
  std::array<at::Tensor, 2> d_c0s;

  // The result from each direction's gradients.
  const auto finish_backward = [&] {
    BackwardResult result;
    if (mask[0]) {
      std::get<0>(result) =
          D == 1 ? d_inputs[0] : d_inputs[0].add_(d_inputs[1]);
    }
    if (mask[1]) {
      std::get<1>(result) = std::move(d_weights);
    }
    if (mask[2]) {
      std::get<2>(result) = std::move(d_bias);
    }
    // The state gradients with the arguments' direction dimension.
    const auto states = [&](const std::array<at::Tensor, 2>& grads) {
      if (!stacked) {
        return grads[0];
      }
      return D == 1 ? grads[0].unsqueeze(0) : at::stack({grads[0], grads[1]});
    };
    if (mask[3]) {
      std::get<3>(result) = states(d_h0s);
    }
    if (mask[4]) {
      std::get<4>(result) = states(d_c0s);
    }
    return result;
  };

  // Direction d's views of the call's tensors.
  struct Views {
    at::Tensor w;
    at::Tensor h0;
    at::Tensor cells;
    at::Tensor gates;
    at::Tensor d_weights;
    at::Tensor d_bias;
    at::Tensor output;
    std::optional<at::Tensor> grad_h_n;
    std::optional<at::Tensor> grad_c_n;
  };
  const auto views_of = [&](int64_t d) {
    Views v;
    v.w = direction_of(in.weights, d, stacked);
    v.h0 = direction_of(h0, d, stacked);
    v.cells =
        direction_of(in.cells, d, stacked).view({T * B, S}).narrow(0, 0, W);
    v.gates =
        direction_of(in.gates, d, stacked).view({T * B, 3 * S}).narrow(0, 0, W);
    if (mask[1]) {
      v.d_weights = direction_of(d_weights, d, stacked);
    }
    if (mask[2]) {
      v.d_bias = direction_of(d_bias, d, stacked);
    }
    if (in.grad_h_n) {
      v.grad_h_n = direction_of(*in.grad_h_n, d, stacked);
    }
    if (in.grad_c_n) {
      v.grad_c_n = direction_of(*in.grad_c_n, d, stacked);
    }
    v.output = D == 1 ? output : output_of(output, d, S);
    return v;
  };
  // A dense call's direction d: one block, direction 1's steps in reverse.
  struct Dense {
    Views v;
    std::optional<at::Tensor> grad_output;
    at::Tensor cells;
    at::Tensor gates;
    at::Tensor d_gates;
  };
  const auto dense_of = [&](int64_t d, Scratch d_gates_slot) {
    Dense x{views_of(d)};
    if (in.grad_output) {
      const at::Tensor g =
          D == 1 ? *in.grad_output : output_of(*in.grad_output, d, S);
      x.grad_output = d == 0 ? g : g.flip(0);
    }
    x.cells = x.v.cells.view({T, B, S});
    x.gates = x.v.gates.view({T, B, 3 * S});
    x.d_gates = engine.scratch(d_gates_slot, {T, B, 3 * S}, options);
    return x;
  };
  const auto dense_inputs = [](const Dense& x) {
    return BackwardInputs{
        x.grad_output, x.v.grad_h_n, x.v.grad_c_n, x.v.w, x.cells, x.gates};
  };
  // The GEMMs over all steps after direction d's reverse loop.
  const auto dense_finish = [&](int64_t d, Dense& x, const StateGrads& state) {
    const at::Tensor in_x = d == 0 ? input : input.flip(0);
    const at::Tensor h = d == 0 ? x.v.output : x.v.output.flip(0);
    const at::Tensor d_input = dense_weight_grads(
        engine,
        p.sizes,
        x.d_gates,
        in_x,
        x.v.w,
        x.v.h0,
        h,
        mask,
        x.v.d_weights,
        x.v.d_bias);
    if (mask[0]) {
      d_inputs[d] = d == 0 ? d_input : d_input.flip(0);
    }
    if (mask[3]) {
      d_h0s[d] = state.d_h0
          ? *state.d_h0
          : at::mm(x.d_gates.select(0, 0), weights_h(x.v.w, S));
    }
    d_c0s[d] = state.d_c0;
  };

  if (const std::optional<Plan> together = together_plan(
          engine,
          p,
          {p.sizes, dtype, true, true},
          directions_wanted,
          "lltm::sequence_backward")) {
    const Plan& plan = *together;
    std::array<Dense, 2> both{
        dense_of(0, Scratch::kDGates), dense_of(1, Scratch::kSecondDGates)};
    const std::array<BackwardInputs, 2> ins{
        dense_inputs(both[0]), dense_inputs(both[1])};
    const std::array<at::Tensor, 2> dz{both[0].d_gates, both[1].d_gates};
    std::vector<StateGrads> states;
    {
      const PathRange range("lltm::sequence_backward_path::", [&] {
        return plan.name() + "/together";
      });
      states = plan.path->backward_directions(plan, p.sizes, ins, mask, dz);
    }
    dense_finish(0, both[0], states.at(0));
    dense_finish(1, both[1], states.at(1));
    return finish_backward();
  }

  engine.for_each_direction(p.sizes, D, [&](int64_t d) {
    if (!p.packed) {
      Dense x = dense_of(d, Scratch::kDGates);
      const StateGrads state = backward_block(
          engine, p.sizes, dtype, dense_inputs(x), mask, x.d_gates);
      dense_finish(d, x, state);
      return;
    }
    Views v = views_of(d);
    const at::Tensor& w = v.w;
    const at::Tensor& cells_d = v.cells;
    const at::Tensor& gates_d = v.gates;
    const std::optional<at::Tensor>& grad_h_n = v.grad_h_n;
    const std::optional<at::Tensor>& grad_c_n = v.grad_c_n;

    // A packed input: the upstream gradient in the work rows, with each
    // sequence's grad_h_n added at its last step.
    at::Tensor g;
    if (in.grad_output) {
      g = to_work(output_of(*in.grad_output, d, S), steps, *idx, d);
      if (grad_h_n && d == 0 && steps.identity()) {
        g = g.clone(at::MemoryFormat::Contiguous);
      }
    } else {
      g = at::zeros({W, S}, options);
    }
    if (grad_h_n) {
      g.index_copy_(
          0, idx->last_work, g.index_select(0, idx->last_work).add_(*grad_h_n));
    }
    at::Tensor d_gates = engine.scratch(Scratch::kDGates, {W, 3 * S}, options);
    // The segments from the last: each hands the one before it the
    // gradients of the state it started from.
    at::Tensor d_h_next;
    at::Tensor d_c_next;
    PackedWeights packed;
    for (size_t i = segments.size(); i-- > 0;) {
      const Segment& s = segments[i];
      const Sizes sizes{s.steps, s.batch, F, S};
      std::optional<at::Tensor> gh;
      std::optional<at::Tensor> gc;
      if (d_h_next.defined()) {
        gh = padded(d_h_next, s.batch);
        gc = padded(d_c_next, s.batch);
      }
      const int64_t end = s.first_step + s.steps;
      const int64_t ended = steps.batch_at(end);
      if (grad_c_n && ended < steps.batch_at(end - 1)) {
        // The sequences whose last step is this segment's.
        if (!gc) {
          gc = at::zeros({s.batch, S}, options);
        }
        const int64_t n = steps.batch_at(end - 1) - ended;
        gc->narrow(0, ended, n).add_(grad_c_n->narrow(0, ended, n));
      }
      at::Tensor dz = block(d_gates, s);
      const OutputMask wanted = segment_mask(i == 0, mask);
      StateGrads state = backward_block(
          engine,
          sizes,
          dtype,
          {block(g, s),
           gh,
           gc,
           w,
           block(cells_d, s),
           block(gates_d, s),
           &packed},
          wanted,
          dz);
      if (wanted[3]) {
        d_h_next = state.d_h0
            ? *state.d_h0
            : at::mm(dz.select(0, 0), packed_w_h(w, S, &packed));
      }
      d_c_next = state.d_c0;
    }
    d_h0s[d] = d_h_next;
    d_c0s[d] = d_c_next;
    // The GEMMs over the real rows alone, in the packed order.
    const at::Tensor dz = from_work(d_gates, steps, *idx, d);
    if (mask[0]) {
      d_inputs[d] = engine_mm(engine, dz, weights_x(w, S));
    }
    if (mask[1]) {
      at::Tensor d_w_x = v.d_weights.narrow(1, S, F);
      at::mm_out(d_w_x, dz.t(), input);
      const at::Tensor previous =
          at::cat({v.h0, v.output}).index_select(0, idx->previous_of_packed[d]);
      at::Tensor d_w_h = v.d_weights.narrow(1, 0, S);
      at::mm_out(d_w_h, dz.t(), previous);
    }
    if (mask[2]) {
      at::sum_out(v.d_bias, dz, 0);
    }
  });
  return finish_backward();
}
} // namespace lltm::sequence
