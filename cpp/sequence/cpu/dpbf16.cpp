// The CPU's dpbf16 path: the fused path's shape in bfloat16 on AVX-512 BF16
// (cpp/cpu_kernels/bf16.{h,cpp}). Per step one parallel region whose tasks
// each run a block of rows of a panel of W_h's units with VDPBF16PS, W_h
// packed once a call in pairs along the dot product, and the cell's math on
// the float32 accumulators; the cell (forward) and dc (backward) stay
// float32 between steps, and only what the op stores is rounded. bfloat16
// alone, where the processor has AVX-512 BF16. Its forward and reverse loop
// serve dpbf16_input too (dpbf16.h).
#include "cpp/sequence/cpu/dpbf16.h"

#include "cpp/cpu_kernels/bf16.h"
#include "cpp/sequence/cpu/loops.h"
#include "cpp/sequence/cpu/model.h"
#include "cpp/sequence/path.h"

#include <ATen/ops/empty.h>

namespace lltm::sequence::cpu_paths {
namespace dpbf16 {
namespace {

namespace bf16 = cpu::bf16;
using c10::BFloat16;

// Where the reverse loop keeps its panels of W_h (PackedWeights::layout).
constexpr char kBackwardLayout = 0;

// A task (a block of rows of one panel) of fewer multiply-adds than this is
// not worth a thread of its own.
constexpr int64_t kTaskMacs = int64_t(1) << 15;

// W in one of bf16.h's panel layouts (with `features` columns of W_x
// after W_h's in the forward's), a panel per task, in layout buffer `index`
// of `owner` (layout_buffer).
at::Tensor panels(
    const at::Tensor& weights,
    int64_t S,
    int64_t features,
    bool backward,
    const void* owner,
    int index) {
  const int64_t count = (S + bf16::kPanelWidth - 1) / bf16::kPanelWidth;
  at::Tensor out = layout_buffer(
      owner,
      index,
      {backward ? bf16::backward_panels_numel(S)
                : bf16::forward_panels_numel(S, features)},
      weights.options());
  const BFloat16* w = weights.const_data_ptr<BFloat16>();
  BFloat16* o = out.mutable_data_ptr<BFloat16>();
  const int64_t row = weights.stride(0);
  const int64_t col = weights.stride(1);
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    if (backward) {
      bf16::pack_backward(w, row, col, S, o, begin, end);
    } else {
      bf16::pack_forward(w, row, col, S, features, o, begin, end);
    }
  });
  return out;
}

int64_t grain(int64_t block_rows, int64_t K) {
  return std::max<int64_t>(
      1, kTaskMacs / (block_rows * 3 * bf16::kPanelWidth * K));
}

// The forward's steps of each direction (inputs, buffers and panels in
// pack_forward's layout, one each), one parallel region a step for all:
// with `in_steps`, each step adds x_t W_x^T itself from buffers.input; else
// the projection is in buffers.projection (float32) or buffers.gates.
void forward_steps(
    const Sizes& sizes,
    c10::ArrayRef<ForwardInputs> ins,
    c10::ArrayRef<ForwardBuffers> bufs,
    c10::ArrayRef<at::Tensor> w,
    bool in_steps) {
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t F = sizes.input_features;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  const auto count = static_cast<int64_t>(ins.size());
  // The plan ran only where the kernels exist.
  const bf16::Kernels& k = *bf16::kernels();
  const bool save = bufs[0].cells.defined();
  // Each direction's operands, dense; its cell in float32 for the whole
  // block, from a fresh copy of c0.
  struct Loop {
    at::Tensor bias;
    at::Tensor h0;
    at::Tensor cell;
    const BFloat16* x;
    BFloat16* gates;
    const float* projection;
    BFloat16* output;
    BFloat16* cells;
  };
  c10::SmallVector<Loop, 2> loops;
  for (int64_t d = 0; d < count; ++d) {
    const ForwardBuffers& b = bufs[d];
    loops.push_back(
        {ins[d].bias.contiguous(),
         ins[d].h0.contiguous(),
         ins[d].c0.to(at::kFloat).contiguous(),
         in_steps ? b.input.const_data_ptr<BFloat16>() : nullptr,
         b.gates.mutable_data_ptr<BFloat16>(),
         b.projection.defined() ? b.projection.const_data_ptr<float>()
                                : nullptr,
         b.output.mutable_data_ptr<BFloat16>(),
         save ? b.cells.mutable_data_ptr<BFloat16>() : nullptr});
  }
  const int64_t row_blocks = (B + bf16::kBlockRows - 1) / bf16::kBlockRows;
  const int64_t tasks =
      (S + bf16::kPanelWidth - 1) / bf16::kPanelWidth * row_blocks;
  const int64_t task_grain = grain(bf16::kBlockRows, S + (in_steps ? F : 0));
  c10::SmallVector<bf16::StepArgs, 2> args(count);
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t d = 0; d < count; ++d) {
      const Loop& l = loops[d];
      bf16::StepArgs& a = args[d];
      a = {};
      a.h = t == 0 ? l.h0.const_data_ptr<BFloat16>() : l.output + (t - 1) * BS;
      a.w = w[d].const_data_ptr<BFloat16>();
      if (in_steps) {
        a.x = l.x + t * B * F;
        a.features = F;
      } else {
        a.z = l.gates + t * B * 3 * S;
        a.z_f32 =
            l.projection != nullptr ? l.projection + t * B * 3 * S : nullptr;
      }
      a.bias = l.bias.const_data_ptr<BFloat16>();
      a.cell = l.cell.mutable_data_ptr<float>();
      a.new_h = l.output + t * BS;
      a.new_cell = save ? l.cells + t * BS : nullptr;
      // [i | o | g] over the step's projection, element for element.
      a.activations = save ? l.gates + t * B * 3 * S : nullptr;
      a.batch = B;
      a.state = S;
    }
    parallel_directions(
        count, tasks, task_grain, [&](int64_t d, int64_t begin, int64_t end) {
          k.step(args[d], begin, end);
        });
  }
  for (int64_t d = 0; d < count; ++d) {
    const Loop& l = loops[d];
    BFloat16* h_n = bufs[d].h_n.mutable_data_ptr<BFloat16>();
    std::copy(l.output + (steps - 1) * BS, l.output + steps * BS, h_n);
    // Rounded as the kernel rounds the saved cells: c_n equals
    // cells[T - 1].
    bufs[d].c_n.copy_(l.cell.view(bufs[d].c_n.sizes()));
  }
}

} // namespace

