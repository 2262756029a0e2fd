# SPDX-License-Identifier: MIT
"""Small native forwards for compute-sanitizer (memcheck, racecheck). Run on a GPU:

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 ci/sanitize_cases.py
    FLASH_KDA_TEST_MODE=sm120 compute-sanitizer ... python3 ci/sanitize_cases.py   (a test mode:
        the other arches' code paths on this GPU, flash_kda.testing.TEST_MODES)

Every block_v on a batched and a varlen case (with an empty and a partial sequence), in
exact mode with K1 before, beside the recurrence and leaving the recurrence's SMs (design
section 4.7; varlen never overlaps), in AUTO mode with one-chunk segments, and in AUTO mode
with 32-token chunks (K1 before, beside the pass (block_v 32; block_v 64 leaves its SMs) and
leaving the pass's SMs, forced by overlap -1, 1 and 2; block_v 32 and 64, the widths built
for them); a twelve-head case for the combine's 16-row CTAs, a forty-head one for the
longest-first varlen pass and a batched one of more CTAs than SMs with K1 beside the pass;
sm_90a's block_v 64 warpgroup passes two CTAs an SM (more CTAs than SMs: the whole pass, K1
first and the plan's K1 beside it, and the segment pass and the rerun);
then state pools (in place, padding, has_initial_state), checkpoints, strided views (fused
projection slices) and garbage device cu_seqlens (non-monotone, negative, past the end,
2**62), each in exact mode, in AUTO mode with a forced small segment_chunks and in AUTO mode
with 32-token chunks.
"""

import sys

import torch

sys.path.insert(0, "tests")
from conftest import TEST_MODE, check, fused_projection_views, make_problem, pooled_problem
from flash_kda import testing

if TEST_MODE != "default":  # every call below in the mode (testing.run_native adds its switches)
    testing.set_overrides(**testing.mode_overrides(TEST_MODE))
print(f"test mode: {TEST_MODE} {testing.get_overrides()}", flush=True)

CASES = [
    dict(batch=2, seqlen=37, heads=2, initial=torch.float32, final=torch.float32),
    dict(batch=1, seqlen=0, heads=2, lens=[20, 0, 33, 1], initial=torch.bfloat16, final=torch.bfloat16),
]
# (name, fwd options, segment_chunks, chunk tokens)
MODES = [
    ("exact", dict(exact=True), 0, 0),
    ("auto-segments-2", dict(exact=False), 2, 16),
    ("auto-32", dict(exact=False), 0, 32),
]
LENS = [150, 0, 70, 1]  # 221 tokens: several segments of 2 chunks, an empty and a 1-token sequence


def run(name, p, segment_chunks=0, chunk=0, **overrides):
    testing.run_native(check(p, **overrides), segment_chunks=segment_chunks, chunk_tokens=chunk)
    torch.cuda.synchronize()
    print(f"{name}: done")


