# SPDX-License-Identifier: MIT
"""Per-kernel GPU time of one native forward (prefix, K1 prepare, K2 recurrence), from
the PyTorch profiler (CUPTI sees the library's launches too). Diagnostics, not a table:

    python benchmarks/profile_kernels.py T8192-N1-H96 T8192-N1-H6
    ncu --clock-control none -k regex:recurrence python benchmarks/profile_kernels.py --once T8192-N1-H6

``--once`` runs each shape's forward once without the profiler (for ncu).
"""

import sys

import torch
from bench_fwd import SHAPES, make_inputs, native_runner


def profile(shape_id, repeats=10, once=False):
    lens, heads = next((l, h) for s, l, h in SHAPES if s == shape_id)
    run = native_runner(make_inputs(lens, heads))
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
            rows.append((name[:48], e.device_time_total / e.count))
    print(f"{shape_id}: " + ", ".join(f"{n} {t:.1f} us" for n, t in sorted(rows, key=lambda r: -r[1])))


if __name__ == "__main__":
    once = "--once" in sys.argv
    for shape in (a for a in sys.argv[1:] if a != "--once"):
        profile(shape, once=once)
