// The sequence ops on CUDA: a C++ layer over three ways to run the steps.
//
//   persistent  one cooperative kernel per direction runs all T steps with
//               W_h in shared memory (cuda/lltm_sequence.cu states the
//               math); cuBLAS GEMMs around it: the input projection before
//               the forward, d_weights and d_input after the backward
//   fused       per step, the recurrent GEMM with the cell in its epilogue
//               (cuda/lltm_step.cu): every step in one cooperative launch
//               per direction where the grid fits at once, else a launch
//               per step from a loop that makes no ATen call; the same
//               GEMMs around it
//   steps       per step, one cuBLAS GEMM and the cell's pointwise kernel
//               (cuda/lltm_kernel.cu), in ATen loops
//
// LLTM_SEQUENCE_PATH (auto, persistent, fused or steps; read at each call)
// picks one. auto goes by the size of a step (choose_path): the persistent
// kernel while a step is a few microseconds of work, the fused kernel while
// a launch of cuBLAS and of a pointwise kernel would cost more than the
// step's arithmetic, cuBLAS beyond. docs/performance.md has the measurements
// behind the thresholds. Either direction may take any path: all save the
// same tensors.
//
// Each call validates its inputs with the shared checks, sets the device,
// and launches on the current stream of the inputs' device.
#include "cpp/cell/backend.h"
#include "cpp/sequence/choice.h"
#include "cpp/sequence/sequence.h"

#include "cpp/cell/cuda_tensors.h"
#include "cuda/cell/cell.h"
#include "cuda/sequence/sequence.h"

#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>

namespace lltm::sequence {
namespace {

using cuda::in;
using cuda::kernel_t;
using cuda::out;
using cuda::out_or_null;
using cuda::strided;

template <typename scalar_t>
cuda::Strided3<kernel_t<scalar_t>> strided3(
    const std::optional<at::Tensor>& t) {
  if (!t) {
    return {nullptr, 0, 0, 0};
  }
  return {in<scalar_t>(*t), t->stride(0), t->stride(1), t->stride(2)};
}

// The forward's operands as the kernels read them: W with unit column
// stride, the others dense.
struct DenseInputs {
  at::Tensor w, bias, h0, c0;

  explicit DenseInputs(const ForwardInputs& in)
      : w(unit_columns(in.weights)),
        bias(in.bias.contiguous()),
        h0(in.h0.contiguous()),
        c0(in.c0.contiguous()) {}

  static at::Tensor unit_columns(const at::Tensor& w) {
    return w.stride(1) == 1 ? w : w.contiguous();
  }
};

// --- the per-step path: cuBLAS and the cell's pointwise kernels --------------

// The cell's pointwise forward over z ([B, 3S] pre-activations without the
// bias, row stride z.stride(0)): writes new_h and new_cell (dense), and the
// activations [i | o | g] in place over z when save is set.
void step_forward(
    at::Tensor& z,
    const at::Tensor& bias,
    const at::Tensor& old_cell,
    at::Tensor& new_h,
    at::Tensor& new_cell,
    bool save) {
  const int64_t S = new_h.size(1);
  const at::Tensor bias_c = bias.contiguous();
  const at::Tensor old_cell_c = old_cell.contiguous();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, z.scalar_type(), "lltm_sequence_cuda", [&] {
        cuda::ForwardArgs<kernel_t<scalar_t>> args{};
        args.z = in<scalar_t>(z);
        args.ld_z = z.stride(0);
        args.bias = in<scalar_t>(bias_c);
        args.old_cell = in<scalar_t>(old_cell_c);
        args.new_h = out<scalar_t>(new_h);
        args.new_cell = out<scalar_t>(new_cell);
        if (save) {
          // [i | o | g] over [Z_i | Z_o | Z_c], element for element.
          kernel_t<scalar_t>* act = out<scalar_t>(z);
          args.input_gate = act;
          args.output_gate = act + S;
          args.candidate_cell = act + 2 * S;
          args.ld_act = z.stride(0);
        }
        args.batch = new_h.size(0);
        args.state = S;
        C10_CUDA_CHECK(cuda::launch_forward(args, stream));
      });
}

// The cell's pointwise backward: dZ into d_gates ([B, 3S], dense) and dc
// into d_old_cell, from gh = grad_h (strided, or none) + grad_h_add (dense,
// or none) and gc = grad_cell (strided, or none).
void step_backward(
    const std::optional<at::Tensor>& grad_h,
    const std::optional<at::Tensor>& grad_h_add,
    const std::optional<at::Tensor>& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& gates,
    at::Tensor& d_gates,
    at::Tensor& d_old_cell) {
  const int64_t S = new_cell.size(1);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf,
      at::kBFloat16,
      new_cell.scalar_type(),
      "lltm_sequence_backward_cuda",
      [&] {
        cuda::BackwardArgs<kernel_t<scalar_t>> args{};
        args.grad_h = strided<scalar_t>(grad_h);
        args.grad_cell = strided<scalar_t>(grad_cell);
        args.new_cell = in<scalar_t>(new_cell);
        const kernel_t<scalar_t>* act = in<scalar_t>(gates);
        args.input_gate = act;
        args.output_gate = act + S;
        args.candidate_cell = act + 2 * S;
        args.ld_act = gates.stride(0);
        args.d_gates = out<scalar_t>(d_gates);
        args.d_old_cell = out<scalar_t>(d_old_cell);
        args.d_bias = nullptr; // summed over all steps at the end
        args.batch = new_cell.size(0);
        args.state = S;
        if (grad_h_add) {
          args.grad_h_add = in<scalar_t>(*grad_h_add);
          args.ld_grad_h_add = grad_h_add->stride(0);
        }
        // Without d_bias the kernel needs no workspace.
        C10_CUDA_CHECK(cuda::launch_backward(args, nullptr, stream));
      });
}

