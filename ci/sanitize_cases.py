# SPDX-License-Identifier: MIT
"""Small native forwards for compute-sanitizer (memcheck, racecheck): a batched and a
varlen case (with an empty and a partial sequence) for every block_v. Run on a GPU:

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 ci/sanitize_cases.py
"""

import sys

import torch

sys.path.insert(0, "tests")
from conftest import FWD_ARGS, make_problem
from flash_kda import dispatch

CASES = [
    dict(batch=2, seqlen=37, heads=2, initial=torch.float32, final=torch.float32),
    dict(batch=1, seqlen=0, heads=2, lens=[20, 0, 33, 1], initial=torch.bfloat16, final=torch.bfloat16),
]

for block_v in (32, 64, 128):
    for case in CASES:
        args = dict(case)
        p = make_problem(args.pop("batch"), args.pop("seqlen"), args.pop("heads"), device="cuda", **args)
        for exact, segment_chunks in ((True, 0), (False, 1)):
            native = dispatch.validated(*[p[n] for n in FWD_ARGS], exact=exact)
            dispatch.run_native(native, block_v=block_v, segment_chunks=segment_chunks)
        torch.cuda.synchronize()
        print(f"block_v={block_v} {case}: out finite {bool(torch.isfinite(p['out']).all())}")
