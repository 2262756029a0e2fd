# SPDX-License-Identifier: MIT
"""The cost table's link times (src/costs.h) measured in a test mode: what the plan's rows
hold, from this GPU. In generic mode on an H200 these are the mma.sync row's estimates.

    python benchmarks/link_rates.py [--mode generic] [--out rates.json]

Each pass's own time is the end of its kernel minus the end of the kernel before it (the
torch profiler's CUPTI spans; every pass waits for the one before, design section 4.1, so the
difference is the pass alone), over two chain lengths, so that a wave's fixed part cancels:
a link = (t(L2) - t(L1)) / (waves (L2 - L1)). The whole-sequence pass runs one CTA an SM
after K1 (T = 8192, 512 links: H = 6 / 48 / 96 at block_v 32 / 64 / 128, and T = 4096 for the
difference); the segment pass and the rerun in 7 segments of 32 and 96 chunks, alone (H = 1: at most one
CTA an SM) and over more than one wave at their residency (H = 24 at block_v 64, 48 at 128),
solved for the link as plan.cpp's pass_us counts waves.
Diagnostics for the cost table: it asserts nothing.
"""

import argparse
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from conftest import check, make_problem  # noqa: E402
from flash_kda import testing  # noqa: E402


def pass_times(p, keywords, forced, overrides, repeats=5):
    """{kernel name: median us from the end of the kernel before it to its own end} of the
    call's kernels (each of `repeats` calls profiled alone)."""
    call = check(p, **keywords)
    testing.run_native(call, **forced, **overrides)
    torch.cuda.synchronize()
    per_kernel = {}
    for _ in range(repeats):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            testing.run_native(call, **forced, **overrides)
            torch.cuda.synchronize()
        kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                         key=lambda e: e.time_range.start)  # fmt: skip
        for before, after in zip(kernels, kernels[1:]):
            per_kernel.setdefault(after.name, []).append(after.time_range.end - before.time_range.end)
    return {name: sorted(v)[len(v) // 2] for name, v in per_kernel.items()}


CODES = {"kPlain": 0, "kGeneral": 1, "kStates": 2, "kRerun": 3}  # src/kda/config.h PassCode


def pass_time(times, codes):
    """The time of the recurrence pass whose PassCode is one of `codes` (the profiler names a
    kernel as its demangled symbol: ``recurrence_kernel<1, 4, (flash_kda::PassCode)0, 1>``)."""
    for name, t in times.items():
        if "recurrence_kernel" in name and any(f"PassCode){CODES[code]}" in name for code in codes):
            return t
    return math.nan


STATES, RERUN = ("kStates",), ("kGeneral", "kRerun")  # recurrence_kernel's rerun is kGeneral


def per_link(slope, ctas, slots, sms, alone):
    """The link time at the pass's residency from the measured time a link of the chain
    (slope) of a pass of `ctas` CTAs, as plan.cpp pass_us counts it: full waves at that link
    time, a last wave of at most one CTA an SM at `alone`."""
    full, rest = divmod(ctas, slots)
    if full == 0:
        return slope  # one wave of more than one CTA on some SM
    last = 0.0 if rest == 0 else alone if rest <= sms else None
    return slope / (full + 1) if last is None else (slope - last) / full


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", default="generic")
    parser.add_argument("--out")
    args = parser.parse_args()
    overrides = testing.mode_overrides(args.mode)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rates = {}

    def problem(seqlen, heads, seed):
        return make_problem(1, seqlen, heads, initial=torch.bfloat16, final=torch.bfloat16, device="cuda", seed=seed)

    for bv, heads in ((32, 6), (64, 48), (128, 96)):
        t = {n: pass_time(pass_times(problem(n, heads, 1), dict(exact=True), dict(block_v=bv, overlap=-1),
                                     overrides), ("kPlain",)) for n in (4096, 8192)}  # fmt: skip
        rates[f"whole_link_us[{bv}]"] = (t[8192] - t[4096]) / 256
        print(f"block_v {bv} whole pass: {t} us -> {rates[f'whole_link_us[{bv}]']:.3f} us a link", flush=True)
    segments, lengths = 7, (32, 96)  # phase A: 2 x 7 - 3 = 11 x 128 columns a head
    for bv, link_heads in ((64, 24), (128, 48)):
        for which, codes, columns, resident in (("states", STATES, 11 * 128, 2),
                                                 ("rerun", RERUN, segments * 128, 2 if bv == 64 else 1)):  # fmt: skip
            slope = {}
            for label, heads in (("alone", 1), ("link", link_heads)):
                forced = [dict(block_v=bv, segment_chunks=L) for L in lengths]
                t = [pass_time(pass_times(problem(16 * L * segments, heads, 2), dict(exact=False), f, overrides), codes)
                     for L, f in zip(lengths, forced)]  # fmt: skip
                slope[label] = (t[1] - t[0]) / (lengths[1] - lengths[0])
                print(f"block_v {bv} {which} H={heads}: {t[0]:.1f} / {t[1]:.1f} us", flush=True)
            ctas = link_heads * columns // bv
            rates[f"{which}_alone_us[{bv}]"] = slope["alone"]
            rates[f"{which}_link_us[{bv}]"] = per_link(slope["link"], ctas, resident * sms, sms, slope["alone"])
            print(f"  -> {which} alone {slope['alone']:.3f}, at {resident} an SM "
                  f"{rates[f'{which}_link_us[{bv}]']:.3f} us a link", flush=True)  # fmt: skip
    for bv, heads in ((32, 24), (64, 48)):
        p = problem(8192, heads, 3)
        t32 = pass_time(pass_times(p, dict(exact=False), dict(block_v=bv, chunk_tokens=32, overlap=-1), overrides),
                        ("kPlain",))  # fmt: skip
        t16 = pass_time(pass_times(p, dict(exact=True), dict(block_v=bv, overlap=-1), overrides), ("kPlain",))
        rates[f"chunk32_link_scale[{bv}]"] = 2 * t32 / t16
        print(f"block_v {bv}: 32-token pass {t32:.1f} us, 16-token {t16:.1f} us -> scale {2 * t32 / t16:.2f}")
    result = dict(mode=args.mode, gpu=torch.cuda.get_device_name(0), rates=rates)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
