# SPDX-License-Identifier: MIT
"""`python -m flash_kda info | check | bench` as a user runs them (a subprocess)."""

import subprocess
import sys

import pytest
import torch


def run(*args, env_extra=None):
    import os

    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "flash_kda", *args], capture_output=True, text=True, timeout=600, env=env, check=False
    )


def test_info_reports_versions_arches_and_backend():
    res = run("info")
    assert res.returncode == 0, res.stderr
    for field in (
        "flash_kda   0.1.0",
        "torch       " + torch.__version__,
        "CUDA driver",
        "fla ",
        "library ",
        "backend ",
    ):
        assert field in res.stdout, field
    if not torch.cuda.is_available():
        assert "GPU         none visible" in res.stdout
        assert "backend     torch on cpu" in res.stdout


def test_info_explains_a_library_that_does_not_load():
    res = run("info", env_extra={"FLASH_KDA_LIBRARY": "/nonexistent/libflash_kda.so"})
    assert res.returncode == 0, res.stderr
    assert "library     not loaded: cannot load /nonexistent/libflash_kda.so" in res.stdout


def test_check_passes_on_the_best_device():
    res = run("check")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all checks passed" in res.stdout
    assert res.stdout.count(" ok") == 3


def run_with_sitecustomize(tmp_path, source, *args):
    """run(*args) in a Python that first executes ``source`` (as sitecustomize)."""
    import os

    (tmp_path / "sitecustomize.py").write_text(source)
    return run(*args, env_extra={"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")})


def test_check_fails_when_results_are_wrong(tmp_path):
    """A sitecustomize that breaks fwd's output must turn check red (exit 1)."""
    broken = "import flash_kda._api as api\nreal = api.fwd\ndef broken(*a):\n    real(*a)\n    a[6].mul_(1.5)\n"
    res = run_with_sitecustomize(tmp_path, broken + "api.fwd = broken\n", "check")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL" in res.stdout


def test_unknown_command_is_a_usage_error():
    res = run("frobnicate")
    assert res.returncode == 2 and "invalid choice" in res.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU message")
def test_bench_needs_a_gpu():
    res = run("bench")
    assert res.returncode == 2 and "bench needs a CUDA GPU" in res.stderr


def test_info_shows_the_library_cuda_versions_and_build_info(tmp_path):
    """Both CUDA versions the library reports, and CMake's _build_info when it exists
    (simulated here: a checkout has none)."""
    from flash_kda import _native

    fake = "import sys, types\nm = types.ModuleType('flash_kda._build_info')\nsys.modules[m.__name__] = m\n"
    product = "({'arch': '90a', 'compute_capability': 90, 'min_nvcc': '12.0'}, {'arch': '100a'})"
    fields = f"m.PRODUCT_ARCHS = {product}\nm.BUILT_ARCHS = ('90a',)\nm.NVCC_VERSION = '12.9.86'\n"
    res = run_with_sitecustomize(tmp_path, fake + fields + "m.FLASH_KDA_CUDA_ARCHS = 'auto'\n", "info")
    assert res.returncode == 0, res.stderr
    assert "build       built arches 90a; product arches 90a, 100a; requested auto; nvcc 12.9.86" in res.stdout
    lib = _native.load()
    if lib is not None:
        runtime, driver = lib.cuda_versions()
        seen = f"{driver // 1000}.{driver % 1000 // 10}" if driver else "none"
        expected = f"lib CUDA    CUDA runtime {runtime // 1000}.{runtime % 1000 // 10} (built with), driver {seen}"
        assert expected in res.stdout, res.stdout