std::optional<at::Tensor> step_of(
    const std::optional<at::Tensor>& t,
    int64_t index) {
  return t ? std::optional<at::Tensor>(t->select(0, index)) : std::nullopt;
}

// Per step one GEMM and one pointwise kernel, then h_n and c_n.
void steps_forward(
    const Sizes& sizes,
    const ForwardInputs& inputs,
    ForwardBuffers& b) {
  const int64_t T = sizes.steps;
  const bool save = b.cells.defined();
  // W_h^T packed once: every step's GEMM reads a dense operand rather than
  // the strided column block of the weights.
  const at::Tensor w_h_t =
      packed_w_h_t(inputs.weights, sizes.state_size, inputs.packed);
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor z = b.gates.select(0, t);
    z.addmm_(t == 0 ? inputs.h0 : b.output.select(0, t - 1), w_h_t);
    at::Tensor new_h = b.output.select(0, t);
    // Without saving, c_t is written over c_{t-1} in c_n: the kernels read
    // each element of old_cell before they write it in new_cell.
    at::Tensor new_cell = save ? b.cells.select(0, t) : b.c_n;
    const at::Tensor old_cell =
        t == 0 ? inputs.c0 : (save ? b.cells.select(0, t - 1) : b.c_n);
    step_forward(z, inputs.bias, old_cell, new_h, new_cell, save);
  }
  b.h_n.copy_(b.output.select(0, T - 1));
  if (save) {
    b.c_n.copy_(b.cells.select(0, T - 1));
  }
}

// The reverse loop, per step the pointwise kernel and one GEMM.
StateGrads steps_backward(
    const Sizes& sizes,
    const BackwardInputs& inputs,
    const OutputMask& /*output_mask*/,
    at::Tensor& d_gates) {
  const int64_t T = sizes.steps;
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  const at::Tensor w_h =
      packed_w_h(inputs.weights, S, inputs.packed); // as above
  const auto options = inputs.gates.options();
  // dc_t, in turns: step t reads dc_t and writes dc_{t-1}.
  std::array<at::Tensor, 2> dc{
      at::empty({B, S}, options), at::empty({B, S}, options)};
  at::Tensor recurrent = at::empty({B, S}, options); // dZ_{t+1} W_h
  for (int64_t t = T - 1; t >= 0; --t) {
    std::optional<at::Tensor> grad_h = step_of(inputs.grad_output, t);
    std::optional<at::Tensor> grad_h_add;
    std::optional<at::Tensor> grad_cell;
    if (t == T - 1) {
      // grad_h_n takes the place of the recurrent term; the second addend
      // is read densely.
      if (!grad_h) {
        grad_h = inputs.grad_h_n;
      } else if (inputs.grad_h_n) {
        grad_h_add = inputs.grad_h_n->contiguous();
      }
      grad_cell = inputs.grad_c_n;
    } else {
      grad_h_add = recurrent;
      grad_cell = dc[(t + 1) % 2];
    }
    at::Tensor d_gates_t = d_gates.select(0, t);
    step_backward(
        grad_h,
        grad_h_add,
        grad_cell,
        inputs.cells.select(0, t),
        inputs.gates.select(0, t),
        d_gates_t,
        dc[t % 2]);
    if (t > 0) {
      at::mm_out(recurrent, d_gates_t, w_h);
    }
  }
  return {dc[0], std::nullopt};
}

