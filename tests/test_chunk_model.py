# SPDX-License-Identifier: MIT
"""The 32-token chunk model (tests/chunk_model.py, design §4.8):
with 16-token chunks and the ledger's Kr it is the exact ledger bit for bit; its 32-token
records hold the inverse and the scores they claim to; and its forward stays within the
issue's accuracy bound of 1.1x the exact path's error, for the unbounded gates too. CPU,
exact math."""

import math

import chunk_model
import pytest
import torch
from conftest import forms, make_problem, with_forms
from flash_kda import reference
from flash_kda.testing import Ops

PROBLEMS = {
    "batched-fp32": dict(batch=2, seqlen=96, heads=2, initial=torch.float32, final=torch.float32),
    "batched-none": dict(batch=1, seqlen=130, heads=1, initial=None, final=torch.bfloat16),
    "varlen-bf16": dict(
        batch=1, seqlen=0, heads=2, lens=[37, 0, 1, 100, 64], initial=torch.bfloat16, final=torch.bfloat16
    ),
}


def problem(name, seed=3, long_memory=False):
    spec = dict(PROBLEMS[name])
    p = reference.random_problem(spec.pop("batch"), spec.pop("seqlen"), spec.pop("heads"), seed=seed, **spec)
    if long_memory:  # gates shifted by -6, as tests/test_segments_gpu.py's long memory
        p["g"] = (p["g"].float() - 6.0).to(torch.bfloat16)
    return p


def ledger(p):
    q = dict(p, out=torch.empty_like(p["v"]), final_state=torch.empty_like(p["final_state"]))
    reference.fwd(*[q[name] for name in reference.FWD_ARGS])
    return q["out"], q["final_state"]


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_sixteen_token_chunks_with_the_ledgers_kr_are_the_ledger(name):
    p = problem(name)
    out, state = chunk_model.fwd(*[p[n] for n in reference.GOLD_ARGS], chunk=16, ledger_kr=True)
    ledger_out, ledger_state = ledger(p)
    assert torch.equal(out, ledger_out)
    assert torch.equal(state.float(), ledger_state.float())


def exact_scores(x, y, G, b=None):
    """fp64 sum_k x[i, k] y[j, k] 2^(G[i, k] - G[j, k]) (times b_i)."""
    x, y, G = x.double(), y.double(), G.double()
    s = torch.einsum("...ik,...jk->...ij", x * torch.exp2(G), y * torch.exp2(-G))
    return s if b is None else s * b.double()[..., :, None]


def test_a_32_token_record_holds_the_inverse_and_the_scores_it_claims():
    """INV ~ (I + L)^-1 and Mqk ~ scale q k^T decayed, over all 32 rows, the cross block
    (formed against the end of block 0) included. Long memory, so that the cross block
    matters: there a zero INV10 leaves a residual of 0.23 and a negated one 0.46, a zero
    Mqk10 an error of 0.69 (the correct record: 0.0011 and 0.0039)."""
    p = problem("batched-fp32", long_memory=True)
    ops = Ops(torch.device("cpu"))
    chunks = reference.chunk_table(2, 96, None, torch.device("cpu"), size=32)
    rec = chunk_model.prepare(
        ops, p["q"], p["k"], p["g"], p["beta"], p["A_log"], p["dt_bias"], p["scale"], p["lower_bound"], chunks
    )
    q_hat = reference.l2_normalize(ops, reference.gather_chunks(p["q"], chunks)).float()
    k_hat = reference.l2_normalize(ops, reference.gather_chunks(p["k"], chunks)).float()
    gamma = reference.gate_values(
        ops, reference.gather_chunks(p["g"], chunks), chunks.valid, p["A_log"], p["dt_bias"], p["lower_bound"]
    )
    G = torch.cumsum(gamma.double(), dim=2)
    b = torch.sigmoid(reference.gather_chunks(p["beta"], chunks).double())
    L = torch.tril(exact_scores(k_hat, k_hat, G, b), diagonal=-1)
    eye = torch.eye(32, dtype=torch.float64)
    residual = rec["INV"].double() @ (eye + L) - eye
    assert residual.abs().max().item() < 0.01
    Mqk = torch.tril(exact_scores(q_hat, k_hat, G)) * p["scale"]
    err = (rec["Mqk"].double() - Mqk).norm() / Mqk.norm()
    assert err.item() < 0.01