bool runs(const Block& block, std::string* why_not) {
  if (block.dtype != at::kBFloat16) {
    *why_not = "bfloat16 only (VDPBF16PS takes pairs of bfloat16)";
    return false;
  }
  if (bf16::kernels() == nullptr) {
    *why_not =
        "needs AVX-512 BF16 (VDPBF16PS), which this processor or build "
        "lacks or ATEN_CPU_CAPABILITY turns off";
    return false;
  }
  return true;
}

void forward_directions(
    const Plan& plan,
    const Sizes& sizes,
    c10::ArrayRef<ForwardInputs> inputs,
    c10::ArrayRef<ForwardBuffers> buffers) {
  const bool in_steps = plan.input_in_steps;
  const int64_t features = in_steps ? sizes.input_features : 0;
  c10::SmallVector<at::Tensor, 2> w;
  for (size_t d = 0; d < inputs.size(); ++d) {
    const ForwardInputs& in = inputs[d];
    // The plan's path owns the layout: dpbf16's and dpbf16_input's differ.
    w.push_back(kept(
        in.packed != nullptr ? in.packed->layout(plan.path, 0) : nullptr, [&] {
          return panels(
              in.weights,
              sizes.state_size,
              features,
              false,
              plan.path,
              static_cast<int>(d));
        }));
  }
  forward_steps(sizes, inputs, buffers, w, in_steps);
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
  // The plan ran only where the kernels exist.
  const bf16::Kernels& k = *bf16::kernels();
  // Each direction's operands; dc_t in float32, in turns: step t reads
  // dc_t and writes dc_{t-1}.
  struct Loop {
    at::Tensor w;
    std::array<at::Tensor, 2> dc;
    std::optional<at::Tensor> grad_h_n_dense;
    BFloat16* dz;
    const BFloat16* act;
    const BFloat16* cell;
  };
  c10::SmallVector<Loop, 2> loops;
  for (int64_t d = 0; d < count; ++d) {
    const BackwardInputs& in = inputs[d];
    const auto options = in.gates.options().dtype(at::kFloat);
    Loop l;
    l.w = kept(
        in.packed != nullptr ? in.packed->layout(&kBackwardLayout, 0) : nullptr,
        [&] {
          return panels(
              in.weights, S, 0, true, &kBackwardLayout, static_cast<int>(d));
        });
    l.dc = {at::empty({B, S}, options), at::empty({B, S}, options)};
    if (in.grad_output && in.grad_h_n) {
      l.grad_h_n_dense = in.grad_h_n->contiguous();
    }
    l.dz = d_gates[d].mutable_data_ptr<BFloat16>();
    l.act = in.gates.const_data_ptr<BFloat16>();
    l.cell = in.cells.const_data_ptr<BFloat16>();
    loops.push_back(std::move(l));
  }
  const int64_t row_blocks =
      (B + bf16::kBackwardBlockRows - 1) / bf16::kBackwardBlockRows;
  const int64_t tasks =
      (S + bf16::kPanelWidth - 1) / bf16::kPanelWidth * row_blocks;
  const int64_t task_grain = grain(bf16::kBackwardBlockRows, S);
  c10::SmallVector<bf16::BackwardStepArgs, 2> args(count);
  for (int64_t t = steps - 1; t >= 0; --t) {
    for (int64_t d = 0; d < count; ++d) {
      const BackwardInputs& in = inputs[d];
      const Loop& l = loops[d];
      bf16::BackwardStepArgs& a = args[d];
      a = {};
      a.w = l.w.const_data_ptr<BFloat16>();
      a.grad_h = strided_step<BFloat16>(in.grad_output, t);
      if (t == steps - 1) {
        a.dz_next = nullptr;
        if (!in.grad_output) {
          a.grad_h = strided<BFloat16>(in.grad_h_n);
        } else if (l.grad_h_n_dense) {
          a.grad_h_add = l.grad_h_n_dense->const_data_ptr<BFloat16>();
        }
        a.grad_cell = strided<BFloat16>(in.grad_c_n);
      } else {
        a.dz_next = l.dz + (t + 1) * B * 3 * S;
        a.grad_cell_f = l.dc[(t + 1) % 2].const_data_ptr<float>();
      }
      a.new_cell = l.cell + t * BS;
      a.activations = l.act + t * B * 3 * S;
      a.d_gates = l.dz + t * B * 3 * S;
      a.d_old_cell = l.dc[t % 2].mutable_data_ptr<float>();
      a.batch = B;
      a.state = S;
    }
    parallel_directions(
        count, tasks, task_grain, [&](int64_t d, int64_t begin, int64_t end) {
          k.backward_step(args[d], begin, end);
        });
  }
  std::vector<StateGrads> grads;
  for (const Loop& l : loops) {
    grads.push_back({l.dc[0].to(at::kBFloat16), std::nullopt});
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

} // namespace dpbf16

namespace {

std::optional<Plan> plan(const Block& block, std::string* why_not) {
  if (!dpbf16::runs(block, why_not)) {
    return std::nullopt;
  }
  // The projection's rounding to bfloat16 was the largest of the path's
  // errors (docs/performance.md, "bfloat16 on AVX-512 BF16").
  Plan plan;
  plan.float32_projection = true;
  return plan;
}

// Fitted by scripts/fit_cpu_paths.py --dtype bfloat16 (cpu/model.h).
constexpr Costs kCosts{
    {5232.0, 2.03, 14052.7, 22968.2},
    {4852.1, 3.75, 22176.2, 21486.9},
    dpbf16::kBackwardCost};

double estimate(const Block& block) {
  return estimate_us(kCosts, block);
}

const Path kDpBf16{
    "dpbf16",
    c10::DeviceType::CPU,
    40,
    &plan,
    nullptr,
    &estimate,
    &dpbf16::forward,
    &dpbf16::backward,
    &dpbf16::forward_directions,
    &dpbf16::backward_directions};

} // namespace

LLTM_REGISTER_SEQUENCE_PATH(kDpBf16);

} // namespace lltm::sequence::cpu_paths