// --- the fused path: one launch per step and direction --------------------

// The loops make no ATen call: a step costs the host one kernel launch.
void fused_forward(
    const Sizes& sizes,
    const ForwardInputs& inputs,
    ForwardBuffers& b) {
  const DenseInputs d(inputs);
  const bool save = b.cells.defined();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, d.w.scalar_type(), "lltm_sequence_cuda", [&] {
        cuda::FusedForwardArgs<kernel_t<scalar_t>> args{};
        args.w = in<scalar_t>(d.w);
        args.ld_w = d.w.stride(0);
        args.bias = in<scalar_t>(d.bias);
        args.h0 = in<scalar_t>(d.h0);
        args.c0 = in<scalar_t>(d.c0);
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
        // The counters of the held steps' barriers, from the caching
        // allocator.
        const size_t bytes = cuda::fused_forward_workspace_size(args);
        at::Tensor workspace;
        if (bytes > 0) {
          workspace = at::empty(
              {static_cast<int64_t>(bytes)}, d.w.options().dtype(at::kByte));
        }
        C10_CUDA_CHECK(
            cuda::launch_fused_forward(
                args,
                bytes > 0 ? workspace.mutable_data_ptr() : nullptr,
                stream));
      });
}

StateGrads fused_backward(
    const Sizes& sizes,
    const BackwardInputs& inputs,
    const OutputMask& /*output_mask*/,
    at::Tensor& d_gates) {
  const at::Tensor w = DenseInputs::unit_columns(inputs.weights);
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
        // The running cell gradient and the held steps' counters, from the
        // caching allocator.
        const at::Tensor workspace = at::empty(
            {static_cast<int64_t>(cuda::fused_backward_workspace_size(args))},
            options.dtype(at::kByte));
        C10_CUDA_CHECK(
            cuda::launch_fused_backward(
                args, workspace.mutable_data_ptr(), stream));
      });
  return {d_c0, std::nullopt};
}

// --- the persistent path -----------------------------------------------------

template <cuda::Exchange X>
void persistent_forward(
    const Sizes& sizes,
    const ForwardInputs& inputs,
    ForwardBuffers& b) {
  const DenseInputs d(inputs);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, d.w.scalar_type(), "lltm_sequence_cuda", [&] {
        cuda::SequenceForwardArgs<kernel_t<scalar_t>> args{};
        args.gates = out<scalar_t>(b.gates);
        args.w = in<scalar_t>(d.w);
        args.ld_w = d.w.stride(0);
        args.bias = in<scalar_t>(d.bias);
        args.h0 = in<scalar_t>(d.h0);
        args.c0 = in<scalar_t>(d.c0);
        args.output = out<scalar_t>(b.output);
        args.cells = out_or_null<scalar_t>(&b.cells);
        args.h_n = out<scalar_t>(b.h_n);
        args.c_n = out<scalar_t>(b.c_n);
        args.steps = sizes.steps;
        args.batch = sizes.batch;
        args.state = sizes.state_size;
        C10_CUDA_CHECK(cuda::launch_sequence_forward(args, X, stream));
      });
}

// The kernel also computes d_h0, when asked for.
template <cuda::Exchange X>
StateGrads persistent_backward(
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
  const at::Tensor w = DenseInputs::unit_columns(inputs.weights);
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
        // dc, the running cell gradient (the grid's), from the caching
        // allocator.
        const at::Tensor workspace = at::empty(
            {static_cast<int64_t>(
                cuda::sequence_backward_workspace_size(args, X))},
            options.dtype(at::kByte));
        C10_CUDA_CHECK(
            cuda::launch_sequence_backward(
                args, X, workspace.mutable_data_ptr(), stream));
      });
  return {d_c0, mask[3] ? std::optional<at::Tensor>(d_h0) : std::nullopt};
}

