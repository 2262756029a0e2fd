# SPDX-License-Identifier: MIT
# The files CMake writes from the product table of FlashKdaArchs.cmake, so that no source
# file spells the arch list out again. They go under FLASH_KDA_GENERATED (set by the caller)
# and are rewritten only when their text changes, so a re-configure rebuilds nothing.
#
#   flash_kda_arch_tu(<arch> <out-var>)                one arch's translation unit

# One arch's TU from src/arch/arch.cu.in (@ARCH@ and @CC@ filled in). It keeps the name the
# hand-written TUs had, sm<arch>.cu: cmake/time-tu.sh and .ci/run's log print that name.
# Example: flash_kda_arch_tu(90a tu) writes ${FLASH_KDA_GENERATED}/arch/sm90a.cu, whose
# code lines are `#define FLASH_KDA_ARCH sm90a`, `#include "kda/launch.cuh"` and
# `FLASH_KDA_DEFINE_ARCH_TABLE(/*name=*/"sm_90a", /*cc=*/90);`, and sets tu to its path.
function(flash_kda_arch_tu arch out)
  set(ARCH ${arch})
  set(CC ${_FLASH_KDA_CC_${arch}})
  set(path "${FLASH_KDA_GENERATED}/arch/sm${arch}.cu")
  configure_file("${PROJECT_SOURCE_DIR}/src/arch/arch.cu.in" "${path}" @ONLY)
  set(${out} "${path}" PARENT_SCOPE)
endfunction()
