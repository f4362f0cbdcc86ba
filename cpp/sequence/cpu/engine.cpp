// The sequence ops on the CPU: per step one GEMM (BLAS) and the cell's
// vectorized pointwise kernel (lltm_cpu_kernel.cpp states its math),
// split over threads by rows; sequence.cpp does the rest (sequence.h states
// the math).
#include "cpp/cell/backend.h"
#include "cpp/cpu_kernels/kernels.h"
#include "cpp/cpu_kernels/tensors.h"
#include "cpp/sequence/choice.h"
#include "cpp/sequence/sequence.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <torch/library.h>

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace lltm::sequence {
namespace {

using cpu::strided;

// Step t of a [T, B, S] operand, read through its strides.
template <typename T>
cpu::Strided<T> strided_step(const std::optional<at::Tensor>& t, int64_t step) {
  if (!t) {
    return {nullptr, 0, 0};
  }
  return {
      t->const_data_ptr<T>() + step * t->stride(0), t->stride(1), t->stride(2)};
}

// Step t of a [T, ...] buffer as one view, moved from step to step: a new
// view per step would cost a dispatcher call and an allocation. The view is
// the loop's own and never escapes it.
class StepView {
 public:
  explicit StepView(const at::Tensor& buffer)
      : view_(buffer.select(0, 0)),
        first_(buffer.storage_offset()),
        stride_(buffer.stride(0)) {}

  at::Tensor& at(int64_t step) {
    view_.unsafeGetTensorImpl()->set_storage_offset(first_ + step * stride_);
    return view_;
  }

 private:
  at::Tensor view_;
  int64_t first_;
  int64_t stride_;
};

// --- the recurrent GEMMs --------------------------------------------------
//
// A step's GEMM, h_{t-1} W_h^T in the forward and dZ_t W_h in the backward,
// runs one of two ways, and each is a path of its own (cpu_loops chooses):
//   blas    ATen's CPU GEMM (MKL or OpenBLAS) past the dispatcher, in place
//           into the step's buffer
//   onednn  oneDNN's matmul through ATen's mkldnn ops, with W_h reordered
//           once per call into oneDNN's blocked layout: a call costs the
//           dispatcher and an allocation, and oneDNN's kernels run a GEMM of
//           a few rows faster than MKL does on some processors
//           (docs/performance.md has both on AMD).

// Where the loops keep their layouts of W_h in PackedWeights::layouts.
enum Layout : size_t {
  kOneDnnForward,
  kOneDnnBackward,
  kPanels,
  kBackwardPanels
};

struct BlasGemm {
  static constexpr const char* kName = "steps";

  BlasGemm(
      const at::Tensor& weights,
      const Sizes& sizes,
      PackedWeights* packed,
      bool backward)
      : w_(backward ? packed_w_h(weights, sizes.state_size, packed)
                    : packed_w_h_t(weights, sizes.state_size, packed)) {}

  // Z_t = P_t + h W_h^T, over P_t in z.
  at::Tensor forward(at::Tensor& z, const at::Tensor& h) const {
    at::cpu::addmm_(z, h, w_);
    return z;
  }

  // dZ_t W_h, into `out`.
  at::Tensor backward(const at::Tensor& dz, at::Tensor& out) const {
    at::cpu::mm_out(out, dz, w_);
    return out;
  }

 private:
  at::Tensor w_; // W_h^T [S, 3S] forward, W_h [3S, S] backward
};

// ATen's mkldnn ops, found through the dispatcher: torch builds without
// oneDNN have none.
class OneDnnOps {
 public:
  using Reorder = at::Tensor(const at::Tensor&, std::optional<int64_t>);
  using Linear = at::Tensor(
      const at::Tensor&,
      const at::Tensor&,
      const std::optional<at::Tensor>&,
      c10::string_view,
      c10::List<std::optional<c10::Scalar>>,
      std::optional<c10::string_view>);
  using LinearAdd = at::Tensor(
      const at::Tensor&,
      const at::Tensor&,
      const at::Tensor&,
      const std::optional<at::Tensor>&,
      c10::string_view);

  // The ops where torch has them and oneDNN is enabled
  // (torch.backends.mkldnn.enabled), else nullptr.
  static const OneDnnOps* get() {
    static const std::optional<OneDnnOps> ops = find();
    if (!ops || !at::globalContext().userEnabledMkldnn()) {
      return nullptr;
    }
    return &*ops;
  }

  c10::TypedOperatorHandle<Reorder> reorder;
  c10::TypedOperatorHandle<Linear> linear;
  c10::TypedOperatorHandle<LinearAdd> linear_add;

 private:
  static std::optional<OneDnnOps> find() {
    auto& dispatcher = c10::Dispatcher::singleton();
    const auto reorder =
        dispatcher.findSchema({"mkldnn::_reorder_linear_weight", ""});
    const auto linear =
        dispatcher.findSchema({"mkldnn::_linear_pointwise", ""});
    const auto linear_add =
        dispatcher.findSchema({"mkldnn::_linear_pointwise", "binary"});
    if (!reorder || !linear || !linear_add ||
        !reorder->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
      return std::nullopt;
    }
    return OneDnnOps{
        reorder->typed<Reorder>(),
        linear->typed<Linear>(),
        linear_add->typed<LinearAdd>()};
  }
};

struct OneDnnGemm {
  static constexpr const char* kName = "onednn";

  // float32 alone: oneDNN's 16-bit matmuls need processor features that
  // vary (float16: AVX-512 FP16 or AVX-NE-CONVERT), and it has no float64.
  static bool runs(const Sizes& sizes, at::ScalarType dtype) {
    return dtype == at::kFloat && sizes.batch > 0 && sizes.state_size > 0 &&
        OneDnnOps::get() != nullptr;
  }

  OneDnnGemm(
      const at::Tensor& weights,
      const Sizes& sizes,
      PackedWeights* packed,
      bool backward)
      : ops_(*OneDnnOps::get()),
        w_(kept(
            packed == nullptr
                ? nullptr
                : &packed->layouts[backward ? kOneDnnBackward : kOneDnnForward],
            [&] {
              // A linear layer's weight is [out, in]: W_h ([3S, S])
              // forward, W_h^T ([S, 3S]) backward.
              const int64_t S = sizes.state_size;
              return ops_.reorder.call(
                  backward ? packed_w_h_t(weights, S, packed)
                           : packed_w_h(weights, S, packed),
                  sizes.batch);
            })) {}

  at::Tensor forward(at::Tensor& z, const at::Tensor& h) const {
    return ops_.linear_add.call(h, z, w_, std::nullopt, "add");
  }

  at::Tensor backward(const at::Tensor& dz, at::Tensor& /*out*/) const {
    return ops_.linear.call(
        dz,
        w_,
        std::nullopt,
        "none",
        c10::List<std::optional<c10::Scalar>>(),
        std::nullopt);
  }

 private:
  const OneDnnOps& ops_;
  at::Tensor w_;
};

template <typename T, typename Gemm>
void forward_loop(
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers) {
  const at::Tensor& h0 = in.h0;
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  const Gemm gemm(in.weights, sizes, in.packed, /*backward=*/false);
  const at::Tensor bias_c = in.bias.contiguous();
  const at::Tensor c0_c = in.c0.contiguous();
  const bool save = buffers.cells.defined();
  T* gates = buffers.gates.mutable_data_ptr<T>();
  T* output = buffers.output.mutable_data_ptr<T>();
  T* cells = save ? buffers.cells.mutable_data_ptr<T>() : nullptr;
  T* c_n = buffers.c_n.mutable_data_ptr<T>();
  const auto& k = cpu::best_kernels<T>();
  const int64_t grain = cpu::rows_per_task(S);
  StepView z_view(buffers.gates);
  StepView h_view(buffers.output);
  for (int64_t t = 0; t < steps; ++t) {
    T* z = gates + t * B * 3 * S;
    const at::Tensor pre =
        gemm.forward(z_view.at(t), t == 0 ? h0 : h_view.at(t - 1));
    cpu::ForwardArgs<T> args{};
    args.z = pre.const_data_ptr<T>();
    args.ld_z = 3 * S;
    args.bias = bias_c.const_data_ptr<T>();
    // Without saving, c_t is written over c_{t-1} in c_n: the kernel reads
    // each element of old_cell before it writes it in new_cell.
    args.old_cell =
        t == 0 ? c0_c.const_data_ptr<T>() : (save ? cells + (t - 1) * BS : c_n);
    args.new_h = output + t * BS;
    args.new_cell = save ? cells + t * BS : c_n;
    if (save) {
      // [i | o | g] over the step's rows of gates (where z may be).
      args.input_gate = z;
      args.output_gate = z + S;
      args.candidate_cell = z + 2 * S;
      args.ld_act = 3 * S;
    }
    args.state = S;
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      k.forward(args, begin, end);
    });
  }
  T* h_n = buffers.h_n.mutable_data_ptr<T>();
  std::copy(output + (steps - 1) * BS, output + steps * BS, h_n);
  if (save) {
    std::copy(cells + (steps - 1) * BS, cells + steps * BS, c_n);
  }
}

