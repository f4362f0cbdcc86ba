// The sequence ops on CUDA: the engine under its paths (cluster.cpp,
// persistent.cpp, fused.cpp, steps.cpp): the directions on streams, a packed
// batch's segments and indices. cpp/sequence/run.cpp and backward.cpp do the
// rest (sequence.h states the math). Each call validates its inputs with the
// shared checks, sets the device, and launches on the current stream of the
// inputs' device.
#include "cpp/cell/backend.h"
#include "cpp/sequence/path.h"
#include "cpp/sequence/sequence.h"

#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>

namespace lltm::sequence {
namespace {

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
// about 16 of them after the first sequence ends (segments.h, "Packed
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

// The current GPU's name: a choice measured on one kind of GPU is not
// another's. Asked once per device (the runtime's query takes a while).
std::string cuda_context() {
  const c10::DeviceIndex device = c10::cuda::current_device();
  static std::mutex mutex;
  static std::unordered_map<c10::DeviceIndex, std::string> names;
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, added] = names.try_emplace(device);
  if (added) {
    cudaDeviceProp properties{};
    C10_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    it->second = std::string("gpu=") + properties.name;
  }
  return it->second;
}

// Between two events on the current stream, so that the time is the GPU's
// with the host's gaps between launches in it; events made for the run and
// let go also when it throws.
double cuda_time_us(c10::function_ref<void()> run) {
  struct Events {
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
    ~Events() {
      for (cudaEvent_t event : {start, stop}) {
        if (event != nullptr) {
          C10_CUDA_CHECK_WARN(cudaEventDestroy(event));
        }
      }
    }
  } events;
  C10_CUDA_CHECK(cudaEventCreate(&events.start));
  C10_CUDA_CHECK(cudaEventCreate(&events.stop));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  C10_CUDA_CHECK(cudaEventRecord(events.start, stream));
  run();
  C10_CUDA_CHECK(cudaEventRecord(events.stop, stream));
  C10_CUDA_CHECK(cudaEventSynchronize(events.stop));
  float ms = 0;
  C10_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
  return 1e3 * static_cast<double>(ms);
}

bool cuda_capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() !=
      c10::cuda::CaptureStatus::None;
}

// The caching allocator keeps freed blocks for the stream: nothing to keep.
at::Tensor cuda_scratch(
    Scratch /*slot*/,
    at::IntArrayRef sizes,
    const at::TensorOptions& options) {
  return at::empty(sizes, options);
}

constexpr Engine kCudaEngine{
    c10::DeviceType::CUDA,
    &cuda_context,
    &cuda_time_us,
    // A step of a small block takes a few microseconds, as much as the
    // host's jitter over a call: 32 steps left the slope to noise.
    /*steps_timed=*/128,
    &cuda_capturing,
    &cuda_for_each_direction,
    /*together=*/nullptr,
    &cuda_min_segment_steps,
    &cuda_indices,
    &cuda_scratch,
    /*mm=*/nullptr};
const EngineRegistration kRegistration{kCudaEngine};

struct Cuda {
  using Guard = c10::cuda::CUDAGuard;
  static const Engine& engine() {
    return kCudaEngine;
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
