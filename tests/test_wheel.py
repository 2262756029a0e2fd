# SPDX-License-Identifier: MIT
"""The shipped binary: the installed library's dependencies, exports and per-arch kernel
namespaces, its build info (flash_kda/_build_info.py), and (when CI names it in
FLASH_KDA_WHEEL) the wheel file's tag and contents. Uses the checks of wheels/check_wheel.py."""

import importlib.util
import os
import re
import shutil
import subprocess
import zipfile

import flash_kda
import pytest
from flash_kda import _native

try:
    from flash_kda import _build_info
except ImportError:  # a source-tree import: only a CMake build writes the file
    _build_info = None

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("check_wheel", os.path.join(HERE, "..", "wheels", "check_wheel.py"))
check_wheel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_wheel)

LIBRARY = _native.library_path()
TORCH_LIBRARY = os.path.join(os.path.dirname(LIBRARY), "libflash_kda_torch.so")
pytestmark = pytest.mark.skipif(not shutil.which("readelf"), reason="needs readelf (binutils)")


@pytest.mark.parametrize("library", [LIBRARY, TORCH_LIBRARY], ids=["kernels", "eager"])
def test_installed_library_depends_only_on_the_system(library):
    if not os.path.exists(library):
        pytest.skip(f"{library} is not built")
    ok, needed = check_wheel.check_needed(library)
    assert ok, needed
    for lib in ("libtorch", "libc10", "libpython", "libcudart", "libcuda.so"):
        assert lib not in needed


@pytest.mark.parametrize("library", [LIBRARY, TORCH_LIBRARY], ids=["kernels", "eager"])
def test_installed_library_exports_only_the_c_abi(library):
    if not os.path.exists(library):
        pytest.skip(f"{library} is not built")
    ok, detail = check_wheel.check_exports(library)
    assert ok, detail


def _kernel_entries():
    """{arch: kernel entry symbols} of the installed library, in its arch order."""
    try:
        cuobjdump = check_wheel.find_cuobjdump()
    except SystemExit:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    dump = subprocess.run([cuobjdump, "--dump-elf-symbols", LIBRARY], check=True, capture_output=True, text=True).stdout
    sections = re.split(r"\narch = ", dump)[1:]
    return {section.split()[0]: re.findall(r"ENTRY\s+(\S+)", section) for section in sections}


def test_every_kernel_lives_in_its_arch_namespace():
    entries_of = _kernel_entries()
    assert list(entries_of) == [a.name for a in _native.compiled_archs()]
    for arch, entries in entries_of.items():  # arch: sm_90a, namespace sm90a
        ns = arch.replace("_", "")
        assert len(entries) >= 6, (arch, entries)  # prefix, K1, 3 x K2, probes
        for entry in entries:
            assert entry.startswith(f"_ZN9flash_kda{len(ns)}{ns}"), (arch, entry)


def test_the_warpgroup_pass_and_its_tile_order_k1_exist_on_sm90a_only():
    """wgmma is sm_90a's alone (design section 4.9): its table has the warpgroup pass in its
    three forms (block_v 64 one and two CTAs an SM, block_v 128 with a producer warpgroup),
    each for the whole pass, the segment pass and the rerun, and the K1 kernels that write
    tile-order records (K1 first, beside the pass and as the lead grid of K1 leaving its SMs,
    in each of its three variants: FlashKDA's contract, the bounded gate's other forms and the
    unbounded gates, prepare.cuh K1Variant; the unbounded gates' leaving form, K1Place, and
    their K1 first for an fp32 g, GateLoad); no other arch has any of them."""
    for arch, entries in _kernel_entries().items():
        passes = [e for e in entries if "warpgroup_recurrence_kernel" in e]
        tile_k1 = [e for e in entries if "RecordOrderE1" in e]
        if arch != "sm_90a":
            assert passes == tile_k1 == [], (arch, passes, tile_k1)
            continue
        pattern = r"warpgroup_recurrence_kernelILi(\d)ELi(\d)ELNS_8PassCodeE(\d)E"
        forms = sorted(re.search(pattern, e).groups() for e in passes)
        # <kGroups, kResident, kCode>: kCode 0 the whole pass, 2 the segment pass, 3 the rerun
        assert forms == [(g, r, c) for g, r in (("1", "1"), ("1", "2"), ("2", "1")) for c in "023"], passes
        assert len(tile_k1) == 11 and sum("K1PlaceE1" in e for e in tile_k1) == 1, tile_k1
        assert sum("GateLoadE1" in e for e in tile_k1) == 1, tile_k1
        assert sum("prepare_lead_kernel" in e for e in tile_k1) == 3, tile_k1


