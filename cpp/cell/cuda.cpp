// LLTM on CUDA: the kernels of every lltm op for the CUDA dispatch key, a
// C++ layer over the kernel library in cuda/ (which states the math).
//
// Each op runs on one of three paths (cell_path says how one is picked):
// cuBLAS GEMMs through ATen around one fused pointwise kernel; small, where
// the GEMMs run in lltm's own kernels, the forward in one kernel and the
// backward's GEMMs in one more (cuda/cell/small.cu says why); tiled, in
// float32, the forward in one kernel, a tiled GEMM with the cell in its
// epilogue (cuda/cell/tiled.cu), and the backward's GEMMs on cuBLAS. A range
// in torch.profiler names the path (lltm::cell_path::small, and
// lltm::cell_backward_path:: for the backward's GEMMs):
//
//   cell           Z = old_h W_h^T + input W_x^T (2 GEMMs), pointwise:
//                  3 launches
//   cell_forward   X = [old_h | input] when saved (1 copy kernel), Z = X W^T,
//                  or 2 GEMMs without X, pointwise that also saves the gate
//                  activations in place of Z: 3 launches
//   cell_backward  pointwise (dZ, d_old_cell, d_bias), then one GEMM per
//                  gradient asked for (d_weights, d_old_h, d_input): 1 to 4
//                  launches, plus one small kernel for d_bias at large batch
//   forward        the tutorial's: X, Z = X W^T, pointwise (writes Z + b)
//   backward       the tutorial's: pointwise, then 3 GEMMs
//
// Each call validates its inputs with the shared checks, sets the device,
// and launches on the current stream of the inputs' device.
#include "cpp/cell/backend.h"
#include "cpp/cell/cell.h"
#include "cpp/ops/path_range.h"

#include "cpp/cell/cuda_tensors.h"
#include "cuda/cell/cell.h"

#include <ATen/Dispatch.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