def serving_cases():
    """(name, problem, fwd keyword overrides) of the serving features."""
    pool = pooled_problem(1, 0, 2, [3, -1, 0, 1], 4, lens=LENS, has_initial=[True, True, False, True],
                          in_place=True, device="cuda", seed=1)  # fmt: skip
    pool_bf16 = pooled_problem(1, 0, 2, [-2, 2, 0, -1], 3, lens=LENS, dtype=torch.bfloat16,
                               index_dtype=torch.int32, device="cuda", seed=2)  # fmt: skip
    ckpt = make_problem(1, 0, 2, lens=LENS, initial=torch.bfloat16, final=torch.bfloat16, device="cuda", seed=3)
    slots = sum(n // 32 for n in LENS) - 1  # one slot short: the last checkpoint is not written
    checkpoints = torch.empty(slots, 2, 128, 128, dtype=torch.bfloat16, device="cuda")
    strided, _ = fused_projection_views(make_problem(2, 91, 2, final=torch.float32, device="cuda", seed=4))
    cases = [
        ("pool-in-place", pool, {}),
        ("pool-bf16-padding", pool_bf16, {}),
        ("checkpoints", ckpt, dict(checkpoint_every=32, checkpoints=checkpoints)),
        ("strided", strided, {}),
    ]
    for bounds in ([0, 150, 20, 221], [0, -40, 100, 221], [0, 150, 400, 9000], [0, 2**62, 2**62, 2**62]):
        garbage = make_problem(1, 0, 2, lens=[150, 30, 41], initial=torch.float32, final=torch.float32,
                               device="cuda", seed=5)  # fmt: skip
        garbage["cu_seqlens"] = torch.tensor(bounds, device="cuda")
        cases.append((f"garbage-cu-{bounds}", garbage, dict(checkpoint_every=16, checkpoints=checkpoints.float())))
    return cases


for block_v in (32, 64, 128):
    for case in CASES:
        args = dict(case)
        p = make_problem(args.pop("batch"), args.pop("seqlen"), args.pop("heads"), device="cuda", **args)
        plans = [(True, 0, -1, 0), (True, 0, 1, 0), (True, 0, 2, 0), (False, 1, 0, 16)]
        if block_v < 128:  # the widths built for 32-token chunks (config.h)
            plans += [(False, 0, -1, 32), (False, 0, 1, 32), (False, 0, 2, 32)]
        for exact, segment_chunks, overlap, chunk in plans:
            call = check(p, exact=exact)
            testing.run_native(
                call, block_v=block_v, segment_chunks=segment_chunks, overlap=overlap, chunk_tokens=chunk
            )
        torch.cuda.synchronize()
        print(f"block_v={block_v} {case}: out finite {bool(torch.isfinite(p['out']).all())}")

# Twelve heads of four sequences: 48 (sequence, head) pairs take the combine's 16-row CTAs
# (config.h combine_rows) where the cases above take its 8-row ones.
wide = make_problem(1, 0, 12, lens=LENS, initial=torch.float32, final=torch.float32, device="cuda", seed=6)
run("auto-segments-2 combine-16-rows", wide, 2, exact=False)
# Forty heads of the same four sequences at block_v 128: 160 CTAs, more than one wave on any
# GPU of up to 159 SMs, so the whole pass takes the sequences longest first (design 4.2).
many = make_problem(1, 0, 40, lens=LENS, initial=torch.bfloat16, final=torch.bfloat16, device="cuda", seed=7)
testing.run_native(check(many, exact=True), block_v=128)
torch.cuda.synchronize()
print("exact longest-first: done")
# K1 beside a batched pass of more CTAs than SMs (design 4.7): its items wave by wave.
sms = torch.cuda.get_device_properties("cuda").multi_processor_count
waves = make_problem(sms // 8 + 3, 100, 4, initial=torch.float32, final=torch.float32, device="cuda", seed=8)
testing.run_native(check(waves, exact=True), block_v=64, overlap=1)
torch.cuda.synchronize()
print("exact overlapped multi-wave: done")
# sm_90a's warpgroup passes two CTAs an SM (design 4.9): block_v 64 over more CTAs than SMs, K1
# first and beside it, and segments of two chunks (the segment pass and the rerun); and the
# plan's K1 beside eight sequences of 256 tokens at eight heads (three or more K1 CTAs a pass
# SM, which fit only beside that form).
shared = make_problem(sms // 2 + 3, 100, 1, initial=torch.bfloat16, final=torch.bfloat16, device="cuda", seed=9)
for overlap in (-1, 1):
    testing.run_native(check(shared, exact=True), block_v=64, overlap=overlap)
testing.run_native(check(shared, exact=False), block_v=64, segment_chunks=2)
beside = make_problem(8, 256, 8, initial=torch.float32, final=torch.float32, device="cuda", seed=10)
testing.run_native(check(beside, exact=True))
torch.cuda.synchronize()
print("exact warpgroup pass two an SM: done")

for mode, options, segment_chunks, chunk in MODES:
    for name, p, overrides in serving_cases():
        if chunk == 32 and overrides.get("checkpoint_every", 0) % 32:  # 32-token chunks need
            overrides = dict(overrides, checkpoint_every=32)  # checkpoints every multiple of 32
        run(f"{mode} {name}", p, segment_chunks, chunk, **options, **overrides)

# Calls without tokens (the state copy alone, src/kda/empty.cuh): T = 0 with fp32 states, a
# bf16 pool with padding and has_initial_state, and tokens no sequence holds (cu_seqlens all
# zero on the device: the whole forward runs over empty sequences).
empty = make_problem(3, 0, 2, initial=torch.float32, final=torch.float32, device="cuda", seed=11)
run("exact no tokens", empty, exact=True)
empty_pool = pooled_problem(1, 0, 2, [2, -1, 0], 3, lens=[0, 0, 0], has_initial=[True, True, False],
                            dtype=torch.bfloat16, device="cuda", seed=12)  # fmt: skip
run("auto no tokens pool", empty_pool, exact=False)
outside = make_problem(1, 0, 2, lens=[40, 24], initial=torch.float32, final=torch.float32, device="cuda", seed=13)
outside["cu_seqlens"] = torch.zeros(3, dtype=torch.int64, device="cuda")
run("auto tokens outside every sequence", outside, exact=False)
