# SPDX-License-Identifier: MIT
"""Every gate and beta form (design sections 2.2, 2.5) and the stable inverse (section 2.6)
on a GPU: the native forward bitwise equal to reference.fwd for each form in exact mode and
on the automatic path's 16-token whole-sequence passes (the stable inverse's fp32 chunks
included), its K1 records plane by plane, extreme decays, the 32-token records' stable
inverse against the chunk model, and degenerate keys within 1.5x of fla Triton's error.

``FLASH_KDA_GATES_LOG`` (a path) appends each accuracy measurement as a JSON line."""

import json
import math
import os

import chunk_model
import pytest
import torch
from conftest import (
    FWD_ARGS,
    GOLD_ARGS,
    STATE_VARIANTS,
    assert_bitwise,
    clone_outputs,
    degenerate_problem,
    forms,
    make_problem,
    rel_err,
    state_id,
    unsound_chunks,
    with_forms,
)
from flash_kda import fallback, reference, testing
from flash_kda._numerics import Ops
from test_fwd_gpu import decode_records, four_k1_waves

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("native_gpu", "unvalidated_kernels")]
DEV = "cuda"
LOG = "FLASH_KDA_GATES_LOG"
# The kernels under test are not enabled by default until this module passes on the GPU
# (flash_kda.h FLASH_KDA_FEATURE_GATE_FORMS, STABLE_INVERSE): the test entry point runs them.
UNVALIDATED = dict(unvalidated_forms=1, stable_inverse=1)


@pytest.fixture
def unvalidated_kernels():
    """Every native call of the test through the test entry point, with the gate forms' kernels
    and AUTO mode's stable inverse on."""
    with testing.overrides(**UNVALIDATED):
        yield


def validated(p, exact):
    return testing.validated(*[p[n] for n in FWD_ARGS], exact=exact, **forms(p))


def native(p, *, exact, **plan):
    """The native forward on problem p, in place; `plan` forces block_v, chunk_tokens, overlap."""
    testing.run_native(validated(p, exact), **UNVALIDATED, **plan)


def reference_outputs(p, exact):
    q = clone_outputs(p)
    reference.fwd(*[q[n] for n in FWD_ARGS], exact=exact, **forms(q))
    return q


def whole_16(p):
    """Asserts that the automatic path's plan for p runs one 16-token whole-sequence pass (what
    the reference models bit for bit)."""
    plan = testing.plan_of(validated(p, False), chunk_tokens=16)
    assert plan.segment_chunks == 0 and plan.chunk_tokens == 16, plan


def log(record):
    path = os.environ.get(LOG)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


# (gate, beta_is_logit, g dtype, beta dtype)
FORMS = [
    ("lower_bound", True, torch.bfloat16, torch.bfloat16),
    ("lower_bound", False, torch.bfloat16, torch.float32),
    ("softplus", True, torch.bfloat16, torch.bfloat16),
    ("softplus", False, torch.bfloat16, torch.bfloat16),
    ("log_decay", True, torch.float32, torch.bfloat16),
    ("log_decay", False, torch.bfloat16, torch.float32),
]
FORM_IDS = [f"{g}-{'logit' if lo else 'prob'}-g{str(gd)[11:]}-b{str(bd)[11:]}" for g, lo, gd, bd in FORMS]


def form_problem(form, seed, **shape):
    gate, logit, g_dtype, beta_dtype = form
    p = make_problem(device=DEV, seed=seed, **shape)
    p = with_forms(p, gate, beta_is_logit=logit, beta_dtype=beta_dtype, seed=seed)
    if gate == "log_decay":
        p["g"] = p["g"].to(g_dtype)
    return p


SHAPES = [
    ("B2-T1000-H3", dict(batch=2, seqlen=1000, heads=3)),
    ("varlen-empty-H2", dict(batch=1, seqlen=0, heads=2, lens=[300, 17, 0, 513, 1])),
]


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("shape", [s[1] for s in SHAPES], ids=[s[0] for s in SHAPES])
@pytest.mark.parametrize("variant", [STATE_VARIANTS[2], STATE_VARIANTS[3]], ids=state_id)
def test_exact_mode_equals_the_reference(form, shape, variant):
    """Exact mode, every form: out and final state bitwise reference.fwd's, at block_v 32
    (fragment-order records) and 64 / 128 (sm_90a: the warpgroup pass, tile-order records)."""
    p = form_problem(form, 31, initial=variant[0], final=variant[1], **shape)
    ref = reference_outputs(p, exact=True)
    for block_v in (32, 64, 128):
        q = clone_outputs(p)
        native(q, exact=True, block_v=block_v)
        assert_bitwise(q["out"], ref["out"], f"out block_v={block_v}")
        if variant[1] is not None:
            assert_bitwise(q["final_state"], ref["final_state"], f"final_state block_v={block_v}")


