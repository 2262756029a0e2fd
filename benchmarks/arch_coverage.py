# SPDX-License-Identifier: MIT
"""Which kernel instantiations and ring depths a test mode runs (flash_kda.testing's modes:
default, generic, sm120, sm100), against every instantiation the other arches build:

    python benchmarks/arch_coverage.py [--modes generic,sm120] [--out coverage.json] [--doc docs/build.md]

Runs a matrix of native calls in each mode (batched and varlen, every block_v, exact and AUTO
with forced segments and 32-token chunks, K1 first, beside and leaving, checkpoints, a wave of
more CTAs than SMs), records what each launched (flash_kda.testing.launched: the instantiation
as the source names it, ring depth, CTAs an SM, shared memory), and prints the instantiations
and depths each mode ran. The instantiations expected are those docs/build.md's resource
summary lists for sm_100a and sm_120a (generated from the build log; --doc, where that file
is elsewhere): the script names any the modes left unrun, and skips that comparison where the
file is missing. Diagnostics: it asserts nothing.
"""

import argparse
import collections
import json
import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from conftest import check, clone_outputs, make_problem, with_forms  # noqa: E402
from flash_kda import testing  # noqa: E402

BUILD_MD = os.path.join(HERE, "..", "docs", "build.md")


def calls(sms):
    """(id, problem, fwd keywords, forced plan) of the matrix."""
    out = []

    def add(name, batch, seqlen, heads, keywords, forced, lens=None, checkpoint=0, gate=None, beta_is_logit=True):
        p = make_problem(batch, seqlen, heads, lens=lens, initial=torch.bfloat16, final=torch.bfloat16,
                         device="cuda", seed=len(out))  # fmt: skip
        if gate is not None:  # the gate and beta forms' K1 (testing's unvalidated_forms)
            p = with_forms(p, gate, beta_is_logit=beta_is_logit, seed=len(out))
            forced = dict(forced, unvalidated_forms=1)
        if checkpoint:
            total = sum(lens) if lens else batch * seqlen
            p["checkpoints"] = torch.empty(total // checkpoint + batch, heads, 128, 128, dtype=torch.bfloat16,
                                           device="cuda")  # fmt: skip
            keywords = dict(keywords, checkpoint_every=checkpoint)
        out.append((name, p, keywords, forced))

    for bv in (32, 64, 128):
        add(f"exact-bv{bv}", 1, 1000, 3, dict(exact=True), dict(block_v=bv, overlap=-1))
        add(f"exact-bv{bv}-beside", 1, 1000, 3, dict(exact=True), dict(block_v=bv, overlap=1))
        add(f"exact-bv{bv}-leaving", 1, 1000, 3, dict(exact=True), dict(block_v=bv, overlap=2))
        add(f"exact-bv{bv}-varlen", 1, 0, 3, dict(exact=True), dict(block_v=bv), lens=[300, 0, 41, 700])
        add(f"exact-bv{bv}-checkpoints", 1, 0, 2, dict(exact=True), dict(block_v=bv), lens=[300, 200], checkpoint=64)
        add(f"auto-seg-bv{bv}", 1, 2000, 2, dict(exact=False), dict(block_v=bv, segment_chunks=8))
        add(f"auto-seg-bv{bv}-checkpoints", 1, 0, 2, dict(exact=False), dict(block_v=bv, segment_chunks=8),
            lens=[900, 500], checkpoint=64)  # fmt: skip
    for bv in (32, 64):
        add(f"auto-32-bv{bv}", 1, 1000, 3, dict(exact=False), dict(block_v=bv, chunk_tokens=32, overlap=-1))
        add(f"auto-32-bv{bv}-beside", 1, 1000, 3, dict(exact=False), dict(block_v=bv, chunk_tokens=32, overlap=1))
        add(f"auto-32-bv{bv}-checkpoints", 1, 0, 2, dict(exact=False), dict(block_v=bv, chunk_tokens=32),
            lens=[300, 200], checkpoint=64)  # fmt: skip
    add("exact-waves-bv64", sms // 2 + 3, 100, 1, dict(exact=True), dict(block_v=64))
    add("auto-seg-waves-bv64", 1, 4000, 24, dict(exact=False), dict(block_v=64, segment_chunks=16))
    add("auto-seg-waves-bv128", 1, 4000, 24, dict(exact=False), dict(block_v=128, segment_chunks=16))
    add("auto-combine-16rows", 1, 2000, 12, dict(exact=False), dict(block_v=64, segment_chunks=8))
    add("auto-plan-T8192-H6", 1, 8192, 6, dict(exact=False), {})
    add("exact-plan-T8192-H48", 1, 8192, 48, dict(exact=True), {})
    add("exact-no-tokens", 3, 0, 2, dict(exact=True), {})  # the state copy alone
    add("exact-softplus-bv64", 1, 1000, 3, dict(exact=True), dict(block_v=64), gate="softplus")
    add("auto-log-decay-seg-bv64", 1, 2000, 2, dict(exact=False), dict(block_v=64, segment_chunks=8),
        gate="log_decay")  # fmt: skip
    add("exact-beta-probability-bv32", 1, 1000, 3, dict(exact=True), dict(block_v=32), gate="lower_bound",
        beta_is_logit=False)  # fmt: skip
    add("auto-32-beta-probability-bv64", 1, 1000, 3, dict(exact=False), dict(block_v=64, chunk_tokens=32),
        gate="lower_bound", beta_is_logit=False)  # fmt: skip
    # K1 beside the pass for the gate and beta forms' K1 (fragment order in the other modes)
    add("exact-softplus-bv64-beside", 1, 1000, 3, dict(exact=True), dict(block_v=64, overlap=1), gate="softplus")
    add("exact-beta-probability-bv32-beside", 1, 1000, 3, dict(exact=True), dict(block_v=32, overlap=1),
        gate="lower_bound", beta_is_logit=False)  # fmt: skip
    # AUTO without the stable inverse: the other arches' tables do not enable it (dispatch.md),
    # so their AUTO calls run FlashKDA's K1 for 32-token records, first and beside the pass
    for bv in (32, 64):
        add(f"auto-32-bv{bv}-unchecked", 1, 1000, 3, dict(exact=False),
            dict(block_v=bv, chunk_tokens=32, overlap=-1, stable_inverse=-1))  # fmt: skip
        add(f"auto-32-bv{bv}-unchecked-beside", 1, 1000, 3, dict(exact=False),
            dict(block_v=bv, chunk_tokens=32, overlap=1, stable_inverse=-1))  # fmt: skip
    add("auto-seg-bv64-unchecked", 1, 2000, 2, dict(exact=False), dict(block_v=64, segment_chunks=8, stable_inverse=-1))
    return out


def expected_instantiations(arch, doc=BUILD_MD):
    """The kernels docs/build.md's resource summary lists for `arch` (probes left out)."""
    with open(doc) as f:
        lines = f.read().split("<!-- resource summary: begin")[1].split("<!-- resource summary: end")[0].splitlines()
    header = next(line for line in lines if line.startswith("| kernel |"))
    column = [c.strip() for c in header.strip("|").split("|")].index(arch)
    names = set()
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > column and cells[0].startswith("`") and cells[column]:
            name = cells[0].strip("`")
            if not name.startswith("probe_"):
                names.add(name)
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="default,generic,sm120,sm100")
    parser.add_argument("--out", help="write every call's launches to this JSON file")
    parser.add_argument("--doc", default=BUILD_MD, help="the file with the resource summary (docs/build.md)")
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    matrix = calls(sms)
    report, ran = {}, collections.defaultdict(set)
    for mode in args.modes.split(","):
        overrides = testing.mode_overrides(mode)
        for name, p, keywords, forced in matrix:
            launches = testing.launched(check(clone_outputs(p), **keywords), **forced, **overrides)
            torch.cuda.synchronize()
            report[f"{mode}/{name}"] = launches
            line = ", ".join(
                f"{k['name']}" + (f" x{k['stages']}" if k["stages"] else "") + f" ({k['resident']}/SM)"
                for k in launches
            )
            print(f"{mode} {name}: {line}", flush=True)
            for k in launches:
                ran[mode].add((k["name"], k["stages"]))
    print()
    for mode, pairs in ran.items():
        depths = collections.defaultdict(set)
        for name, stages in pairs:
            depths[name].add(stages)
        print(f"== {mode}: {len(depths)} instantiations")
        for name in sorted(depths):
            print(f"  {name}: stages {sorted(depths[name])}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    if not os.path.exists(args.doc):
        print(f"{args.doc} not found: no comparison with the instantiations built (--doc)")
        return
    generic = set().union(*(names for mode, names in ran.items() if mode != "default"))
    ran_names = {re.sub(r"\s+", " ", n) for n, _ in generic}
    for arch in ("sm_100a", "sm_120a"):
        expected = expected_instantiations(arch, args.doc)
        missing = sorted(expected - ran_names)
        print(f"{arch}: {len(expected)} instantiations built, not run here: {missing or 'none'}")


if __name__ == "__main__":
    main()
