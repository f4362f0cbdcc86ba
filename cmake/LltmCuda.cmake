# CUDA for lltm, included before find_package(Torch). Sets LLTM_WITH_CUDA
# (whether to build the kernels), LLTM_CUDA_ARCH_LIST and the function
# lltm_add_cuda_kernels.
#
# A CUDA build of torch needs a CUDA toolkit for its own CMake config, even
# when lltm builds no kernels (LLTM_CUDA=0): find one here, hand it to torch's
# CMake, and fail with a clear message when there is none.

set(LLTM_WITH_CUDA OFF)
# AUTO wants the kernels when they can be built; a true value forces them.
string(TOUPPER "${LLTM_CUDA}" _lltm_cuda_mode)
set(_lltm_force_cuda OFF)
if(_lltm_cuda_mode STREQUAL "AUTO")
  set(_lltm_want_cuda ON)
elseif(LLTM_CUDA)
  set(_lltm_want_cuda ON)
  set(_lltm_force_cuda ON)
else()
  set(_lltm_want_cuda OFF)
endif()

if(NOT LLTM_TORCH_CUDA)
  if(_lltm_force_cuda)
    message(FATAL_ERROR "lltm: LLTM_CUDA=${LLTM_CUDA} asks for the CUDA kernels, but torch "
                        "${LLTM_TORCH_VERSION} is a CPU build (torch.version.cuda is None). "
                        "Install a CUDA build of torch, or set LLTM_CUDA=0.")
  endif()
  message(STATUS "lltm: building without CUDA kernels: torch ${LLTM_TORCH_VERSION} is a CPU build")
  return()
endif()

# Find nvcc as torch.utils.cpp_extension does: CUDACXX, CUDA_HOME, PATH, then
# /usr/local/cuda.
if(NOT DEFINED ENV{CUDACXX} AND NOT CMAKE_CUDA_COMPILER)
  foreach(_root IN ITEMS "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" /usr/local/cuda)
    if(_root AND EXISTS "${_root}/bin/nvcc")
      set(CMAKE_CUDA_COMPILER "${_root}/bin/nvcc")
      break()
    endif()
  endforeach()
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  if(_lltm_force_cuda)
    set(_lltm_ask "LLTM_CUDA=${LLTM_CUDA} asks for the CUDA kernels, but no CUDA compiler was found")
  else()
    string(CONCAT _lltm_ask "torch ${LLTM_TORCH_VERSION} is a CUDA build, whose CMake config "
                  "needs the CUDA ${LLTM_TORCH_CUDA} toolkit even for a CPU-only build, and no "
                  "CUDA compiler was found")
  endif()
  message(FATAL_ERROR "lltm: ${_lltm_ask}: put nvcc on PATH, or set CUDACXX or CUDA_HOME "
                      "(or build against a CPU build of torch).")
endif()

enable_language(CUDA)
# Architectures are set on the kernel library (below); torch's CMake warns
# when a global default is set.
set(CMAKE_CUDA_ARCHITECTURES OFF)
string(REGEX MATCH "^[0-9]+" _torch_cuda_major "${LLTM_TORCH_CUDA}")
if(NOT CMAKE_CUDA_COMPILER_VERSION MATCHES "^${_torch_cuda_major}\\.")
  message(FATAL_ERROR "lltm: nvcc ${CMAKE_CUDA_COMPILER_VERSION} (${CMAKE_CUDA_COMPILER}) cannot "
                      "build for torch ${LLTM_TORCH_VERSION}, which uses CUDA ${LLTM_TORCH_CUDA}: "
                      "use a CUDA ${_torch_cuda_major}.x toolkit.")
endif()

