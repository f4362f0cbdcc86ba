// The CPU's fused path: per step one parallel region whose tasks each run a
// block of rows of a panel of W_h^T's columns and the cell on them
// (cpp/cpu_kernels/kernels.cpp, FusedStepArgs): no GEMM library and no
// pointwise pass, and each thread runs the same panels at every step, from
// its own cache; a bidirectional call's two directions share each step's
// region where the engine runs them together. float32 alone. Its forward
// and reverse loop serve fused_input too (fused.h).
#include "cpp/sequence/cpu/fused.h"

#include "cpp/sequence/cpu/loops.h"
#include "cpp/sequence/cpu/model.h"

namespace lltm::sequence::cpu_paths {
namespace fused {
namespace {

// Where the reverse loop keeps its panels of W_h (PackedWeights::layout).
constexpr char kBackwardLayout = 0;

// A task (a block of rows of one panel) of fewer multiply-adds than this is
// not worth a thread of its own.
constexpr int64_t kTaskMacs = int64_t(1) << 15;

// W_h in panels of `width` state units: [panels, 3S, width], zeros past
// the state's end; one pass, a panel per task.
at::Tensor backward_panels(
    const at::Tensor& weights,
    int64_t S,
    int64_t width,
    int index) {
  const int64_t panels = (S + width - 1) / width;
  at::Tensor out = layout_buffer(
      &kBackwardLayout, index, {panels, 3 * S, width}, weights.options());
  const float* w = weights.const_data_ptr<float>();
  const int64_t row = weights.stride(0);
  const int64_t col = weights.stride(1);
  float* o = out.mutable_data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t units = std::min(width, S - p * width);
      for (int64_t k = 0; k < 3 * S; ++k) {
        float* dst = o + (p * 3 * S + k) * width;
        const float* src = w + k * row + p * width * col;
        if (col == 1) {
          // A row's units are contiguous: a copy.
          std::copy(src, src + units, dst);
        } else {
          for (int64_t j = 0; j < units; ++j) {
            dst[j] = src[j * col];
          }
        }
        std::fill(dst + units, dst + width, 0.0f);
      }
    }
  });
  return out;
}

// Rows [0, K) of W^T (weights [3S, S + F]: W_h^T's S rows, then W_x^T's F)
// in panels of `width` state units, [panels, K, 3, width], zeros past the
// state's end, in layout buffer `index` of `owner` (layout_buffer).
at::Tensor forward_panels(
    const at::Tensor& weights,
    int64_t S,
    int64_t K,
    int64_t width,
    const void* owner,
    int index) {
  const int64_t panels = (S + width - 1) / width;
  at::Tensor out =
      layout_buffer(owner, index, {panels, K, 3, width}, weights.options());
  const float* w = weights.const_data_ptr<float>();
  const int64_t row = weights.stride(0);
  const int64_t col = weights.stride(1);
  float* o = out.mutable_data_ptr<float>();
  const auto& k = cpu::best_kernels<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      float* panel = o + p * K * 3 * width;
      const int64_t units = std::min(width, S - p * width);
      if (col == 1) {
        // Each gate's units of the panel, rows of W, transposed into the
        // panel's columns: a scalar gather ran at about 5 GB/s, most of a
        // short call.
        if (units < width) {
          std::fill(panel, panel + K * 3 * width, 0.0f);
        }
        for (int64_t g = 0; g < 3; ++g) {
          k.transpose(
              w + (g * S + p * width) * row,
              row,
              panel + g * width,
              3 * width,
              units,
              K);
        }
        continue;
      }
      for (int64_t kk = 0; kk < K; ++kk) {
        for (int64_t g = 0; g < 3; ++g) {
          float* dst = panel + (kk * 3 + g) * width;
          for (int64_t j = 0; j < width; ++j) {
            dst[j] =
                j < units ? w[(g * S + p * width + j) * row + kk * col] : 0.0f;
          }
        }
      }
    }
  });
  return out;
}

