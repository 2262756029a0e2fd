#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build the sdist and, from that sdist, the wheel (so a broken sdist fails here).
#   bash wheels/build.sh [outdir]          (default dist/)
# FLASH_KDA_CUDA_ARCHS selects the kernels (default here: all). Needs `python -m build`,
# nvcc and network access for the isolated build environment (pyproject's requires).
set -euo pipefail
out=${1:-dist}
export FLASH_KDA_CUDA_ARCHS=${FLASH_KDA_CUDA_ARCHS:-all}
python=${PYTHON:-python3}
echo "wheels/build.sh: FLASH_KDA_CUDA_ARCHS=$FLASH_KDA_CUDA_ARCHS -> $out"
"$python" -m build --outdir "$out" .
