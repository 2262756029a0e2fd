#!/bin/sh
# SPDX-License-Identifier: MIT
# Compiler launcher (CMAKE_CUDA_COMPILER_LAUNCHER): runs the compile command, then prints
# the translation unit's compile time, e.g. "flash-kda: sm90a.cu compiled in 9.8 s".
start=$(date +%s%N)
"$@"
rc=$?
end=$(date +%s%N)
src=unknown
for arg in "$@"; do
  case $arg in *.cu) src=$(basename "$arg") ;; esac
done
ms=$(( (end - start) / 1000000 ))
echo "flash-kda: $src compiled in $((ms / 1000)).$(( (ms % 1000) / 100 )) s"
exit $rc
