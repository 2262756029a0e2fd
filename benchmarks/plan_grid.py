# SPDX-License-Identifier: MIT
"""The plans of a grid of problem sizes, from the native library's cost model alone (no GPU),
for the reference devices the plan knows (src/costs.h: the H200, sm_100's and sm_120's facts)
at any SM count: what a change to the plan (src/plan.cpp, src/costs.h) moves, before any
device time.

    python benchmarks/plan_grid.py [--device h200] [--sms 132] [--exact]          (every plan)
    python benchmarks/plan_grid.py --against /path/to/old/libflash_kda.so   (only the plans that differ)
    python benchmarks/plan_grid.py --against old.so --moved moved.txt   (and those shapes for ab_graph.py:
        python benchmarks/ab_graph.py --libs old.so new.so $(cat moved.txt))
    python benchmarks/plan_grid.py --summary --device all --sms 20,48,84,132,148,170,188
    python benchmarks/plan_grid.py --gate softplus --against-gate lower_bound   (where a gate's plans differ)

--summary prints, for each device and SM count, the plans, the refusals, the plans the launch
could not honour (K1 beside a pass with more K1 CTAs than the device fits there) and what moved
against the same grid planned with the H200's facts (the plan before it took the device's),
by what moved: chunk length, widths, segments, K1's place. The library is the one flash_kda
loads ($FLASH_KDA_LIBRARY or the package's). Batched calls of N sequences of T tokens with H
heads, N T <= 2^20; the plan's words are report.py's.
"""

import argparse
import collections
import os

from bench_fwd import plan_fields
from flash_kda import _native, testing
from report import describe_plan

TOKENS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576)
HEADS = (1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 24, 28, 32, 48, 64, 96)
SEQUENCES = (1, 2, 4, 8)
WIDTHS = (32, 64, 128)  # src/kda/config.h kRecurrenceShapes


def plan_of(lib, num_seqs, seqlen, heads, sms, exact, device="h200", gate="lower_bound"):
    """lib's plan (bench_fwd.plan_of's dict) for a batched call with that gate form on a
    reference device; the pointers are never read. None where the library refuses it."""
    pointers = dict(q=0x1000, k=0x2000, v=0x3000, g=0x4000, beta=0x5000, out=0x6000, A_log=0x7000, dt_bias=0x8000)
    args = testing.FwdArgs(
        mode=0 if exact else 1, batch=num_seqs, seqlen=seqlen, heads=heads, head_dim=128,
        num_seqs=num_seqs, scale=0.088, lower_bound=-5.0, workspace=0x9000, workspace_bytes=1 << 40,
        num_sms=sms, gate=_native.GATE_CODES[gate], **pointers,
    )  # fmt: skip
    try:
        return plan_fields(testing.plan_on(device, args, sms=sms, library=lib))
    except RuntimeError:
        return None