namespace lltm {
namespace {

// The CUDA backend of the cell ops (cell_backend.h).
struct Cuda {
  using Guard = c10::cuda::CUDAGuard;
  static CellResult run(ops::Cell, const Sizes&, const backend::CellInputs&);
  static CellForwardResult run(
      ops::CellForward,
      const Sizes&,
      const backend::CellInputs&,
      bool save_X);
  static ForwardResult run(
      ops::Forward,
      const Sizes&,
      const backend::CellInputs&);
  static at::Tensor pointwise_backward(const backend::BackwardTensors& t);
  static void gemms_backward(
      const at::Tensor& d_gates,
      const std::optional<at::Tensor>& X,
      const at::Tensor& weights,
      const OutputMask& mask,
      CellBackwardResult& result);
};

using cuda::in;
using cuda::kernel_t;
using cuda::out;
using cuda::out_or_null;
using cuda::strided;

using backend::ForwardTensors;

template <typename scalar_t>
cuda::ForwardArgs<kernel_t<scalar_t>> forward_args(
    const ForwardTensors& t,
    const at::Tensor& bias,
    const at::Tensor& old_cell) {
  cuda::ForwardArgs<kernel_t<scalar_t>> args{};
  args.batch = t.new_h.size(0);
  args.state = t.new_h.size(1);
  args.z = t.z.defined() ? in<scalar_t>(t.z) : nullptr;
  args.ld_z = t.z.defined() ? t.z.stride(0) : 0;
  args.bias = in<scalar_t>(bias);
  args.old_cell = in<scalar_t>(old_cell);
  args.new_h = out<scalar_t>(t.new_h);
  args.new_cell = out<scalar_t>(t.new_cell);
  args.input_gate = out_or_null<scalar_t>(t.input_gate);
  args.output_gate = out_or_null<scalar_t>(t.output_gate);
  args.candidate_cell = out_or_null<scalar_t>(t.candidate_cell);
  args.ld_act = t.input_gate != nullptr ? t.input_gate->stride(0) : 0;
  if (t.input_gate != nullptr && t.output_gate == nullptr) {
    args.output_gate = args.input_gate + args.state;
    args.candidate_cell = args.input_gate + 2 * args.state;
  }
  args.z_with_bias = t.write_z_with_bias ? out<scalar_t>(t.z) : nullptr;
  return args;
}

// The pointwise pass over the pre-activations in t.z, which the GEMMs wrote.
void pointwise_forward(const ForwardTensors& t) {
  const at::Tensor bias = t.bias.contiguous();
  const at::Tensor old_cell = t.old_cell.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, t.z.scalar_type(), "lltm_forward_cuda", [&] {
        C10_CUDA_CHECK(
            cuda::launch_forward(
                forward_args<scalar_t>(t, bias, old_cell), stream));
      });
}

// Which kernels run a cell's GEMMs: lltm's own, in one launch per direction
// (small, in float32 tiled for the forward), or cuBLAS through ATen around
// the pointwise kernels.
enum class Path { kSmall, kTiled, kCublas };
constexpr std::array<const char*, 3> kPathNames{"small", "tiled", "cublas"};

// Auto's rules: the small kernels while each GEMM is at most kSmallMostMacs
// multiply-adds and a thread's loops are short (kSmallMostBatch terms for
// d_weights, kSmallMostGates for d_old_h and d_input); the tiled forward in
// float32 up to kTiledMostMacs, beyond which cuBLAS's larger tiles win back
// more GPU time than its host time costs; cuBLAS beyond
// (docs/performance.md, "The cell's CUDA paths").
constexpr int64_t kSmallMostMacs = int64_t(1) << 22;
constexpr int64_t kSmallMostBatch = 256;
constexpr int64_t kSmallMostGates = 1536;
constexpr int64_t kTiledMostMacs = int64_t(1) << 28;

Path auto_path(const Sizes& sizes, at::ScalarType dtype) {
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  if (B == 0 || S == 0) {
    return Path::kCublas; // ATen's ops make an empty problem's outputs
  }
  const int64_t macs = B * 3 * S * (S + sizes.input_features);
  if (B <= kSmallMostBatch && 3 * S <= kSmallMostGates &&
      macs <= kSmallMostMacs) {
    return Path::kSmall;
  }
  return dtype == at::kFloat && macs <= kTiledMostMacs ? Path::kTiled
                                                       : Path::kCublas;
}

// LLTM_CELL_PATH (auto, small, tiled or cublas; read at each call) forces
// one, for tests and benchmarks; auto goes by size (auto_path).
Path cell_path(const Sizes& sizes, at::ScalarType dtype) {
  const char* value = std::getenv("LLTM_CELL_PATH");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) {
    return auto_path(sizes, dtype);
  }
  if (std::strcmp(value, "small") == 0) {
    return Path::kSmall;
  }
  if (std::strcmp(value, "cublas") == 0) {
    return Path::kCublas;
  }
  TORCH_CHECK_VALUE(
      std::strcmp(value, "tiled") == 0,
      "LLTM_CELL_PATH=",
      std::string(value),
      ": expected auto, small, tiled or cublas (or unset, which is auto)");
  TORCH_CHECK_VALUE(
      dtype == at::kFloat,
      "LLTM_CELL_PATH=tiled: the tiled kernels take float32, not ",
      dtype);
  return Path::kTiled;
}

// The range that names a cell op's path.
PathRange path_range(Path path, bool backward) {
  return PathRange(
      backward ? "lltm::cell_backward_path::" : "lltm::cell_path::",
      [&] { return std::string(kPathNames[static_cast<size_t>(path)]); });
}

template <typename T>
cudaError_t launch_own_forward(
    Path path,
    const cuda::SmallForwardArgs<T>& args,
    cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (path == Path::kTiled) {
      return cuda::launch_tiled_forward(args, stream);
    }
  }
  return cuda::launch_small_forward(args, stream);
}

// The whole forward in one kernel (the small or the tiled path): t.z is only
// written, as the activations or as Z + b, and X when given.
void own_forward(
    Path path,
    const ForwardTensors& t,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& old_h,
    const std::optional<at::Tensor>& X) {
  const at::Tensor bias = t.bias.contiguous();
  const at::Tensor old_cell = t.old_cell.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      t.new_h.scalar_type(),
      "lltm_small_forward",
      [&] {
        cuda::SmallForwardArgs<kernel_t<scalar_t>> args{};
        args.old_h = strided<scalar_t>(old_h);
        args.input = strided<scalar_t>(input);
        args.weights = strided<scalar_t>(weights);
        args.cell = forward_args<scalar_t>(t, bias, old_cell);
        args.cell.z = nullptr;
        args.X = X ? out<scalar_t>(*X) : nullptr;
        args.input_features = input.size(1);
        C10_CUDA_CHECK(launch_own_forward(path, args, stream));
      });
}

