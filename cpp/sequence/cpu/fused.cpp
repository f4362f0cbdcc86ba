// The CPU's fused path: per step one parallel region whose tasks each run a
// block of rows of a panel of W_h^T's columns and the cell on them
// (cpp/cpu_kernels/kernels.cpp, FusedStepArgs): no GEMM library and no
// pointwise pass, and each thread runs the same panels at every step, from
// its own cache. float32 alone. Its forward and reverse loop serve
// fused_input too (fused.h).
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
    int64_t width) {
  const int64_t panels = (S + width - 1) / width;
  at::Tensor out = layout_buffer(
      &kBackwardLayout, 0, {panels, 3 * S, width}, weights.options());
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
// state's end, in the layout buffer of `owner` (layout_buffer).
at::Tensor forward_panels(
    const at::Tensor& weights,
    int64_t S,
    int64_t K,
    int64_t width,
    const void* owner) {
  const int64_t panels = (S + width - 1) / width;
  at::Tensor out =
      layout_buffer(owner, 0, {panels, K, 3, width}, weights.options());
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

// The forward's steps over `panels` (forward_panels' layout): with `input`
// ([T, B, F], dense) each step adds x_t W_x^T itself (K = S + F); without,
// buffers.gates holds the projection (K = S).
void forward_steps(
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers,
    const at::Tensor& panels,
    const at::Tensor& input) {
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t F = sizes.input_features;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  const int64_t K = S + (input.defined() ? F : 0);
  const auto& k = cpu::best_kernels<float>();
  const at::Tensor bias_c = in.bias.contiguous();
  const at::Tensor h0_c = in.h0.contiguous();
  const at::Tensor c0_c = in.c0.contiguous();
  const bool save = buffers.cells.defined();
  const bool in_steps = input.defined();
  const float* x = in_steps ? input.const_data_ptr<float>() : nullptr;
  float* gates = buffers.gates.mutable_data_ptr<float>();
  float* output = buffers.output.mutable_data_ptr<float>();
  float* cells = save ? buffers.cells.mutable_data_ptr<float>() : nullptr;
  float* c_n = buffers.c_n.mutable_data_ptr<float>();
  const int64_t row_blocks = (B + k.block_rows - 1) / k.block_rows;
  const int64_t tasks = (S + k.panel_width - 1) / k.panel_width * row_blocks;
  const int64_t grain =
      std::max<int64_t>(1, kTaskMacs / (k.block_rows * 3 * k.panel_width * K));
  for (int64_t t = 0; t < steps; ++t) {
    cpu::FusedStepArgs<float> args{};
    args.h = t == 0 ? h0_c.const_data_ptr<float>() : output + (t - 1) * BS;
    args.w = panels.const_data_ptr<float>();
    if (in_steps) {
      args.x = x + t * B * F;
      args.features = F;
    } else {
      args.z = gates + t * B * 3 * S;
    }
    args.bias = bias_c.const_data_ptr<float>();
    // Without saving, c_t is written over c_{t-1} in c_n.
    args.old_cell = t == 0 ? c0_c.const_data_ptr<float>()
                           : (save ? cells + (t - 1) * BS : c_n);
    args.new_h = output + t * BS;
    args.new_cell = save ? cells + t * BS : c_n;
    // [i | o | g] over the step's projection, element for element.
    args.activations = save ? gates + t * B * 3 * S : nullptr;
    args.batch = B;
    args.state = S;
    at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
      k.fused_step(args, begin, end);
    });
  }
  float* h_n = buffers.h_n.mutable_data_ptr<float>();
  std::copy(output + (steps - 1) * BS, output + steps * BS, h_n);
  if (save) {
    std::copy(cells + (steps - 1) * BS, cells + steps * BS, c_n);
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

void forward(
    const Plan& plan,
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers) {
  const int64_t S = sizes.state_size;
  const at::Tensor input = plan.input_in_steps ? buffers.input : at::Tensor();
  const int64_t K = S + (input.defined() ? sizes.input_features : 0);
  // The plan's path owns the layout: fused's and fused_input's differ.
  const at::Tensor panels = kept(
      in.packed != nullptr ? in.packed->layout(plan.path, 0) : nullptr, [&] {
        return forward_panels(
            in.weights,
            S,
            K,
            cpu::best_kernels<float>().panel_width,
            plan.path);
      });
  forward_steps(sizes, in, buffers, panels, input);
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
  const auto& k = cpu::best_kernels<float>();
  const at::Tensor panels = kept(
      in.packed != nullptr ? in.packed->layout(&kBackwardLayout, 0) : nullptr,
      [&] { return backward_panels(in.weights, S, k.panel_width); });
  const auto options = in.gates.options();
  // dc_t, in turns: step t reads dc_t and writes dc_{t-1}.
  const std::array<at::Tensor, 2> dc{
      at::empty({B, S}, options), at::empty({B, S}, options)};
  std::optional<at::Tensor> grad_h_n_dense;
  if (grad_output && grad_h_n) {
    grad_h_n_dense = grad_h_n->contiguous();
  }
  float* dz = d_gates.mutable_data_ptr<float>();
  const float* act = in.gates.const_data_ptr<float>();
  const float* cell = in.cells.const_data_ptr<float>();
  const int64_t row_blocks =
      (B + k.backward_block_rows - 1) / k.backward_block_rows;
  const int64_t tasks = (S + k.panel_width - 1) / k.panel_width * row_blocks;
  const int64_t grain = std::max<int64_t>(
      1, kTaskMacs / (k.backward_block_rows * 3 * k.panel_width * S));
  for (int64_t t = steps - 1; t >= 0; --t) {
    cpu::FusedBackwardStepArgs<float> args{};
    args.w = panels.const_data_ptr<float>();
    args.grad_h = strided_step<float>(grad_output, t);
    if (t == steps - 1) {
      args.dz_next = nullptr;
      if (!grad_output) {
        args.grad_h = strided<float>(grad_h_n);
      } else if (grad_h_n_dense) {
        args.grad_h_add = grad_h_n_dense->const_data_ptr<float>();
      }
      args.grad_cell = strided<float>(in.grad_c_n);
    } else {
      args.dz_next = dz + (t + 1) * B * 3 * S;
      args.grad_cell = {dc[(t + 1) % 2].const_data_ptr<float>(), S, 1};
    }
    args.new_cell = cell + t * BS;
    args.activations = act + t * B * 3 * S;
    args.d_gates = dz + t * B * 3 * S;
    args.d_old_cell = dc[t % 2].mutable_data_ptr<float>();
    args.batch = B;
    args.state = S;
    at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
      k.fused_backward_step(args, begin, end);
    });
  }
  return {dc[0], std::nullopt};
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
    &fused::backward};

} // namespace

LLTM_REGISTER_SEQUENCE_PATH(kFused);

} // namespace lltm::sequence::cpu_paths
