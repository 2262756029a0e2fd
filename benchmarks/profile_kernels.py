# SPDX-License-Identifier: MIT
"""Per-kernel GPU time of one native forward (prefix, K1 prepare, the recurrence passes,
combine), from the PyTorch profiler (CUPTI sees the library's launches too). Diagnostics,
not a table:

    python benchmarks/profile_kernels.py [--exact] T8192-N1-H96 T8192-N1-H6
    python benchmarks/profile_kernels.py --segments 16,32 T8192-N1-H6   (forced segment lengths)
    python benchmarks/profile_kernels.py --segments 64 --block-v 64,128 T32768-N1-H6   (and widths)
    python benchmarks/profile_kernels.py --serial T8192-N1-H96   (K1 before the pass, never beside it)
    python benchmarks/profile_kernels.py --gate lower_bound,softplus T8192-N1-H96   (gate forms in turn)
    python benchmarks/profile_kernels.py --timeline T8192-N1-H96   (each kernel's start and end)
    ncu --clock-control none -k regex:recurrence python benchmarks/profile_kernels.py --once T8192-N1-H6

``--once`` runs each shape's forward once without the profiler (for ncu). ``--timeline``
prints, for each of three forwards, every kernel's start and end in microseconds after the
forward's first kernel began, so where one kernel waits for another shows.

Every kernel after K1 is launched programmatically (design section 4.1): its CTAs start while
the kernel before drains and wait for its end, so a kernel's span here includes that wait and
the spans of one call overlap (the combine's, at T=8192 H=6, shows ~45 us for ~11 of work).
For a kernel's own time use ncu (``--once`` above), which runs the kernels one at a time.
"""

import argparse
import re

import torch
from bench_fwd import SHAPES, make_inputs, runner, with_gate

PASS_CODES = {"0": "plain", "1": "general", "2": "states", "3": "rerun"}  # config.h PassCode


def kernel_name(key):
    """A kernel's short name: no namespace or parameter list, the PassCode by name."""
    name = re.sub(r"^void |flash_kda::(sm\w+::)?", "", key)
    name = re.sub(r"\(FwdParams.*$", "", name)
    return re.sub(r"\(PassCode\)(\d)", lambda m: PASS_CODES.get(m.group(1), m.group(1)), name)


def timeline(prof):
    """'name start-end' of every kernel of a profiled forward, in us after its first began."""
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)  # fmt: skip
    t0 = events[0].time_range.start
    spans = (f"{kernel_name(e.name)} {e.time_range.start - t0:.1f}-{e.time_range.end - t0:.1f}" for e in events)
    return " | ".join(spans)


def profile(shape_id, exact, repeats=10, once=False, segment_chunks=0, block_v=0, overlap=0, chunk=0,
            gate="lower_bound", timelines=0):  # fmt: skip
    lens, heads = SHAPES[shape_id]
    hook = dict(segment_chunks=segment_chunks, block_v=block_v, overlap=overlap, chunk_tokens=chunk)
    hook = {k: v for k, v in hook.items() if v}
    run = runner(with_gate(make_inputs(lens, heads), gate), exact, **hook)
    run()
    torch.cuda.synchronize()
    if once:
        return
    for i in range(timelines):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        print(f"{shape_id} gate={gate} forward {i}: {timeline(prof)}")
    if timelines:
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            run()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_time_total > 0 and e.count >= repeats:
            rows.append((kernel_name(e.key), e.device_time_total / repeats, e.count // repeats))
    mode = "exact" if exact else f"auto L={segment_chunks}" if segment_chunks else "auto"
    mode += f" block_v={block_v}" if block_v else ""
    mode += " K1 serial" if overlap < 0 else ""
    mode += f" chunk={chunk}" if chunk else ""
    mode += f" gate={gate}" if gate != "lower_bound" else ""
    print(f"{shape_id} {mode}: " + ", ".join(f"{n} x{c} {t:.1f} us" for n, t, c in sorted(rows, key=lambda r: -r[1])))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shapes", nargs="+")
    parser.add_argument("--exact", action="store_true", help="the exact path (default: automatic)")
    parser.add_argument("--once", action="store_true", help="one forward per shape, no profiler (for ncu)")
    parser.add_argument("--segments", default="0", help="forced segment lengths in chunks, comma-separated")
    parser.add_argument("--block-v", default="0", help="forced block_v values, comma-separated (0: the plan's)")
    parser.add_argument("--serial", action="store_true", help="K1 before the pass, never beside it")
    parser.add_argument("--chunk", default="0", help="forced chunk lengths (16, 32; 0: the plan's), comma-separated")
    parser.add_argument("--gate", default="lower_bound", help="gate forms (bench_fwd.with_gate), comma-separated")
    parser.add_argument("--timeline", action="store_true", help="each kernel's start and end, three forwards")
    args = parser.parse_args()
    overlap = -1 if args.serial else 0
    for shape in args.shapes:
        for L in [0] if args.exact else [int(x) for x in args.segments.split(",")]:
            for bv in [int(x) for x in args.block_v.split(",")]:
                for chunk in [int(x) for x in args.chunk.split(",")]:
                    for gate in args.gate.split(","):
                        profile(shape, args.exact, once=args.once, segment_chunks=L, block_v=bv, overlap=overlap,
                                chunk=chunk, gate=gate, timelines=3 if args.timeline else 0)  # fmt: skip


if __name__ == "__main__":
    main()