// The GEMMs of the backward: one small kernel, or cuBLAS.
void Cuda::gemms_backward(
    const at::Tensor& d_gates,
    const std::optional<at::Tensor>& X,
    const at::Tensor& weights,
    const OutputMask& mask,
    CellBackwardResult& result) {
  const int64_t B = d_gates.size(0);
  const int64_t S = d_gates.size(1) / 3;
  const int64_t F = weights.size(1) - S;
  const bool small =
      cell_path({B, F, S}, d_gates.scalar_type()) == Path::kSmall;
  const PathRange range =
      path_range(small ? Path::kSmall : Path::kCublas, /*backward=*/true);
  if (!small) {
    backward_gemms(d_gates, X, weights, mask, result);
    return;
  }
  const auto options = d_gates.options();
  at::Tensor d_weights =
      mask[1] ? at::empty({3 * S, S + F}, options) : at::Tensor();
  at::Tensor d_old_h = mask[3] ? at::empty({B, S}, options) : at::Tensor();
  at::Tensor d_input = mask[0] ? at::empty({B, F}, options) : at::Tensor();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      d_gates.scalar_type(),
      "lltm_small_backward",
      [&] {
        cuda::SmallBackwardArgs<kernel_t<scalar_t>> args{};
        args.d_gates = in<scalar_t>(d_gates);
        args.X = mask[1] ? in<scalar_t>(*X) : nullptr;
        args.weights = strided<scalar_t>(weights);
        args.d_weights = mask[1] ? out<scalar_t>(d_weights) : nullptr;
        args.d_old_h = mask[3] ? out<scalar_t>(d_old_h) : nullptr;
        args.d_input = mask[0] ? out<scalar_t>(d_input) : nullptr;
        args.batch = B;
        args.input_features = F;
        args.state = S;
        C10_CUDA_CHECK(cuda::launch_small_backward_gemms(args, stream));
      });
  if (mask[1]) {
    std::get<1>(result) = std::move(d_weights);
  }
  if (mask[3]) {
    std::get<3>(result) = std::move(d_old_h);
  }
  if (mask[0]) {
    std::get<0>(result) = std::move(d_input);
  }
}

// The pointwise backward (cell_backend.h).
at::Tensor Cuda::pointwise_backward(const backend::BackwardTensors& t) {
  const at::Tensor new_cell_c = t.new_cell.contiguous();
  at::Tensor d_bias;
  if (t.want_bias) {
    d_bias = at::empty({3 * t.new_cell.size(1)}, t.new_cell.options());
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      t.new_cell.scalar_type(),
      "lltm_backward_cuda",
      [&] {
        cuda::BackwardArgs<kernel_t<scalar_t>> args{};
        args.grad_h = strided<scalar_t>(t.grad_h);
        args.grad_cell = strided<scalar_t>(t.grad_cell);
        args.new_cell = in<scalar_t>(new_cell_c);
        const int64_t S = t.new_cell.size(1);
        args.input_gate = in<scalar_t>(t.input_gate);
        args.output_gate = t.output_gate != nullptr
            ? in<scalar_t>(*t.output_gate)
            : args.input_gate + S;
        args.candidate_cell = t.candidate_cell != nullptr
            ? in<scalar_t>(*t.candidate_cell)
            : args.input_gate + 2 * S;
        args.ld_act = t.input_gate.stride(0);
        args.d_gates = out<scalar_t>(t.d_gates);
        args.d_old_cell = out_or_null<scalar_t>(t.d_old_cell);
        args.d_bias = t.want_bias ? out<scalar_t>(d_bias) : nullptr;
        args.batch = t.new_cell.size(0);
        args.state = t.new_cell.size(1);
        // Scratch for the bias's partial sums, from the caching allocator.
        const size_t bytes = cuda::backward_workspace_size(args);
        at::Tensor workspace;
        if (bytes > 0) {
          workspace = at::empty(
              {static_cast<int64_t>(bytes)},
              t.new_cell.options().dtype(at::kByte));
        }
        C10_CUDA_CHECK(
            cuda::launch_backward(
                args,
                bytes > 0 ? workspace.mutable_data_ptr() : nullptr,
                stream));
      });
  return d_bias;
}