template <typename T, typename Gemm>
at::Tensor backward_loop(
    const Sizes& sizes,
    const BackwardInputs& in,
    at::Tensor& d_gates) {
  const std::optional<at::Tensor>& grad_output = in.grad_output;
  const std::optional<at::Tensor>& grad_h_n = in.grad_h_n;
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  const Gemm gemm(in.weights, sizes, in.packed, /*backward=*/true);
  const auto options = in.gates.options();
  // dc_t, in turns: step t reads dc_t and writes dc_{t-1}; and the
  // recurrent term dZ_{t+1} W_h.
  const std::array<at::Tensor, 2> dc{
      at::empty({B, S}, options), at::empty({B, S}, options)};
  at::Tensor recurrent_buffer = at::empty({B, S}, options);
  at::Tensor recurrent;
  // grad_h_n joins grad_output[T - 1] as the dense second addend.
  std::optional<at::Tensor> grad_h_n_dense;
  if (grad_output && grad_h_n) {
    grad_h_n_dense = grad_h_n->contiguous();
  }
  const std::array<T*, 2> dc_data{
      dc[0].mutable_data_ptr<T>(), dc[1].mutable_data_ptr<T>()};
  T* dz = d_gates.mutable_data_ptr<T>();
  const T* act = in.gates.const_data_ptr<T>();
  const T* cell = in.cells.const_data_ptr<T>();
  const auto& k = cpu::best_kernels<T>();
  const int64_t grain = cpu::rows_per_task(S);
  StepView dz_view(d_gates);
  for (int64_t t = steps - 1; t >= 0; --t) {
    cpu::BackwardArgs<T> args{};
    args.grad_h = strided_step<T>(grad_output, t);
    if (t == steps - 1) {
      if (!grad_output) {
        args.grad_h = strided<T>(grad_h_n);
      } else if (grad_h_n_dense) {
        args.grad_h_add = grad_h_n_dense->const_data_ptr<T>();
        args.ld_grad_h_add = S;
      }
      args.grad_cell = strided<T>(in.grad_c_n);
    } else {
      args.grad_h_add = recurrent.const_data_ptr<T>();
      args.ld_grad_h_add = S;
      args.grad_cell = {dc_data[(t + 1) % 2], S, 1};
    }
    args.new_cell = cell + t * BS;
    args.input_gate = act + t * B * 3 * S;
    args.output_gate = args.input_gate + S;
    args.candidate_cell = args.input_gate + 2 * S;
    args.ld_act = 3 * S;
    args.d_gates = dz + t * B * 3 * S;
    args.d_old_cell = dc_data[t % 2];
    args.d_bias_sum = nullptr; // summed over all steps at the end
    args.state = S;
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      k.backward(args, begin, end);
    });
    if (t > 0) {
      recurrent = gemm.backward(dz_view.at(t), recurrent_buffer);
    }
  }
  return dc[0];
}

