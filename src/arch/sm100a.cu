// SPDX-License-Identifier: MIT
// The kernels of sm_100a, compiled for that arch alone (-gencode arch=compute_100a,code=sm_100a).
#define FLASH_KDA_ARCH sm100a
#include "kda/launch.cuh"
FLASH_KDA_DEFINE_ARCH_TABLE(/*name=*/"sm_100a", /*cc=*/100);
