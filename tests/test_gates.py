# SPDX-License-Identifier: MIT
"""Every gate and beta form (design sections 2.2, 2.5) and the stable inverse (section 2.6)
on the CPU: the PyTorch path (the ledger with exact math) against the fp64 recurrence for
each form, extreme decays, probability betas, varlen with empty and one-token sequences and
states in and out; the degenerate keys on the default path; and the design's own claims,
checked on the reference's steps (the split's error bound, the inverse's residual test)."""

import math

import chunk_model
import flash_kda
import pytest
import torch
from chunked_gold import gold_chunked
from conftest import (
    FWD_ARGS,
    GOLD_ARGS,
    STATE_VARIANTS,
    chunk_l,
    degenerate_problem,
    forms,
    make_problem,
    rel_err,
    state_id,
    with_forms,
)
from flash_kda import _native, _validate, dispatch, fallback, reference, testing
from flash_kda._numerics import Ops, hf
from test_fast_path import Recorder

CPU = Ops(torch.device("cpu"))
FORMS = [(gate, logit) for gate in reference.GATES for logit in (True, False)]
FORM_IDS = [f"{gate}-{'logit' if logit else 'prob'}" for gate, logit in FORMS]


def torch_path(p, *, exact=False):
    """The PyTorch fallback path on problem p, in place (fallback.torch_fwd)."""
    fallback.torch_fwd(_validate.check_fwd(*[p[n] for n in FWD_ARGS], exact=exact, **forms(p)))


def gold(p):
    return reference.gold(*[p[n] for n in GOLD_ARGS], **forms(p))


def fresh(p):
    """p with NaN-filled outputs."""
    q = dict(p, out=torch.full_like(p["out"], math.nan))
    if p["final_state"] is not None:
        q["final_state"] = torch.full_like(p["final_state"], math.nan)
    return q


# ------------------------------------------------------------------ every form against fp64


SHAPES = [(None, STATE_VARIANTS[2]), ([37, 0, 1, 64, 16], STATE_VARIANTS[4])]


