// What the two flavors of the persistent kernel in one thread-block cluster
// (sm_90 on) share: cluster.cu's, whose math runs on CUDA cores in every
// type, and cluster_mma.cu's, on tensor cores for float16 and bfloat16. The
// exchange between steps (stores and bulk copies into distributed shared
// memory, counted down a transaction barrier), and a launch of one cluster.
#pragma once

#include "cuda/common/device.h"
#include "cuda/sequence/persistent/persistent.h"
#include "cuda/sequence/sequence.h"

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdint>

namespace lltm::cuda::detail {

// --- the exchange ------------------------------------------------------------
// Each block's values of step t go into the tile of every block of the
// cluster, by st.async (send_element; this block too) or a bulk copy
// (send_bulk; to the others, a block stores its own part), and each
// st.async or copy counts its bytes down a transaction barrier (mbarrier)
// of the block it lands in. A block then waits on its own barrier for
// exactly the bytes of a step: the whole tile (less its own part, where it
// stored that; a block barrier orders those stores). Nothing waits for
// its own stores to land (a release at the cluster's barrier does), and no
// block waits for another to arrive. With the tile double-buffered, no
// barrier is needed after the read either: a block can send step t + 1's
// values only once it has every block's step t ones, and each block sent
// those after its last read of the buffer they overwrite. Bytes may land
// before their phase is armed (barrier_expect): the arrival it makes holds
// the phase open until then.

// The cluster's barrier, once before the first step: every block has
// started, with its barriers initialized, before any block stores into it.
[[maybe_unused]] __device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

[[maybe_unused]] __device__ __forceinline__ uint32_t
shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Arms the barrier's current phase: one arrival, and `bytes` to come.
[[maybe_unused]] __device__ __forceinline__ void barrier_expect(
    uint64_t* bar,
    uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                   shared_address(bar)),
               "r"(bytes)
               : "memory");
#endif
}

// A barrier whose phases complete on one arrival and their bytes, its first
// one armed; seen by the other blocks after the next cluster_sync.
[[maybe_unused]] __device__ __forceinline__ void barrier_init(
    uint64_t* bar,
    uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar))
      : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  barrier_expect(bar, bytes);
#endif
}

// Until the barrier's phase of this parity has completed. At the block's
// scope, as the CUDA C++ examples of st.async wait: the cluster's would
// invalidate L1 at every step.
[[maybe_unused]] __device__ __forceinline__ void barrier_wait(
    uint64_t* bar,
    uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

// The end of a step: until the phase of this parity of the barrier has
// completed (every block's bytes are in), then its next phase armed for
// `bytes` more, by one thread.
[[maybe_unused]] __device__ __forceinline__ void barrier_pass(
    uint64_t* bar,
    uint32_t parity,
    uint32_t bytes) {
  barrier_wait(bar, parity);
  if (threadIdx.x == 0) {
    barrier_expect(bar, bytes);
  }
}

// The address of this block's shared `p` in block `rank` of the cluster.
// Not volatile: the compiler may share one mapping between stores.
[[maybe_unused]] __device__ __forceinline__ uint32_t
map_to(const void* p, int rank) {
  uint32_t there = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mapa.shared::cluster.u32 %0, %1, %2;"
      : "=r"(there)
      : "r"(shared_address(p)), "r"(rank));
#endif
  return there;
}

// v into this block's tile at `at`, in block `rank` (this one too), by
// st.async on that block's barrier `bar`.
template <typename A>
__device__ __forceinline__ void send_element(
    const A* at,
    int rank,
    A v,
    uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t there = map_to(at, rank);
  const uint32_t bar_there = map_to(bar, rank);
  if constexpr (sizeof(A) == 4) {
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::
            "r"(there),
        "r"(__float_as_uint(v)),
        "r"(bar_there)
        : "memory");
  } else {
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::
            "r"(there),
        "l"(__double_as_longlong(v)),
        "r"(bar_there)
        : "memory");
  }
#endif
}

// Orders this thread's ordinary shared-memory writes before the bulk copies
// that read them (send_bulk): those run in the async proxy.
[[maybe_unused]] __device__ __forceinline__ void fence_for_bulk() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// `bytes` (a multiple of 16) from this block's shared `from` to `to` (the
// address of this block's copy) in block `rank`, by the bulk-copy engine,
// counted down that block's barrier `bar`.
[[maybe_unused]] __device__ __forceinline__ void send_bulk(
    const void* to,
    int rank,
    const void* from,
    uint32_t bytes,
    uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes "
      "[%0], [%1], %2, [%3];" ::"r"(map_to(to, rank)),
      "r"(shared_address(from)),
      "r"(bytes),
      "r"(map_to(bar, rank))
      : "memory");
