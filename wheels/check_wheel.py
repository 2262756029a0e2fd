# SPDX-License-Identifier: MIT
"""Check a flash-kda-bin wheel before it ships; exit 1 if any check fails.

    python wheels/check_wheel.py WHEEL [--archs 90a,100a] [--smoke "torch==2.13.0"]

Checks: the tag is ``py3-none-manylinux_*``; the wheel holds exactly two shared libraries,
``flash_kda/libflash_kda.so`` (the kernels) and ``flash_kda/libflash_kda_torch.so`` (the
eager launch through torch's stable C ABI); their NEEDED entries are only libc, libm, libdl,
libpthread, librt, libstdc++, libgcc_s and the loader (no libtorch, libpython, libcudart or
libcuda: libcuda is opened at run time, torch's C functions are looked up in the process);
they export only ``flash_kda_*`` symbols; the arches are
right; every stage release of the recurrence kernels follows a proxy fence (SASS); the wheel
is at most 100 MB; and with ``--smoke``, ``pip install WHEEL`` in a clean
venv followed by ``python -m flash_kda info`` works. Uses readelf (binutils) and cuobjdump
(on PATH or from the nvidia-cuda-cuobjdump package, with nvdisasm beside it for the SASS).
A wheel built with FLASH_KDA_CUDA_ARCHS=none (its build info says so) must instead be
``py3-none-any`` with no shared library and no arches, and its clean-venv ``info`` must run.

The expected arches come from the wheel itself, from ``flash_kda/_build_info.py`` (written
by CMake from cmake/FlashKdaArchs.cmake; read with ``ast.literal_eval``, never imported):
the embedded cubins (``cuobjdump --list-elf``) must be exactly BUILT_ARCHS, and when the
request was ``all``, BUILT_ARCHS must be every PRODUCT_ARCHS entry whose min_nvcc is at
most NVCC_VERSION (any other request: product arches that nvcc can build). ``--archs``
pins the list instead, for a caller that wants exactly those arches.
"""

import argparse
import ast
import glob
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

ALLOWED_NEEDED = re.compile(
    r"^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libstdc\+\+\.so\.6|"
    r"libgcc_s\.so\.1|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1)$"
)
LIBRARY = "flash_kda/libflash_kda.so"
TORCH_LIBRARY = "flash_kda/libflash_kda_torch.so"
BUILD_INFO = "flash_kda/_build_info.py"
MAX_MB = 100


def wheel_tags(path):
    name = os.path.basename(path)
    parts = name[: -len(".whl")].split("-")
    return parts[-3], parts[-2], parts[-1]  # python, abi, platform (possibly dotted)


def check_tag(path, pure=False):
    py, abi, plat = wheel_tags(path)
    plat_ok = plat == "any" if pure else all(p.startswith("manylinux_") for p in plat.split("."))
    return py == "py3" and abi == "none" and plat_ok, f"{py}-{abi}-{plat}"


def is_pure(info):
    """Whether the build info is that of a wheel without kernels (FLASH_KDA_CUDA_ARCHS=none)."""
    return info is not None and info.get("FLASH_KDA_CUDA_ARCHS") == "none"


def readelf(args, path):
    return subprocess.run(["readelf", *args, path], check=True, capture_output=True, text=True).stdout


def check_needed(so):
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf(["-d"], so))
    bad = [n for n in needed if not ALLOWED_NEEDED.match(n)]
    return not bad, ", ".join(needed) + (f"  (not allowed: {', '.join(bad)})" if bad else "")


def check_exports(so):
    names = set()
    for line in readelf(["--dyn-syms", "-W"], so).splitlines():
        f = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(f) >= 8 and f[4] in ("GLOBAL", "WEAK") and f[6] != "UND" and f[3] in ("FUNC", "OBJECT"):
            names.add(f[7])
    bad = sorted(n for n in names if not n.startswith("flash_kda_"))
    return not bad and bool(names), f"{len(names)} exports" + (f"  (unexpected: {', '.join(bad)})" if bad else "")


