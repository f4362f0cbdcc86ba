// The LLTM CPU kernels for x86-64 processors with AVX-512 (F, BW, VL, DQ),
// the set ATen's AVX512 capability asks for. How the instruction set is
// chosen: see lltm_cpu_kernel_avx2.cpp.
#include "lltm_cpu_kernel.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LLTM_BUILD_AVX512 1
#pragma GCC target( \
    "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi,bmi2,lzcnt,popcnt")
#pragma GCC diagnostic ignored "-Wpsabi"
#ifndef __AVX512F__
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512VL__ 1
#define __AVX512DQ__ 1
#endif
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include "lltm_cpu_kernel_impl.h"
#endif

namespace lltm::cpu {

template <typename T>
Kernels<T> avx512_kernels() {
#ifdef LLTM_BUILD_AVX512
  return CPU_CAPABILITY::kernels<T>();
#else
  return {nullptr, nullptr};
#endif
}

template Kernels<float> avx512_kernels();
template Kernels<double> avx512_kernels();
template Kernels<c10::Half> avx512_kernels();
template Kernels<c10::BFloat16> avx512_kernels();

} // namespace lltm::cpu