// The forward's steps of each direction (inputs, buffers and panels in
// forward_panels' layout, one each), one parallel region a step for all:
// with `in_steps`, each step adds x_t W_x^T itself from buffers.input
// (K = S + F); else buffers.gates holds the projection (K = S).
void forward_steps(
    const Sizes& sizes,
    c10::ArrayRef<ForwardInputs> ins,
    c10::ArrayRef<ForwardBuffers> bufs,
    c10::ArrayRef<at::Tensor> panels,
    bool in_steps) {
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t F = sizes.input_features;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  const int64_t K = S + (in_steps ? F : 0);
  const auto count = static_cast<int64_t>(ins.size());
  const auto& k = cpu::best_kernels<float>();
  // Each direction's operands, dense.
  struct Loop {
    at::Tensor bias;
    at::Tensor h0;
    at::Tensor c0;
    const float* x;
    float* gates;
    float* output;
    float* cells;
    float* c_n;
  };
  const bool save = bufs[0].cells.defined();
  c10::SmallVector<Loop, 2> loops;
  for (int64_t d = 0; d < count; ++d) {
    const ForwardBuffers& b = bufs[d];
    loops.push_back(
        {ins[d].bias.contiguous(),
         ins[d].h0.contiguous(),
         ins[d].c0.contiguous(),
         in_steps ? b.input.const_data_ptr<float>() : nullptr,
         b.gates.mutable_data_ptr<float>(),
         b.output.mutable_data_ptr<float>(),
         save ? b.cells.mutable_data_ptr<float>() : nullptr,
         b.c_n.mutable_data_ptr<float>()});
  }
  const int64_t row_blocks = (B + k.block_rows - 1) / k.block_rows;
  const int64_t tasks = (S + k.panel_width - 1) / k.panel_width * row_blocks;
  const int64_t grain =
      std::max<int64_t>(1, kTaskMacs / (k.block_rows * 3 * k.panel_width * K));
  c10::SmallVector<cpu::FusedStepArgs<float>, 2> args(count);
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t d = 0; d < count; ++d) {
      const Loop& l = loops[d];
      cpu::FusedStepArgs<float>& a = args[d];
      a = {};
      a.h = t == 0 ? l.h0.const_data_ptr<float>() : l.output + (t - 1) * BS;
      a.w = panels[d].const_data_ptr<float>();
      if (in_steps) {
        a.x = l.x + t * B * F;
        a.features = F;
      } else {
        a.z = l.gates + t * B * 3 * S;
      }
      a.bias = l.bias.const_data_ptr<float>();
      // Without saving, c_t is written over c_{t-1} in c_n.
      a.old_cell = t == 0 ? l.c0.const_data_ptr<float>()
                          : (save ? l.cells + (t - 1) * BS : l.c_n);
      a.new_h = l.output + t * BS;
      a.new_cell = save ? l.cells + t * BS : l.c_n;
      // [i | o | g] over the step's projection, element for element.
      a.activations = save ? l.gates + t * B * 3 * S : nullptr;
      a.batch = B;
      a.state = S;
    }
    parallel_directions(
        count, tasks, grain, [&](int64_t d, int64_t begin, int64_t end) {
          k.fused_step(args[d], begin, end);
        });
  }
  for (int64_t d = 0; d < count; ++d) {
    const Loop& l = loops[d];
    float* h_n = bufs[d].h_n.mutable_data_ptr<float>();
    std::copy(l.output + (steps - 1) * BS, l.output + steps * BS, h_n);
    if (save) {
      std::copy(l.cells + (steps - 1) * BS, l.cells + steps * BS, l.c_n);
    }
  }
}

} // namespace

bool runs(const Block& block, std::string* why_not) {
  if (block.dtype != at::kFloat) {
    *why_not = "float32 only (its kernels are float's alone)";
    return false;
  }
  return true;
}

void forward_directions(
    const Plan& plan,
    const Sizes& sizes,
    c10::ArrayRef<ForwardInputs> inputs,
    c10::ArrayRef<ForwardBuffers> buffers) {
  const int64_t S = sizes.state_size;
  const bool in_steps = plan.input_in_steps;
  const int64_t K = S + (in_steps ? sizes.input_features : 0);
  c10::SmallVector<at::Tensor, 2> panels;
  for (size_t d = 0; d < inputs.size(); ++d) {
    const ForwardInputs& in = inputs[d];
    // The plan's path owns the layout: fused's and fused_input's differ.
    panels.push_back(kept(
        in.packed != nullptr ? in.packed->layout(plan.path, 0) : nullptr, [&] {
          return forward_panels(
              in.weights,
              S,
              K,
              cpu::best_kernels<float>().panel_width,
              plan.path,
              static_cast<int>(d));
        }));
  }
  forward_steps(sizes, inputs, buffers, panels, in_steps);
}

void forward(
    const Plan& plan,
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers) {
  forward_directions(plan, sizes, in, buffers);
}

