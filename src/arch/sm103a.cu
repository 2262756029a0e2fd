// SPDX-License-Identifier: MIT
// The kernels of sm_103a, compiled for that arch alone (-gencode arch=compute_103a,code=sm_103a).
#define FLASH_KDA_ARCH sm103a
#include "kda/launch.cuh"
FLASH_KDA_DEFINE_ARCH_TABLE(/*name=*/"sm_103a", /*cc=*/103);