AUTO = [
    ("kimi-B8-T200-H4", None),
    ("repeated-sat", ("repeated", 20.0)),
    ("alternating-sig3", ("alternating", 3.0)),
    ("few-sat", ("few", 20.0)),
]


@pytest.mark.parametrize("gate", reference.GATES)
@pytest.mark.parametrize("case", [a[1] for a in AUTO], ids=[a[0] for a in AUTO])
def test_automatic_whole_pass_equals_the_reference(gate, case):
    """The automatic path with 16-token whole-sequence passes, its stable inverse included:
    bitwise reference.fwd(exact=False) on Kimi-Linear-like gates (every chunk sound) and on
    degenerate keys (fp32 chunks: the reference counts them), at block_v 32 and 128."""
    if case is None:
        p = with_forms(make_problem(8, 200, 4, initial=torch.float32, final=torch.float32, device=DEV, seed=5), gate)
    else:
        p = degenerate_problem(*case[:1], gate, case[1], batch=8, seqlen=128, heads=4, device=DEV)
    whole_16(p)
    unsound = unsound_chunks(validated(p, False), Ops(torch.device(DEV)))
    assert (unsound == 0) == (case is None), unsound
    ref = reference_outputs(p, exact=False)
    for block_v in (32, 128):
        q = clone_outputs(p)
        native(q, exact=False, block_v=block_v, chunk_tokens=16)
        assert_bitwise(q["out"], ref["out"], f"out block_v={block_v}")
        assert_bitwise(q["final_state"], ref["final_state"], f"final_state block_v={block_v}")


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "auto"])
def test_records_equal_the_reference_k1(form, exact):
    """K1's records (fragment order) plane by plane equal reference.prepare's, degenerate keys
    in half the heads so that the automatic path's records include fp32 inverses."""
    p = form_problem(form, 41, batch=2, seqlen=77, heads=4)
    d = degenerate_problem("repeated", form[0], 20.0, batch=2, seqlen=77, heads=4, device=DEV)
    for name in ("k", "g"):
        p[name][:, :, :2] = d[name][:, :, :2].to(p[name].dtype)
    p["beta"][:, :, :2] = 20.0 if form[1] else 1.0
    call = validated(p, exact)
    assert unsound_chunks(call, Ops(torch.device(DEV))) > 0
    plan = testing.plan_of(call, block_v=32, chunk_tokens=16)
    workspace = torch.zeros(plan.workspace_bytes, dtype=torch.uint8, device=DEV)
    testing.run_native(call, block_v=32, chunk_tokens=16, workspace=workspace, overlap=-1, **UNVALIDATED)
    chunks = reference.chunk_table(call.batch, call.seqlen, None, DEV)
    ref = reference.prepare(
        Ops(torch.device(DEV)), p["q"], p["k"], p["g"], p["beta"], call.A_log, call.dt_bias, call.scale,
        call.lower_bound, chunks, call.gate, call.beta_is_logit, stable=not exact,
    )  # fmt: skip
    total = call.batch * call.seqlen
    got = decode_records(workspace, 4, -(-total // 16) + call.num_seqs, chunks.tok0.numel())
    for name in ("beta", "e", "Kd", "Qd", "Kr", "Mqk", "INV"):
        assert_bitwise(got[name], ref[name], f"record plane {name}")


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("block_v", (32, 128))
def test_k1_placements_give_the_reference_bits(form, block_v):
    """K1 first (overlap -1: on sm_90a an fp32 g's own kernel, GateLoad::kBeforeWait), beside
    the pass (1) and leaving its SMs (2: on sm_90a the unbounded gates' ten-CTA leaving form,
    K1Place::kLeaving, but with an fp32 g) give out and final state bitwise reference.fwd's,
    for every form, with 16-token records in fragment order (block_v 32) and, on sm_90a, tile
    order (128)."""
    p = form_problem(form, 52, batch=2, seqlen=333, heads=3, initial=torch.float32, final=torch.float32)
    ref = reference_outputs(p, exact=False)
    sm90 = torch.cuda.get_device_capability(DEV) == (9, 0)
    leaving_form = sm90 and form[0] != "lower_bound" and form[2] != torch.float32
    fp32_g_form = sm90 and form[0] == "log_decay" and form[2] == torch.float32
    for overlap in (-1, 1, 2):
        q = clone_outputs(p)
        plan = dict(block_v=block_v, chunk_tokens=16, overlap=overlap)
        assert testing.plan_of(validated(q, False), **plan).segment_chunks == 0  # a whole pass
        names = [k["name"] for k in testing.launched(validated(q, False), **UNVALIDATED, **plan)]
        where = f"overlap={overlap}"
        assert_bitwise(q["out"], ref["out"], f"out {where}")
        assert_bitwise(q["final_state"], ref["final_state"], f"final_state {where}")
        k1 = [n for n in names if n.startswith("prepare_")]
        if overlap == -1:
            assert k1 and all(n.startswith("prepare_kernel<") for n in k1), names
            assert all(("GateLoad::kBeforeWait" in n) == fp32_g_form for n in k1), names
        if overlap == 2:  # (overlap 1 leaves too where no K1 CTA fits beside the pass)
            grid = [n for n in k1 if n.startswith("prepare_overlap_kernel<")]  # (a long lead: a grid first)
            assert grid and all(("K1Place::kLeaving" in n) == leaving_form for n in grid), names


@pytest.mark.parametrize("form", FORMS, ids=FORM_IDS)
def test_a_long_lead_grid_gives_the_reference_bits(form):
    """K1 leaving the pass's SMs after a lead of at least four K1 waves (design section 4.7):
    the lead runs first as prepare_lead_kernel, one CTA a lead item (the unbounded and the
    tile-order bounded K1 with the item in shared memory), and out and final state are
    bitwise reference.fwd's for every form (4 x 2048 tokens, 24 heads, block_v 128, 16-token
    records)."""
    p = form_problem(form, 53, batch=4, seqlen=2048, heads=24, initial=torch.float32, final=torch.float32)
    plan = dict(block_v=128, chunk_tokens=16, overlap=2)
    lead = testing.plan_of(validated(p, False), **UNVALIDATED, **plan).overlap_lead
    if lead < four_k1_waves():
        pytest.skip(f"this GPU's plan leads by {lead} records, under four K1 waves")
    ref = reference_outputs(p, exact=False)
    names = [k["name"] for k in testing.launched(validated(p, False), **UNVALIDATED, **plan)]
    k1 = [n.split("<")[0] for n in names if n.startswith("prepare_")]
    assert k1 == ["prepare_lead_kernel", "prepare_overlap_kernel"], names
    assert_bitwise(p["out"], ref["out"], "out")
    assert_bitwise(p["final_state"], ref["final_state"], "final_state")


@pytest.mark.parametrize("gate", ["softplus", "log_decay"])
def test_extreme_decays(gate):
    """Decays of -200 and -inf (log_decay), gate inputs of +-inf and 1000 (softplus), positive
    and NaN log decays (taken as 0): finite, bitwise the reference in both modes (the chunk
    model with 32-token chunks), and within 1% of the fp64 recurrence."""
    p = with_forms(make_problem(2, 300, 3, initial=torch.float32, final=torch.float32, device=DEV, seed=51), gate)
    g = p["g"]
    if gate == "log_decay":
        g[0, 5:9] = -200.0
        g[0, 20, :, ::3] = -math.inf
        g[1, 40:60, 1] = -math.inf
        g[1, 33, 0, :10] = 3.0
        g[0, 70, 1, 5:50] = math.nan
    else:
        g[0, 3] = math.inf
        g[0, 10, 0] = -math.inf
        g[1, 30:34, 1] = 1000.0
        g[1, 50:70] = -1000.0
    gold_out, gold_state = reference.gold(*[p[n] for n in GOLD_ARGS], **forms(p))
    for exact in (True, False):
        ref = reference_outputs(p, exact)
        q = clone_outputs(p)
        native(q, exact=exact, chunk_tokens=16)
        assert torch.isfinite(q["out"]).all() and torch.isfinite(q["final_state"]).all()
        assert_bitwise(q["out"], ref["out"], "out")
        assert_bitwise(q["final_state"], ref["final_state"], "final_state")
        assert rel_err(q["out"], gold_out) < 0.01 and rel_err(q["final_state"], gold_state) < 0.01
    out, state = chunk_model.fwd(*[p[n] for n in GOLD_ARGS], chunk=32, ops=Ops(torch.device(DEV)), **forms(p))
    q = clone_outputs(p)
    native(q, exact=False, chunk_tokens=32, block_v=32)
    assert torch.isfinite(q["out"]).all() and torch.isfinite(q["final_state"]).all()
    assert_bitwise(q["out"], out, "out (32-token chunks)")
    assert_bitwise(q["final_state"], state.to(q["final_state"].dtype), "final_state (32-token chunks)")
    assert rel_err(q["out"], gold_out) < 0.01 and rel_err(q["final_state"], gold_state) < 0.01


@pytest.mark.parametrize("form", FORMS[2:], ids=FORM_IDS[2:])
@pytest.mark.parametrize("shape", [s[1] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_32_token_unbounded_records_equal_the_chunk_model(form, shape):
    """32-token chunks of the unbounded gates (design section 2.5), every beta and g form, batched
    and varlen with empty and one-token sequences, states in and out: out and final state
    bitwise the chunk model's, at both 32-token widths and with K1 before, beside and leaving
    the pass."""
    p = form_problem(form, 31, initial=torch.float32, final=torch.float32, **shape)
    out, state = chunk_model.fwd(*[p[n] for n in GOLD_ARGS], chunk=32, ops=Ops(torch.device(DEV)), **forms(p))
    for block_v, overlap in [(32, -1), (64, -1), (32, 1), (32, 2)]:
        q = clone_outputs(p)
        native(q, exact=False, block_v=block_v, chunk_tokens=32, overlap=overlap)
        where = f"block_v={block_v} overlap={overlap}"
        assert_bitwise(q["out"], out, f"out {where}")
        assert_bitwise(q["final_state"], state.to(q["final_state"].dtype), f"final_state {where}")


@pytest.mark.parametrize("gate", reference.GATES)
@pytest.mark.parametrize("kind,beta", [("repeated", 20.0), ("alternating", 3.0), ("few", 5.0)])
def test_32_token_records_take_the_stable_inverse(kind, beta, gate):
    """32-token chunks (AUTO mode), every gate, on degenerate keys: bitwise the chunk model, whose
    unsound chunks take the fp32 forward substitution of their 32 rows."""
    p = degenerate_problem(kind, gate, beta, batch=4, seqlen=200, heads=4, device=DEV)
    out, state = chunk_model.fwd(*[p[n] for n in GOLD_ARGS], chunk=32, ops=Ops(torch.device(DEV)), **forms(p))
    for block_v in (32, 64):
        q = clone_outputs(p)
        native(q, exact=False, block_v=block_v, chunk_tokens=32)
        assert_bitwise(q["out"], out, f"out block_v={block_v}")
        assert_bitwise(q["final_state"], state.to(q["final_state"].dtype), f"final_state block_v={block_v}")


def fla_error(p):
    """fla Triton's relative errors (out, final state) on problem p, its gate and beta given
    pre-activated (use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False: fla's path for
    every form), against reference.gold."""
    gate_log = reference.gate_gold(p["g"], p["A_log"], p["dt_bias"], p["lower_bound"], p.get("gate", "lower_bound"))
    b = p["beta"].float()
    if p.get("beta_is_logit", True):
        b = torch.sigmoid(b.double()).float()
    pre = dict(p, g=gate_log.reshape(p["g"].shape).float(), beta=b, gate="log_decay", beta_is_logit=False)
    pre.update(A_log=None, dt_bias=None, lower_bound=None)
    q = clone_outputs(pre)
    fallback.fla_fwd(validated(q, False))
    gold_out, gold_state = reference.gold(*[p[n] for n in GOLD_ARGS], **forms(p))
    return rel_err(q["out"], gold_out), rel_err(q["final_state"], gold_state)


@pytest.mark.parametrize("kind", ["repeated", "alternating", "few"])
@pytest.mark.parametrize("beta", [20.0, 5.0, 3.0], ids=["saturated", "sig5", "sig3"])
def test_degenerate_keys_within_fla_error(kind, beta):
    """Degenerate keys on the default path, every gate form: finite, and out and final state
    within 1.5x of fla Triton's error on the same inputs (T = 256, H = 2)."""
    if not fallback.fla_available():
        pytest.skip("fla is not importable")
    for gate in reference.GATES:
        p = degenerate_problem(kind, gate, beta, device=DEV)
        q = clone_outputs(p)
        native(q, exact=False)
        gold_out, gold_state = reference.gold(*[p[n] for n in GOLD_ARGS], **forms(p))
        e_out, e_state = rel_err(q["out"], gold_out), rel_err(q["final_state"], gold_state)
        f_out, f_state = fla_error(p)
        record = dict(test="degenerate", kind=kind, beta=beta, gate=gate, out=e_out, state=e_state)
        record.update(fla_out=f_out, fla_state=f_state)
        log(record)
        assert torch.isfinite(q["out"]).all() and torch.isfinite(q["final_state"]).all(), record
        assert e_out <= 1.5 * f_out and e_state <= 1.5 * f_state, record