std::vector<StateGrads> backward_directions(
    const Plan& /*plan*/,
    const Sizes& sizes,
    c10::ArrayRef<BackwardInputs> inputs,
    const OutputMask& /*output_mask*/,
    c10::ArrayRef<at::Tensor> d_gates) {
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  const auto count = static_cast<int64_t>(inputs.size());
  const auto& k = cpu::best_kernels<float>();
  // Each direction's operands; dc_t in turns: step t reads dc_t and writes
  // dc_{t-1}.
  struct Loop {
    at::Tensor panels;
    std::array<at::Tensor, 2> dc;
    std::optional<at::Tensor> grad_h_n_dense;
    float* dz;
    const float* act;
    const float* cell;
  };
  c10::SmallVector<Loop, 2> loops;
  for (int64_t d = 0; d < count; ++d) {
    const BackwardInputs& in = inputs[d];
    const auto options = in.gates.options();
    Loop l;
    l.panels = kept(
        in.packed != nullptr ? in.packed->layout(&kBackwardLayout, 0) : nullptr,
        [&] {
          return backward_panels(
              in.weights, S, k.panel_width, static_cast<int>(d));
        });
    l.dc = {at::empty({B, S}, options), at::empty({B, S}, options)};
    if (in.grad_output && in.grad_h_n) {
      l.grad_h_n_dense = in.grad_h_n->contiguous();
    }
    l.dz = d_gates[d].mutable_data_ptr<float>();
    l.act = in.gates.const_data_ptr<float>();
    l.cell = in.cells.const_data_ptr<float>();
    loops.push_back(std::move(l));
  }
  const int64_t row_blocks =
      (B + k.backward_block_rows - 1) / k.backward_block_rows;
  const int64_t tasks = (S + k.panel_width - 1) / k.panel_width * row_blocks;
  const int64_t grain = std::max<int64_t>(
      1, kTaskMacs / (k.backward_block_rows * 3 * k.panel_width * S));
  c10::SmallVector<cpu::FusedBackwardStepArgs<float>, 2> args(count);
  for (int64_t t = steps - 1; t >= 0; --t) {
    for (int64_t d = 0; d < count; ++d) {
      const BackwardInputs& in = inputs[d];
      const Loop& l = loops[d];
      cpu::FusedBackwardStepArgs<float>& a = args[d];
      a = {};
      a.w = l.panels.const_data_ptr<float>();
      a.grad_h = strided_step<float>(in.grad_output, t);
      if (t == steps - 1) {
        a.dz_next = nullptr;
        if (!in.grad_output) {
          a.grad_h = strided<float>(in.grad_h_n);
        } else if (l.grad_h_n_dense) {
          a.grad_h_add = l.grad_h_n_dense->const_data_ptr<float>();
        }
        a.grad_cell = strided<float>(in.grad_c_n);
      } else {
        a.dz_next = l.dz + (t + 1) * B * 3 * S;
        a.grad_cell = {l.dc[(t + 1) % 2].const_data_ptr<float>(), S, 1};
      }
      a.new_cell = l.cell + t * BS;
      a.activations = l.act + t * B * 3 * S;
      a.d_gates = l.dz + t * B * 3 * S;
      a.d_old_cell = l.dc[t % 2].mutable_data_ptr<float>();
      a.batch = B;
      a.state = S;
    }
    parallel_directions(
        count, tasks, grain, [&](int64_t d, int64_t begin, int64_t end) {
          k.fused_backward_step(args[d], begin, end);
        });
  }
  std::vector<StateGrads> grads;
  for (const Loop& l : loops) {
    grads.push_back({l.dc[0], std::nullopt});
  }
  return grads;
}

StateGrads backward(
    const Plan& plan,
    const Sizes& sizes,
    const BackwardInputs& in,
    const OutputMask& output_mask,
    at::Tensor& d_gates) {
  return backward_directions(plan, sizes, in, output_mask, d_gates)[0];
}

} // namespace fused

namespace {

std::optional<Plan> plan(const Block& block, std::string* why_not) {
  if (!fused::runs(block, why_not)) {
    return std::nullopt;
  }
  return Plan{};
}

// Fitted by scripts/fit_cpu_paths.py (cpu/model.h).
constexpr Costs kCosts{
    {2431.7, 3.57, 18863.9, 18254.8},
    {3369.4, 2.02, 17648.6, 20685.4},
    fused::kBackwardCost};

double estimate(const Block& block) {
  return estimate_us(kCosts, block);
}

const Path kFused{
    "fused",
    c10::DeviceType::CPU,
    30,
    &plan,
    nullptr,
    &estimate,
    &fused::forward,
    &fused::backward,
    &fused::forward_directions,
    &fused::backward_directions};

} // namespace

LLTM_REGISTER_SEQUENCE_PATH(kFused);

} // namespace lltm::sequence::cpu_paths
