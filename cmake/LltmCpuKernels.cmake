# The CPU kernels of each instruction set: lltm_add_cpu_kernels(target).
#
# sources.txt's cpu_kernels, among the module's sources, are the DEFAULT
# kernels, which any processor runs. On x86-64 Linux they are compiled again
# for each capability of cpp/cpu_kernels/capabilities.txt, each object with
# its own flags and CPU_CAPABILITY, as ATen builds its own kernels;
# cpp/cpu_kernels/dispatch.cpp picks one at run time. src/lltm/jit.py builds
# the same objects.
#
# An object compiled with -mavx2 holds its own copies of the inline functions
# of the headers it includes (c10, ATen, the standard library), compiled for
# AVX2, in COMDAT groups. The linker keeps one copy of each for the whole
# module, the first it meets, so code outside the AVX2 kernels could run an
# AVX2 copy on a processor without AVX2. objcopy makes every symbol of the
# object local but its table, and removes its COMDAT groups: its copies then
# serve that object alone, whatever the link order. That takes ELF, so
# elsewhere (Windows, macOS, Linux on other processors) the DEFAULT kernels
# are the only ones.

function(lltm_add_cpu_kernels target)
  if(NOT (CMAKE_SYSTEM_NAME STREQUAL "Linux"
          AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64)$"
          AND CMAKE_CXX_COMPILER_ID MATCHES "^(GNU|Clang)$"
          AND CMAKE_OBJCOPY))
    message(STATUS "lltm: CPU kernels for the DEFAULT capability only")
    return()
  endif()
  set(_list "${PROJECT_SOURCE_DIR}/cpp/cpu_kernels/capabilities.txt")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_list}")
  file(STRINGS "${_list}" _lines REGEX "^[A-Z]")
  foreach(_line IN LISTS _lines)
    separate_arguments(_flags UNIX_COMMAND "${_line}")
    list(POP_FRONT _flags _capability)
    string(TOLOWER "lltm_cpu_kernel_${_capability}" _kernels)
    add_library(${_kernels} OBJECT ${LLTM_SOURCES_cpu_kernels})
    target_compile_definitions(${_kernels} PRIVATE CPU_CAPABILITY=${_capability}
                                                   CPU_CAPABILITY_${_capability})
    target_compile_options(${_kernels} PRIVATE ${_flags})
    target_link_libraries(${_kernels} PRIVATE lltm_cxx)
    set_target_properties(${_kernels} PROPERTIES POSITION_INDEPENDENT_CODE ON
                                                 CXX_VISIBILITY_PRESET hidden)
    set(_object "${CMAKE_CURRENT_BINARY_DIR}/${_kernels}.o")
    add_custom_command(
      OUTPUT "${_object}"
      COMMAND "${CMAKE_OBJCOPY}" --keep-global-symbol=lltm_cpu_kernels_${_capability}
              --remove-section=.group "$<TARGET_OBJECTS:${_kernels}>" "${_object}"
      DEPENDS "$<TARGET_OBJECTS:${_kernels}>"
      VERBATIM)
    target_sources(${target} PRIVATE "${_object}")
    target_compile_definitions(${target} PRIVATE LLTM_HAVE_${_capability}_KERNELS)
    list(APPEND _built ${_capability})
  endforeach()
  list(JOIN _built ", " _built)
  message(STATUS "lltm: CPU kernels for DEFAULT, ${_built}")
endfunction()
