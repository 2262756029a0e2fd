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
between the libraries. LIB:gate=softplus runs that gate form (bench_fwd.with_gate; several joined
by + take turns on each shape in one process, a column each: LIB:gate=lower_bound+softplus;
round r starts with the (r mod n)-th of n gates, so that over n rounds each takes each place:
a shape's later gates run on a hotter GPU, H200: T=32768 H=96's bounded gate 2.806 / 2.835 /
2.858 / 2.898 ms first to fourth, so run a multiple of n rounds), and
LIB:py=DIR imports flash_kda from DIR (another tree's package, for a library of another C ABI);
LIB:stable runs AUTO mode's stable inverse (design section 2.6) and LIB:nostable FlashKDA's
inverse, whatever the arch table's default (flash_kda.testing's overrides stable_inverse and
unvalidated_forms); LIB:plan=chunk_tokens=32,block_v=64 forces those plan fields (the test
entry point's overrides, bench_fwd.runner), so that one library's plan and a forced one run
side by side; options combine
(LIB:hint:gate=softplus). --json PATH also writes the rounds' numbers. Prints a
markdown table: each library's plan (report.describe_plan) and its milliseconds a round (the lowest of three medians of
triton.testing.do_bench over graph replays, bf16 state in and out, the automatic path unless
--exact).
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


def measure(shapes, exact, hint, gates, forced):
    """One JSON line per shape and gate for the library this process loaded: its plan (or the
    `forced` fields) and graph ms; the gates take turns on each shape's inputs, in the given order."""
    from bench_fwd import graphed, make_inputs, plan_of, runner, time_ms, with_gate
    from report import describe_plan
    from triton.testing import do_bench

    import torch

    for shape in shapes:
        lens, heads = parse_shape(shape)
        base = make_inputs(lens, heads)
        for gate in gates:
            p = with_gate(base, gate)
            max_seqlen = max(lens) if hint and p["cu_seqlens"] is not None else None
            replay = graphed(runner(p, exact, max_seqlen=max_seqlen, **forced))
            ms = min(time_ms(do_bench, replay) for _ in range(3))
            if forced:
                plan = "forced " + " ".join(f"{k}={v}" for k, v in forced.items())
            else:
                plan = describe_plan(plan_of(p, exact, max_seqlen=max_seqlen))
            print(json.dumps(dict(shape=shape, gate=gate, plan=plan, ms=ms)), flush=True)
            del p, replay
        del base
        torch.cuda.empty_cache()


def forced_of(text):
    """The plan fields of a plan= option ("chunk_tokens=32,block_v=64") as {name: int}."""
    pairs = [item.partition("=") for item in text.split(",") if item]
    return {name: int(value) for name, _, value in pairs}


def column_tag(option):
    """What a LIB option adds to its columns' names (the inverse's and a forced plan's)."""
    if option in ("stable", "nostable") or option.startswith("plan="):
        return " " + option
    return ""


def gates_of(lib):
    """The gate forms a LIB spec runs (its gate= option, + joined)."""
    for opt in lib.split(":")[1:]:
        if opt.startswith("gate="):
            return opt[5:].split("+")
    return ["lower_bound"]


def run_round(lib, shapes, exact, turn):
    """{(shape, gate): (plan, ms)} of one round of `lib` (LIB[:hint][:gate=G[+G]][:py=DIR]),
    measured in a child process: its gates in turn from the one numbered `turn` on."""
    path, *opts = lib.split(":")
    env = dict(os.environ, FLASH_KDA_LIBRARY=os.path.abspath(path))
    options = (["--exact"] if exact else []) + (["--hint"] if "hint" in opts else [])
    options += ["--stable", "1"] if "stable" in opts else ["--stable", "-1"] if "nostable" in opts else []
    gates = gates_of(lib)
    turn %= len(gates)
    options += ["--gate", "+".join(gates[turn:] + gates[:turn])]
    options += [f"--plan={opt[5:]}" for opt in opts if opt.startswith("plan=")]
    for opt in opts:
        if opt.startswith("py="):
            env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(opt[3:]), env.get("PYTHONPATH", "")])
    command = [sys.executable, __file__, "--worker", *options, *shapes]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {(r["shape"], r["gate"]): (r["plan"], r["ms"]) for r in rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shapes", nargs="+")
    parser.add_argument("--libs", nargs="+", help="libflash_kda.so files to compare, in order")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every library, interleaved")
    parser.add_argument("--exact", action="store_true", help="the exact path (default: automatic)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hint", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stable", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--gate", default="lower_bound", help=argparse.SUPPRESS)
    parser.add_argument("--plan", default="", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write {lib: {gate: {shape: [ms of each round]}}} here")
    args = parser.parse_args()
    if args.worker:
        if args.stable:
            from flash_kda import testing

            testing.set_overrides(stable_inverse=args.stable, unvalidated_forms=1)
        return measure(args.shapes, args.exact, args.hint, args.gate.split("+"), forced_of(args.plan))
    if not args.libs:
        parser.error("--libs is required")
    results = {lib: [] for lib in args.libs}
    for turn in range(args.rounds):
        for lib in args.libs:
            results[lib].append(run_round(lib, args.shapes, args.exact, turn))
    columns = [(lib, gate) for lib in args.libs for gate in gates_of(lib)]
    names = [os.path.basename(lib.split(":")[0]) + "".join(column_tag(o) for o in lib.split(":")[1:])
             + (f" {g}" if len(gates_of(lib)) > 1 else "") for lib, g in columns]  # fmt: skip
    print("| shape | " + " | ".join(f"{n} plan | {n} ms" for n in names) + " |")
    print("|---|" + "---|---|" * len(names))
    for shape in args.shapes:
        cells = []
        for lib, gate in columns:
            plan = results[lib][0][(shape, gate)][0]
            cells += [plan, " / ".join(f"{r[(shape, gate)][1]:.4f}" for r in results[lib])]
        print(f"| {shape} | " + " | ".join(cells) + " |")
    if args.json:
        data = {lib: {g: {s: [r[(s, g)][1] for r in results[lib]] for s in args.shapes} for g in gates_of(lib)}
                for lib in args.libs}  # fmt: skip
        import datetime

        from bench_host import git_commit

        import torch

        facts = dict(gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None, commit=git_commit(),
                     date=datetime.date.today().isoformat(), command=" ".join(["python", *sys.argv]))  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(dict(facts, shapes=args.shapes, exact=args.exact, results=data), f, indent=1)


if __name__ == "__main__":
    main()