// --- the fused forward ------------------------------------------------------
//
// Per step one parallel region whose tasks each run a block of rows of a
// panel of W_h^T's columns and the cell on them (lltm_cpu_kernel.cpp,
// FusedStepArgs): no GEMM library and no pointwise pass, and each thread
// runs the same panels at every step, from its own cache. float alone.

bool fused_runs(const Sizes& sizes, at::ScalarType dtype) {
  return dtype == at::kFloat && sizes.batch > 0 && sizes.state_size > 0 &&
      cpu::best_kernels<float>().fused_step != nullptr;
}

// W_h^T in panels of `width` state units: [panels, S, 3, width], zeros past
// the state's end; one pass, a panel per task.
at::Tensor fused_panels(const at::Tensor& weights, int64_t S, int64_t width) {
  const int64_t panels = (S + width - 1) / width;
  at::Tensor out = at::empty({panels, S, 3, width}, weights.options());
  const float* w = weights.const_data_ptr<float>();
  const int64_t row = weights.stride(0);
  const int64_t col = weights.stride(1);
  float* o = out.mutable_data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t k = 0; k < S; ++k) {
        for (int64_t g = 0; g < 3; ++g) {
          float* dst = o + ((p * S + k) * 3 + g) * width;
          for (int64_t j = 0; j < width; ++j) {
            const int64_t unit = p * width + j;
            dst[j] = unit < S ? w[(g * S + unit) * row + k * col] : 0.0f;
          }
        }
      }
    }
  });
  return out;
}

