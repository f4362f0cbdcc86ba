// The CPU kernels' dispatch: which capability's kernels run, and how the
// rows of a problem are cut into at::parallel_for tasks.
//
// kernels.cpp is compiled once per CPU capability, and each object
// defines its capability's table. The build defines LLTM_HAVE_<name>_KERNELS
// for each capability it compiled besides DEFAULT (cpu_capabilities.txt, on
// x86-64 Linux only: cmake/LltmCpuKernels.cmake says why).
#include "cpp/cpu_kernels/kernels.h"

#include <ATen/Version.h>

#include <algorithm>
#include <string>

extern "C" {
extern const lltm::cpu::KernelTable LLTM_CPU_KERNEL_TABLE(DEFAULT);
#ifdef LLTM_HAVE_AVX2_KERNELS
extern const lltm::cpu::KernelTable LLTM_CPU_KERNEL_TABLE(AVX2);
#endif
#ifdef LLTM_HAVE_AVX512_KERNELS
extern const lltm::cpu::KernelTable LLTM_CPU_KERNEL_TABLE(AVX512);
#endif
}

namespace lltm::cpu {
namespace {

// The table of the best capability that ATen reports for this processor
// (which ATEN_CPU_CAPABILITY can lower, as for ATen's own kernels).
const KernelTable& best_table() {
  static const KernelTable& table = []() -> const KernelTable& {
    const std::string capability = at::get_cpu_capability();
#ifdef LLTM_HAVE_AVX512_KERNELS
    if (capability == "AVX512") {
      return LLTM_CPU_KERNEL_TABLE(AVX512);
    }
#endif
#ifdef LLTM_HAVE_AVX2_KERNELS
    if (capability == "AVX512" || capability == "AVX2") {
      return LLTM_CPU_KERNEL_TABLE(AVX2);
    }
#endif
    return LLTM_CPU_KERNEL_TABLE(DEFAULT);
  }();
  return table;
}

} // namespace

template <typename T>
const Kernels<T>& best_kernels() {
  return std::get<Kernels<T>>(best_table());
}

template const Kernels<float>& best_kernels();
template const Kernels<double>& best_kernels();
template const Kernels<c10::Half>& best_kernels();
template const Kernels<c10::BFloat16>& best_kernels();

// Rows per task: enough elements to be worth a thread.
int64_t rows_per_task(int64_t state_size) {
  constexpr int64_t kElementsPerTask = 16384;
  return std::max<int64_t>(
      1, kElementsPerTask / std::max<int64_t>(1, state_size));
}

} // namespace lltm::cpu
