// The forward's driver (sequence.h states the math): the input projection
// before the blocks, the directions and segments (segments.h) and the plan
// of each block (choice.h); and what it shares with the backward's
// (backward.cpp, run.h).
#include "cpp/sequence/run.h"

#include "cpp/ops/path_range.h"
#include "cpp/sequence/choice.h"
#include "cpp/sequence/path.h"
#include "cpp/sequence/segments.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/flip.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/mm.h>

#include <array>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lltm::sequence {

namespace {

// The forward of one planned block: recorded and run.
void forward_block(
    const Plan& plan,
    const Sizes& sizes,
    const ForwardInputs& inputs,
    ForwardBuffers& buffers) {
  const PathRange range("lltm::sequence_path::", [&] { return plan.name(); });
  plan.path->forward(plan, sizes, inputs, buffers);
}

} // namespace

at::Tensor aten_mm(
    const at::Tensor& a,
    const at::Tensor& b,
    const at::Tensor& out) {
  if (!out.defined()) {
    return at::mm(a, b);
  }
  at::Tensor o = out;
  return at::mm_out(o, a, b);
}

at::Tensor engine_mm(
    const Engine& engine,
    const at::Tensor& a,
    const at::Tensor& b,
    const at::Tensor& out) {
  return engine.mm != nullptr ? engine.mm(engine, a, b, out)
                              : aten_mm(a, b, out);
}

bool empty_block(const Sizes& sizes) {
  return sizes.batch == 0 || sizes.state_size == 0;
}

Steps steps_of(const Engine& engine, const Problem& p) {
  return p.packed
      ? Steps(p.batch_sizes, min_segment_steps(engine, p.sizes.steps))
      : Steps(p.sizes.steps, p.sizes.batch);
}

std::optional<Indices> indices_of(
    const Engine& engine,
    const Problem& p,
    const Steps& steps,
    c10::Device device,
    bool previous) {
  if (!p.packed) {
    return std::nullopt;
  }
  return std::optional<Indices>(
      std::in_place, steps, p.directions, engine, device, previous);
}

std::string_view directions_setting() {
  const char* value = std::getenv("LLTM_DIRECTIONS");
  const std::string_view wanted = value != nullptr ? value : "";
  TORCH_CHECK_VALUE(
      wanted.empty() || wanted == "together" || wanted == "apart" ||
          wanted == "calls",
      "LLTM_DIRECTIONS=",
      std::string(wanted),
      ": expected together, apart or calls (or unset: the backend's choice)");
  // "calls" is LLTMLayer's (a call per direction): a call with both
  // directions runs as unset.
  return wanted == "calls" ? std::string_view() : wanted;
}

std::optional<Plan> together_plan(
    const Engine& engine,
    const Problem& p,
    const Block& b,
    std::string_view wanted,
    const char* op) {
  if (p.directions != 2 || p.packed || empty_block(p.sizes) ||
      wanted == "apart" ||
      (wanted.empty() &&
       (engine.together == nullptr ||
        !engine.together(p.sizes, p.directions)))) {
    return std::nullopt;
  }
  Plan plan = choice::plan_block(engine, b, op);
  const bool has_loop = b.backward ? plan.path->backward_directions != nullptr
                                   : plan.path->forward_directions != nullptr;
  return has_loop ? std::optional<Plan>(std::move(plan)) : std::nullopt;
}

at::Tensor* PackedWeights::layout(const void* owner, int index) {
  for (Layout& l : layouts_) {
    if (l.owner == owner && l.index == index) {
      return &l.tensor;
    }
  }
  layouts_.push_back({owner, index, at::Tensor()});
  return &layouts_.back().tensor;
}

at::Tensor packed_w_h_t(
    const at::Tensor& weights,
    int64_t state_size,
    PackedWeights* packed) {
  return kept(packed != nullptr ? &packed->w_h_t : nullptr, [&] {
    return weights_h(weights, state_size).t().contiguous();
  });
}

at::Tensor packed_w_h(
    const at::Tensor& weights,
    int64_t state_size,
    PackedWeights* packed) {
  return kept(packed != nullptr ? &packed->w_h : nullptr, [&] {
    return weights_h(weights, state_size).contiguous();
  });
}