// A task (a block of rows of one panel) of fewer multiply-adds than this is
// not worth a thread of its own.
constexpr int64_t kTaskMacs = int64_t(1) << 15;

void fused_forward(
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& buffers) {
  const int64_t steps = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const int64_t BS = B * S;
  const auto& k = cpu::best_kernels<float>();
  const at::Tensor panels = kept(
      in.packed != nullptr ? &in.packed->layouts[kPanels] : nullptr,
      [&] { return fused_panels(in.weights, S, k.panel_width); });
  const at::Tensor bias_c = in.bias.contiguous();
  const at::Tensor h0_c = in.h0.contiguous();
  const at::Tensor c0_c = in.c0.contiguous();
  const bool save = buffers.cells.defined();
  float* gates = buffers.gates.mutable_data_ptr<float>();
  float* output = buffers.output.mutable_data_ptr<float>();
  float* cells = save ? buffers.cells.mutable_data_ptr<float>() : nullptr;
  float* c_n = buffers.c_n.mutable_data_ptr<float>();
  const int64_t row_blocks = (B + k.block_rows - 1) / k.block_rows;
  const int64_t tasks = (S + k.panel_width - 1) / k.panel_width * row_blocks;
  const int64_t grain =
      std::max<int64_t>(1, kTaskMacs / (k.block_rows * 3 * k.panel_width * S));
  for (int64_t t = 0; t < steps; ++t) {
    cpu::FusedStepArgs<float> args{};
    args.h = t == 0 ? h0_c.const_data_ptr<float>() : output + (t - 1) * BS;
    args.w = panels.const_data_ptr<float>();
    args.z = gates + t * B * 3 * S;
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

// W_h in panels of `width` state units: [panels, 3S, width], zeros past
// the state's end; one pass, a panel per task.
at::Tensor fused_backward_panels(
    const at::Tensor& weights,
    int64_t S,
    int64_t width) {
  const int64_t panels = (S + width - 1) / width;
  at::Tensor out = at::empty({panels, 3 * S, width}, weights.options());
  const float* w = weights.const_data_ptr<float>();
  const int64_t row = weights.stride(0);
  const int64_t col = weights.stride(1);
  float* o = out.mutable_data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t k = 0; k < 3 * S; ++k) {
        float* dst = o + (p * 3 * S + k) * width;
        for (int64_t j = 0; j < width; ++j) {
          const int64_t unit = p * width + j;
          dst[j] = unit < S ? w[k * row + unit * col] : 0.0f;
        }
      }
    }
  });
  return out;
}

// The reverse loop: per step one parallel region of tasks that each run the
// recurrent GEMM of a block of rows and a panel of units and the cell's
// backward on them (lltm_cpu_kernel.cpp, FusedBackwardStepArgs).
StateGrads fused_backward(
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
      in.packed != nullptr ? &in.packed->layouts[kBackwardPanels] : nullptr,
      [&] { return fused_backward_panels(in.weights, S, k.panel_width); });
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

// The step loops, with raw pointers for the pointwise kernels: at a small
// batch a step is a few microseconds of work, and each ATen op adds about
// as much.
template <typename Gemm>
void cpu_forward(
    const Sizes& sizes,
    const ForwardInputs& in,
    ForwardBuffers& b) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      in.weights.scalar_type(),
      "lltm_sequence_cpu",
      [&] { forward_loop<scalar_t, Gemm>(sizes, in, b); });
}

template <typename Gemm>
StateGrads cpu_backward(
    const Sizes& sizes,
    const BackwardInputs& in,
    const OutputMask& /*output_mask*/,
    at::Tensor& d_gates) {
  StateGrads state;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      in.weights.scalar_type(),
      "lltm_sequence_backward_cpu",
      [&] { state.d_c0 = backward_loop<scalar_t, Gemm>(sizes, in, d_gates); });
  return state;
}

