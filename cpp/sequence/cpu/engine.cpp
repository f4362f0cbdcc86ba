// The sequence ops on the CPU: the engine under its paths (steps.cpp,
// onednn.cpp, fused.cpp, fused_input.cpp, dpbf16.cpp, dpbf16_input.cpp):
// the directions on threads, a packed batch's segments and indices, the
// op's buffers and the paths' layouts of W kept between calls, and the
// GEMMs around the blocks (gemm.cpp).
// cpp/sequence/run.cpp and backward.cpp do the rest (sequence.h states the
// math).
#include "cpp/cell/backend.h"
#include "cpp/sequence/choice.h"
#include "cpp/sequence/cpu/gemm.h"
#include "cpp/sequence/path.h"
#include "cpp/sequence/sequence.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <vector>

namespace lltm::sequence {
namespace {

// A direction on a thread of its own runs its steps on that thread.
int64_t cpu_threads() {
  return at::in_parallel_region() ? 1 : at::get_num_threads();
}

std::string cpu_context() {
  return "threads=" + std::to_string(cpu_threads());
}

double cpu_time_us(c10::function_ref<void()> run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  const std::chrono::duration<double, std::micro> took =
      std::chrono::steady_clock::now() - start;
  return took.count();
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

// Both directions' steps in one parallel region a step where there are
// more threads than directions and a step's work spreads over them: on
// threads of their own, each direction's steps had one thread, the others
// idle (a bidirectional layer at 16 threads ran at 0.94x nn.LSTM). Apart,
// a step of M multiply-adds (batch x 3 state x state) takes M / r on its
// thread; together, 2 M / (r n) on n threads plus a barrier, which pays
// where M (n - 2) / n is past about 2^17 multiply-adds: measured on a
// 16-core Xeon, apart ran faster at 2^15.6 and together at 2^17.6 with 16
// threads; with 4, the two met at 2^17.6 (docs/performance.md).
constexpr int64_t kTogetherStepMacs = int64_t(1) << 17;

bool cpu_together(const Sizes& sizes, int64_t directions) {
  const int64_t S = sizes.state_size;
  const int64_t threads = at::get_num_threads();
  return directions > 1 && !at::in_parallel_region() && threads > directions &&
      sizes.batch * 3 * S * S * (threads - directions) >=
      kTogetherStepMacs * threads;
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

// The op's own buffers and the paths' layouts of W, kept by each thread
// from call to call: a fresh buffer of megabytes comes from the system,
// whose page faults at its first writes cost more than the GEMM that fills
// it (docs/performance.md, "The CPU's paths"). A buffer past kScratchKept
// bytes is not kept. The choice's measured runs (inside a call, whose own
// buffers are in use) keep a set of their own: in fresh bytes, each run
// paid the faults that a call of the path does not, and the choice kept
// paths up to 1.5x slower than the best (docs/performance.md, "Timing the
// candidates").
constexpr size_t kScratchKept = size_t(256) << 20;

// `sizes` of `options` in the bytes that `kept` holds where they suffice,
// else in fresh bytes, which `kept` then holds.
at::Tensor reused(
    at::Tensor& kept,
    at::IntArrayRef sizes,
    const at::TensorOptions& options) {
  const at::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
  const auto bytes = static_cast<int64_t>(
      c10::multiply_integers(sizes) * c10::elementSize(dtype));
  at::Tensor bytes_of = kept.defined() && kept.numel() >= bytes
      ? kept
      : at::empty({bytes}, options.dtype(at::kByte));
  kept = static_cast<size_t>(bytes) <= kScratchKept ? bytes_of : at::Tensor();
  return bytes_of.narrow(0, 0, bytes).view(dtype).view(sizes);
}

at::Tensor cpu_scratch(
    Scratch slot,
    at::IntArrayRef sizes,
    const at::TensorOptions& options) {
  thread_local std::array<std::array<at::Tensor, kScratchSlots>, 2> kept;
  return reused(
      kept[choice::Forced::active() ? 1 : 0][static_cast<size_t>(slot)],
      sizes,
      options);
}

constexpr Engine kCpuEngine{
    c10::DeviceType::CPU,
    &cpu_context,
    &cpu_time_us,
    /*steps_timed=*/32,
    /*capturing=*/nullptr,
    &cpu_for_each_direction,
    &cpu_together,
    &cpu_min_segment_steps,
    &cpu_indices,
    &cpu_scratch,
    &cpu_paths::mm};
const EngineRegistration kRegistration{kCpuEngine};

struct Cpu {
  using Guard = backend::NoGuard;
  static const Engine& engine() {
    return kCpuEngine;
  }
};

} // namespace

at::Tensor layout_buffer(
    const void* owner,
    int index,
    at::IntArrayRef sizes,
    const at::TensorOptions& options) {
  struct Layout {
    const void* owner;
    int index;
    bool measured;
    at::Tensor bytes;
  };
  thread_local std::vector<Layout> kept;
  const bool measured = choice::Forced::active();
  auto it = std::find_if(kept.begin(), kept.end(), [&](const Layout& l) {
    return l.owner == owner && l.index == index && l.measured == measured;
  });
  if (it == kept.end()) {
    it = kept.insert(kept.end(), {owner, index, measured, at::Tensor()});
  }
  return reused(it->bytes, sizes, options);
}

} // namespace lltm::sequence

TORCH_LIBRARY_IMPL(lltm, CPU, m) {
  using lltm::sequence::Cpu;
  using lltm::sequence::sequence_forward_kernel;
  m.impl("sequence", &sequence_forward_kernel<Cpu, false>);
  m.impl("sequence_forward", &sequence_forward_kernel<Cpu, true>);
  m.impl("sequence_backward", &lltm::sequence::sequence_backward_kernel<Cpu>);
}
