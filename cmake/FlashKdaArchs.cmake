# SPDX-License-Identifier: MIT
# flash_kda_arch_request(<request-var>): FLASH_KDA_CUDA_ARCHS normalized (lower case, no
# spaces; unset means auto). flash_kda_enable_cuda(): the CUDA language, or an error that says
# what to install or set. flash_kda_resolve_archs(<archs-var> <request>): the arches to build.
#
#   FLASH_KDA_CUDA_ARCHS=auto        the visible GPUs' arches (nvidia-smi); with no GPU
#                                    visible, says so and builds `all`
#   FLASH_KDA_CUDA_ARCHS=all         every arch of the product this nvcc can build
#   FLASH_KDA_CUDA_ARCHS=90a,100a    exactly those (an `sm_` prefix is accepted)
#   FLASH_KDA_CUDA_ARCHS=none        no kernels and no CUDA toolkit: the package's PyTorch and
#                                    fla paths only (a pure-Python wheel, pyproject.toml)
#
# Example: FLASH_KDA_CUDA_ARCHS=all with nvcc 13.0 -> archs "90a;100a;103a;110a;120a;121a"
# and request "all"; with nvcc 12.8 -> archs "90a;100a;120a". The value comes from the
# CMake variable (what scikit-build-core passes) or else the environment; unset means auto.

# The product's arches: the one list every other file derives from (the arch TUs, the
# wheel's flash_kda/_build_info.py, wheels/check_wheel.py, the tests). Each row: the arch,
# the first nvcc that can build it, and the compute capability (10 * major + minor) whose
# GPUs run its kernels. `cmake -P cmake/FlashKdaArchs.cmake` prints the table. Example:
# _flash_kda_product_arch(90a 12.0 90) appends 90a to _FLASH_KDA_ARCHS and sets
# _FLASH_KDA_MIN_NVCC_90a=12.0, _FLASH_KDA_CC_90a=90. A macro: the rows set file scope.
macro(_flash_kda_product_arch arch min_nvcc cc)
  list(APPEND _FLASH_KDA_ARCHS ${arch})
  set(_FLASH_KDA_MIN_NVCC_${arch} ${min_nvcc})
  set(_FLASH_KDA_CC_${arch} ${cc})
endmacro()
set(_FLASH_KDA_ARCHS "")
#                       arch  min nvcc  compute capability
_flash_kda_product_arch(90a   12.0      90)   # H100, H200, GH200
_flash_kda_product_arch(100a  12.8      100)  # B200, GB200
_flash_kda_product_arch(103a  12.9      103)  # B300, GB300
_flash_kda_product_arch(110a  13.0      110)  # Jetson Thor
_flash_kda_product_arch(120a  12.8      120)  # RTX 50xx, RTX PRO Blackwell
_flash_kda_product_arch(121a  12.9      121)  # DGX Spark

# "9.0" -> "90a": the product arch for that compute capability, else "".
function(_flash_kda_arch_of_capability cap out)
  string(REPLACE "." "" digits "${cap}")
  set(found "")
  foreach(arch IN LISTS _FLASH_KDA_ARCHS)
    if("${_FLASH_KDA_CC_${arch}}" STREQUAL "${digits}")
      set(found ${arch})
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

function(_flash_kda_nvcc_supports arch out)
  if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL "${_FLASH_KDA_MIN_NVCC_${arch}}")
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

function(_flash_kda_all_archs out)
  set(archs "")
  foreach(arch IN LISTS _FLASH_KDA_ARCHS)
    _flash_kda_nvcc_supports(${arch} ok)
    if(ok)
      list(APPEND archs ${arch})
    endif()
  endforeach()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

