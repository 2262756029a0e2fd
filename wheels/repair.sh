#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Repair a wheel with auditwheel: retag it manylinux (the library only needs libc,
# libstdc++ and libgcc_s; libcuda is opened at run time by the static CUDA runtime).
#   bash wheels/repair.sh WHEEL DEST_DIR [PLAT]
# PLAT defaults to $AUDITWHEEL_PLAT (set in the manylinux build images), else to this
# host's manylinux_2_34_<arch> (what a glibc 2.34+ machine's symbols allow).
set -euo pipefail
wheel=$1
dest=$2
plat=${3:-${AUDITWHEEL_PLAT:-manylinux_2_34_$(uname -m)}}
auditwheel=${AUDITWHEEL:-auditwheel}
echo "wheels/repair.sh: $wheel -> $dest ($plat)"
"$auditwheel" repair --exclude libcuda.so.1 --plat "$plat" -w "$dest" "$wheel"