def find_cuobjdump():
    on_path = subprocess.run(["which", "cuobjdump"], capture_output=True, text=True, check=False).stdout.strip()
    if on_path:
        return on_path
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}
    for root in roots:
        found = glob.glob(os.path.join(root, "nvidia", "*", "bin", "cuobjdump"))
        found += glob.glob(os.path.join(root, "nvidia", "cuda_cuobjdump", "bin", "cuobjdump"))
        if found:
            return found[0]
    raise SystemExit("check_wheel: cuobjdump not found (pip install nvidia-cuda-cuobjdump)")


def check_cubins(so, archs):
    out = subprocess.run([find_cuobjdump(), "--list-elf", so], check=True, capture_output=True, text=True).stdout
    found = sorted(set(re.findall(r"\.(sm_\d+a?)\.cubin", out)))
    want = sorted(f"sm_{a}" for a in archs)
    return found == want, ", ".join(found) + ("" if found == want else f"  (expected {', '.join(want)})")


def stage_release_fences(sass):
    """(releases checked per arch, offenders) in ``cuobjdump -sass`` text: in every recurrence kernel, each
    consumer arrive on a stage's empty barrier (``SYNCS.ARRIVE.TRANS64.A1T0``) must follow a
    ``FENCE.VIEW.ASYNC.S`` (``fence.proxy.async.shared::cta``) with no shared-memory load between
    them. Without the fence the producer's next bulk copy could land before loads issued ahead of
    the arrive had read the stage (docs/design.md section 4.5)."""
    checked, bad = {}, []
    arch = function = state = None
    for line in sass.splitlines():
        header = re.match(r"\s*(arch = (sm_\w+)|Function : (\S+))", line)
        if header:
            arch = header.group(2) or arch
            function = header.group(3) if header.group(3) and "recurrence_kernel" in header.group(3) else None
            state = None
            continue
        instruction = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
        if function is None or not instruction:
            continue
        text = instruction.group(1)
        if "FENCE.VIEW.ASYNC.S" in text:
            state = "fenced"
        elif re.search(r"\bLDS", text):
            state = "loaded"
        elif "SYNCS.ARRIVE.TRANS64.A1T0" in text:
            checked[arch] = checked.get(arch, 0) + 1
            if state != "fenced":
                bad.append(f"{arch} {function}: {text}")
    return checked, bad


def sass_of(so):
    """``cuobjdump -sass`` of a library, or None where it gives none (it needs nvdisasm)."""
    sass = subprocess.run([find_cuobjdump(), "-sass", so], capture_output=True, text=True, check=False)
    return sass.stdout if sass.returncode == 0 and "Function :" in sass.stdout else None


def check_stage_fences(so):
    sass = sass_of(so)
    if sass is None:
        return False, "cuobjdump -sass failed (it needs nvdisasm: pip install nvidia-cuda-nvdisasm)"
    checked, bad = stage_release_fences(sass)
    ok = bool(checked) and not bad
    detail = f"{sum(checked.values())} stage releases in {len(checked)} arches, {len(bad)} without a proxy fence"
    return ok, detail + (f": {bad[0]}" if bad else "")


def read_build_info(text):
    """The fields of a ``_build_info.py`` (its text) as a dict, by ``ast.literal_eval`` of each
    top-level assignment: the file is data, so it is never executed."""
    info = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            info[node.targets[0].id] = ast.literal_eval(node.value)
    return info


def _version(text):
    """``"13.0.88"`` -> (13, 0, 88), compared the way CMake's VERSION_GREATER_EQUAL does."""
    return tuple(int(part) for part in text.split("."))


def nvcc_archs(info):
    """The product arches (in product order) that the build's nvcc can compile: what `all` builds."""
    nvcc = _version(info["NVCC_VERSION"])
    return [a["arch"] for a in info["PRODUCT_ARCHS"] if _version(a["min_nvcc"]) <= nvcc]


def check_archs(info, pinned=None):
    """BUILT_ARCHS against --archs when pinned, else against the request: `all` must give every
    product arch the nvcc can build; any other request only product arches that nvcc can build."""
    built = list(info["BUILT_ARCHS"])
    request, nvcc = info["FLASH_KDA_CUDA_ARCHS"], info["NVCC_VERSION"]
    supported = nvcc_archs(info)
    if pinned:
        ok, want = sorted(built) == sorted(pinned), f"--archs {','.join(pinned)}"
    elif request == "all":
        ok, want = sorted(built) == sorted(supported), f"all with nvcc {nvcc}: {', '.join(supported)}"
    else:
        ok, want = bool(built) and set(built) <= set(supported), f"product arches nvcc {nvcc} builds"
    detail = f"{', '.join(built) or 'none'} (FLASH_KDA_CUDA_ARCHS={request}, nvcc {nvcc})"
    return ok, detail + ("" if ok else f"  (expected {want})")


