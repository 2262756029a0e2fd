# SPDX-License-Identifier: MIT
"""Per-kernel GPU time of one native forward (prefix, K1 prepare, the recurrence passes,
combine), from the PyTorch profiler (CUPTI sees the library's launches too). Diagnostics,
not a table:

    python benchmarks/profile_kernels.py [--exact] T8192-N1-H96 T8192-N1-H6
    python benchmarks/profile_kernels.py --segments 16,32 T8192-N1-H6   (forced segment lengths)
    ncu --clock-control none -k regex:recurrence python benchmarks/profile_kernels.py --once T8192-N1-H6

``--once`` runs each shape's forward once without the profiler (for ncu).
"""

import argparse

import torch
from bench_fwd import SHAPES, make_inputs, runner


def profile(shape_id, exact, repeats=10, once=False, segment_chunks=0):
    lens, heads = SHAPES[shape_id]
    hook = dict(segment_chunks=segment_chunks) if segment_chunks else {}
    run = runner(make_inputs(lens, heads), exact, **hook)
    run()
    torch.cuda.synchronize()
    if once:
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            run()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_time_total > 0 and e.count >= repeats:
            name = e.key.split("(")[0].replace("void flash_kda::sm90a::", "")
            rows.append((name[:40], e.device_time_total / repeats, e.count // repeats))
    mode = "exact" if exact else f"auto L={segment_chunks}" if segment_chunks else "auto"
    print(f"{shape_id} {mode}: " + ", ".join(f"{n} x{c} {t:.1f} us" for n, t, c in sorted(rows, key=lambda r: -r[1])))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shapes", nargs="+")
    parser.add_argument("--exact", action="store_true", help="the exact path (default: automatic)")
    parser.add_argument("--once", action="store_true", help="one forward per shape, no profiler (for ncu)")
    parser.add_argument("--segments", default="0", help="forced segment lengths in chunks, comma-separated")
    args = parser.parse_args()
    for shape in args.shapes:
        for L in [0] if args.exact else [int(x) for x in args.segments.split(",")]:
            profile(shape, args.exact, once=args.once, segment_chunks=L)


if __name__ == "__main__":
    main()