ForwardResult run_forward(
    const Problem& p,
    const at::Tensor& input,
    const ForwardInputs& in,
    const Engine& engine,
    bool save,
    const char* op) {
  const auto [T, B, F, S] = p.sizes;
  const int64_t D = p.directions;
  const bool stacked = p.stacked;
  const std::string_view directions_wanted = directions_setting();
  const auto options = input.options();
  const int64_t N = p.packed ? input.size(0) : T * B;
  const std::vector<int64_t> output_shape = p.packed
      ? std::vector<int64_t>{N, D * S}
      : std::vector<int64_t>{T, B, D * S};
  if (T == 0) {
    at::Tensor cells;
    at::Tensor gates;
    if (save) {
      cells = at::empty(directed(stacked, D, {0, B, S}), options);
      gates = at::empty(directed(stacked, D, {0, B, 3 * S}), options);
    }
    return {
        at::empty(output_shape, options),
        in.h0.clone(at::MemoryFormat::Contiguous),
        in.c0.clone(at::MemoryFormat::Contiguous),
        cells,
        gates};
  }
  const Steps steps = steps_of(engine, p);
  const int64_t W = steps.work_rows();
  const std::optional<Indices> idx =
      indices_of(engine, p, steps, input.device(), false);
  // A packed batch reads each sequence's last c_t from cells, saved or not.
  const bool keep_cells = save || p.packed;
  at::Tensor h_n = at::empty(directed(stacked, D, {B, S}), options);
  at::Tensor c_n = at::empty(directed(stacked, D, {B, S}), options);
  at::Tensor cells;
  // What the op returns is shaped for any lengths ([T, B] rows a
  // direction); what it keeps to itself, the work rows alone.
  const int64_t rows = save ? T * B : W;
  if (keep_cells) {
    cells = save ? at::empty(directed(stacked, D, {T, B, S}), options)
                 : engine.scratch(Scratch::kCells, {D, W, S}, options);
  }
  at::Tensor gates = save
      ? at::empty(directed(stacked, D, {T, B, 3 * S}), options)
      : engine.scratch(Scratch::kGates, {D, W, 3 * S}, options);
  at::Tensor output = at::empty(output_shape, options);
  // Each direction's h_t in its own work rows: the output itself for one
  // direction over the input's own rows.
  const bool own_output = D == 1 && steps.identity();
  const at::Tensor work_output = own_output
      ? output.view({1, W, S})
      : engine.scratch(Scratch::kOutput, {D, W, S}, options);
  const at::ScalarType dtype = input.scalar_type();

  // Each direction's blocks, planned, with their inputs' views and buffers.
  struct PlannedBlock {
    Plan plan;
    Sizes sizes;
    at::Tensor h_first;
    at::Tensor c_first;
    ForwardBuffers buffers;
  };
  struct Direction {
    at::Tensor w;
    at::Tensor bias;
    at::Tensor h_n;
    at::Tensor c_n;
    at::Tensor cells;
    at::Tensor out;
    std::vector<PlannedBlock> blocks;
    PackedWeights packed;
  };
  std::array<Direction, 2> directions;
  // A together call is dense: its one block's plan is this one.
  const std::optional<Plan> together = together_plan(
      engine, p, {p.sizes, dtype, false, save}, directions_wanted, op);

  // Direction d's views, its blocks' plans and the input's projection.
  const auto prepare = [&](int64_t d) {
    Direction& dir = directions[d];
    dir.w = direction_of(in.weights, d, stacked);
    dir.bias = direction_of(in.bias, d, stacked);
    dir.h_n = direction_of(h_n, d, stacked);
    dir.c_n = direction_of(c_n, d, stacked);
    const at::Tensor gates_d = direction_of(gates, d, stacked || !save)
                                   .view({rows, 3 * S})
                                   .narrow(0, 0, W);
    dir.cells = keep_cells ? direction_of(cells, d, stacked || !save)
                                 .view({rows, S})
                                 .narrow(0, 0, W)
                           : at::Tensor();
    dir.out = work_output.select(0, d);
    const std::vector<Segment>& segments = steps.segments();
    // Each block's plan before the projection, which a plan may ask for in
    // float32, or run in its steps; none for a block with nothing to
    // compute.
    std::vector<std::optional<Plan>> plans;
    bool float32_projection = false;
    bool rounded_projection = false;
    bool input_in_steps = false;
    for (const Segment& s : segments) {
      const Sizes sizes{s.steps, s.batch, F, S};
      if (empty_block(sizes)) {
        plans.emplace_back();
        continue;
      }
      plans.push_back(
          together
              ? *together
              : choice::plan_block(engine, {sizes, dtype, false, save}, op));
      const Plan& plan = *plans.back();
      (plan.input_in_steps           ? input_in_steps
           : plan.float32_projection ? float32_projection
                                     : rounded_projection) = true;
    }
    // The input projection of every step, unless every block's plan runs it
    // in its steps: one GEMM over the work rows.
    const at::Tensor x = (p.packed ? to_work(input, steps, *idx, d)
                                   : (d == 0 ? input : input.flip(0)))
                             .reshape({W, F});
    at::Tensor projection;
    if (float32_projection) {
      projection = engine.scratch(
          together && d == 1 ? Scratch::kSecondProjection
                             : Scratch::kProjection,
          {W, 3 * S},
          options.dtype(at::kFloat));
      engine_mm(
          engine,
          x.to(at::kFloat),
          weights_x(dir.w, S).t().to(at::kFloat),
          projection);
      if (rounded_projection) {
        gates_d.copy_(projection);
      }
    } else if (rounded_projection) {
      engine_mm(engine, x, weights_x(dir.w, S).t(), gates_d);
    }
    const at::Tensor x_dense = input_in_steps ? x.contiguous() : at::Tensor();
    // A segment's h_n and c_n are not the sequences' (each sequence's comes
    // from its own last step): scratch, one pair per direction.
    const at::Tensor h_scratch =
        p.packed ? at::empty({B, S}, options) : at::Tensor();
    const at::Tensor c_scratch =
        p.packed ? at::empty({B, S}, options) : at::Tensor();
    for (size_t i = 0; i < segments.size(); ++i) {
      if (!plans[i]) {
        continue;
      }
      const Segment& s = segments[i];
      PlannedBlock b{*plans[i], {s.steps, s.batch, F, S}};
      b.buffers.output = block(dir.out, s);
      b.buffers.gates = block(gates_d, s);
      if (keep_cells) {
        b.buffers.cells = block(dir.cells, s);
      }
      if (b.plan.float32_projection) {
        b.buffers.projection = block(projection, s);
      }
      if (b.plan.input_in_steps) {
        b.buffers.input = block(x_dense, s);
      }
      b.buffers.h_n = p.packed ? h_scratch.narrow(0, 0, s.batch) : dir.h_n;
      b.buffers.c_n = p.packed ? c_scratch.narrow(0, 0, s.batch) : dir.c_n;
      b.h_first = i == 0 ? direction_of(in.h0, d, stacked)
                         : state_before(dir.out, segments[i - 1], s.batch);
      b.c_first = i == 0 ? direction_of(in.c0, d, stacked)
                         : state_before(dir.cells, segments[i - 1], s.batch);
      dir.blocks.push_back(std::move(b));
    }
  };
  const auto inputs = [&](Direction& dir, const PlannedBlock& b) {
    return ForwardInputs{dir.w, dir.bias, b.h_first, b.c_first, &dir.packed};
  };
  // Direction d's blocks, in order, then its output in the op's rows.
  const auto run = [&](int64_t d) {
    Direction& dir = directions[d];
    for (PlannedBlock& b : dir.blocks) {
      forward_block(b.plan, b.sizes, inputs(dir, b), b.buffers);
    }
  };
  const auto finish = [&](int64_t d) {
    Direction& dir = directions[d];
    if (p.packed) {
      at::index_select_out(dir.h_n, dir.out, 0, idx->last_work);
      at::index_select_out(dir.c_n, dir.cells, 0, idx->last_work);
      if (!own_output) {
        output_of(output, d, S).copy_(from_work(dir.out, steps, *idx, d));
      }
    } else if (!own_output) {
      const at::Tensor h = dir.out.view({T, B, S});
      output_of(output, d, S).copy_(d == 0 ? h : h.flip(0));
    }
  };

  if (together) {
    // One dense block a direction, by a path that runs both at once.
    prepare(0);
    prepare(1);
    const PlannedBlock& b0 = directions[0].blocks.at(0);
    const PlannedBlock& b1 = directions[1].blocks.at(0);
    const std::array<ForwardInputs, 2> ins{
        inputs(directions[0], b0), inputs(directions[1], b1)};
    const std::array<ForwardBuffers, 2> bufs{b0.buffers, b1.buffers};
    // One loop for both: one range.
    const PathRange range(
        "lltm::sequence_path::", [&] { return b0.plan.name() + "/together"; });
    b0.plan.path->forward_directions(b0.plan, b0.sizes, ins, bufs);
    finish(0);
    finish(1);
  } else {
    engine.for_each_direction(p.sizes, D, [&](int64_t d) {
      prepare(d);
      run(d);
      finish(d);
    });
  }
  if (save && p.packed && W < T * B) {
    // The rows past the work rows: never read, but an output's bytes are
    // all defined.
    gates.view({D, T * B, 3 * S}).narrow(1, W, T * B - W).zero_();
    cells.view({D, T * B, S}).narrow(1, W, T * B - W).zero_();
  }
  return {output, h_n, c_n, save ? cells : at::Tensor(), gates};
}
} // namespace lltm::sequence
