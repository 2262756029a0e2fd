# SPDX-License-Identifier: MIT
"""The native forward on a GPU: bitwise equal to the reference for every block_v, state
variant, batched and varlen; accurate against the fp64 gold; deterministic; CUDA-graph
capturable; K1's records equal the reference's K1 quantities."""

import re

import flash_kda
import pytest
import torch
from conftest import (
    FWD_ARGS,
    STATE_VARIANTS,
    assert_bitwise,
    call,
    clone_outputs,
    gold_of,
    k1_fits_beside,
    kernels_of,
    make_problem,
    rel_err,
    state_id,
    warpgroup_passes_run,
)
from flash_kda import reference, testing
from flash_kda.testing import Ops

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("native_gpu")]
BLOCK_VS = (32, 64, 128)
DEV = "cuda"


def run_native(p, block_v=0, workspace=None, overlap=0):
    """The exact-mode native forward on problem p, block_v forced (0: the library's pick),
    K1 beside the recurrence as the plan decides (0), forced (1) or never (-1)."""
    native = testing.validated(*[p[name] for name in FWD_ARGS], exact=True)
    testing.run_native(native, block_v=block_v, workspace=workspace, overlap=overlap)


def reference_outputs(p):
    """Reference out and final state (in the initial state's dtype, else fp32: the state
    is bf16-valued either way, so converting it later is exact)."""
    q = clone_outputs(p)
    n_seqs = p["q"].shape[0] if p["cu_seqlens"] is None else p["cu_seqlens"].numel() - 1
    dtype = p["initial_state"].dtype if p["initial_state"] is not None else torch.float32
    q["final_state"] = torch.empty(n_seqs, p["q"].shape[2], 128, 128, dtype=dtype, device=DEV)
    call(reference.fwd, q)
    return q["out"], q["final_state"]


def check_variants(make, label, variants=STATE_VARIANTS, block_vs=BLOCK_VS):
    """For each initial dtype: one reference run; then every final dtype and block_v."""
    for initial in sorted({v[0] for v in variants}, key=str):
        ref_out, ref_final = reference_outputs(make(initial, torch.float32))
        for init, final in (v for v in variants if v[0] == initial):
            for bv in block_vs:
                p = make(init, final)
                run_native(p, block_v=bv)
                what = f"{label} {state_id((init, final))} block_v={bv}"
                assert_bitwise(p["out"], ref_out, f"{what} out")
                if final is not None:
                    assert_bitwise(p["final_state"], ref_final.to(final), f"{what} final_state")


SHAPES = [(b, t, h) for b in (1, 2) for t in (1, 15, 16, 17, 1000) for h in (1, 6)]


@pytest.mark.parametrize("batch,seqlen,heads", SHAPES, ids=[f"B{b}-T{t}-H{h}" for b, t, h in SHAPES])
def test_bitwise_batched(batch, seqlen, heads):
    seed = 1000 * batch + 10 * seqlen + heads

    def make(initial, final):
        return make_problem(batch, seqlen, heads, initial=initial, final=final, device=DEV, seed=seed)

    check_variants(make, f"B{batch}-T{seqlen}-H{heads}")


VARLEN = [([1300, 547, 2048, 963, 271, 3063], 4), ([300, 17, 0, 513, 1], 2)]


@pytest.mark.parametrize("lens,heads", VARLEN, ids=["6seqs-H4", "5seqs-empty-H2"])
def test_bitwise_varlen(lens, heads):
    def make(initial, final):
        return make_problem(1, 0, heads, lens=lens, initial=initial, final=final, device=DEV, seed=len(lens) + heads)

    check_variants(make, f"varlen{lens}-H{heads}")