CellResult Cuda::run(
    ops::Cell /*op*/,
    const Sizes& sizes,
    const backend::CellInputs& inputs) {
  const auto& [input, weights, bias, old_h, old_cell] = inputs;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const auto options = old_cell.options();
  at::Tensor new_h = at::empty({B, S}, options);
  at::Tensor new_cell = at::empty({B, S}, options);
  const Path path = cell_path(sizes, old_cell.scalar_type());
  const PathRange range = path_range(path, /*backward=*/false);
  if (path != Path::kCublas) {
    const at::Tensor none;
    own_forward(
        path,
        {none, bias, old_cell, new_h, new_cell},
        input,
        weights,
        old_h,
        {});
    return {new_h, new_cell};
  }
  at::Tensor z = at::empty({B, 3 * S}, options);
  gate_preactivations(z, input, weights, old_h, std::nullopt);
  pointwise_forward({z, bias, old_cell, new_h, new_cell});
  return {new_h, new_cell};
}

CellForwardResult Cuda::run(
    ops::CellForward /*op*/,
    const Sizes& sizes,
    const backend::CellInputs& inputs,
    bool save_X) {
  const auto& [input, weights, bias, old_h, old_cell] = inputs;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const auto options = old_cell.options();
  // Z, then the activations over it: gates = [i | o | g].
  at::Tensor gates = at::empty({B, 3 * S}, options);
  at::Tensor new_h = at::empty({B, S}, options);
  at::Tensor new_cell = at::empty({B, S}, options);
  const ForwardTensors t{gates, bias, old_cell, new_h, new_cell, &gates};
  std::optional<at::Tensor> X;
  const Path path = cell_path(sizes, old_cell.scalar_type());
  const PathRange range = path_range(path, /*backward=*/false);
  if (path != Path::kCublas) {
    if (save_X) {
      X = at::empty({B, S + sizes.input_features}, options);
    }
    own_forward(path, t, input, weights, old_h, X);
    return {new_h, new_cell, gates, X};
  }
  if (save_X) {
    X = at::cat({old_h, input}, /*dim=*/1);
  }
  gate_preactivations(gates, input, weights, old_h, X);
  pointwise_forward(t);
  return {new_h, new_cell, gates, X};
}

ForwardResult Cuda::run(
    ops::Forward /*op*/,
    const Sizes& sizes,
    const backend::CellInputs& inputs) {
  const auto& [input, weights, bias, old_h, old_cell] = inputs;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const auto options = old_cell.options();
  const Path path = cell_path(sizes, old_cell.scalar_type());
  const PathRange range = path_range(path, /*backward=*/false);
  const bool own = path != Path::kCublas;
  at::Tensor X = own ? at::empty({B, S + sizes.input_features}, options)
                     : at::cat({old_h, input}, /*dim=*/1);
  at::Tensor gate_weights = at::empty({B, 3 * S}, options);
  if (!own) {
    gate_preactivations(gate_weights, input, weights, old_h, X);
  }
  backend::TutorialOutputs outputs(B, S, options);
  const ForwardTensors t = outputs.over(gate_weights, bias, old_cell);
  if (own) {
    own_forward(path, t, input, weights, old_h, X);
  } else {
    pointwise_forward(t);
  }
  return std::move(outputs).result(X, gate_weights);
}

} // namespace
} // namespace lltm

TORCH_LIBRARY_IMPL(lltm, CUDA, m) {
  using lltm::Cuda;
  using Forward = lltm::backend::ForwardKernel<Cuda>;
  m.impl("forward", &lltm::ops::Forward::kernel<Forward>);
  m.impl("backward", &lltm::backend::backward<Cuda>);
  m.impl("cell", &lltm::ops::Cell::kernel<Forward>);
  m.impl("cell_forward", &lltm::ops::CellForward::kernel<Forward>);
  m.impl("cell_backward", &lltm::backend::cell_backward<Cuda>);
}
