# SPDX-License-Identifier: MIT
"""The plans of a grid of problem sizes, from the native library's cost model alone (no GPU):
what a change to the plan (src/plan.cpp, src/kda/config.h) moves, before any device time.

    python benchmarks/plan_grid.py [--sms 132] [--exact]
    python benchmarks/plan_grid.py --against /path/to/old/libflash_kda.so   (only the plans that differ)
    python benchmarks/plan_grid.py --against old.so --moved moved.txt   (and those shapes for ab_graph.py:
        python benchmarks/ab_graph.py --libs old.so new.so $(cat moved.txt))

The library is the one flash_kda loads ($FLASH_KDA_LIBRARY or the package's). Batched calls
of N sequences of T tokens with H heads, N T <= 2^20; the plan's words are report.py's.
"""

import argparse
import os

from bench_fwd import plan_fields
from flash_kda import testing
from report import describe_plan

TOKENS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576)
HEADS = (1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 24, 28, 32, 48, 64, 96)
SEQUENCES = (1, 2, 4, 8)


def plan_of(lib, num_seqs, seqlen, heads, sms, exact):
    """lib's plan (bench_fwd.plan_of's dict) for a batched call; the pointers are never read."""
    pointers = dict(q=0x1000, k=0x2000, v=0x3000, g=0x4000, beta=0x5000, out=0x6000, A_log=0x7000, dt_bias=0x8000)
    args = testing.FwdArgs(
        mode=0 if exact else 1, batch=num_seqs, seqlen=seqlen, heads=heads, head_dim=128,
        num_seqs=num_seqs, scale=0.088, lower_bound=-5.0, workspace=0x9000, workspace_bytes=1 << 40,
        num_sms=sms, **pointers,
    )  # fmt: skip
    return plan_fields(lib.plan(args))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sms", type=int, default=132, help="multiprocessors of the GPU planned for (H200: 132)")
    parser.add_argument("--exact", action="store_true", help="exact mode (default: automatic)")
    parser.add_argument("--against", help="another libflash_kda.so: print only the plans that differ")
    parser.add_argument("--moved", help="with --against: write the shapes whose plans differ to this file (NxTxH)")
    args = parser.parse_args()
    if args.moved and not args.against:
        parser.error("--moved needs --against")
    lib = testing.native_library()
    if lib is None:
        parser.error(testing.native_error())
    other = testing.load_library(os.path.abspath(args.against)) if args.against else None
    shapes = [(n, t, h) for t in TOKENS for h in HEADS for n in SEQUENCES if n * t <= 1 << 20]
    moved = []
    for n, t, h in shapes:
        new = describe_plan(plan_of(lib, n, t, h, args.sms, args.exact))
        if other is None:
            print(f"N{n} T{t} H{h}: {new}")
            continue
        old = describe_plan(plan_of(other, n, t, h, args.sms, args.exact))
        if old != new:
            moved.append(f"{n}x{t}x{h}")
            print(f"N{n} T{t} H{h}: {old} -> {new}")
    if other is not None:
        print(f"{len(moved)} of {len(shapes)} plans differ ({lib.path} against {other.path})")
    if args.moved:
        with open(args.moved, "w") as f:
            f.write(" ".join(moved) + "\n")


if __name__ == "__main__":
    main()
