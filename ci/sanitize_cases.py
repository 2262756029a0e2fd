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
with 32-token chunks; last the unbounded gate forms (softplus; log decay in fp32 and bf16, with
probability betas in fp32; design section 2.5) on both cases at every block_v with K1 before,
beside and leaving the pass and with segments, strided fp32 log decays, and degenerate keys
whose chunks take the stable inverse's fp32 path (design section 2.6), 16- and 32-token
(those kernels through the test entry point's unvalidated_forms and stable_inverse), and K1's
lead as a grid of its own (4 x 2048 tokens at 24 heads, K1 leaving block_v 128's SMs; every
gate); the calls without tokens (the state copy) close the base cases.
"""

import sys

import torch

sys.path.insert(0, "tests")
from conftest import (
    FWD_ARGS,
    TEST_MODE,
    check,
    degenerate_problem,
    forms,
    fused_projection_views,
    make_problem,
    pooled_problem,
    with_forms,
)
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


# The gate and beta forms other than FlashKDA's: (gate, beta_is_logit, g dtype, beta dtype).
GATE_FORMS = [
    ("lower_bound", False, torch.bfloat16, torch.float32),
    ("softplus", True, torch.bfloat16, torch.bfloat16),
    ("log_decay", False, torch.float32, torch.float32),
    ("log_decay", True, torch.bfloat16, torch.bfloat16),
]


def base_cases():
    """Every pass, K1 mode, serving feature and the garbage cu_seqlens (the bounded gate)."""
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


UNVALIDATED = dict(unvalidated_forms=1, stable_inverse=1)  # kernels not yet enabled by default


def gate_cases():
    """The unbounded gate forms, the beta forms and the stable inverse (through the test entry
    point's unvalidated_forms and stable_inverse)."""
    for gate, logit, g_dtype, beta_dtype in GATE_FORMS:
        for block_v in (32, 64, 128):
            for case in CASES:
                args = dict(case)
                p = make_problem(args.pop("batch"), args.pop("seqlen"), args.pop("heads"), device="cuda", **args)
                p = with_forms(p, gate, beta_is_logit=logit, beta_dtype=beta_dtype)
                p["g"] = p["g"].to(g_dtype) if gate == "log_decay" else p["g"]
                plans = ((True, 0, -1), (True, 0, 1), (True, 0, 2), (False, 1, 0))
                for exact, segment_chunks, overlap in plans[:2] if block_v == 64 else plans:
                    call = testing.validated(*[p[n] for n in FWD_ARGS], exact=exact, **forms(p))
                    testing.run_native(
                        call,
                        block_v=block_v,
                        segment_chunks=segment_chunks,
                        overlap=overlap,
                        chunk_tokens=16,
                        **UNVALIDATED,
                    )
                torch.cuda.synchronize()
                print(f"{gate} g {g_dtype} beta {beta_dtype} block_v={block_v} {case}: done")
    # An fp32 log decay read through strides (heads 136 elements apart), and degenerate keys on the
    # automatic path: 16-token chunks for every gate, 32-token chunks for the bounded one.
    strided = with_forms(make_problem(2, 91, 2, final=torch.float32, device="cuda", seed=11), "log_decay")
    buffer = torch.zeros(2, 91, 2, 136, device="cuda")
    buffer[..., :128] = strided["g"]
    strided["g"] = buffer[..., :128]
    testing.run_native(testing.validated(*[strided[n] for n in FWD_ARGS], exact=True, **forms(strided)), **UNVALIDATED)
    for gate in ("lower_bound", "softplus", "log_decay"):
        p = degenerate_problem("alternating", gate, 3.0, batch=2, seqlen=77, heads=2, device="cuda")
        call = testing.validated(*[p[n] for n in FWD_ARGS], exact=False, **forms(p))
        testing.run_native(call, chunk_tokens=16, **UNVALIDATED)
        if gate == "lower_bound":
            call = testing.validated(*[p[n] for n in FWD_ARGS], exact=False)
            testing.run_native(call, chunk_tokens=32, **UNVALIDATED)
    torch.cuda.synchronize()
    print("strided log decay, degenerate keys (stable inverse): done")
    lead_grid_cases()


def lead_grid_cases():
    """K1 leaving the pass's SMs after a lead of more than four K1 waves (on 132 SMs): the lead
    as a grid of its own before the overlap kernel (design section 4.7, launch.cuh
    kLeadGridWaves), for the bounded gate in exact mode and each unbounded form in AUTO mode."""
    for gate, logit, g_dtype, beta_dtype in [("lower_bound", True, torch.bfloat16, torch.bfloat16)] + GATE_FORMS[1:]:
        p = make_problem(4, 2048, 24, initial=torch.float32, final=torch.float32, device="cuda", seed=14)
        if gate != "lower_bound":
            p = with_forms(p, gate, beta_is_logit=logit, beta_dtype=beta_dtype)
            p["g"] = p["g"].to(g_dtype) if gate == "log_decay" else p["g"]
        call = testing.validated(*[p[n] for n in FWD_ARGS], exact=gate == "lower_bound", **forms(p))
        testing.run_native(call, block_v=128, overlap=2, chunk_tokens=16, **UNVALIDATED)
        torch.cuda.synchronize()
        print(f"lead grid {gate} g {g_dtype}: done")


if __name__ == "__main__":  # "base", "gates" (with the lead grid's), "lead" or both (the default)
    which = sys.argv[1:] or ["base", "gates"]
    if which == ["lead"]:
        lead_grid_cases()
    if "base" in which:
        base_cases()
    if "gates" in which:
        gate_cases()
