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
// after W_h's in the forward's), a panel per task.
at::Tensor panels(
    const at::Tensor& weights,
    int64_t S,
    int64_t features,
    bool backward,
    const void* owner) {
  const int64_t count = (S + bf16::kPanelWidth - 1) / bf16::kPanelWidth;
  at::Tensor out = layout_buffer(
      owner,
      0,
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

// The forward's steps over panels `w` (pack_forward's layout): with `input`
// ([T, B, F], dense) each step adds x_t W_x^T itself; without, the
// projection is in buffers.projection (float32) or buffers.gates.
void forward_steps(
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers,
    const at::Tensor& w,
    const at::Tensor& input) {
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t F = sizes.input_features;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  // The plan ran only where the kernels exist.
  const bf16::Kernels& k = *bf16::kernels();
  const bool in_steps = input.defined();
  const BFloat16* x = in_steps ? input.const_data_ptr<BFloat16>() : nullptr;
  const at::Tensor bias_c = in.bias.contiguous();
  const at::Tensor h0_c = in.h0.contiguous();
  // The cell in float32 for the whole block: a fresh copy of c0.
  at::Tensor cell = in.c0.to(at::kFloat).contiguous();
  const bool save = buffers.cells.defined();
  BFloat16* gates = buffers.gates.mutable_data_ptr<BFloat16>();
  const float* projection = buffers.projection.defined()
      ? buffers.projection.const_data_ptr<float>()
      : nullptr;
  BFloat16* output = buffers.output.mutable_data_ptr<BFloat16>();
  BFloat16* cells = save ? buffers.cells.mutable_data_ptr<BFloat16>() : nullptr;
  const int64_t row_blocks = (B + bf16::kBlockRows - 1) / bf16::kBlockRows;
  const int64_t tasks =
      (S + bf16::kPanelWidth - 1) / bf16::kPanelWidth * row_blocks;
  const int64_t task_grain = grain(bf16::kBlockRows, S + (in_steps ? F : 0));
  for (int64_t t = 0; t < steps; ++t) {
    bf16::StepArgs args{};
    args.h = t == 0 ? h0_c.const_data_ptr<BFloat16>() : output + (t - 1) * BS;
    args.w = w.const_data_ptr<BFloat16>();
    if (in_steps) {
      args.x = x + t * B * F;
      args.features = F;
    } else {
      args.z = gates + t * B * 3 * S;
      args.z_f32 = projection != nullptr ? projection + t * B * 3 * S : nullptr;
    }
    args.bias = bias_c.const_data_ptr<BFloat16>();
    args.cell = cell.mutable_data_ptr<float>();
    args.new_h = output + t * BS;
    args.new_cell = save ? cells + t * BS : nullptr;
    // [i | o | g] over the step's projection, element for element.
    args.activations = save ? gates + t * B * 3 * S : nullptr;
    args.batch = B;
    args.state = S;
    at::parallel_for(0, tasks, task_grain, [&](int64_t begin, int64_t end) {
      k.step(args, begin, end);
    });
  }
  BFloat16* h_n = buffers.h_n.mutable_data_ptr<BFloat16>();
  std::copy(output + (steps - 1) * BS, output + steps * BS, h_n);
  // Rounded as the kernel rounds the saved cells: c_n equals cells[T - 1].
  buffers.c_n.copy_(cell.view(buffers.c_n.sizes()));
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

void forward(
    const Plan& plan,
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers) {
  const at::Tensor input = plan.input_in_steps ? buffers.input : at::Tensor();
  const int64_t features = input.defined() ? sizes.input_features : 0;
  // The plan's path owns the layout: dpbf16's and dpbf16_input's differ.
  const at::Tensor w = kept(
      in.packed != nullptr ? in.packed->layout(plan.path, 0) : nullptr, [&] {
        return panels(in.weights, sizes.state_size, features, false, plan.path);
      });
  forward_steps(sizes, in, buffers, w, input);
}

StateGrads backward(
    const Plan& /*plan*/,
    const Sizes& sizes,
    const BackwardInputs& in,
    const OutputMask& /*output_mask*/,
    at::Tensor& d_gates) {
  const std::optional<at::Tensor>& grad_output = in.grad_output;
  const std::optional<at::Tensor>& grad_h_n = in.grad_h_n;
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  // The plan ran only where the kernels exist.
  const bf16::Kernels& k = *bf16::kernels();
  const at::Tensor w = kept(
      in.packed != nullptr ? in.packed->layout(&kBackwardLayout, 0) : nullptr,
      [&] { return panels(in.weights, S, 0, true, &kBackwardLayout); });
  const auto options = in.gates.options().dtype(at::kFloat);
  // dc_t in float32, in turns: step t reads dc_t and writes dc_{t-1}.
  const std::array<at::Tensor, 2> dc{
      at::empty({B, S}, options), at::empty({B, S}, options)};
  std::optional<at::Tensor> grad_h_n_dense;
  if (grad_output && grad_h_n) {
    grad_h_n_dense = grad_h_n->contiguous();
  }
  BFloat16* dz = d_gates.mutable_data_ptr<BFloat16>();
  const BFloat16* act = in.gates.const_data_ptr<BFloat16>();
  const BFloat16* cell = in.cells.const_data_ptr<BFloat16>();
  const int64_t row_blocks =
      (B + bf16::kBackwardBlockRows - 1) / bf16::kBackwardBlockRows;
  const int64_t tasks =
      (S + bf16::kPanelWidth - 1) / bf16::kPanelWidth * row_blocks;
  const int64_t task_grain = grain(bf16::kBackwardBlockRows, S);
  for (int64_t t = steps - 1; t >= 0; --t) {
    bf16::BackwardStepArgs args{};
    args.w = w.const_data_ptr<BFloat16>();
    args.grad_h = strided_step<BFloat16>(grad_output, t);
    if (t == steps - 1) {
      args.dz_next = nullptr;
      if (!grad_output) {
        args.grad_h = strided<BFloat16>(grad_h_n);
      } else if (grad_h_n_dense) {
        args.grad_h_add = grad_h_n_dense->const_data_ptr<BFloat16>();
      }
      args.grad_cell = strided<BFloat16>(in.grad_c_n);
    } else {
      args.dz_next = dz + (t + 1) * B * 3 * S;
      args.grad_cell_f = dc[(t + 1) % 2].const_data_ptr<float>();
    }
    args.new_cell = cell + t * BS;
    args.activations = act + t * B * 3 * S;
    args.d_gates = dz + t * B * 3 * S;
    args.d_old_cell = dc[t % 2].mutable_data_ptr<float>();
    args.batch = B;
    args.state = S;
    at::parallel_for(0, tasks, task_grain, [&](int64_t begin, int64_t end) {
      k.backward_step(args, begin, end);
    });
  }
  return {dc[0].to(at::kBFloat16), std::nullopt};
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
    &dpbf16::backward};

} // namespace

LLTM_REGISTER_SEQUENCE_PATH(kDpBf16);

} // namespace lltm::sequence::cpu_paths
