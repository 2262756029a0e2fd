# SPDX-License-Identifier: MIT
"""Hashes of the forward's outputs over a grid of cases, for checking that a kernel or launch
change keeps every bit. Diagnostics, not a test:

    FLASH_KDA_LIBRARY=old.so python benchmarks/output_hashes.py old.json
    FLASH_KDA_LIBRARY=new.so python benchmarks/output_hashes.py new.json --against old.json
    python benchmarks/output_hashes.py generic.json --mode generic --against default.json

The grid: 15 length sets (1-32768 tokens, batched and varlen, with empty-prefix and length-1
sequences) x H in {1, 3, 6, 12, 32, 96} (up to 600k token-heads) x both modes, so every pass
kind the plan picks runs (16- and 32-token chunks, segments, K1 first, beside and leaving).
Each case hashes out and the final state (bf16) of one call on bench_fwd.make_inputs' inputs.
The automatic path's bits follow its plan: compare libraries whose plans agree (plan_grid.py).
--mode runs every call in a test mode (flash_kda.testing.TEST_MODES: the other arches' passes,
their simulated limits), whose exact cases must give the default mode's bits; its plans, and
so its automatic cases' bits, may differ.
"""

import argparse
import hashlib
import json

import torch
from bench_fwd import fwd_args, make_inputs

LENGTHS = (
    [1], [15], [16], [17], [100], [1000], [4096], [8197], [32768], [3, 3], [2048] * 3, [512] * 8,
    [1300, 547, 2048, 963, 271, 3063], [1, 16, 17, 33, 700], [5000, 20],
)  # fmt: skip
HEADS = (1, 3, 6, 12, 32, 96)
MAX_TOKEN_HEADS = 600_000


def case_hash(lens, heads, exact):
    """sha256 (16 hex digits) of out and final state of one forward."""
    import flash_kda

    args, out, final = fwd_args(make_inputs(lens, heads, seed=sum(lens) + heads))
    flash_kda.fwd(*args, exact=exact)
    digest = hashlib.sha256()
    for t in (out, final):
        digest.update(t.contiguous().view(torch.int16).cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", help="JSON file of {case: hash} to write")
    parser.add_argument("--against", help="an earlier run's JSON: print the cases whose hashes differ")
    parser.add_argument("--mode", default="default", help="a test mode (flash_kda.testing.TEST_MODES)")
    args = parser.parse_args()
    from flash_kda import testing

    testing.set_overrides(**testing.mode_overrides(args.mode))
    hashes = {}
    for lens in LENGTHS:
        for heads in HEADS:
            if sum(lens) * heads > MAX_TOKEN_HEADS:
                continue
            for exact in (False, True):
                key = f"{'x'.join(map(str, lens))}-H{heads}-{'exact' if exact else 'auto'}"
                hashes[key] = case_hash(lens, heads, exact)
    with open(args.out, "w") as f:
        json.dump(hashes, f, indent=0)
    print(f"{len(hashes)} cases")
    if args.against:
        with open(args.against) as f:
            base = json.load(f)
        differ = [k for k in hashes if base.get(k) != hashes[k]]
        print(f"{len(differ)} of {len(hashes)} differ from {args.against}: {differ}")
        exact = [k for k in hashes if k.endswith("-exact")]
        print(f"exact: {sum(k in differ for k in exact)} of {len(exact)} differ")


if __name__ == "__main__":
    main()