// --- choosing the path -------------------------------------------------------

enum class Path { kAuto, kPersistent, kCluster, kFused, kSteps };

// LLTM_SEQUENCE_PATH (path_choice.h checks the name); a CPU path is auto
// here.
Path requested_path() {
  const std::string value = choice::requested_path();
  if (value == "persistent") {
    return Path::kPersistent;
  }
  if (value == "cluster") {
    return Path::kCluster;
  }
  if (value == "fused") {
    return Path::kFused;
  }
  if (value == "steps") {
    return Path::kSteps;
  }
  return Path::kAuto;
}

// What auto runs where the cluster does not (cluster_size, below): the
// persistent kernel's cooperative grid up to a batch of 16 and 4096
// elements of batch * state_size (where it fits; in float64 up to either); the
// fused steps up to fused_max_macs multiply-adds per recurrent product (batch *
// 3 state_size * state_size); and cuBLAS's GEMMs beyond, where its large tiles
// win and the launches are a small part of a step. The fused steps of every
// type but float64 run in one cooperative launch per direction where their grid
// fits (lltm_step.cu), and so overtake the persistent kernel from batch 17
// (measured at states 64 and 128) and from batch * state_size = 8192 (batch
// 16 at state 512); float64's fused steps take a launch each. Where they
// run on tensor cores (lltm_step_mma.cu: float16 from sm_70, bfloat16 from
// sm_80) they win over the persistent kernel at every size (batch 1 too), and
// over cuBLAS up to 2^29 multiply-adds; on CUDA cores cuBLAS's tensor cores
// overtake them from 2^24 in 16-bit types. docs/performance.md has the
// measurements.
bool persistent_size(
    int64_t batch,
    int64_t state,
    at::ScalarType dtype,
    bool tensor_cores) {
  if (tensor_cores) {
    return false;
  }
  if (dtype == at::kDouble) { // a launch per fused step: no cooperative one
    return batch * state <= 4096 || batch <= 16;
  }
  // float32's fused steps hold W_h in shared memory where their grid fits
  // (lltm_step.cu), and win from batch x state = 2048 (16 x 128; 16 x 256
  // and 8 x 512 on the H200: 5.85 and 8.40 ms at T = 512 against 8.07 and
  // 9.52).
  return dtype == at::kFloat ? batch * state <= 1024
                             : batch <= 16 && batch * state <= 4096;
}

// Where auto takes the cluster (sm_90 on), where it fits, before any other
// path. Clusters on CUDA cores take the batch in tiles of rows, and auto
// takes them up to 224 (row, column) items a block of a tile in float32
// (whose fused steps hold W_h: at T = 512 on the H200, µs a step,
// 512,192,32,128, 224 items, 9.14 against the fused steps' 9.67, and
// 512,96,128,256, 224 items, 12.43 against 14.90, but 512,256,32,128, 296
// items, 12.08 against 10.20), 256 in other types. In float16 and bfloat16
// up to 160 items in both directions (cuda::sequence_cluster_small_tiles):
// 512,128,32,128, 152 items, 6.29 against the tensor-core steps' 7.12, but
// 512,192,32,128, 224 items, 8.30 against 7.21. Their cluster on tensor
// cores, which takes the whole batch (on_tensor_cores in
// cuda/lltm_sequence.cu chooses), up to 512 fragments a block of its 16
// (batch * state_size / 16): ms per call at T = 512, 512,16,128,256 (256)
// 2.76 against the tensor-core steps' 4.24, but at 512,48,128,256 (768)
// 4.58 against 4.39. docs/performance.md.
template <typename K>
bool cluster_size(
    int64_t batch,
    int64_t state,
    at::ScalarType dtype,
    bool tensor_cores,
    bool backward) {
  if (tensor_cores) {
    return cuda::cluster_mma_fragments(batch, state) <= cuda::kClusterMmaMost ||
        cuda::sequence_cluster_small_tiles<K>(batch, state);
  }
  const int64_t items = cuda::sequence_cluster_items<K>(batch, state, backward);
  return items > 0 && items <= (dtype == at::kFloat ? 224 : 256);
}

