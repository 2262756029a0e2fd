// SPDX-License-Identifier: MIT
// The kernels of sm_90a, compiled for that arch alone (-gencode arch=compute_90a,code=sm_90a).
#define FLASH_KDA_ARCH sm90a
#include "kda/launch.cuh"
FLASH_KDA_DEFINE_ARCH_TABLE(/*name=*/"sm_90a", /*cc=*/90);
