# SPDX-License-Identifier: MIT
"""The shipped binary: the installed library's dependencies, exports and per-arch kernel
namespaces, and (when CI names it in FLASH_KDA_WHEEL) the wheel file's tag and contents.
Uses the checks of wheels/check_wheel.py."""

import importlib.util
import os
import re
import shutil
import subprocess

import pytest
from flash_kda import _native

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("check_wheel", os.path.join(HERE, "..", "wheels", "check_wheel.py"))
check_wheel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_wheel)

LIBRARY = _native.library_path()
pytestmark = pytest.mark.skipif(not shutil.which("readelf"), reason="needs readelf (binutils)")


def test_installed_library_depends_only_on_the_system():
    ok, needed = check_wheel.check_needed(LIBRARY)
    assert ok, needed
    for lib in ("libtorch", "libc10", "libpython", "libcudart", "libcuda.so"):
        assert lib not in needed


def test_installed_library_exports_only_the_c_abi():
    ok, detail = check_wheel.check_exports(LIBRARY)
    assert ok, detail


def test_every_kernel_lives_in_its_arch_namespace():
    try:
        cuobjdump = check_wheel.find_cuobjdump()
    except SystemExit:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    dump = subprocess.run([cuobjdump, "--dump-elf-symbols", LIBRARY], check=True, capture_output=True, text=True).stdout
    sections = re.split(r"\narch = ", dump)[1:]
    assert [s.split()[0] for s in sections] == [a.name for a in _native.compiled_archs()]
    for section in sections:
        arch = section.split()[0]  # sm_90a
        ns = arch.replace("_", "")  # sm90a
        entries = re.findall(r"ENTRY\s+(\S+)", section)
        assert len(entries) >= 6, (arch, entries)  # prefix, K1, 3 x K2, probes
        for entry in entries:
            assert entry.startswith(f"_ZN9flash_kda{len(ns)}{ns}"), (arch, entry)


WHEEL = os.environ.get("FLASH_KDA_WHEEL")


@pytest.mark.skipif(not WHEEL, reason="FLASH_KDA_WHEEL names no wheel (set by .ci/run)")
def test_wheel_tag_contents_and_size():
    ok, tag = check_wheel.check_tag(WHEEL)
    assert ok and tag.startswith("py3-none-manylinux_"), tag
    ok, size = check_wheel.check_size(WHEEL)
    assert ok, size
    import zipfile

    with zipfile.ZipFile(WHEEL) as zf:
        names = zf.namelist()
    assert [n for n in names if ".so" in n] == ["flash_kda/libflash_kda.so"]
    assert "flash_kda/__init__.py" in names and "flash_kda/reference.py" in names
