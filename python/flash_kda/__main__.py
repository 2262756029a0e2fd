# SPDX-License-Identifier: MIT
"""``python -m flash_kda info | check | bench``: environment report, self-check, timing.

The only module of the package that prints.
"""

import argparse
import ctypes
import importlib.metadata
import math
import sys
from typing import Optional

import torch

from . import _native, dispatch, reference
from ._api import fwd
from ._version import __version__

# Built-in self-check problems: (name, batch, seqlen, heads, sequence lengths, state dtype).
CHECKS = [
    ("batched-bf16state", 2, 100, 2, None, torch.bfloat16),
    ("varlen-fp32state", 1, 102, 3, [37, 0, 64, 1], torch.float32),
    ("single-chunk-nostate", 1, 16, 1, None, None),
]
CHECK_TOLERANCE = 1e-2  # relative Frobenius error against the fp64 gold


def _version_of(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version() -> str:
    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"{version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        pass
    return "none (no libcuda.so.1)"


def _arches(archs) -> str:
    """``"90a, 100a"`` from _build_info's tuples (of names, or of dicts with an ``arch``)."""
    return ", ".join(a["arch"] if isinstance(a, dict) else str(a) for a in archs)


def _build_line() -> Optional[str]:
    """What CMake recorded about the build (``_build_info``, absent in a source checkout)."""
    try:
        from . import _build_info
    except ImportError:
        return None
    fields = [
        ("built arches", _arches(getattr(_build_info, "BUILT_ARCHS", ()))),
        ("product arches", _arches(getattr(_build_info, "PRODUCT_ARCHS", ()))),
        ("requested", getattr(_build_info, "FLASH_KDA_CUDA_ARCHS", None)),
        ("nvcc", getattr(_build_info, "NVCC_VERSION", None)),
    ]
    return "; ".join(f"{name} {value}" for name, value in fields if value)


def _library_cuda(lib) -> str:
    runtime, driver = lib.cuda_versions()
    seen = dispatch.cuda_version_text(driver) if driver else "none"
    return f"CUDA runtime {dispatch.cuda_version_text(runtime)} (built with), driver {seen} (seen by the library)"


def _best_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def cmd_info(_args) -> int:
    lib = _native.load()
    fla = _version_of("flash-linear-attention") or _version_of("fla-core")
    print(f"flash_kda   {__version__}")
    print(f"torch       {torch.__version__} (CUDA runtime {torch.version.cuda or 'none'})")
    print(f"CUDA driver {_driver_version()}")
    print(f"fla         {fla or 'not installed'}")
    if lib is None:
        print(f"library     not loaded: {_native.load_error()}")
    else:
        names = ", ".join(a.name for a in lib.archs) or "none"
        print(f"library     {lib.path} (C ABI {_native.ABI_VERSION}); arches: {names}")
        print(f"lib CUDA    {_library_cuda(lib)}")
    build = _build_line()
    if build:
        print(f"build       {build}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"GPU {i}       {p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs)")
    else:
        print("GPU         none visible")
    device = _best_device()
    path, reason = dispatch.explain(device)
    print(f"backend     {path} on {device}: {reason}")
    return 0


def cmd_check(_args) -> int:
    device = _best_device()
    path, reason = dispatch.explain(device)
    print(f"flash_kda check on {device}, path {path} ({reason})")
    print(f"{'problem':<22} {'out err':>10} {'state err':>10}  result")
    failed = 0
    for seed, (name, batch, seqlen, heads, lens, state_dtype) in enumerate(CHECKS):
        final = state_dtype or torch.float32
        p = reference.random_problem(
            batch, seqlen, heads, lens=lens, initial=state_dtype, final=final, device=device, seed=seed
        )
        fwd(*[p[name] for name in reference.FWD_ARGS])
        gold_out, gold_state = reference.gold(*[p[name] for name in reference.GOLD_ARGS])
        e_out = reference.rel_err(p["out"], gold_out)
        e_state = reference.rel_err(p["final_state"], gold_state)
        ok = math.isfinite(e_out) and math.isfinite(e_state) and max(e_out, e_state) <= CHECK_TOLERANCE
        failed += not ok
        print(f"{name:<22} {e_out:>10.2e} {e_state:>10.2e}  {'ok' if ok else 'FAIL'}")
    print("all checks passed" if not failed else f"{failed} check(s) failed (tolerance {CHECK_TOLERANCE})")
    return 1 if failed else 0


def cmd_bench(args) -> int:
    if not torch.cuda.is_available():
        print("bench needs a CUDA GPU", file=sys.stderr)
        return 2
    device = _best_device()
    bf16 = torch.bfloat16
    p = reference.random_problem(args.batch, args.seqlen, args.heads, initial=bf16, final=bf16, device=device)

    def run():
        fwd(*[p[name] for name in reference.FWD_ARGS])

    for _ in range(3):
        run()
    times: list[float] = []
    for _ in range(args.repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    print(
        f"B={args.batch} T={args.seqlen} H={args.heads} path={dispatch.backend_for(device)}: "
        f"median {times[len(times) // 2]:.3f} ms over {args.repeats} runs"
    )
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flash_kda", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, GPU, compiled arches and the path fwd would take")
    sub.add_parser("check", help="run fwd on small problems and compare with the fp64 gold")
    bench = sub.add_parser("bench", help="time fwd on one batched shape (bf16 state)")
    bench.add_argument("--batch", type=int, default=1)
    bench.add_argument("--seqlen", type=int, default=8192)
    bench.add_argument("--heads", type=int, default=16)
    bench.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    return {"info": cmd_info, "check": cmd_check, "bench": cmd_bench}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