const Engine& cpu_engine();

// Estimated microseconds of a block on each candidate, for LLTM_TUNING=0:
// what packing W_h costs a call, a cost per step and per multiply-add of
// the steps' GEMMs, and per multiply-add of the input's GEMMs, fitted by
// scripts/fit_cpu_paths.py to 40 random sizes (seed 1) on a 2-core AMD
// EPYC. There it picks the fastest path for 25 to 32 of 40 sizes, and at
// worst one 1.7x to 3.1x slower; measuring is the default for that reason
// (docs/performance.md, "The CPU's paths").
std::vector<double> cpu_model(
    const Sizes& sizes,
    c10::ArrayRef<const StepLoops*> candidates,
    bool backward,
    bool save) {
  struct Cost {
    const char* name;
    double per_s2; // per S^2 / 1e6, once a call
    double per_step;
    double per_gmac; // per 1e9 multiply-adds of the steps' GEMMs
    double per_io_gmac; // of the input's GEMMs
  };
  using Costs = std::array<Cost, 3>;
  static constexpr Costs kInference{
      Cost{"steps", 2078.0, 2.47, 22040.4, 15132.6},
      Cost{"onednn", 2079.4, 17.19, 5259.5, 16835.2},
      Cost{"fused", 2935.0, 1.85, 9523.6, 15649.2}};
  static constexpr Costs kForward{
      Cost{"steps", 2196.2, 2.79, 20620.9, 17126.1},
      Cost{"onednn", 1844.7, 17.23, 6139.1, 16459.7},
      Cost{"fused", 1763.5, 1.19, 2504.3, 19552.6}};
  static constexpr Costs kBackward{
      Cost{"steps", 2794.1, 4.84, 36970.0, 29335.2},
      Cost{"onednn", 4381.4, 13.89, 17782.9, 30611.9},
      Cost{"fused", 3035.6, 2.85, 16207.9, 31038.8}};
  const Costs& costs = backward ? kBackward : (save ? kForward : kInference);
  const auto [T, B, F, S] = sizes;
  const double steps = static_cast<double>(T);
  const double s2 = 1e-6 * static_cast<double>(S) * static_cast<double>(S);
  const double gmacs = 1e-9 * static_cast<double>(B * 3 * S) * S;
  const double io_gmacs = 1e-9 * steps * static_cast<double>(B * 3 * S) * F;
  std::vector<double> out;
  for (const StepLoops* c : candidates) {
    double estimate = 0;
    for (const Cost& cost : costs) {
      if (std::strcmp(cost.name, c->name) == 0) {
        estimate = cost.per_s2 * s2 +
            steps * (cost.per_step + cost.per_gmac * gmacs) +
            cost.per_io_gmac * io_gmacs;
      }
    }
    out.push_back(estimate);
  }
  return out;
}

// The CPU's paths, chosen per kind of block (path_choice.h): steps runs
// every block; onednn and fused float32's, where torch has oneDNN and the
// processor the fused kernel's vectors.
const StepLoops& cpu_loops(
    const Sizes& sizes,
    at::ScalarType dtype,
    bool backward,
    bool save,
    const char* /*op*/) {
  static constexpr StepLoops kSteps{
      &cpu_forward<BlasGemm>, &cpu_backward<BlasGemm>, BlasGemm::kName};
  static constexpr StepLoops kOneDnn{
      &cpu_forward<OneDnnGemm>, &cpu_backward<OneDnnGemm>, OneDnnGemm::kName};
  static constexpr StepLoops kFused{&fused_forward, &fused_backward, "fused"};
  std::array<const StepLoops*, 3> candidates{};
  size_t n = 0;
  candidates[n++] = &kSteps;
  if (OneDnnGemm::runs(sizes, dtype)) {
    candidates[n++] = &kOneDnn;
  }
  if (fused_runs(sizes, dtype)) {
    candidates[n++] = &kFused;
  }
  const c10::ArrayRef<const StepLoops*> paths(candidates.data(), n);
  // A direction on a thread of its own runs its steps on that thread.
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  const choice::Key key = choice::key_of(
      c10::DeviceType::CPU, dtype, backward, save, threads, sizes);
  return choice::choose(
      key,
      paths,
      [&](const StepLoops& loops) {
        return choice::time_steps(sizes.steps, [&](int64_t steps) {
          Sizes timed = sizes;
          timed.steps = steps;
          return time_loops(
              cpu_engine(), loops, timed, dtype, at::kCPU, backward, save);
        });
      },
      [&] { return cpu_model(sizes, paths, backward, save); });
}

