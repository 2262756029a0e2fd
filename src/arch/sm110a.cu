// SPDX-License-Identifier: MIT
// The kernels of sm_110a, compiled for that arch alone (-gencode arch=compute_110a,code=sm_110a).
#define FLASH_KDA_ARCH sm110a
#include "kda/launch.cuh"
FLASH_KDA_DEFINE_ARCH_TABLE(/*name=*/"sm_110a", /*cc=*/110);