def test_every_stage_release_follows_a_proxy_fence():
    """In every arch's SASS each recurrence kernel's consumer arrive on a stage's empty barrier
    follows a proxy fence with no shared-memory load between them (design section 4.5): the
    GPU-free guard of the fix that tests/test_streams_gpu.py checks on a GPU."""
    try:
        sass = check_wheel.sass_of(LIBRARY)
    except SystemExit:
        pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
    if sass is None:
        pytest.skip("cuobjdump -sass needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    checked, bad = check_wheel.stage_release_fences(sass)
    assert sorted(checked) == sorted(a.name for a in _native.compiled_archs()), checked
    assert not bad, bad


def _sass(function, *instructions):
    lines = [f"        /*{16 * i:04x}*/                   {text} ;   /* 0x0 */" for i, text in enumerate(instructions)]
    return "\n".join(["arch = sm_90a", f"        Function : {function}", *lines])


ARRIVE = "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR15+0x30], RZ"
LOAD = "LDS.128 R28, [R116+UR10+0x80]"
KERNEL = "_ZN9flash_kda5sm90a17recurrence_kernelILi1ELi4ELNS_8PassCodeE0ELi1EEEv"


@pytest.mark.parametrize(
    "function,instructions,offenders",
    [
        (KERNEL, [LOAD, "MEMBAR.ALL.CTA", "FENCE.VIEW.ASYNC.S", "FFMA R1, R2, R3, R4", ARRIVE], 0),
        (KERNEL, [LOAD, "FENCE.VIEW.ASYNC.S", ARRIVE, "@P3 " + ARRIVE], 0),  # one fence, two releases
        (KERNEL, [LOAD, ARRIVE], 1),
        (KERNEL, ["FENCE.VIEW.ASYNC.S", "LDSM.16.M88.4 R4, [R2]", ARRIVE], 1),  # a load after the fence
        (KERNEL, ["FENCE.VIEW.ASYNC.G", LOAD, ARRIVE], 1),  # the global-memory fence is not it
        ("_ZN9flash_kda5sm90a14combine_kernelILi8EEEv", [LOAD, ARRIVE], 0),  # only recurrence kernels
    ],
)
def test_stage_release_check_reads_sass(function, instructions, offenders):
    checked, bad = check_wheel.stage_release_fences(_sass(function, *instructions))
    assert len(bad) == offenders, bad
    assert sum(checked.values()) == sum(ARRIVE in text for text in instructions) * ("recurrence" in function)


WHEEL = os.environ.get("FLASH_KDA_WHEEL")


@pytest.mark.skipif(not WHEEL, reason="FLASH_KDA_WHEEL names no wheel (set by .ci/run)")
def test_wheel_tag_contents_and_size():
    ok, tag = check_wheel.check_tag(WHEEL)
    assert ok and tag.startswith("py3-none-manylinux_"), tag
    ok, size = check_wheel.check_size(WHEEL)
    assert ok, size
    with zipfile.ZipFile(WHEEL) as zf:
        names = zf.namelist()
    assert sorted(n for n in names if ".so" in n) == [check_wheel.LIBRARY, check_wheel.TORCH_LIBRARY]
    assert "flash_kda/__init__.py" in names and "flash_kda/reference.py" in names
    assert check_wheel.BUILD_INFO in names


@pytest.mark.skipif(_build_info is None, reason="no flash_kda/_build_info.py (a source-tree import)")
def test_build_info_describes_the_installed_library():
    assert flash_kda.compiled_archs() == list(_build_info.BUILT_ARCHS)
    product = {a["arch"]: a["compute_capability"] for a in _build_info.PRODUCT_ARCHS}
    for arch in _native.compiled_archs():
        assert product[arch.short_name] == arch.compute_capability
    ok, detail = check_wheel.check_archs(vars(_build_info))
    assert ok, detail


# A made-up two-arch product for check_wheel's arch rules (not the real table).
PRODUCT = (
    {"arch": "90a", "compute_capability": 90, "min_nvcc": "12.0"},
    {"arch": "110a", "compute_capability": 110, "min_nvcc": "13.0"},
)


@pytest.mark.parametrize(
    "request_,nvcc,built,pinned,ok",
    [
        ("all", "12.9.86", ("90a",), None, True),
        ("all", "13.0.88", ("90a", "110a"), None, True),
        ("all", "13.0.88", ("90a",), None, False),  # `all` left out an arch nvcc builds
        ("90a", "13.0.88", ("90a",), None, True),
        ("110a", "12.9.86", ("110a",), None, False),  # that nvcc cannot build 110a
        ("all", "13.0.88", ("90a", "110a"), ["90a"], False),  # --archs pins another list
        ("all", "13.0.88", ("110a", "90a"), ["90a", "110a"], True),
    ],
)
def test_check_archs_follows_the_build_info(request_, nvcc, built, pinned, ok):
    info = {"PRODUCT_ARCHS": PRODUCT, "NVCC_VERSION": nvcc, "FLASH_KDA_CUDA_ARCHS": request_, "BUILT_ARCHS": built}
    assert check_wheel.check_archs(info, pinned)[0] == ok


def test_a_wheel_without_build_info_fails_the_arch_check(tmp_path):
    wheel = tmp_path / "flash_kda_bin-0.1.0-py3-none-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("flash_kda/__init__.py", "")
    with zipfile.ZipFile(wheel) as zf:
        results = {name: (ok, detail) for name, ok, detail in check_wheel.check_contents(zf, str(tmp_path), [])}
    assert results["archs"][0] is False and "_build_info.py missing" in results["archs"][1]