@pytest.mark.parametrize("long_memory", [False, True])
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_32_token_chunks_stay_within_the_accuracy_bound(name, long_memory):
    """Issue 7, acceptance 2: the automatic path's errors against the fp64 gold no worse
    than 1.1x the exact path's on the same inputs."""
    p = problem(name, long_memory=long_memory)
    args = [p[n] for n in reference.GOLD_ARGS]
    gold_out, gold_state = reference.gold(*args)
    ledger_out, ledger_state = ledger(p)
    out, state = chunk_model.fwd(*args, chunk=32)
    assert reference.rel_err(out, gold_out) <= 1.1 * reference.rel_err(ledger_out, gold_out)
    assert reference.rel_err(state, gold_state) <= 1.1 * reference.rel_err(ledger_state, gold_state)


@pytest.mark.parametrize("chunk, ledger_kr", [(64, False), (48, False), (32, True)])
def test_other_chunk_lengths_are_refused(chunk, ledger_kr):
    """The model has the cross block of two 16-row blocks only, and the ledger's Kr
    overflows past 16 rows: anything else is an error, not a silently wrong record."""
    p = problem("batched-none")
    with pytest.raises(ValueError, match="chunk"):
        chunk_model.fwd(*[p[n] for n in reference.GOLD_ARGS], chunk=chunk, ledger_kr=ledger_kr)


@pytest.mark.parametrize("gate", ["softplus", "log_decay"])
@pytest.mark.parametrize("extreme", [False, True], ids=["kimi", "extreme"])
def test_unbounded_32_token_chunks_stay_within_the_accuracy_bound(gate, extreme):
    """The unbounded gates' 32-token model (design section 2.5): finite, and its errors against
    the fp64 gold no worse than 1.1x those of the 16-token reference on Kimi-Linear-like gates,
    and with decays of -200 and -inf (log decay) or gate inputs of +-inf and 1000 (softplus)."""
    p = with_forms(make_problem(2, 96, 2, initial=torch.float32, final=torch.float32, seed=5), gate)
    if extreme and gate == "log_decay":
        p["g"][0, 5:9] = -200.0
        p["g"][0, 20, :, ::3] = -math.inf
        p["g"][1, 40:60, 1] = -math.inf
    elif extreme:
        p["g"][0, 3] = math.inf
        p["g"][0, 10, 0] = -math.inf
        p["g"][1, 30:34, 1] = 1000.0
        p["g"][1, 50:70] = -1000.0
    args = [p[n] for n in reference.GOLD_ARGS]
    gold_out, gold_state = reference.gold(*args, **forms(p))
    q = dict(p, out=torch.empty_like(p["v"]), final_state=torch.empty_like(p["final_state"]))
    reference.fwd(*[q[n] for n in reference.FWD_ARGS], exact=False, **forms(q))
    out, state = chunk_model.fwd(*args, chunk=32, **forms(p))
    assert torch.isfinite(out).all() and torch.isfinite(state.float()).all()
    assert reference.rel_err(out, gold_out) <= 1.1 * reference.rel_err(q["out"], gold_out)
    assert reference.rel_err(state, gold_state) <= 1.1 * reference.rel_err(q["final_state"], gold_state)


def test_the_unbounded_model_is_of_32_row_chunks():
    p = with_forms(make_problem(1, 32, 1, seed=5), "softplus")
    with pytest.raises(ValueError, match="32-row chunks"):
        chunk_model.fwd(*[p[n] for n in reference.GOLD_ARGS], chunk=16, **forms(p))
