# SPDX-License-Identifier: MIT
# flash_kda_find_cutlass(<out-var>): the CUTLASS/CuTe include directory, no network.
#
#   1. FLASH_KDA_CUTLASS_DIR (CMake variable or environment): a CUTLASS checkout or its
#      include directory, e.g. /opt/cutlass or /opt/cutlass/include
#   2. the nvidia-cutlass Python package of the build's interpreter:
#      <site-packages>/cutlass_library/source/include

function(_flash_kda_cutlass_include dir out)
  set(found "")
  foreach(candidate "${dir}" "${dir}/include" "${dir}/source/include")
    if(EXISTS "${candidate}/cute/tensor.hpp" AND EXISTS "${candidate}/cutlass/arch/barrier.h")
      set(found "${candidate}")
      break()
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

function(flash_kda_find_cutlass out)
  set(dir "${FLASH_KDA_CUTLASS_DIR}")
  if(dir STREQUAL "")
    set(dir "$ENV{FLASH_KDA_CUTLASS_DIR}")
  endif()
  if(NOT dir STREQUAL "")
    _flash_kda_cutlass_include("${dir}" include)
    if(include STREQUAL "")
      message(FATAL_ERROR "FLASH_KDA_CUTLASS_DIR=${dir} holds no CUTLASS headers "
                          "(looked for cute/tensor.hpp in it, its include/ and source/include/)")
    endif()
  else()
    find_package(Python3 COMPONENTS Interpreter QUIET)
    set(include "")
    if(Python3_Interpreter_FOUND)
      execute_process(
        COMMAND "${Python3_EXECUTABLE}" -c
                "import importlib.util as u, os; s = u.find_spec('cutlass_library'); print(os.path.dirname(s.origin) if s else '')"
        OUTPUT_VARIABLE package RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(rc EQUAL 0 AND NOT package STREQUAL "")
        _flash_kda_cutlass_include("${package}" include)
      endif()
    endif()
    if(include STREQUAL "")
      message(FATAL_ERROR "CUTLASS/CuTe headers not found: install the nvidia-cutlass package "
                          "(pip install nvidia-cutlass) for ${Python3_EXECUTABLE}, or set "
                          "FLASH_KDA_CUTLASS_DIR to a CUTLASS checkout")
    endif()
  endif()
  message(STATUS "flash-kda: CUTLASS headers from ${include}")
  set(${out} "${include}" PARENT_SCOPE)
endfunction()