def check_size(path):
    mb = os.path.getsize(path) / 2**20
    return mb <= MAX_MB, f"{mb:.1f} MB (limit {MAX_MB} MB)"


def check_smoke(path, torch_spec, pip_args, pure=False):
    """pip install the wheel (and torch_spec) into a clean venv, then `python -m flash_kda info`
    (which must find the library, unless the wheel has none)."""
    with tempfile.TemporaryDirectory() as tmp:
        venv = os.path.join(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        install = subprocess.run(
            [py, "-m", "pip", "install", "-q", *pip_args, path, torch_spec], capture_output=True, text=True, check=False
        )
        if install.returncode != 0:
            return False, "pip install failed:\n" + install.stdout + install.stderr
        info = subprocess.run([py, "-m", "flash_kda", "info"], capture_output=True, text=True, cwd=tmp, check=False)
        library = next((l for l in info.stdout.splitlines() if l.startswith("library")), "")
        ok = info.returncode == 0 and (pure or "not loaded" not in library)
        return ok, library if ok else info.stdout + info.stderr


def check_contents(zf, tmp, pinned):
    """The checks on the wheel's files: the two libraries, the arches, each library's NEEDED and
    exports, the kernel library's cubins (against BUILT_ARCHS, or the pinned list when the
    build info is missing)."""
    libs = [n for n in zf.namelist() if ".so" in os.path.basename(n)]
    info = read_build_info(zf.read(BUILD_INFO).decode()) if BUILD_INFO in zf.namelist() else None
    if is_pure(info):
        return [("library", not libs, ", ".join(libs) or "none (FLASH_KDA_CUDA_ARCHS=none)"),
                ("archs", info["BUILT_ARCHS"] == (), ", ".join(info["BUILT_ARCHS"]) or "none")]  # fmt: skip
    results = [("library", sorted(libs) == [LIBRARY, TORCH_LIBRARY], ", ".join(libs) or "none")]
    if info is None:
        results.append(("archs", False, f"{BUILD_INFO} missing: the wheel does not say what it built"))
    else:
        results.append(("archs", *check_archs(info, pinned)))
    if LIBRARY in libs:
        so = zf.extract(LIBRARY, tmp)
        results += [("NEEDED", *check_needed(so)), ("exports", *check_exports(so))]
        built = info["BUILT_ARCHS"] if info else pinned
        if built:
            results.append(("cubins", *check_cubins(so, built)))
        results.append(("fences", *check_stage_fences(so)))
    if TORCH_LIBRARY in libs:
        so = zf.extract(TORCH_LIBRARY, tmp)
        results += [("NEEDED (eager)", *check_needed(so)), ("exports (eager)", *check_exports(so))]
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel")
    parser.add_argument("--archs", help="pin the arches: a comma list the wheel must hold (default: its build info)")
    parser.add_argument("--smoke", metavar="TORCH_SPEC", help="run the clean-venv check with this torch")
    parser.add_argument("--pip-arg", action="append", default=[], help="extra pip install argument")
    args = parser.parse_args(argv)
    pinned = [re.sub(r"^sm_", "", a.strip()) for a in (args.archs or "").split(",") if a.strip()]

    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(args.wheel) as zf:
        info = read_build_info(zf.read(BUILD_INFO).decode()) if BUILD_INFO in zf.namelist() else None
        pure = is_pure(info)
        results = [("tag", *check_tag(args.wheel, pure)), *check_contents(zf, tmp, pinned)]
    results.append(("size", *check_size(args.wheel)))
    if args.smoke:
        results.append(("clean venv", *check_smoke(args.wheel, args.smoke, args.pip_arg, pure)))

    print(f"check_wheel: {os.path.basename(args.wheel)}")
    for name, ok, detail in results:
        print(f"  {'ok  ' if ok else 'FAIL'} {name:<10} {detail}")
    failed = [name for name, ok, _ in results if not ok]
    print("check_wheel: " + ("all checks passed" if not failed else "FAILED: " + ", ".join(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