#endif
}

// --- the launch --------------------------------------------------------------

// A launch of `tiles` clusters of `blocks` blocks of `threads` threads: grid
// (blocks, tiles), a cluster a row of it. The configuration points at the
// attribute beside it, so the two live together.
struct ClusterLaunch {
  cudaLaunchAttribute attribute{};
  cudaLaunchConfig_t config{};

  ClusterLaunch(
      int blocks,
      int threads,
      size_t shared_bytes,
      cudaStream_t stream,
      int tiles = 1) {
    const auto n = static_cast<unsigned int>(blocks);
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = n;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.gridDim = dim3(n, static_cast<unsigned int>(tiles));
    config.blockDim = dim3(static_cast<unsigned int>(threads));
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// kernel(args, tiling) as a cluster plan says: plan.tiles clusters of
// plan.blocks blocks of `threads` threads.
template <typename Args, typename Tiling>
cudaError_t launch_clusters(
    const void* kernel,
    const Args& args,
    const Tiling& tiling,
    const SequencePlan& plan,
    int threads,
    cudaStream_t stream) {
  Args a = args;
  Tiling t = tiling;
  void* params[] = {&a, &t};
  ClusterLaunch launch(
      plan.blocks, threads, plan.shared_bytes, stream, plan.tiles);
  const cudaError_t launched =
      cudaLaunchKernelExC(&launch.config, kernel, params);
  return launched != cudaSuccess ? launched : cudaGetLastError();
}

// The most blocks of Kernel (of `threads` threads) that one cluster of this
// device runs at the device's most shared memory per block (16, on sm_90,
// where the device allows a cluster beyond the portable 8), or 0 where it
// has no clusters. Asked once per kernel and device, at the most shared
// memory: one block per multiprocessor, the fewest a cluster can be placed
// with. Raises the kernel's shared-memory limit to that most.
template <auto Kernel>
cudaError_t cluster_blocks(const DeviceLimits& limits, int threads, int* out) {
  static std::array<std::atomic<int>, 64> known{}; // blocks + 1; 0: unasked
  std::atomic<int>& here = known[device_slot(limits.device)];
  const int seen = here.load(std::memory_order_acquire);
  if (seen != 0) {
    *out = seen - 1;
    return cudaSuccess;
  }
  int blocks = 0;
  const auto* kernel = reinterpret_cast<const void*>(Kernel);
  // The code the device runs, not only the device: a build for sm_80 with
  // PTX runs on an sm_90 GPU, JIT-compiled for sm_80's features, where the
  // kernel is a stub.
  cudaFuncAttributes compiled{};
  if (limits.capability >= 90) {
    if (const cudaError_t status = cudaFuncGetAttributes(&compiled, kernel);
        status != cudaSuccess) {
      return status;
    }
  }
  if (limits.capability >= 90 && compiled.ptxVersion >= 90) {
    cudaError_t status = cudaFuncSetAttribute(
        kernel,
        cudaFuncAttributeMaxDynamicSharedMemorySize,
        limits.shared_bytes);
    if (status == cudaSuccess) {
      status = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    }
    for (const int n : {16, 8}) {
      if (status != cudaSuccess || blocks != 0) {
        break;
      }
      ClusterLaunch launch(
          n, threads, static_cast<size_t>(limits.shared_bytes), nullptr);
      int clusters = 0;
      status =
          cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config);
      if (status == cudaSuccess && clusters > 0) {
        blocks = n;
      }
    }
    if (status != cudaSuccess) {
      return status;
    }
  }
  here.store(blocks + 1, std::memory_order_release);
  *out = blocks;
  return cudaSuccess;
}

// The current device's limits, and in `most` the most blocks a cluster of
// Forward's kernel (Backward's, when `backward`) holds there (cluster_blocks).
template <auto Forward, auto Backward>
cudaError_t cluster_limits(
    bool backward,
    int threads,
    DeviceLimits* limits,
    int* most) {
  *most = 0;
  const cudaError_t status = device_limits(limits);
  if (status != cudaSuccess) {
    return status;
  }
  return backward ? cluster_blocks<Backward>(*limits, threads, most)
                  : cluster_blocks<Forward>(*limits, threads, most);
}

} // namespace lltm::cuda::detail