// The two directions on a thread each, where there are threads to spare or
// a step is too small to share: each direction's steps then run on one
// thread, with no barrier between threads at every step. A step of more
// multiply-adds than this (batch x 3 state x state) gains more from all the
// threads than from running beside the other direction.
constexpr int64_t kSharedStepMacs = int64_t(1) << 22;

void cpu_for_each_direction(
    const Sizes& sizes,
    int64_t directions,
    c10::function_ref<void(int64_t)> body) {
  const int64_t S = sizes.state_size;
  const int64_t threads = at::get_num_threads();
  const bool apart = directions > 1 && threads > 1 &&
      !at::in_parallel_region() &&
      (threads <= directions || sizes.batch * 3 * S * S <= kSharedStepMacs);
  if (apart) {
    // The workers take the caller's dispatch state (below autograd, where
    // the op runs), which at::parallel_for leaves behind.
    const at::ThreadLocalState state;
    at::parallel_for(0, directions, 1, [&](int64_t begin, int64_t end) {
      const at::ThreadLocalStateGuard guard(state);
      for (int64_t d = begin; d < end; ++d) {
        body(d);
      }
    });
    return;
  }
  for (int64_t d = 0; d < directions; ++d) {
    body(d);
  }
}

// Every segment of a packed batch costs the CPU a few views and no launch.
int64_t cpu_min_segment_steps(int64_t /*steps*/) {
  return 1;
}

at::Tensor cpu_indices(std::vector<int64_t>&& values, c10::Device /*device*/) {
  at::Tensor out =
      at::empty({static_cast<int64_t>(values.size())}, at::dtype(at::kLong));
  std::copy(values.begin(), values.end(), out.mutable_data_ptr<int64_t>());
  return out;
}

// The op's own buffers, kept by each thread from call to call: a fresh
// buffer of megabytes comes from the system, whose page faults at its first
// writes cost more than the GEMM that fills it (39 MB in 11 ms, against 0.5
// ms to write it again). A buffer past kScratchKept bytes is not kept.
constexpr size_t kScratchKept = size_t(256) << 20;

at::Tensor cpu_scratch(
    Scratch slot,
    at::IntArrayRef sizes,
    const at::TensorOptions& options) {
  if (choice::Forced::active()) {
    // A measured run inside a call: the call's own buffers are in use.
    return at::empty(sizes, options);
  }
  thread_local std::array<at::Tensor, kScratchSlots> kept;
  at::Tensor& buffer = kept[static_cast<size_t>(slot)];
  const at::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
  const auto bytes = static_cast<int64_t>(
      c10::multiply_integers(sizes) * c10::elementSize(dtype));
  at::Tensor bytes_of = buffer.defined() && buffer.numel() >= bytes
      ? buffer
      : at::empty({bytes}, options.dtype(at::kByte));
  buffer = static_cast<size_t>(bytes) <= kScratchKept ? bytes_of : at::Tensor();
  return bytes_of.narrow(0, 0, bytes).view(dtype).view(sizes);
}

const Engine& cpu_engine() {
  static constexpr Engine kEngine{
      &cpu_loops,
      &cpu_for_each_direction,
      &cpu_min_segment_steps,
      &cpu_indices,
      &cpu_scratch};
  return kEngine;
}

struct Cpu {
  using Guard = backend::NoGuard;
  static const Engine& engine() {
    return cpu_engine();
  }
};

} // namespace
} // namespace lltm::sequence

TORCH_LIBRARY_IMPL(lltm, CPU, m) {
  using lltm::sequence::Cpu;
  using lltm::sequence::sequence_forward_kernel;
  m.impl("sequence", &sequence_forward_kernel<Cpu, false>);
  m.impl("sequence_forward", &sequence_forward_kernel<Cpu, true>);
  m.impl("sequence_backward", &lltm::sequence::sequence_backward_kernel<Cpu>);
}
