// SPDX-License-Identifier: MIT
// The kernels of sm_120a, compiled for that arch alone (-gencode arch=compute_120a,code=sm_120a).
#define FLASH_KDA_ARCH sm120a
#include "kda/launch.cuh"
FLASH_KDA_DEFINE_ARCH_TABLE(/*name=*/"sm_120a", /*cc=*/120);
