// CUDA's fused path: per step the recurrent GEMM with the cell in its
// epilogue (cuda/sequence/fused/ states the math), every step in one
// cooperative launch per direction where the plan says so, else a launch
// per step from a loop that makes no ATen call; on tensor cores
// ("fused/mma/..."), W_h held in shared memory ("fused/held") or read in
// chunks ("fused/chunked/..."), as the kernel library's plan says. cuBLAS
// GEMMs around it (run.cpp, backward.cpp).
#include "cpp/sequence/cuda/operands.h"
#include "cpp/sequence/path.h"

#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAStream.h>

namespace lltm::sequence::cuda_paths {
namespace {

// Where auto takes the fused steps, by its rules: up to these multiply-adds
// of a step's recurrent product (batch x 3 state x state), beyond which
// cuBLAS's large tiles win and the launches are a small part of a step: on
// tensor cores, on CUDA cores in 16-bit types, and in the others
// (docs/performance.md, "Why these thresholds").
constexpr int64_t kTensorCoreMostMacs = int64_t(1) << 29;
constexpr int64_t k16BitMostMacs = int64_t(1) << 24;
constexpr int64_t kMostMacs = int64_t(1) << 26;

bool window(const Block& block) {
  const int64_t B = block.sizes.batch;
  const int64_t S = block.sizes.state_size;
  const int64_t most = steps_on_tensor_cores(block.dtype)
      ? kTensorCoreMostMacs
      : (c10::elementSize(block.dtype) == 2 ? k16BitMostMacs : kMostMacs);
  return B * 3 * S * S <= most;
}

// Every block: W_h's rows S + F apart (the weights' own layout).
std::optional<Plan> plan(const Block& block, std::string* why_not) {
  const auto [T, B, F, S] = block.sizes;
  return plan_with(block, why_not, [&](auto k, cuda::SequencePlan* p) {
    return cuda::plan_fused<decltype(k)>(T, B, S, S + F, block.backward, p);
  });
}

// W_h as the plan reads it: with unit column stride; where it takes 16-byte
// vectors of W_h, dense (rows S + F apart, as the plan counted) and aligned.
at::Tensor weights_of(const cuda::SequencePlan& p, const at::Tensor& weights) {
  return p.vector == 8 ? aligned(weights) : unit_columns(weights);
}

// h0 as the plan reads it: aligned where it takes 16-byte vectors of rows.
at::Tensor h0_of(const cuda::SequencePlan& p, const at::Tensor& h0) {
  const bool vectors =
      p.vector == 8 || p.kernel == cuda::SequenceKernel::kFusedHeld;
  return vectors ? aligned(h0) : h0.contiguous();
}

// A workspace of the plan's bytes, from the caching allocator.
at::Tensor workspace_of(const cuda::SequencePlan& p, const at::Tensor& like) {
  return at::empty(
      {static_cast<int64_t>(p.workspace_bytes)},
      like.options().dtype(at::kByte));
}

// The loops make no ATen call: a step costs the host one kernel launch.
void fused_forward(
    const Plan& plan,
    const Sizes& sizes,
    const ForwardInputs& inputs,
    ForwardBuffers& b) {
  const cuda::SequencePlan& p = planned(plan);
  const at::Tensor w = weights_of(p, inputs.weights);
  const at::Tensor bias = inputs.bias.contiguous();
  const at::Tensor h0 = h0_of(p, inputs.h0);
  const at::Tensor c0 = inputs.c0.contiguous();
  const bool save = b.cells.defined();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, w.scalar_type(), "lltm_sequence_cuda", [&] {
        cuda::FusedForwardArgs<kernel_t<scalar_t>> args{};
        args.w = in<scalar_t>(w);
        args.ld_w = w.stride(0);
        args.bias = in<scalar_t>(bias);
        args.h0 = in<scalar_t>(h0);
        args.c0 = in<scalar_t>(c0);
        args.output = out<scalar_t>(b.output);
        args.gates = out<scalar_t>(b.gates);
        // Without saving, c_t is written over c_{t-1} in c_n.
        args.cells = save ? out<scalar_t>(b.cells) : out<scalar_t>(b.c_n);
        args.h_n = out<scalar_t>(b.h_n);
        args.c_n = out<scalar_t>(b.c_n);
        args.save = save;
        args.steps = sizes.steps;
        args.batch = sizes.batch;
        args.state = sizes.state_size;
        // The counters of the cooperative steps' barriers.
        at::Tensor workspace = workspace_of(p, w);
        C10_CUDA_CHECK(
            cuda::launch_fused_forward(
                args,
                p,
                p.workspace_bytes > 0 ? workspace.mutable_data_ptr() : nullptr,
                stream));
      });
}

StateGrads fused_backward(
    const Plan& plan,
    const Sizes& sizes,
    const BackwardInputs& inputs,
    const OutputMask& /*output_mask*/,
    at::Tensor& d_gates) {
  const cuda::SequencePlan& p = planned(plan);
  const at::Tensor w = weights_of(p, inputs.weights);
  const auto options = inputs.gates.options();
  at::Tensor d_c0 = at::empty({sizes.batch, sizes.state_size}, options);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, w.scalar_type(), "lltm_sequence_cuda", [&] {
        cuda::FusedBackwardArgs<kernel_t<scalar_t>> args{};
        args.grad_output = strided3<scalar_t>(inputs.grad_output);
        args.grad_h_n = strided<scalar_t>(inputs.grad_h_n);
        args.grad_c_n = strided<scalar_t>(inputs.grad_c_n);
        args.w = in<scalar_t>(w);
        args.ld_w = w.stride(0);
        args.cells = in<scalar_t>(inputs.cells);
        args.gates = in<scalar_t>(inputs.gates);
        args.d_gates = out<scalar_t>(d_gates);
        args.d_c0 = out<scalar_t>(d_c0);
        args.steps = sizes.steps;
        args.batch = sizes.batch;
        args.state = sizes.state_size;
        // The running cell gradient and the cooperative steps' counters.
        at::Tensor workspace = workspace_of(p, w);
        C10_CUDA_CHECK(
            cuda::launch_fused_backward(
                args, p, workspace.mutable_data_ptr(), stream));
      });
  return {d_c0, std::nullopt};
}

const Path kFused{
    "fused",
    c10::DeviceType::CUDA,
    30,
    &plan,
    &window,
    nullptr,
    &fused_forward,
    &fused_backward};

} // namespace

LLTM_REGISTER_SEQUENCE_PATH(kFused);

} // namespace lltm::sequence::cuda_paths