# Architectures: TORCH_CUDA_ARCH_LIST when set, else machine code for each
# architecture the toolkit and torch support, sm_90 among them, plus PTX for
# the newest so that later GPUs can run it. No GPU is probed.
if(DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT "$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL "")
  string(REGEX REPLACE "[ ;]+" ";" LLTM_CUDA_ARCH_LIST "$ENV{TORCH_CUDA_ARCH_LIST}")
elseif(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13.0)
  set(LLTM_CUDA_ARCH_LIST 7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX)
elseif(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)
  set(LLTM_CUDA_ARCH_LIST 7.0 7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX)
else()
  set(LLTM_CUDA_ARCH_LIST 7.0 7.5 8.0 8.6 8.9 9.0+PTX)
endif()

# torch's CMake probes the GPU when TORCH_CUDA_ARCH_LIST is unset, and finds
# the toolkit through CUDA_TOOLKIT_ROOT_DIR (else the first nvcc on PATH,
# maybe a wrapper outside the toolkit): hand it ours.
set(ENV{TORCH_CUDA_ARCH_LIST} "${LLTM_CUDA_ARCH_LIST}")
file(REAL_PATH "${CMAKE_CUDA_COMPILER}" _lltm_nvcc)
cmake_path(GET _lltm_nvcc PARENT_PATH _lltm_cuda_home)
cmake_path(GET _lltm_cuda_home PARENT_PATH _lltm_cuda_home)
set(CUDA_TOOLKIT_ROOT_DIR "${_lltm_cuda_home}" CACHE PATH "The CUDA toolkit torch's CMake uses")
set(ENV{CUDA_HOME} "${_lltm_cuda_home}")
# torch's CMake also rewrites the global CUDA flags (gencode lists and more);
# the kernel library sets its own, per target.
set(_lltm_saved_cuda_flags "${CMAKE_CUDA_FLAGS}")

if(NOT _lltm_want_cuda)
  message(STATUS "lltm: building without CUDA kernels (LLTM_CUDA=${LLTM_CUDA})")
  return()
endif()
set(LLTM_WITH_CUDA ON)
message(STATUS "lltm: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${LLTM_CUDA_ARCH_LIST}")

# Adds the kernel library (cuda/) and the C++ layer over it to `target`.
function(lltm_add_cuda_kernels target)
  set(CMAKE_CUDA_FLAGS "${_lltm_saved_cuda_flags}")
  set(_archs "")
  foreach(_arch IN LISTS LLTM_CUDA_ARCH_LIST)
    if(NOT _arch MATCHES "^([0-9]+)\\.([0-9]+)([af]?)(\\+PTX)?$")
      message(FATAL_ERROR "lltm: cannot read '${_arch}' in TORCH_CUDA_ARCH_LIST; "
                          "expected entries like 9.0, 9.0a or 12.0+PTX")
    endif()
    set(_sm "${CMAKE_MATCH_1}${CMAKE_MATCH_2}${CMAKE_MATCH_3}")
    if(CMAKE_MATCH_4)
      list(APPEND _archs "${_sm}") # machine code and PTX
    else()
      list(APPEND _archs "${_sm}-real")
    endif()
  endforeach()

  # The kernel library: the .cu files of sources.txt's cuda group; the C++
  # over it joins the module.
  set(_kernels ${LLTM_SOURCES_cuda})
  list(FILTER _kernels INCLUDE REGEX "\\.cu$")
  set(_bridge ${LLTM_SOURCES_cuda})
  list(FILTER _bridge EXCLUDE REGEX "\\.cu$")
  add_library(lltm_cuda_kernels STATIC ${_kernels})
  target_include_directories(lltm_cuda_kernels PRIVATE "${PROJECT_SOURCE_DIR}")
  set_target_properties(
    lltm_cuda_kernels
    PROPERTIES CUDA_ARCHITECTURES "${_archs}"
               CUDA_STANDARD 17
               CUDA_STANDARD_REQUIRED ON
               POSITION_INDEPENDENT_CODE ON
               CUDA_VISIBILITY_PRESET hidden
               # The CUDA runtime torch loads, not a second, static copy.
               CUDA_RUNTIME_LIBRARY Shared)
  target_compile_options(lltm_cuda_kernels PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>")
  # As torch.utils.cpp_extension compiles CUDA (the JIT flavor): no implicit
  # half/bfloat16 conversions, so both builds accept the same code.
  target_compile_definitions(
    lltm_cuda_kernels PRIVATE __CUDA_NO_HALF_OPERATORS__ __CUDA_NO_HALF_CONVERSIONS__
                              __CUDA_NO_BFLOAT16_CONVERSIONS__ __CUDA_NO_HALF2_OPERATORS__)
  target_sources(${target} PRIVATE ${_bridge})
  target_link_libraries(${target} PRIVATE lltm_cuda_kernels)
endfunction()
