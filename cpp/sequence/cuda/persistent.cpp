// CUDA's persistent path: one cooperative grid per direction runs all T
// steps with W_h in shared memory, h_t passing through L2 after a grid-wide
// barrier (cuda/sequence/persistent/grid.cu states the math); cuBLAS GEMMs
// around it (run.cpp, backward.cpp). Also the forward and backward of every
// persistent plan, which the cluster's path runs too.
#include "cpp/sequence/cuda/operands.h"
#include "cpp/sequence/path.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAStream.h>

namespace lltm::sequence::cuda_paths {
namespace {

// Where auto takes the grid, by its rules: while a step is a few
// microseconds of work, and not where the fused steps run on tensor cores,
// which win at every size there. float32's fused steps hold W_h (held.cu),
// and win past kFloatMostElements of batch x state; float64's take a launch
// per step, and the grid keeps to kMostElements or kMostBatch
// (docs/performance.md, "Why these thresholds").
constexpr int64_t kFloatMostElements = 1024;
constexpr int64_t kMostElements = 4096;
constexpr int64_t kMostBatch = 16;

bool window(const Block& block) {
  if (steps_on_tensor_cores(block.dtype)) {
    return false;
  }
  const int64_t B = block.sizes.batch;
  const int64_t elements = B * block.sizes.state_size;
  if (block.dtype == at::kDouble) {
    return elements <= kMostElements || B <= kMostBatch;
  }
  return block.dtype == at::kFloat
      ? elements <= kFloatMostElements
      : B <= kMostBatch && elements <= kMostElements;
}

std::optional<Plan> plan(const Block& block, std::string* why_not) {
  return plan_with(block, why_not, [&](auto k, cuda::SequencePlan* p) {
    return cuda::plan_grid<decltype(k)>(
        block.sizes.batch, block.sizes.state_size, block.backward, p);
  });
}

const Path kPersistent{
    "persistent",
    c10::DeviceType::CUDA,
    20,
    &plan,
    &window,
    nullptr,
    &persistent_forward,
    &persistent_backward};

} // namespace

LLTM_REGISTER_SEQUENCE_PATH(kPersistent);

void persistent_forward(
    const Plan& plan,
    const Sizes& sizes,
    const ForwardInputs& inputs,
    ForwardBuffers& b) {
  const at::Tensor w = unit_columns(inputs.weights);
  const at::Tensor bias = inputs.bias.contiguous();
  const at::Tensor h0 = inputs.h0.contiguous();
  const at::Tensor c0 = inputs.c0.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, w.scalar_type(), "lltm_sequence_cuda", [&] {
        cuda::SequenceForwardArgs<kernel_t<scalar_t>> args{};
        args.gates = out<scalar_t>(b.gates);
        args.w = in<scalar_t>(w);
        args.ld_w = w.stride(0);
        args.bias = in<scalar_t>(bias);
        args.h0 = in<scalar_t>(h0);
        args.c0 = in<scalar_t>(c0);
        args.output = out<scalar_t>(b.output);
        args.cells = out_or_null<scalar_t>(&b.cells);
        args.h_n = out<scalar_t>(b.h_n);
        args.c_n = out<scalar_t>(b.c_n);
        args.steps = sizes.steps;
        args.batch = sizes.batch;
        args.state = sizes.state_size;
        C10_CUDA_CHECK(
            cuda::launch_sequence_forward(args, planned(plan), stream));
      });
}

// The kernel also computes d_h0, when asked for.
StateGrads persistent_backward(
    const Plan& plan,
    const Sizes& sizes,
    const BackwardInputs& inputs,
    const OutputMask& mask,
    at::Tensor& d_gates) {
  const auto options = inputs.gates.options();
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  at::Tensor d_h0;
  at::Tensor d_c0;
  if (mask[3]) {
    d_h0 = at::empty({B, S}, options);
  }
  if (mask[4]) {
    d_c0 = at::empty({B, S}, options);
  }
  const cuda::SequencePlan& p = planned(plan);
  const at::Tensor w = unit_columns(inputs.weights);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      w.scalar_type(),
      "lltm_sequence_backward_cuda",
      [&] {
        cuda::SequenceBackwardArgs<kernel_t<scalar_t>> args{};
        args.grad_output = strided3<scalar_t>(inputs.grad_output);
        args.grad_h_n = strided<scalar_t>(inputs.grad_h_n);
        args.grad_c_n = strided<scalar_t>(inputs.grad_c_n);
        args.w = in<scalar_t>(w);
        args.ld_w = w.stride(0);
        args.cells = in<scalar_t>(inputs.cells);
        args.gates = in<scalar_t>(inputs.gates);
        args.d_gates = out<scalar_t>(d_gates);
        args.d_h0 = out_or_null<scalar_t>(&d_h0);
        args.d_c0 = out_or_null<scalar_t>(&d_c0);
        args.steps = sizes.steps;
        args.batch = B;
        args.state = S;
        // dc, the grid's running cell gradient, from the caching allocator.
        const at::Tensor workspace = at::empty(
            {static_cast<int64_t>(p.workspace_bytes)},
            options.dtype(at::kByte));
        C10_CUDA_CHECK(
            cuda::launch_sequence_backward(
                args, p, workspace.mutable_data_ptr(), stream));
      });
  return {d_c0, mask[3] ? std::optional<at::Tensor>(d_h0) : std::nullopt};
}

} // namespace lltm::sequence::cuda_paths