@pytest.mark.parametrize("gate,logit", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("lens,variant", SHAPES, ids=[f"batched-{state_id(SHAPES[0][1])}", "varlen-empty-one-noin"])
def test_each_form_matches_the_fp64_recurrence(gate, logit, variant, lens):
    """Kimi-Linear-like gates in each form, logit or probability betas (fp32 for the latter),
    batched and varlen with an empty and a one-token sequence, with and without an initial
    state: out and final state within 1% of reference.gold, which evaluates the gate formula
    in fp64."""
    p = make_problem(2, 70, 3, lens=lens, initial=variant[0], final=variant[1], seed=3)
    p = with_forms(p, gate, beta_is_logit=logit, beta_dtype=torch.float32 if not logit else torch.bfloat16)
    torch_path(p)
    out, state = gold(p)
    assert rel_err(p["out"], out) < 0.01
    assert rel_err(p["final_state"], state) < 0.01


@pytest.mark.parametrize("gate", ["lower_bound", "softplus"])
def test_the_gate_forms_agree_on_one_decay(gate):
    """A gate's natural-log decay, computed apart and passed as a log decay, gives the same fp64
    recurrence (gold) as the gate itself (to the fp32 rounding of the decay)."""
    p = with_forms(make_problem(1, 40, 2, initial=torch.float32, final=torch.float32, seed=4), gate)
    decay = reference.gate_gold(p["g"], p["A_log"], p["dt_bias"], p["lower_bound"], gate).reshape(p["g"].shape)
    pre = dict(p, gate="log_decay", g=decay.float(), A_log=None, dt_bias=None, lower_bound=None)
    for a, b in zip(gold(p), gold(pre)):
        assert rel_err(b, a) < 1e-6


def test_chunked_gold_equals_the_token_gold_for_unbounded_gates():
    """tests/chunked_gold.py's pairwise decays (no exp(-G)) give the token recurrence's result
    for decays far outside exp's range, -inf included."""
    p = with_forms(make_problem(1, 150, 2, lens=[70, 0, 80], initial=torch.float32, seed=5), "log_decay")
    p["g"][0, 3, 0, :8] = -1e4
    p["g"][0, 90, 1, 64:] = -math.inf
    for a, b in zip(gold_chunked(*[p[n] for n in GOLD_ARGS], **forms(p)), gold(p)):
        assert rel_err(a, b) < 1e-10


# ------------------------------------------------------------------ extreme decays


def test_extreme_log_decays_stay_finite_and_exact_in_meaning():
    """Log decays of -200 and -inf (a full reset of those channels), positive values and NaN
    (taken as 0, design section 2.5): the PyTorch path is finite and matches the fp64
    recurrence, which applies the same contract."""
    p = with_forms(make_problem(1, 96, 2, initial=torch.float32, final=torch.float32, seed=6), "log_decay")
    g = p["g"]
    g[0, 5:9] = -200.0
    g[0, 20, :, ::3] = -math.inf
    g[0, 40:60, 1] = -math.inf
    g[0, 33, 0, :10] = 3.0
    g[0, 70, 1, 5:50] = math.nan
    torch_path(p)
    assert torch.isfinite(p["out"]).all() and torch.isfinite(p["final_state"]).all()
    out, state = gold(p)
    assert rel_err(p["out"], out) < 0.01 and rel_err(p["final_state"], state) < 0.01


def test_extreme_softplus_inputs():
    """softplus gate inputs of +-inf and +-1000 (decays of -inf down to none) in bf16."""
    p = with_forms(make_problem(1, 80, 2, initial=torch.float32, final=torch.float32, seed=7), "softplus")
    g = p["g"]
    g[0, 3] = math.inf
    g[0, 10, 0] = -math.inf
    g[0, 30:34, 1] = 1000.0
    g[0, 50:70] = -1000.0
    torch_path(p)
    assert torch.isfinite(p["out"]).all() and torch.isfinite(p["final_state"]).all()
    out, state = gold(p)
    assert rel_err(p["out"], out) < 0.01 and rel_err(p["final_state"], state) < 0.01


def test_probability_betas_are_the_logits_sigmoid():
    """beta_is_logit=False with beta = sigmoid(logit), rounded to fp32 as the exact-math sigmoid
    rounds it, is the logit call bit for bit; values outside [0, 1] and NaN are clamped
    (NaN: 0)."""
    p = make_problem(1, 50, 2, initial=torch.float32, final=torch.float32, seed=8)
    prob = dict(p, beta=torch.sigmoid(p["beta"].double()).float(), beta_is_logit=False)
    a, b = fresh(p), fresh(prob)
    torch_path(a)
    torch_path(b)
    assert torch.equal(a["out"], b["out"]) and torch.equal(a["final_state"], b["final_state"])
    wild = dict(prob, beta=prob["beta"].clone())
    wild["beta"][0, :10] = 7.0
    wild["beta"][0, 10:20] = -3.0
    wild["beta"][0, 20:30] = math.nan
    clamped = dict(prob, beta=torch.nan_to_num(wild["beta"], nan=0.0).clamp(0, 1))
    c, d = fresh(wild), fresh(clamped)
    torch_path(c)
    torch_path(d)
    assert torch.equal(c["out"], d["out"]) and torch.equal(c["final_state"], d["final_state"])


# ------------------------------------------------------------------ the stable inverse


KINDS = ("repeated", "alternating", "few")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("gate", reference.GATES)
@pytest.mark.parametrize("beta", [20.0, 3.0], ids=["saturated", "sig3"])
def test_degenerate_keys_on_the_default_path(kind, gate, beta):
    """Keys that repeat, alternate in sign or take few directions, gates that do not decay and
    betas up to saturated ones: the default (stable) path is finite and within 2% of the fp64
    recurrence (the exact path's fp16 Neumann inverse gives up to 10^6 there)."""
    p = degenerate_problem(kind, gate, beta, seqlen=64)
    torch_path(p)
    out, state = gold(p)
    assert torch.isfinite(p["out"]).all() and torch.isfinite(p["final_state"]).all()
    assert rel_err(p["out"], out) < 0.02 and rel_err(p["final_state"], state) < 0.02


@pytest.mark.parametrize("gate", reference.GATES)
def test_sound_chunks_keep_the_neumann_bits(gate):
    """On healthy inputs every chunk's residual is within tolerance, so the stable inverse
    changes no bit: exact=False equals exact=True."""
    p = with_forms(make_problem(1, 300, 3, initial=torch.float32, final=torch.float32, seed=9), gate)
    a, b = fresh(p), fresh(p)
    torch_path(a, exact=True)
    torch_path(b, exact=False)
    assert torch.equal(a["out"], b["out"]) and torch.equal(a["final_state"], b["final_state"])


def test_forward_substitution_inverts_and_follows_its_order():
    """forward_substitution is (I + L)^-1 to fp32 rounding, and each entry is the FMA chain of
    design section 2.6, checked element by element in plain Python fp32 arithmetic."""
    gen = torch.Generator().manual_seed(10)
    L = hf(torch.tril(torch.randn(3, 16, 16, generator=gen), -1))
    X = reference.forward_substitution(L)
    eye = torch.eye(16, dtype=torch.float64)
    assert (X.double() @ (eye + L.double()) - eye).abs().max() < 1e-5
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    b = 1
    for j in (0, 5, 15):
        col = [f32(0.0)] * 16
        col[j] = f32(1.0)
        for i in range(j + 1, 16):
            acc = f32(0.0)
            for s in range(i):
                acc = torch.tensor(float(L[b, i, s]) * float(col[s]) + float(acc), dtype=torch.float64).float()
            col[i] = -acc
        assert torch.equal(torch.stack(col), X[b, :, j]), j


def test_the_residual_test_catches_the_degenerate_chunks_only():
    """The residual tolerance (2^-8) lies between healthy chunks' residuals (random and
    long-memory inputs, every gate: at most 2^-11 here) and the degenerate chunks' (at least
    2^-7)."""

    def worst(p):
        call = _validate.check_fwd(*[p[n] for n in FWD_ARGS], exact=True, **forms(p))
        L = chunk_l(call, CPU)
        return float(reference.residual(CPU, L, reference.neumann_product(CPU, L)).abs().amax())

    healthy = []
    for gate in reference.GATES:
        healthy.append(worst(with_forms(make_problem(1, 1024, 2, seed=12), gate)))
        long_memory = make_problem(1, 1024, 2, seed=13)
        long_memory["g"] = (long_memory["g"].float() - 6).bfloat16()
        healthy.append(worst(long_memory))
    assert max(healthy) <= 2.0**-11 < reference.INVERSE_TOLERANCE, healthy
    degenerate = [worst(degenerate_problem(kind, "log_decay", 3.0, seqlen=64)) for kind in ("repeated", "alternating")]
    assert min(degenerate) >= 2.0**-7 > reference.INVERSE_TOLERANCE, degenerate


def test_32_token_chunks_take_the_stable_inverse_too():
    """The 32-token model (the oracle of the native 32-token K1) checks its diagonal and cross
    blocks: on degenerate keys it stays within 2% of the fp64 recurrence, and on healthy keys
    it keeps the Neumann bits."""
    p = degenerate_problem("repeated", "lower_bound", 3.0, seqlen=200)
    args = [p[n] for n in GOLD_ARGS]
    out, state = chunk_model.fwd(*args, chunk=32)
    gold_out, gold_state = gold(p)
    assert rel_err(out, gold_out) < 0.02 and rel_err(state.float(), gold_state) < 0.02
    healthy = make_problem(1, 200, 2, initial=torch.float32, seed=14)
    args = [healthy[n] for n in GOLD_ARGS]
    for a, b in zip(chunk_model.fwd(*args, chunk=32, stable=True), chunk_model.fwd(*args, chunk=32, stable=False)):
        assert torch.equal(a, b)


# ------------------------------------------------------------------ the unbounded split


def _true_scores(k_hat, gamma, b):
    """fp64 L of each chunk, b_i <k_i, k_j 2^(G_i - G_j)> for i > j with G from gamma (log2),
    and the same sum of absolute terms."""
    G = torch.cumsum(torch.clamp(gamma.double(), min=-2000.0), dim=-2)  # 2^-2000 is 0 in fp64
    lower = torch.tril(torch.ones(16, 16, dtype=torch.bool), -1)[..., None]
    d = torch.exp2(torch.where(lower, G[..., :, None, :] - G[..., None, :, :], -math.inf))  # [.., i, j, k]
    k = k_hat.double()
    L = torch.einsum("...ik,...jk,...ijk->...ij", k, k, d) * b.double()[..., :, None]
    size = torch.einsum("...ik,...jk,...ijk->...ij", k.abs(), k.abs(), d) * b.double()[..., :, None]
    return L, size


def test_the_split_stays_within_its_error_bound():
    """design section 2.5: the score operands' clamp errs only across a token that decays by
    more than 2^-C, and then by at most 2^-C per entry; with decays up to -inf in a chunk every
    L entry is within 2^-C plus its fp16 rounding of the fp64 value, and Kd, Qd, Kr, e (never
    clamped) are finite."""
    gen = torch.Generator().manual_seed(15)
    chunks, H = 64, 2
    k_hat = reference.l2_normalize(CPU, torch.randn(chunks, H, 16, 128, generator=gen).bfloat16())
    q_hat = reference.l2_normalize(CPU, torch.randn(chunks, H, 16, 128, generator=gen).bfloat16())
    magnitude = torch.tensor([0.1, 3.0, 40.0, 400.0]).repeat(4).reshape(1, 1, 16, 1)  # per row, log2
    gamma = -torch.rand(chunks, H, 16, 128, generator=gen) * magnitude
    gamma[::4, :, 6, ::2] = -math.inf
    gamma[1::4, :, 11] = -500.0
    b = torch.rand(chunks, H, 16, generator=gen)
    e, Qd, Kd, Kr, A_q, A_k, B = reference.unbounded_decays(CPU, q_hat, k_hat, gamma, 128**-0.5)
    L, _ = reference.chunk_scores(CPU, A_q, A_k, B, b)
    for x in (e, Qd, Kd, Kr, L):
        assert torch.isfinite(x.float()).all()
    exact, size = _true_scores(k_hat, gamma, b)
    # the clamp's 2^-C, the operands' bf16 roundings (four of 2^-9 a term), L's fp16 rounding
    bound = 2.0**-reference.CLAMP_LOG2 + 2.0**-7 * size + 2.0**-11 * exact.abs() + 2.0**-24
    assert ((L.double() - exact).abs() <= bound).all()
    clamped = (gamma < -reference.CLAMP_LOG2).any(-1)  # rows with a token beyond the clamp
    assert clamped.any() and (L.double() - exact).abs().max() > 0


def test_the_decay_factors_are_two_to_the_true_sums():
    """Step U2's factors of Kd, Qd and Kr are 2^G_t and 2^(G_15 - G_t) of the fp64 sums to one
    bf16 rounding, never above 1, and 0 where a sum is -inf or below 2^-126, on decays from -0.05
    to -inf with clamped and unclamped halves (the score operands' clamp never reaches them)."""
    gen = torch.Generator().manual_seed(17)
    chunks, H = 48, 2
    magnitude = torch.tensor([0.05, 2.0, 20.0, 90.0]).repeat(4).reshape(1, 1, 16, 1)  # per row, log2
    gamma = -torch.rand(chunks, H, 16, 128, generator=gen) * magnitude
    gamma[:16] = gamma[:16].clamp(min=-reference.CLAMP_LOG2)  # no clamp in either half
    gamma[16::3, :, 3, ::2] = -math.inf
    gamma[17::3, :, 12] = -500.0
    ones = torch.ones(chunks, H, 16, 128, dtype=torch.bfloat16)
    e, Qd, Kd, Kr, *_ = reference.unbounded_decays(CPU, ones, ones, gamma, 1.0)
    G = torch.cumsum(torch.clamp(gamma.double(), min=-2000.0), dim=-2)
    for got, want in ((Kd, torch.exp2(G)), (Qd, torch.exp2(G)), (Kr, torch.exp2(G[:, :, -1:] - G))):
        got = got.double()
        assert (got <= 1).all()
        tiny = want < 2.0**-126
        assert ((got - want).abs() <= 2.0**-8 * want + torch.where(tiny, 2.0**-126, 0.0)).all()
        assert (got[want == 0] == 0).all()
    assert (gamma < -reference.CLAMP_LOG2).any() and not (gamma[:16] < -reference.CLAMP_LOG2).any()


def test_tame_decays_score_as_the_bounded_gate():
    """On decays the bounded gate can express, the unbounded split's L and Mqk equal the
    bounded path's to their rounding (the same entries, rebased on token 7 instead of the
    chunk start)."""
    p = with_forms(make_problem(1, 320, 2, seed=16), "lower_bound")
    chunks = reference.chunk_table(1, 320, None, "cpu")
    q_hat = reference.l2_normalize(CPU, reference.gather_chunks(p["q"], chunks))
    k_hat = reference.l2_normalize(CPU, reference.gather_chunks(p["k"], chunks))
    g = reference.gather_chunks(p["g"], chunks)
    gamma = reference.gate_values(CPU, g, chunks.valid, p["A_log"], p["dt_bias"], -5.0)
    b = reference.write_strength(CPU, reference.gather_chunks(p["beta"], chunks))
    _, Qd, Kd, Ki, _ = reference.apply_decays(CPU, q_hat, k_hat, reference.cumulative_gates(gamma), 0.125)
    L0, M0 = reference.chunk_scores(CPU, Qd, Kd, Ki, b)
    *_, A_q, A_k, B = reference.unbounded_decays(CPU, q_hat, k_hat, gamma, 0.125)
    L1, M1 = reference.chunk_scores(CPU, A_q, A_k, B, b)
    assert (L1.float() - L0.float()).abs().max() < 2e-3
    assert (M1.float() - M0.float()).abs().max() < 2e-3 * 0.125 * 8


def test_softplus_gamma_is_log2_softplus():
    """Step U1: gamma = -a log2(1 + 2^y) within a few fp32 ulps on [-60, 60], exactly -a y where
    2^-y is below fp32's resolution, 0 far below, and +-inf / NaN as the contract says."""
    g = torch.tensor([-1e9, -60.0, -5.0, -0.5, 0.0, 0.5, 5.0, 30.0, 60.0, 1e9, math.inf, -math.inf, math.nan])
    g = g.reshape(1, 1, -1, 1).expand(1, 1, -1, 128).contiguous()
    valid = torch.ones(1, g.shape[2], dtype=torch.bool)
    A_log, dt = torch.zeros(1), torch.zeros(1, 128)
    got = reference.unbounded_gamma(CPU, g, valid, A_log, dt, "softplus")[0, 0, :, 0]
    x = g[0, 0, :, 0].double()
    want = -torch.nn.functional.softplus(x) / math.log(2)
    finite = torch.isfinite(x)
    assert torch.allclose(got[finite].double(), want[finite], rtol=1e-6, atol=2e-7)
    assert got[-3] == -math.inf and got[-2] == 0 and got[-1] == 0


# ------------------------------------------------------------------ the path of each form

# The forms whose native kernels have not run on a GPU: (gate, beta_is_logit, beta dtype).
UNVALIDATED = [("softplus", True, torch.bfloat16), ("log_decay", True, torch.bfloat16),
               ("lower_bound", False, torch.bfloat16), ("lower_bound", True, torch.float32)]  # fmt: skip
UNVALIDATED_IDS = ["softplus", "log_decay", "probability", "fp32-logits"]


def routed(p, recorder, monkeypatch, *, fla=False):
    """flash_kda.fwd of problem p on a simulated native device: [(path, reason)] logged."""
    logged = []
    monkeypatch.setattr(dispatch, "_log_once", lambda device, path, reason: logged.append((path, reason)))
    monkeypatch.setattr(fallback, "fla_available", lambda: fla)
    monkeypatch.setattr(fallback, "fla_fwd", lambda call: None)
    call_fwd(p)
    return logged


def call_fwd(p):
    flash_kda.fwd(*[p[n] for n in FWD_ARGS], **forms(p))


def form_problem(gate, logit, beta_dtype):
    p = make_problem(1, 40, 2, initial=torch.float32, final=torch.float32, seed=12)
    return with_forms(p, gate, beta_is_logit=logit, beta_dtype=beta_dtype)


@pytest.mark.parametrize("gate,logit,beta_dtype", UNVALIDATED, ids=UNVALIDATED_IDS)
@pytest.mark.parametrize("fla", [True, False], ids=["fla", "no-fla"])
def test_forms_leave_the_native_path_until_enabled(gate, logit, beta_dtype, fla, monkeypatch):
    """A call of a form whose kernels are not enabled on the device (its arch table sets no
    FEATURE_GATE_FORMS there) runs on fla's Triton path, else PyTorch, and says why; nothing is
    launched natively."""
    recorder = Recorder()
    with testing.simulated_native(recorder):
        logged = routed(form_problem(gate, logit, beta_dtype), recorder, monkeypatch, fla=fla)
    assert recorder.launches == []
    ((path, reason),) = logged
    assert path == (dispatch.FLA if fla else dispatch.TORCH)
    assert reason.startswith("native kernels for ") and "are built but not yet validated on sm_90; " in reason
    described = {"softplus": "gate='softplus'", "log_decay": "gate='log_decay'"}.get(gate, "")
    assert described in reason and ("beta_is_logit=False" in reason) == (not logit)
    assert ("float32 beta" in reason) == (beta_dtype == torch.float32)


@pytest.mark.parametrize("gate,logit,beta_dtype", UNVALIDATED, ids=UNVALIDATED_IDS)
def test_the_testing_switch_or_the_table_s_bit_takes_them_native(gate, logit, beta_dtype, monkeypatch):
    """flash_kda.testing's unvalidated_forms sends them to the native path through the test
    entry point; an arch table with FEATURE_GATE_FORMS (once validated) takes them through the
    stable one. The struct carries the form."""
    p = form_problem(gate, logit, beta_dtype)
    recorder = Recorder()
    with testing.simulated_native(recorder), testing.overrides(unvalidated_forms=1):
        logged = routed(p, recorder, monkeypatch)
    assert [path for path, _ in logged] == [dispatch.NATIVE]
    ((kind, raw, overrides),) = recorder.launches
    assert kind == "validated" and overrides.unvalidated_forms == 1
    args = _native.FwdArgs.from_buffer_copy(raw)
    assert (args.gate, args.beta_form) == (_native.GATE_CODES[gate], 0 if logit else 1)
    assert args.beta_dtype == (2 if beta_dtype == torch.float32 else 1)
    enabled = Recorder()
    enabled.archs = [a._replace(features=a.features | _native.FEATURE_GATE_FORMS) for a in enabled.archs]
    with testing.simulated_native(enabled):
        routed(p, enabled, monkeypatch)
    assert [(kind, overrides) for kind, _, overrides in enabled.launches] == [("validated", None)]


def test_flashkda_s_forms_stay_native(monkeypatch):
    """The bounded gate with bf16 logits (FlashKDA's contract) keeps the native path."""
    recorder = Recorder()
    with testing.simulated_native(recorder):
        logged = routed(make_problem(1, 40, 2, final=torch.float32, seed=13), recorder, monkeypatch)
    assert [path for path, _ in logged] == [dispatch.NATIVE] and len(recorder.launches) == 1


def test_native_refusal_answers_as_run_decides():
    """dispatch.native_refusal (what fla's backend asks): None for FlashKDA's forms on a native
    device, the forms' reason for the others until enabled, the path's reason on the CPU."""
    assert dispatch.native_refusal("cpu") == "cpu tensors run on the PyTorch path"
    with testing.simulated_native(Recorder()):
        assert dispatch.native_refusal("cpu") is None
        why = dispatch.native_refusal("cpu", gate="softplus")
        assert why == "native kernels for gate='softplus' are built but not yet validated on sm_90"
        with testing.overrides(unvalidated_forms=1):
            assert dispatch.native_refusal("cpu", gate="log_decay", g_dtype=torch.float32) is None