int64_t fused_max_macs(at::ScalarType dtype, bool tensor_cores) {
  if (tensor_cores) {
    return int64_t(1) << 29;
  }
  return c10::elementSize(dtype) == 2 ? int64_t(1) << 24 : int64_t(1) << 26;
}

Path choose_path(
    const Sizes& sizes,
    at::ScalarType dtype,
    bool backward,
    const char* op) {
  const Path path = requested_path();
  const int64_t B = sizes.batch;
  const int64_t S = sizes.state_size;
  // Nothing to run: the steps path handles empty problems.
  if (sizes.steps == 0 || B == 0 || S == 0) {
    return Path::kSteps;
  }
  if (path == Path::kSteps || path == Path::kFused) {
    return path;
  }
  bool tensor_cores = false;
  bool wanted = false; // a persistent kernel, if one fits
  bool cluster = false; // the cluster's fits
  bool grid = false; // the cooperative grid's fits
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, dtype, "lltm_sequence_fits", [&] {
        using K = kernel_t<scalar_t>;
        tensor_cores = cuda::steps_on_tensor_cores<K>();
        // Their plans ask the driver: only where they could run.
        cluster = path != Path::kPersistent &&
            (path == Path::kCluster ||
             cluster_size<K>(B, S, dtype, tensor_cores, backward)) &&
            cuda::sequence_persistent_fits<K>(
                      B, S, backward, cuda::Exchange::kCluster);
        wanted = path != Path::kAuto || cluster ||
            persistent_size(B, S, dtype, tensor_cores);
        grid = wanted && path != Path::kCluster && !cluster &&
            cuda::sequence_persistent_fits<K>(
                   B, S, backward, cuda::Exchange::kGrid);
      });
  const Path beyond = B * 3 * S * S <= fused_max_macs(dtype, tensor_cores)
      ? Path::kFused
      : Path::kSteps;
  if (!wanted) {
    return beyond;
  }
  const auto refuse = [&](const char* name, const char* why) {
    TORCH_CHECK(
        false,
        op,
        ": LLTM_SEQUENCE_PATH=",
        name,
        ", but the ",
        name,
        " kernel cannot run batch = ",
        std::to_string(B),
        ", state_size = ",
        std::to_string(S),
        " in ",
        std::string(c10::getDtypeNames(dtype).first),
        " on this GPU (",
        why,
        "): unset it, or set it to auto, fused or steps");
  };
  if (path == Path::kPersistent && !grid) {
    refuse(
        "persistent",
        "W_h's slices do not fit in the shared memory of its "
        "multiprocessors, or it has no cooperative launch");
  }
  if (path == Path::kCluster && !cluster) {
    refuse(
        "cluster",
        "it has no thread-block clusters (sm_90 on), or W_h and the batch "
        "do not fit in the shared memory and threads of one cluster");
  }
  return cluster ? Path::kCluster : grid ? Path::kPersistent : beyond;
}

const StepLoops& cuda_loops(
    const Sizes& sizes,
    at::ScalarType dtype,
    bool backward,
    bool /*save*/,
    const char* op) {
  static constexpr StepLoops kPersistent{
      &persistent_forward<cuda::Exchange::kGrid>,
      &persistent_backward<cuda::Exchange::kGrid>,
      "persistent"};
  static constexpr StepLoops kCluster{
      &persistent_forward<cuda::Exchange::kCluster>,
      &persistent_backward<cuda::Exchange::kCluster>,
      "cluster"};
  static constexpr StepLoops kFused{&fused_forward, &fused_backward, "fused"};
  static constexpr StepLoops kSteps{&steps_forward, &steps_backward, "steps"};
  switch (choose_path(sizes, dtype, backward, op)) {
    case Path::kPersistent:
      return kPersistent;
    case Path::kCluster:
      return kCluster;
    case Path::kFused:
      return kFused;
    default:
      return kSteps;
  }
}

// --- directions and packed batches -------------------------------------------

