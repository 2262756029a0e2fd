# SPDX-License-Identifier: MIT
"""The paired bf16 instructions of the kernels (src/kda/numerics.cuh: bf16x2_add,
bf16x2_sub, bf16x2_mul, pack_bf16x2) give the same bits as the per-element fp32 forms the
reference mirrors, on every input: tests/probes/bf16_pairs.cu, built for this GPU with nvcc."""

import os
import pathlib
import shutil
import subprocess

import pytest

PROBE = pathlib.Path(__file__).parent / "probes" / "bf16_pairs.cu"
INSTRUCTIONS = ("add.rn.bf16x2", "sub.rn.bf16x2", "mul.rn.bf16x2", "cvt.rn.bf16x2.f32")


def _nvcc():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [shutil.which("nvcc"), home and os.path.join(home, "bin", "nvcc"), "/usr/local/cuda/bin/nvcc"]
    return next((c for c in candidates if c and os.path.exists(c)), None)


@pytest.mark.gpu
def test_paired_bf16_instructions_equal_the_per_element_forms_on_every_input(tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("needs nvcc to build the probe")
    exe = tmp_path / "bf16_pairs"
    subprocess.run([nvcc, "-O2", "-arch=native", "-o", str(exe), str(PROBE)], check=True, capture_output=True)
    run = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=300)
    counts = {}
    for line in run.stdout.splitlines():
        name, _, count, *rest = line.split()
        counts[name] = (int(count), rest)
    assert set(counts) == set(INSTRUCTIONS), run.stdout
    for name in INSTRUCTIONS:
        assert counts[name][0] == 0, f"{name}: {counts[name][0]} mismatches, first (input, got, want) {counts[name][1]}"
