# SPDX-License-Identifier: MIT
"""The CMake configure step: FLASH_KDA_CUDA_ARCHS resolution, the CUTLASS search and the files
generated from the product table (the arch TUs, flash_kda/_build_info.py), run on the source
tree (configure only; needs cmake and nvcc, skipped without them; FLASH_KDA_CUDA_ARCHS=none
needs no nvcc). The expected arches come from cmake/FlashKdaArchs.cmake itself, never from a
list written here."""

import os
import runpy
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
pytestmark = pytest.mark.skipif(
    not (shutil.which("cmake") and shutil.which("nvcc") and os.path.exists(os.path.join(ROOT, "CMakeLists.txt"))),
    reason="needs cmake, nvcc and the source tree",
)


def configure(tmp_path, archs, cutlass=None, env=None):
    args = ["cmake", "-S", ROOT, "-B", str(tmp_path), f"-DFLASH_KDA_CUDA_ARCHS={archs}"]
    if cutlass is not None:
        args.append(f"-DFLASH_KDA_CUTLASS_DIR={cutlass}")
    return subprocess.run(args, capture_output=True, text=True, check=False, env=env)


def no_nvcc_env():
    """The environment with CUDACXX naming no compiler: CMake finds no nvcc."""
    return dict(os.environ, CUDACXX="/nonexistent/nvcc")


def product_archs():
    """The product table, [(arch, min_nvcc, compute_capability)], as `cmake -P
    cmake/FlashKdaArchs.cmake` prints it: a header line, then one row per arch."""
    script = os.path.join(ROOT, "cmake", "FlashKdaArchs.cmake")
    out = subprocess.run(["cmake", "-P", script], capture_output=True, text=True, check=True).stdout
    return [(arch, nvcc, int(cc)) for arch, nvcc, cc in (line.split() for line in out.splitlines()[1:])]


def fake_cutlass(path):
    """A directory FlashKdaCutlass.cmake accepts (it only looks for two headers): enough to
    configure, not to build."""
    for header in ("cute/tensor.hpp", "cutlass/arch/barrier.h"):
        (path / header).parent.mkdir(parents=True, exist_ok=True)
        (path / header).write_text("")
    return str(path)


def version(text):
    return tuple(int(part) for part in text.split("."))


def test_product_table_is_well_formed():
    rows = product_archs()
    assert rows and len({arch for arch, _, _ in rows}) == len(rows)
    for arch, nvcc, cc in rows:
        assert arch.startswith(str(cc)) and version(nvcc) >= (12, 0), (arch, nvcc, cc)


def test_unknown_arch_is_a_configure_error_naming_it(tmp_path):
    res = configure(tmp_path, "90a,89")
    assert res.returncode != 0
    assert "FLASH_KDA_CUDA_ARCHS: unknown arch '89'" in res.stderr
    message = " ".join(res.stderr.split())  # CMake wraps long messages
    assert "a comma list of " + ",".join(arch for arch, _, _ in product_archs()) in message


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="a GPU may be visible here")
def test_auto_without_a_visible_gpu_builds_all(tmp_path):
    res = configure(tmp_path, "auto", cutlass=str(tmp_path / "no-cutlass"))
    assert "(FLASH_KDA_CUDA_ARCHS=auto: no GPU visible, so every arch nvcc " in res.stdout


def test_explicit_list_and_missing_cutlass(tmp_path):
    res = configure(tmp_path, "sm_90a, 100a", cutlass=str(tmp_path / "no-cutlass"))
    assert "building kernels for 90a, 100a (FLASH_KDA_CUDA_ARCHS=sm_90a,100a: as requested, nvcc " in res.stdout
    assert res.returncode != 0 and "FLASH_KDA_CUTLASS_DIR=" in res.stderr and "holds no CUTLASS headers" in res.stderr


def test_all_generates_every_buildable_arch_tu_and_the_build_info(tmp_path):
    build = tmp_path / "build"
    res = configure(build, "all", cutlass=fake_cutlass(tmp_path / "cutlass"))
    assert res.returncode == 0, res.stderr
    info = runpy.run_path(str(build / "generated" / "_build_info.py"))  # plain Python, no imports
    product = product_archs()
    assert info["PRODUCT_ARCHS"] == tuple(
        {"arch": arch, "compute_capability": cc, "min_nvcc": nvcc} for arch, nvcc, cc in product
    )
    nvcc = version(info["NVCC_VERSION"])
    assert info["BUILT_ARCHS"] == tuple(arch for arch, min_nvcc, _ in product if version(min_nvcc) <= nvcc)
    assert info["FLASH_KDA_CUDA_ARCHS"] == "all"
    assert f"building kernels for {', '.join(info['BUILT_ARCHS'])} (FLASH_KDA_CUDA_ARCHS=all: every arch" in res.stdout
    for arch, _, cc in product:
        tu = build / "generated" / "arch" / f"sm{arch}.cu"
        assert tu.exists() == (arch in info["BUILT_ARCHS"])
        if tu.exists():
            assert tu.read_text().splitlines()[2:] == [
                f"#define FLASH_KDA_ARCH sm{arch}",
                f"#define FLASH_KDA_CC {cc}",
                '#include "kda/launch.cuh"',
                f'FLASH_KDA_DEFINE_ARCH_TABLE(/*name=*/"sm_{arch}", /*cc=*/{cc});',
            ]


def test_none_configures_without_a_cuda_compiler(tmp_path):
    build = tmp_path / "build"
    res = configure(build, "none", env=no_nvcc_env())
    assert res.returncode == 0, res.stderr
    assert "FLASH_KDA_CUDA_ARCHS=none: no kernels" in res.stdout
    info = runpy.run_path(str(build / "generated" / "_build_info.py"))
    assert info["BUILT_ARCHS"] == () and info["FLASH_KDA_CUDA_ARCHS"] == "none"
    assert not (build / "generated" / "arch").exists()


def test_without_nvcc_the_error_says_what_to_install_or_set(tmp_path):
    res = configure(tmp_path, "auto", env=no_nvcc_env())
    message = " ".join(res.stderr.split())  # CMake wraps long messages
    assert res.returncode != 0
    assert "no CUDA compiler (nvcc) found" in message and "Install the CUDA toolkit" in message
    assert "CUDACXX" in message and "FLASH_KDA_CUDA_ARCHS=none" in message