# The arches of the visible GPUs that the product has kernels for; `seen` lists all GPUs.
function(_flash_kda_visible_archs out seen)
  set(archs "")
  set(caps "")
  find_program(_FLASH_KDA_NVIDIA_SMI nvidia-smi)
  if(_FLASH_KDA_NVIDIA_SMI)
    execute_process(COMMAND ${_FLASH_KDA_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE smi RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(rc EQUAL 0)
      string(REPLACE "\n" ";" caps "${smi}")
      foreach(cap IN LISTS caps)
        string(STRIP "${cap}" cap)
        _flash_kda_arch_of_capability("${cap}" arch)
        if(arch AND NOT arch IN_LIST archs)
          list(APPEND archs ${arch})
        endif()
      endforeach()
    endif()
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
  set(${seen} "${caps}" PARENT_SCOPE)
endfunction()

function(flash_kda_arch_request out)
  set(request "${FLASH_KDA_CUDA_ARCHS}")
  if(request STREQUAL "")
    set(request "$ENV{FLASH_KDA_CUDA_ARCHS}")
  endif()
  if(request STREQUAL "")
    set(request auto)
  endif()
  string(TOLOWER "${request}" request)
  string(REPLACE " " "" request "${request}")
  set(${out} "${request}" PARENT_SCOPE)
endfunction()

# The CUDA language (nvcc), found as CMake finds it (CUDACXX, CMAKE_CUDA_COMPILER, PATH), or
# a configure error naming what to install or set.
macro(flash_kda_enable_cuda)
  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR
      "flash-kda: no CUDA compiler (nvcc) found, which the kernels need. Install the CUDA "
      "toolkit (12.8 or newer builds every arch but 103a, 110a and 121a, which need 12.9 or "
      "13.0; 12.0 builds sm_90a) and put its bin/ on PATH, or point CUDACXX or "
      "CMAKE_CUDA_COMPILER at nvcc. To build without kernels (the PyTorch and fla paths only), "
      "set FLASH_KDA_CUDA_ARCHS=none.")
  endif()
  enable_language(CUDA)
endmacro()

function(flash_kda_resolve_archs out request)
  string(REPLACE ";" "," valid_list "${_FLASH_KDA_ARCHS}")
  set(valid "auto, all, none, or a comma list of ${valid_list}")
  set(nvcc "nvcc ${CMAKE_CUDA_COMPILER_VERSION}")
  _flash_kda_all_archs(all_archs)
  set(skipped "")
  foreach(arch IN LISTS _FLASH_KDA_ARCHS)
    if(NOT arch IN_LIST all_archs)
      list(APPEND skipped "${arch} (needs nvcc ${_FLASH_KDA_MIN_NVCC_${arch}})")
    endif()
  endforeach()
  if(skipped)
    string(REPLACE ";" ", " skipped "; not ${skipped}")
  endif()

  if(request STREQUAL "auto")
    _flash_kda_visible_archs(archs seen)
    string(REPLACE ";" ", " seen_text "${seen}")
    if(NOT archs STREQUAL "")
      set(why "auto: the visible GPUs are compute capability ${seen_text}")
    else()
      set(archs "${all_archs}")
      if(seen STREQUAL "")
        set(why "auto: no GPU visible, so every arch ${nvcc} builds${skipped}")
      else()
        string(CONCAT why "auto: the visible GPUs (compute capability ${seen_text}) have no "
               "native kernels and use the fallback, so every arch ${nvcc} builds${skipped}")
      endif()
    endif()
  elseif(request STREQUAL "all")
    set(archs "${all_archs}")
    set(why "all: every arch ${nvcc} builds${skipped}")
  else()
    string(REPLACE "," ";" entries "${request}")
    set(archs "")
    foreach(entry IN LISTS entries)
      string(REGEX REPLACE "^sm_" "" arch "${entry}")
      if(NOT arch IN_LIST _FLASH_KDA_ARCHS)
        message(FATAL_ERROR "FLASH_KDA_CUDA_ARCHS: unknown arch '${entry}'; valid values: ${valid}")
      endif()
      _flash_kda_nvcc_supports(${arch} ok)
      if(NOT ok)
        message(FATAL_ERROR "FLASH_KDA_CUDA_ARCHS: ${arch} needs nvcc >= ${_FLASH_KDA_MIN_NVCC_${arch}}, "
                            "found ${CMAKE_CUDA_COMPILER_VERSION}; valid values: ${valid}")
      endif()
      if(NOT arch IN_LIST archs)
        list(APPEND archs ${arch})
      endif()
    endforeach()
    set(why "${request}: as requested, ${nvcc}")
  endif()
  if(archs STREQUAL "")
    message(FATAL_ERROR "FLASH_KDA_CUDA_ARCHS=${request}: ${nvcc} supports none of ${valid_list}")
  endif()
  string(REPLACE ";" ", " archs_text "${archs}")
  message(STATUS "flash-kda: building kernels for ${archs_text} (FLASH_KDA_CUDA_ARCHS=${why})")
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

# `cmake -P cmake/FlashKdaArchs.cmake` prints the product table on stdout, a header line
# then one row per arch, e.g. "90a 12.0 90" (tests/test_build.py reads it).
if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  set(table "arch min_nvcc compute_capability")
  foreach(arch IN LISTS _FLASH_KDA_ARCHS)
    string(APPEND table "\n${arch} ${_FLASH_KDA_MIN_NVCC_${arch}} ${_FLASH_KDA_CC_${arch}}")
  endforeach()
  execute_process(COMMAND "${CMAKE_COMMAND}" -E echo "${table}")
endif()
