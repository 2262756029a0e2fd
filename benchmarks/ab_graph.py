# SPDX-License-Identifier: MIT
"""Graph-replay medians of two or more libraries side by side, in interleaved rounds: what a
change to the plan or to the launches moves. Diagnostics
for a change, not the table:

    python benchmarks/ab_graph.py --libs OLD.so NEW.so [--rounds 2] [--exact] SHAPE ...

SHAPE is a bench_fwd.py id (T8192-N1-H6), NxTxH for N sequences of T tokens (2x1024x14), or
vL1,L2,...xH for varlen lengths (v700,324x12). A library named LIB:hint runs LIB with
flash_kda.fwd's max_seqlen hint (the longest sequence) on varlen shapes, so that
``--libs new.so new.so:hint`` compares the plan without and with it. flash_kda loads one library a process
($FLASH_KDA_LIBRARY), so each library's round runs in a process of its own; rounds alternate
between the libraries. Prints a markdown table: each library's plan (report.describe_plan)
and its milliseconds a round (the lowest of three medians of triton.testing.do_bench over
graph replays, bf16 state in and out, the automatic path unless --exact).
"""

import argparse
import json
import os
import subprocess
import sys

from bench_fwd import SHAPES


def parse_shape(shape):
    """(lengths, heads) of a SHAPE argument."""
    if shape in SHAPES:
        return SHAPES[shape]
    body, _, heads = shape.rpartition("x")
    if shape.startswith("v"):
        return [int(n) for n in body[1:].split(",")], int(heads)
    num_seqs, _, seqlen = body.partition("x")
    return [int(seqlen)] * int(num_seqs), int(heads)


def measure(shapes, exact, hint):
    """One JSON line per shape for the library this process loaded: its plan and graph ms."""
    import torch
    from bench_fwd import graphed, make_inputs, plan_of, runner, time_ms
    from report import describe_plan
    from triton.testing import do_bench

    for shape in shapes:
        lens, heads = parse_shape(shape)
        p = make_inputs(lens, heads)
        max_seqlen = max(lens) if hint and p["cu_seqlens"] is not None else None
        replay = graphed(runner(p, exact, max_seqlen=max_seqlen))
        ms = min(time_ms(do_bench, replay) for _ in range(3))
        plan = describe_plan(plan_of(p, exact, max_seqlen=max_seqlen))
        print(json.dumps(dict(shape=shape, plan=plan, ms=ms)), flush=True)
        del p, replay
        torch.cuda.empty_cache()


def run_round(lib, shapes, exact):
    """{shape: (plan, ms)} of one round of `lib` (LIB or LIB:hint), measured in a child process."""
    path, _, hint = lib.partition(":")
    env = dict(os.environ, FLASH_KDA_LIBRARY=os.path.abspath(path))
    options = (["--exact"] if exact else []) + (["--hint"] if hint == "hint" else [])
    command = [sys.executable, __file__, "--worker", *options, *shapes]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {r["shape"]: (r["plan"], r["ms"]) for r in rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shapes", nargs="+")
    parser.add_argument("--libs", nargs="+", help="libflash_kda.so files to compare, in order")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every library, interleaved")
    parser.add_argument("--exact", action="store_true", help="the exact path (default: automatic)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hint", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return measure(args.shapes, args.exact, args.hint)
    if not args.libs:
        parser.error("--libs is required")
    results = {lib: [] for lib in args.libs}
    for _ in range(args.rounds):
        for lib in args.libs:
            results[lib].append(run_round(lib, args.shapes, args.exact))
    names = [os.path.basename(lib) for lib in args.libs]
    print("| shape | " + " | ".join(f"{n} plan | {n} ms" for n in names) + " |")
    print("|---|" + "---|---|" * len(names))
    for shape in args.shapes:
        cells = []
        for lib in args.libs:
            plan = results[lib][0][shape][0]
            cells += [plan, " / ".join(f"{r[shape][1]:.4f}" for r in results[lib])]
        print(f"| {shape} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
