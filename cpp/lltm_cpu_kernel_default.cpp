// The LLTM CPU kernels for any processor: at::vec's portable Vectorized
// (NEON on arm64).
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT

#include "lltm_cpu_kernel_impl.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

namespace lltm::cpu {

template <typename T>
Kernels<T> default_kernels() {
  return CPU_CAPABILITY::kernels<T>();
}

template Kernels<float> default_kernels();
template Kernels<double> default_kernels();
template Kernels<c10::Half> default_kernels();
template Kernels<c10::BFloat16> default_kernels();

} // namespace lltm::cpu
