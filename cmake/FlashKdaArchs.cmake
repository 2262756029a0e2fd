# SPDX-License-Identifier: MIT
# flash_kda_resolve_archs(<out-var>): turn FLASH_KDA_CUDA_ARCHS into the arches to build.
#
#   FLASH_KDA_CUDA_ARCHS=auto        the visible GPUs' arches (nvidia-smi); with no GPU
#                                    visible, says so and builds `all`
#   FLASH_KDA_CUDA_ARCHS=all         every arch of the product this nvcc can build
#   FLASH_KDA_CUDA_ARCHS=90a,100a    exactly those (an `sm_` prefix is accepted)
#
# Example: FLASH_KDA_CUDA_ARCHS=all with nvcc 13.0 -> "90a;100a;103a;110a;120a;121a";
# with nvcc 12.8 -> "90a;100a;120a". The value comes from the CMake variable (what
# scikit-build-core passes) or else the environment; unset means auto.

# The product's arches, each with the first nvcc that can build it.
set(_FLASH_KDA_ARCHS 90a 100a 103a 110a 120a 121a)
set(_FLASH_KDA_MIN_NVCC_90a 12.0)
set(_FLASH_KDA_MIN_NVCC_100a 12.8)
set(_FLASH_KDA_MIN_NVCC_103a 12.9)
set(_FLASH_KDA_MIN_NVCC_110a 13.0)
set(_FLASH_KDA_MIN_NVCC_120a 12.8)
set(_FLASH_KDA_MIN_NVCC_121a 12.9)

# "9.0" -> "90a" when the product has that arch, else "".
function(_flash_kda_arch_of_capability cap out)
  string(REPLACE "." "" digits "${cap}")
  set(arch "${digits}a")
  if(NOT arch IN_LIST _FLASH_KDA_ARCHS)
    set(arch "")
  endif()
  set(${out} "${arch}" PARENT_SCOPE)
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

function(flash_kda_resolve_archs out)
  set(request "${FLASH_KDA_CUDA_ARCHS}")
  if(request STREQUAL "")
    set(request "$ENV{FLASH_KDA_CUDA_ARCHS}")
  endif()
  if(request STREQUAL "")
    set(request auto)
  endif()
  string(TOLOWER "${request}" request)
  string(REPLACE " " "" request "${request}")
  string(REPLACE ";" "," valid_list "${_FLASH_KDA_ARCHS}")
  set(valid "auto, all, or a comma list of ${valid_list}")

  if(request STREQUAL "auto")
    _flash_kda_visible_archs(archs seen)
    if(archs STREQUAL "")
      _flash_kda_all_archs(archs)
      if(seen STREQUAL "")
        message(STATUS "flash-kda: FLASH_KDA_CUDA_ARCHS=auto sees no GPU; building all")
      else()
        message(STATUS "flash-kda: FLASH_KDA_CUDA_ARCHS=auto sees compute capability ${seen}, "
                       "which has no native kernels; building all (that GPU uses the fallback)")
      endif()
    endif()
  elseif(request STREQUAL "all")
    _flash_kda_all_archs(archs)
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
  endif()
  if(archs STREQUAL "")
    message(FATAL_ERROR "FLASH_KDA_CUDA_ARCHS=${request}: nvcc ${CMAKE_CUDA_COMPILER_VERSION} "
                        "supports none of ${valid_list}")
  endif()
  message(STATUS "flash-kda: building kernels for ${archs} (FLASH_KDA_CUDA_ARCHS=${request}, "
                 "nvcc ${CMAKE_CUDA_COMPILER_VERSION})")
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()