def test_varlen_multiwave_pass_takes_longest_first():
    """A varlen whole pass of more CTAs than SMs takes its sequences longest first (design
    section 4.2): prefix_kernel leaves the order (more chunks first, ties by index) in the
    segment prefix's space of the workspace, and out and final state stay bitwise the
    reference's. Lengths out of order, with a tie, an empty and a one-token sequence;
    enough heads that the CTAs at block_v 128 outnumber the SMs."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    lens = [300, 17, 0, 513, 1, 300, 700]
    heads, total, n = sms // len(lens) + 1, sum(lens), len(lens)
    p = make_problem(1, 0, heads, lens=lens, initial=torch.float32, final=torch.float32, device=DEV, seed=41)
    workspace = torch.zeros(flash_kda.get_workspace_size(total, heads, n), dtype=torch.uint8, device=DEV)
    run_native(p, block_v=128, workspace=workspace)
    # The workspace opens with the records ([H][tiles][RECORD_BYTES]), then the tile prefix
    # and the segment prefix (N + 1 int32 each, 128-byte aligned; design section 1.6).
    start = heads * (-(-total // 16) + n) * testing.RECORD_BYTES + -(-4 * (n + 1) // 128) * 128
    order = workspace[start : start + 4 * n].view(torch.int32).tolist()
    chunks = [-(-length // 16) for length in lens]
    assert order == sorted(range(n), key=lambda i: (-chunks[i], i)), order
    ref_out, ref_final = reference_outputs(p)
    assert_bitwise(p["out"], ref_out, "longest-first out")
    assert_bitwise(p["final_state"], ref_final, "longest-first final_state")


LONG = [
    ("T131072-H1", dict(batch=1, seqlen=131072)),
    ("varlen-2x524288-H1", dict(batch=1, seqlen=0, lens=[524288] * 2)),
]


@pytest.mark.slow
@pytest.mark.parametrize("shape", [c[1] for c in LONG], ids=[c[0] for c in LONG])
def test_bitwise_very_long(shape):
    """8,192 and 32,768 links per chain: the exact path stays bitwise on the reference."""

    def make(initial, final):
        return make_problem(heads=1, initial=initial, final=final, device=DEV, seed=131, **shape)

    check_variants(make, str(shape), variants=[(torch.float32, torch.float32)], block_vs=(32, 128))


@pytest.mark.slow
def test_bitwise_long_many_heads():
    def make(initial, final):
        return make_problem(1, 8192, 96, initial=initial, final=final, device=DEV, seed=96)

    check_variants(make, "B1-T8192-H96", variants=[(torch.bfloat16, torch.bfloat16)])


@pytest.mark.parametrize("case", ["T8192-H2", "varlen-H4"])
def test_accuracy_against_gold(case):
    if case == "T8192-H2":
        p = make_problem(1, 8192, 2, initial=torch.float32, final=torch.float32, device=DEV, seed=7)
    else:
        p = make_problem(1, 0, 4, lens=VARLEN[0][0], initial=torch.float32, final=torch.float32, device=DEV, seed=8)
    flash_kda.fwd(*[p[name] for name in FWD_ARGS])
    gold_out, gold_state = gold_of(p)
    e_out, e_state = rel_err(p["out"], gold_out), rel_err(p["final_state"], gold_state)
    print(f"{case}: out {e_out:.5f} final_state {e_state:.5f}")
    assert e_out <= 0.0065, f"{case}: out relative error {e_out}"
    assert e_state <= 0.006, f"{case}: final_state relative error {e_state}"


@pytest.mark.parametrize("block_v", BLOCK_VS)
def test_deterministic_and_graph_replay(block_v):
    p = make_problem(
        1, 0, 3, lens=[700, 33, 0, 1029], initial=torch.bfloat16, final=torch.bfloat16, device=DEV, seed=11
    )
    first = clone_outputs(p)
    run_native(first, block_v)
    second = clone_outputs(p)
    run_native(second, block_v)
    assert_bitwise(second["out"], first["out"], "second call out")
    assert_bitwise(second["final_state"], first["final_state"], "second call final_state")

    graphed = clone_outputs(p)
    workspace = torch.empty(flash_kda.get_workspace_size(p["q"].shape[1], 3, 4), dtype=torch.uint8, device=DEV)
    run_native(graphed, block_v, workspace)  # warm-up outside capture
    graphed["out"].fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_native(graphed, block_v, workspace)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise(graphed["out"], first["out"], "graph replay out")
    assert_bitwise(graphed["final_state"], first["final_state"], "graph replay final_state")


def decode_records(workspace, heads, tiles_per_head, num_tiles):
    """The K1 records of the first num_tiles chunks of every head -> reference layouts."""
    RECORD_BYTES = testing.RECORD_BYTES

    i = torch.arange(16).repeat_interleave(16)
    j = torch.arange(16).repeat(16)
    frag = (((i % 8) * 4 + (j % 8) // 2) * 8 + ((i // 8) + 2 * (j // 8)) * 2 + j % 2).to(workspace.device)
    k = torch.arange(128)
    decay_idx = (((k % 8) * 8 + k // 16) * 2 + (k // 8) % 2).to(workspace.device)
    rec = workspace[: heads * tiles_per_head * RECORD_BYTES].view(heads, tiles_per_head, RECORD_BYTES)
    rec = rec[:, :num_tiles].transpose(0, 1)  # [chunks, H, bytes]

    def tiles(offset):  # 8 A tiles in fragment order -> [chunks, H, 8, 16, 16] row-major
        planes = rec[..., offset : offset + 4096].contiguous().view(torch.bfloat16).unflatten(-1, (8, 256))
        return planes[..., frag].unflatten(-1, (16, 16))

    def row_major(t):  # [.., 8 kb, 16 t, 16 k] -> [.., 16, 128]
        return t.permute(0, 1, 3, 2, 4).reshape(*t.shape[:2], 16, 128)

    def one(off):  # one A tile in fragment order -> [chunks, H, 16, 16]
        return rec[..., off : off + 512].contiguous().view(torch.bfloat16)[..., frag].unflatten(-1, (16, 16))

    return dict(
        Kd=row_major(tiles(0)),
        Qd=row_major(tiles(4096)),
        Kr=row_major(tiles(8192).transpose(-1, -2)),
        INV=one(12288),
        Mqk=one(12800),
        e=rec[..., 13312:13824].contiguous().view(torch.float32)[..., decay_idx],
        beta=rec[..., 13824:13856].contiguous().view(torch.bfloat16),
    )


@pytest.mark.parametrize("lens", [None, [37, 0, 64, 1, 200]], ids=["batched", "varlen"])
def test_records_equal_reference_k1(lens):
    heads = 3
    p = make_problem(2, 50, heads, lens=lens, device=DEV, seed=5)
    problem = call(testing.validated, p)
    total, n_seqs = problem.batch * problem.seqlen, problem.num_seqs
    workspace = torch.zeros(flash_kda.get_workspace_size(total, heads, n_seqs), dtype=torch.uint8, device=DEV)
    run_native(p, workspace=workspace)
    bounds = None if lens is None else p["cu_seqlens"].tolist()
    chunks = reference.chunk_table(problem.batch, problem.seqlen, bounds, DEV)
    ref = reference.prepare(
        Ops(torch.device(DEV)),
        p["q"],
        p["k"],
        p["g"],
        p["beta"],
        p["A_log"],
        p["dt_bias"],
        p["scale"],
        p["lower_bound"],
        chunks,
    )
    got = decode_records(workspace, heads, -(-total // 16) + n_seqs, chunks.tok0.numel())
    for name in ("beta", "e", "Kd", "Qd", "Kr", "Mqk", "INV"):
        assert_bitwise(got[name], ref[name], f"record plane {name}")


OVERLAP_SHAPES = [(1, 1000, 1), (2, 333, 3), (1, 2048, 6)]


def _check_overlap_bits(p, block_v, k1_grids, overlap=1):
    """Runs p serially (K1 then the pass) and with K1 forced beside the pass (overlap 1) or
    leaving the pass's SMs (overlap 2): the serial run launches no prepare_overlap_kernel
    grid, the overlapped one `k1_grids`, and the overlapped out and final state equal the
    serial ones and the reference bitwise."""
    serial, overlapped = clone_outputs(p), clone_outputs(p)

    def grids(launches):
        return sum(n for name, n in launches.items() if "prepare_overlap_kernel" in name)

    assert grids(kernels_of(lambda: run_native(serial, block_v, overlap=-1))) == 0
    assert grids(kernels_of(lambda: run_native(overlapped, block_v, overlap=overlap))) == k1_grids
    assert_bitwise(overlapped["out"], serial["out"], "overlapped out")
    assert_bitwise(overlapped["final_state"], serial["final_state"], "overlapped final_state")
    ref_out, ref_final = reference_outputs(p)
    assert_bitwise(overlapped["out"], ref_out, "overlapped out vs reference")
    assert_bitwise(overlapped["final_state"], ref_final, "overlapped final_state vs reference")


@pytest.mark.parametrize("batch,seqlen,heads", OVERLAP_SHAPES, ids=[f"B{b}-T{t}-H{h}" for b, t, h in OVERLAP_SHAPES])
@pytest.mark.parametrize("block_v", (32, 64))
def test_overlapped_k1_gives_the_serial_bits(batch, seqlen, heads, block_v):
    """K1 beside the whole-sequence pass (design section 4.7), forced on: its kernel runs
    twice (the grid beside the pass, then the grid on the SMs the pass leaves free: these
    passes have at most 24 CTAs), and out and final state are bitwise those of K1 then
    the pass, and of the reference. (No K1 CTA fits beside block_v 128's pass, config.h:
    there overlap 1 has K1 leave the pass's SMs, which the next test checks.)"""
    p = make_problem(batch, seqlen, heads, initial=torch.float32, final=torch.float32, device=DEV, seed=21)
    _check_overlap_bits(p, block_v, k1_grids=2 if k1_fits_beside(block_v) else 1)  # else K1 leaves


@pytest.mark.parametrize("batch,seqlen,heads", OVERLAP_SHAPES, ids=[f"B{b}-T{t}-H{h}" for b, t, h in OVERLAP_SHAPES])
@pytest.mark.parametrize("block_v", BLOCK_VS)
def test_k1_leaving_the_pass_sms_gives_the_serial_bits(batch, seqlen, heads, block_v):
    """K1 leaving the pass's SMs (design section 4.7), forced on: one K1 grid on every SM,
    whose CTAs on the SMs the pass takes stop taking items, and out and final state are
    bitwise those of K1 then the pass, and of the reference."""
    p = make_problem(batch, seqlen, heads, initial=torch.float32, final=torch.float32, device=DEV, seed=22)
    _check_overlap_bits(p, block_v, k1_grids=1, overlap=2)


def four_k1_waves():
    """Four waves of FlashKDA's 16-token K1 on every SM of this GPU (launch.cuh kLeadGridWaves,
    counted at FlashKDA's K1, whose CTAs an SM are the most): a lead this long runs as a grid of
    its own for every gate form."""
    facts = testing.device_facts()
    sms = min(facts["sms"], torch.cuda.get_device_properties(DEV).multi_processor_count)
    return 4 * facts["k1_alone"][0] * sms


def test_a_long_lead_runs_as_a_grid_of_its_own():
    """K1 leaving the pass's SMs after a lead of at least four waves of K1 on every SM
    (design section 4.7, launch.cuh kLeadGridWaves): the lead runs first as
    prepare_lead_kernel, one CTA a lead item, then the overlap kernel takes the items after
    it, and out and final state are bitwise those of K1 then the pass, and of the reference
    (4 x 2048 tokens, 24 heads, block_v 128: a lead of 8,369 records on 132 SMs)."""
    p = make_problem(4, 2048, 24, initial=torch.float32, final=torch.float32, device=DEV, seed=25)
    call = testing.validated(*[p[name] for name in FWD_ARGS], exact=True)
    plan = testing.plan_of(call, block_v=128, overlap=2)
    waves = four_k1_waves()
    if plan.overlap_max_ctas != 0 or plan.overlap_lead < waves:
        pytest.skip(f"this GPU's plan leads by {plan.overlap_lead} records, under four K1 waves ({waves})")
    serial = clone_outputs(p)
    run_native(serial, 128, overlap=-1)
    k1 = [k for k in testing.launched(call, block_v=128, overlap=2) if k["name"].startswith("prepare_")]
    assert [k["name"].split("<")[0] for k in k1] == ["prepare_lead_kernel", "prepare_overlap_kernel"], k1
    assert k1[0]["ctas"] == plan.overlap_lead, k1
    assert_bitwise(p["out"], serial["out"], "out")
    assert_bitwise(p["final_state"], serial["final_state"], "final_state")
    ref_out, ref_final = reference_outputs(p)
    assert_bitwise(p["out"], ref_out, "out vs reference")
    assert_bitwise(p["final_state"], ref_final, "final_state vs reference")


def test_overlapped_k1_beside_a_pass_of_several_waves():
    """K1 beside a whole-sequence pass of more CTAs than SMs (design section 4.7), forced
    on: its items come wave by wave (the sequences one wave of the pass starts together,
    chunk by chunk), one K1 grid runs (no SM is left free for a second), and out and final
    state are bitwise those of K1 then the pass, and of the reference."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    heads, batch = 4, sms // 8 + 3  # block_v 64: two CTAs per (sequence, head)
    p = make_problem(batch, 100, heads, initial=torch.float32, final=torch.float32, device=DEV, seed=23)
    _check_overlap_bits(p, 64, k1_grids=1 if k1_fits_beside(64) else 0)  # else K1 first (no SM free)


def _warpgroup_forms(launches):
    """The warpgroup pass's forms among launched kernels: '<1, 1>' (one CTA an SM), '<1, 2>'
    (two), '<2, 1>' (block_v 128)."""
    forms = (re.search(r"warpgroup_recurrence_kernel<(\d), (\d),", name) for name in launches)
    return sorted({f"<{m.group(1)}, {m.group(2)}>" for m in forms if m})


# (batch, seqlen, heads, block_v, overlap, form): a wave with K1 first or one K1 CTA beside
# each pass CTA, one CTA an SM; more CTAs than SMs, two; the plan's K1 beside 8 x 1024 tokens
# at 8 heads (three or more CTAs a pass SM on 132 SMs), two; block_v 128 with K1 first or
# leaving the pass's SMs, the producer-warpgroup form.
WARPGROUP_FORMS = [
    (2, 700, 3, 64, -1, "<1, 1>"),
    (2, 700, 3, 64, 1, "<1, 1>"),
    ("waves", 100, 1, 64, -1, "<1, 2>"),
    (8, 1024, 8, 0, 0, "plan"),
    (2, 700, 3, 128, -1, "<2, 1>"),
    (2, 700, 3, 128, 2, "<2, 1>"),
]


@pytest.mark.parametrize("batch,seqlen,heads,block_v,overlap,form", WARPGROUP_FORMS,
                         ids=["one-wave", "one-wave-k1-beside", "waves", "plan-8x1024", "bv128",
                              "bv128-k1-leaving"])  # fmt: skip
def test_the_warpgroup_pass_takes_two_ctas_an_sm_where_waves_or_k1_need_it(
    batch, seqlen, heads, block_v, overlap, form
):
    """sm_90a's warpgroup pass (design section 4.9, launch.cuh configure_pass): at block_v
    64 in its two register forms, one CTA an SM, or two where its grid is more than one wave
    or the plan keeps more K1 CTAs beside each pass CTA than fit beside the first form; at
    block_v 128 two warpgroups and a producer warpgroup, K1 first or leaving its SMs. The
    form launched is the expected one, and out and final state are bitwise the reference's."""
    if not warpgroup_passes_run():
        pytest.skip("the warpgroup pass is sm_90a's, outside the generic test modes")
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    if batch == "waves":
        batch = sms // 2 + 3  # 2 CTAs a sequence at block_v 64: more CTAs than SMs
    p = make_problem(batch, seqlen, heads, initial=torch.float32, final=torch.float32, device=DEV, seed=24)
    if form == "plan":
        plan = testing.plan_of(testing.validated(*[p[name] for name in FWD_ARGS], exact=True))
        if plan.block_v != 64 or plan.overlap_min_ctas <= 2 or plan.overlap_max_ctas <= 2:
            pytest.skip(f"this GPU's plan keeps at most two K1 CTAs beside the pass ({plan})")
        form = "<1, 2>"
    launches = kernels_of(lambda: run_native(p, block_v, overlap=overlap))
    assert _warpgroup_forms(launches) == [form], launches
    if overlap == 0:  # the plan's K1 beside the pass
        assert any("prepare_overlap_kernel" in name for name in launches), launches
    ref_out, ref_final = reference_outputs(p)
    assert_bitwise(p["out"], ref_out, "out")
    assert_bitwise(p["final_state"], ref_final, "final_state")


@pytest.mark.parametrize("overlap,batch,heads", [(1, 1, 6), (2, 1, 6), (2, 4, 24)],
                         ids=["beside", "leaving", "leaving-lead-grid"])  # fmt: skip
def test_overlapped_graph_replays_follow_new_inputs(overlap, batch, heads):
    """A captured overlapped forward (memset of the ready flags and K1's counters, K1, the
    pass) replayed twice, with new inputs copied in between: each replay equals an eager
    serial call on the same inputs (stale flags from the first replay would let the pass
    read records before the second replay's K1 wrote them; a stale stayer count would let
    K1 leave the pass's SMs before a stayer exists; 4 x 2048 tokens at 24 heads lead by more
    than four K1 waves on an H200, a lead grid whose counter start the memset must not undo)."""
    a = make_problem(batch, 2048, heads, initial=torch.bfloat16, final=torch.bfloat16, device=DEV, seed=31)
    b = make_problem(batch, 2048, heads, initial=torch.bfloat16, final=torch.bfloat16, device=DEV, seed=32)
    graphed = clone_outputs(a)
    workspace = torch.empty(flash_kda.get_workspace_size(batch * 2048, heads, batch), dtype=torch.uint8, device=DEV)
    run_native(graphed, workspace=workspace, overlap=overlap)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_native(graphed, workspace=workspace, overlap=overlap)
    for source in (a, b, a):
        for name in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state"):
            graphed[name].copy_(source[name])
        graphed["out"].fill_(float("nan"))
        graph.replay()
        expect = clone_outputs(source)
        run_native(expect, overlap=-1)
        torch.cuda.synchronize()
        assert_bitwise(graphed["out"], expect["out"], "replay out")
        assert_bitwise(graphed["final_state"], expect["final_state"], "replay final_state")
