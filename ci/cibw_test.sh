#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# cibuildwheel's test command: the repaired wheel is installed (with a CPU torch) in a clean
# venv; the library must load there and the CPU test suite must pass against it.
set -euo pipefail
project=$1
cd "$(mktemp -d)"  # not the source tree: tests import the installed flash_kda
python -m flash_kda info
python -m pytest -q -rs -p no:cacheprovider -m "not gpu" "$project/tests"