def honoured(plan, facts, gate="lower_bound"):
    """Whether the launch can run the plan's K1 as planned on a device with these facts: K1
    beside the pass needs that many of the gate's K1 CTAs to fit beside one pass CTA."""
    if plan["overlap_min_ctas"] == 0 or plan["overlap_max_ctas"] == 0:
        return True  # K1 first, or leaving the pass's SMs: any device
    beside = facts["k1_beside" if gate == "lower_bound" else "k1_beside_unbounded"]
    fits = beside[plan["chunk_tokens"] // 16 - 1][WIDTHS.index(plan["block_v"])]
    return plan["overlap_min_ctas"] <= fits


def what_moved(old, new):
    """The parts of a plan that differ: chunk, width, segments, K1."""
    parts = []
    if old["chunk_tokens"] != new["chunk_tokens"]:
        parts.append("chunk")
    if (old["block_v"], old["segment_block_v"]) != (new["block_v"], new["segment_block_v"]):
        parts.append("width")
    if old["segment_chunks"] != new["segment_chunks"]:
        parts.append("segments")
    if (old["overlap_min_ctas"], old["overlap_max_ctas"]) != (new["overlap_min_ctas"], new["overlap_max_ctas"]):
        parts.append("K1")
    return parts


def summary(lib, devices, sms_list, exact, shapes, gate):
    print("| device | SMs | plans | refused | not honourable | moved against the H200's facts | chunk | width | "
          "segments | K1 |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for device in devices:
        facts = testing.reference_device(device)
        for sms in sms_list:
            refused, unhonoured, moved, parts = 0, 0, 0, collections.Counter()
            for n, t, h in shapes:
                new = plan_of(lib, n, t, h, sms, exact, device, gate)
                if new is None:
                    refused += 1
                    continue
                unhonoured += not honoured(new, facts, gate)
                old = plan_of(lib, n, t, h, sms, exact, "h200", gate)
                if old is not None and describe_plan(old) != describe_plan(new):
                    moved += 1
                    parts.update(what_moved(old, new))
            cells = (device, sms, len(shapes), refused, unhonoured, moved, *(parts[p] for p in ("chunk", "width",
                     "segments", "K1")))  # fmt: skip
            print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--device", default="h200", help=f"a reference device ({', '.join(testing.REFERENCE_DEVICES)}) or all"
    )
    parser.add_argument("--sms", default="132", help="multiprocessors planned for, comma-separated (H200: 132)")
    parser.add_argument("--exact", action="store_true", help="exact mode (default: automatic)")
    parser.add_argument("--summary", action="store_true", help="counts per device and SM count (see above)")
    parser.add_argument("--against", help="another libflash_kda.so: print only the plans that differ")
    parser.add_argument("--moved", help="with --against: write the shapes whose plans differ to this file (NxTxH)")
    parser.add_argument("--gate", default="lower_bound", choices=_native.GATE_CODES, help="the gate form planned for")
    parser.add_argument("--against-gate", choices=_native.GATE_CODES,
                        help="print only the plans that differ from this gate's (the same library)")  # fmt: skip
    args = parser.parse_args()
    if args.moved and not (args.against or args.against_gate):
        parser.error("--moved needs --against or --against-gate")
    lib = testing.native_library()
    if lib is None:
        parser.error(testing.native_error())
    devices = testing.REFERENCE_DEVICES if args.device == "all" else (args.device,)
    sms_list = [int(s) for s in args.sms.split(",")]
    shapes = [(n, t, h) for t in TOKENS for h in HEADS for n in SEQUENCES if n * t <= 1 << 20]
    if args.summary:
        summary(lib, devices, sms_list, args.exact, shapes, args.gate)
        return
    other = testing.load_library(os.path.abspath(args.against)) if args.against else None
    compared = other is not None or args.against_gate is not None
    other_gate = args.against_gate or args.gate
    moved = []
    for device in devices:
        for sms in sms_list:
            for n, t, h in shapes:
                plan = plan_of(lib, n, t, h, sms, args.exact, device, args.gate)
                new = describe_plan(plan) if plan is not None else "refused"
                label = f"{device} {sms} SMs N{n} T{t} H{h}" if len(devices) * len(sms_list) > 1 else f"N{n} T{t} H{h}"
                if not compared:
                    print(f"{label}: {new}")
                    continue
                before = plan_of(other or lib, n, t, h, sms, args.exact, device, other_gate)
                old = describe_plan(before) if before is not None else "refused"
                if old != new:
                    moved.append(f"{n}x{t}x{h}")
                    print(f"{label}: {old} -> {new}")
    if compared:
        against = f"{(other or lib).path}, gate {other_gate}"
        print(f"{len(moved)} of {len(shapes) * len(devices) * len(sms_list)} plans differ ({lib.path}, gate "
              f"{args.gate}, against {against})")  # fmt: skip
    if args.moved:
        with open(args.moved, "w") as f:
            f.write(" ".join(moved) + "\n")


if __name__ == "__main__":
    main()
