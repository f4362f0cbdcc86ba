// The LLTM CPU kernels for x86-64 processors with AVX2 and FMA.
//
// The instruction set is chosen here, by a pragma, rather than by per-file
// compiler flags, so that the CMake build and the JIT build
// (torch.utils.cpp_extension, which has one set of flags for every file)
// compile this file alike. The pragma does not define the macros that
// -mavx2 would, and at::vec's AVX2 code and Sleef's declarations test them,
// so they are defined too. This file comes after the other sources in the
// link, so that the linker keeps their copies of any inline function the
// headers define, which any processor can run.
#include "lltm_cpu_kernel.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LLTM_BUILD_AVX2 1
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
#pragma GCC diagnostic ignored "-Wpsabi"
#ifndef __AVX2__
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#endif
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "lltm_cpu_kernel_impl.h"
#endif

namespace lltm::cpu {

template <typename T>
Kernels<T> avx2_kernels() {
#ifdef LLTM_BUILD_AVX2
  return CPU_CAPABILITY::kernels<T>();
#else
  return {nullptr, nullptr};
#endif
}

template Kernels<float> avx2_kernels();
template Kernels<double> avx2_kernels();
template Kernels<c10::Half> avx2_kernels();
template Kernels<c10::BFloat16> avx2_kernels();

} // namespace lltm::cpu
