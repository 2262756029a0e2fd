// SPDX-License-Identifier: MIT
// The kernels of sm_121a, compiled for that arch alone (-gencode arch=compute_121a,code=sm_121a).
#define FLASH_KDA_ARCH sm121a
#include "kda/launch.cuh"
FLASH_KDA_DEFINE_ARCH_TABLE(/*name=*/"sm_121a", /*cc=*/121);
