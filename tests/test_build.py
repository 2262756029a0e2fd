# SPDX-License-Identifier: MIT
"""The CMake configure step: FLASH_KDA_CUDA_ARCHS resolution and the CUTLASS search, run on
the source tree (configure only; needs cmake and nvcc, skipped without them)."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
pytestmark = pytest.mark.skipif(
    not (shutil.which("cmake") and shutil.which("nvcc") and os.path.exists(os.path.join(ROOT, "CMakeLists.txt"))),
    reason="needs cmake, nvcc and the source tree",
)


def configure(tmp_path, archs, cutlass=None):
    args = ["cmake", "-S", ROOT, "-B", str(tmp_path), f"-DFLASH_KDA_CUDA_ARCHS={archs}"]
    if cutlass is not None:
        args.append(f"-DFLASH_KDA_CUTLASS_DIR={cutlass}")
    return subprocess.run(args, capture_output=True, text=True, check=False)


def test_unknown_arch_is_a_configure_error_naming_it(tmp_path):
    res = configure(tmp_path, "90a,89")
    assert res.returncode != 0
    assert "FLASH_KDA_CUDA_ARCHS: unknown arch '89'" in res.stderr
    assert "90a,100a,103a,110a,120a,121a" in res.stderr


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="a GPU may be visible here")
def test_auto_without_a_visible_gpu_builds_all(tmp_path):
    res = configure(tmp_path, "auto", cutlass=str(tmp_path / "no-cutlass"))
    assert "FLASH_KDA_CUDA_ARCHS=auto sees no GPU; building all" in res.stdout


def test_explicit_list_and_missing_cutlass(tmp_path):
    res = configure(tmp_path, "sm_90a, 100a", cutlass=str(tmp_path / "no-cutlass"))
    assert "building kernels for 90a;100a" in res.stdout
    assert res.returncode != 0 and "FLASH_KDA_CUTLASS_DIR=" in res.stderr and "holds no CUTLASS headers" in res.stderr