// `waiting` waits for what `done` has been given so far: an event, made,
// recorded and let go (CUDA keeps it until the wait is over). c10's streams
// and CUDA's runtime alone: ATen's CUDA headers need the toolkit's cuBLAS
// and cuSPARSE headers, which a compiler-only toolkit does not have.
cudaError_t wait_for(
    const c10::cuda::CUDAStream& waiting,
    const c10::cuda::CUDAStream& done) {
  cudaEvent_t event = nullptr;
  cudaError_t error = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (error == cudaSuccess) {
    error = cudaEventRecord(event, done.stream());
    if (error == cudaSuccess) {
      error = cudaStreamWaitEvent(waiting.stream(), event, 0);
    }
    const cudaError_t destroyed = cudaEventDestroy(event);
    error = error == cudaSuccess ? destroyed : error;
  }
  return error;
}

// Direction 1 on a stream of its own, forked from the current stream and
// joined back into it, also when its launches throw: its kernels run beside
// direction 0's where the GPU has room for both (a small batch's steps use
// a few multiprocessors). Inside a CUDA graph's capture the fork and the
// join are the graph's edges.
void cuda_for_each_direction(
    const Sizes& /*sizes*/,
    int64_t directions,
    c10::function_ref<void(int64_t)> body) {
  if (directions == 1) {
    body(0);
    return;
  }
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  const c10::cuda::CUDAStream side =
      c10::cuda::getStreamFromPool(false, current.device_index());
  C10_CUDA_CHECK(wait_for(side, current));
  // The join, also when a launch throws: the current stream's later work,
  // and the caching allocator's reuse of what direction 1 read, wait for it
  // (a destructor does not throw: a failed join there warns).
  struct Join {
    const c10::cuda::CUDAStream& current;
    const c10::cuda::CUDAStream& side;
    bool joined = false;
    ~Join() {
      if (!joined) {
        C10_CUDA_CHECK_WARN(wait_for(current, side));
      }
    }
  } join{current, side};
  body(0);
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    body(1);
  }
  join.joined = true;
  C10_CUDA_CHECK(wait_for(current, side));
}

// A packed batch's segments take a launch (or a cooperative launch) each,
// the host's few microseconds: where its batch shrinks every few steps, a
// segment lasts at least 1/16 of the steps, so that a call runs at most
// about 16 of them after the first sequence ends (sequence.cpp, "Packed
// batches", and docs/performance.md).
constexpr int64_t kSegments = 16;

int64_t cuda_min_segment_steps(int64_t steps) {
  return (steps + kSegments - 1) / kSegments;
}

// From pinned memory, without waiting. A graph would replay the copy from
// host memory that the next call reuses, so a packed batch is not captured.
at::Tensor cuda_indices(std::vector<int64_t>&& values, c10::Device device) {
  TORCH_CHECK(
      c10::cuda::currentStreamCaptureStatusMayInitCtx() ==
          c10::cuda::CaptureStatus::None,
      "lltm::sequence: a packed batch (batch_sizes) cannot run inside a CUDA "
      "graph's capture: its row indices come from the host at every call; "
      "capture a padded batch instead");
  at::Tensor host = at::empty(
      {static_cast<int64_t>(values.size())},
      at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::copy(values.begin(), values.end(), host.mutable_data_ptr<int64_t>());
  return host.to(device, /*non_blocking=*/true);
}

// The caching allocator keeps freed blocks for the stream: nothing to keep.
at::Tensor cuda_scratch(
    Scratch /*slot*/,
    at::IntArrayRef sizes,
    const at::TensorOptions& options) {
  return at::empty(sizes, options);
}

struct Cuda {
  using Guard = c10::cuda::CUDAGuard;
  static const Engine& engine() {
    static constexpr Engine kEngine{
        &cuda_loops,
        &cuda_for_each_direction,
        &cuda_min_segment_steps,
        &cuda_indices,
        &cuda_scratch};
    return kEngine;
  }
};

} // namespace
} // namespace lltm::sequence

TORCH_LIBRARY_IMPL(lltm, CUDA, m) {
  using lltm::sequence::Cuda;
  using lltm::sequence::sequence_forward_kernel;
  m.impl("sequence", &sequence_forward_kernel<Cuda, false>);
  m.impl("sequence_forward", &sequence_forward_kernel<Cuda, true>);
  m.impl("sequence_backward", &lltm::sequence::sequence_backward_kernel<Cuda>);
}
