# SPDX-License-Identifier: MIT
# The files CMake writes from the product table of FlashKdaArchs.cmake, so that no source
# file spells the arch list out again. Both go under FLASH_KDA_GENERATED (set by the caller)
# and are rewritten only when their text changes, so a re-configure rebuilds nothing.
#
#   flash_kda_arch_tu(<arch> <out-var>)                one arch's translation unit
#   flash_kda_build_info(<path> <request> <archs>)     flash_kda/_build_info.py

# One arch's TU from src/arch/arch.cu.in (@ARCH@ and @CC@ filled in). It keeps the name the
# hand-written TUs had, sm<arch>.cu: cmake/time-tu.sh and .ci/run's log print that name.
# Example: flash_kda_arch_tu(90a tu) writes ${FLASH_KDA_GENERATED}/arch/sm90a.cu, whose
# code lines are `#define FLASH_KDA_ARCH sm90a`, `#define FLASH_KDA_CC 90`, `#include "kda/launch.cuh"` and
# `FLASH_KDA_DEFINE_ARCH_TABLE(/*name=*/"sm_90a", /*cc=*/90);`, and sets tu to its path.
function(flash_kda_arch_tu arch out)
  set(ARCH ${arch})
  set(CC ${_FLASH_KDA_CC_${arch}})
  set(path "${FLASH_KDA_GENERATED}/arch/sm${arch}.cu")
  configure_file("${PROJECT_SOURCE_DIR}/src/arch/arch.cu.in" "${path}" @ONLY)
  set(${out} "${path}" PARENT_SCOPE)
endfunction()

# A Python tuple literal of strings. Example: "90a;100a" -> ("90a", "100a"), and
# "90a" -> ("90a",) (the comma makes a one-element tuple).
function(_flash_kda_py_str_tuple items out)
  list(TRANSFORM items PREPEND "\"")
  list(TRANSFORM items APPEND "\"")
  list(JOIN items ", " text)
  list(LENGTH items count)
  if(count EQUAL 1)
    string(APPEND text ",")
  endif()
  set(${out} "(${text})" PARENT_SCOPE)
endfunction()

# flash_kda/_build_info.py from cmake/build_info.py.in: the product table, the arches built,
# the request and the nvcc version (the fields are documented in the template's docstring).
# Example: flash_kda_build_info(${FLASH_KDA_GENERATED}/_build_info.py all "90a;100a") with
# nvcc 13.0.88 writes BUILT_ARCHS = ("90a", "100a"), NVCC_VERSION = "13.0.88",
# FLASH_KDA_CUDA_ARCHS = "all", DEBUG_WAITS = False and PRODUCT_ARCHS = ({"arch": "90a", "compute_capability":
# 90, "min_nvcc": "12.0"}, ...), one dict per row of the product table.
function(flash_kda_build_info path request archs)
  set(FLASH_KDA_PY_PRODUCT_ARCHS "(\n")
  foreach(arch IN LISTS _FLASH_KDA_ARCHS)
    string(APPEND FLASH_KDA_PY_PRODUCT_ARCHS "    {\"arch\": \"${arch}\", \"compute_capability\": "
           "${_FLASH_KDA_CC_${arch}}, \"min_nvcc\": \"${_FLASH_KDA_MIN_NVCC_${arch}}\"},\n")
  endforeach()
  string(APPEND FLASH_KDA_PY_PRODUCT_ARCHS ")")
  _flash_kda_py_str_tuple("${archs}" FLASH_KDA_PY_BUILT_ARCHS)
  set(FLASH_KDA_PY_REQUEST "${request}")
  if(FLASH_KDA_DEBUG_WAITS)
    set(FLASH_KDA_PY_DEBUG_WAITS True)
  else()
    set(FLASH_KDA_PY_DEBUG_WAITS False)
  endif()
  configure_file("${PROJECT_SOURCE_DIR}/cmake/build_info.py.in" "${path}" @ONLY)
endfunction()
