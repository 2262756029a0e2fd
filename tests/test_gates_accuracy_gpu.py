# SPDX-License-Identifier: MIT
"""The accuracy matrix of the unbounded gates (issue 37's acceptance) on a GPU: relative
Frobenius error of out and final state of the default (automatic) path against the fp64
recurrence, T in {1024, 8192, 65536}, H in {2, 6}, batched and varlen, with and without an
initial state, for Kimi-Linear-like softplus gates and the same decays passed pre-activated
(log_decay): each within the section 3.6 bounds and at most 1.1x (+ 1e-4) the bounded gate's
error at the same shape. fla Triton's error on the same inputs (its gates and betas given
pre-activated) is measured beside it where H = 2 and batched (one autotuning). Each case is
appended as a JSON line to ``FLASH_KDA_GATES_LOG`` when set."""

import pytest
import torch
from chunked_gold import gold_chunked
from conftest import FWD_ARGS, GOLD_ARGS, OUT_TOLERANCE, RATIO, STATE_TOLERANCE, clone_outputs, forms, with_forms
from flash_kda import fallback, reference, testing
from test_gates_gpu import fla_error, log, unvalidated_kernels  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("native_gpu", "unvalidated_kernels")]
DEV = "cuda"


def problem(lens, heads, initial, seed):
    """Random q, k, v, beta (bf16, N(0, 1)); fp32 states: 0.1 N(0, 1) in (or none), out."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    T, N = sum(lens), len(lens)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device=DEV).to(dtype)

    p = dict(q=randn(1, T, heads, 128), k=randn(1, T, heads, 128), v=randn(1, T, heads, 128))
    p.update(g=randn(1, T, heads, 128), beta=randn(1, T, heads), scale=128**-0.5, lower_bound=-5.0)
    p.update(A_log=torch.zeros(heads, device=DEV), dt_bias=torch.zeros(heads, 128, device=DEV))
    p["initial_state"] = 0.1 * randn(N, heads, 128, 128, dtype=torch.float32) if initial else None
    p["final_state"] = torch.full((N, heads, 128, 128), float("nan"), device=DEV)
    p["cu_seqlens"] = None if N == 1 else torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEV)
    p["out"] = torch.full_like(p["q"], float("nan"))
    return p


def cases():
    out = []
    for T in (1024, 8192, 65536):
        for heads in (2, 6):
            for layout in ("batched", "varlen"):
                for initial in (True, False):
                    marks = [pytest.mark.slow] if T == 65536 else []
                    name = f"T{T}-H{heads}-{layout}-{'init' if initial else 'noinit'}"
                    out.append(pytest.param(T, heads, layout, initial, id=name, marks=marks))
    return out


@pytest.mark.parametrize("T,heads,layout,initial", cases())
def test_unbounded_gates_are_as_accurate_as_the_bounded_one(T, heads, layout, initial):
    lens = [T] if layout == "batched" else [T * 5 // 8, T - T * 5 // 8 - 16, 16]
    base = problem(lens, heads, initial, seed=T + heads)
    with_fla = heads == 2 and layout == "batched" and fallback.fla_available()
    errors = {}
    for gate in reference.GATES:
        p = with_forms(base, gate, seed=T)
        q = clone_outputs(p)
        call = testing.validated(*[q[n] for n in FWD_ARGS], exact=False, **forms(q))
        plan = testing.plan_of(call)
        testing.run_native(call)  # with the process-wide overrides of the fixture
        gold_out, gold_state = gold_chunked(*[p[n] for n in GOLD_ARGS], **forms(p))
        errors[gate] = dict(
            out=reference.rel_err(q["out"], gold_out), state=reference.rel_err(q["final_state"], gold_state)
        )
        errors[gate].update(chunk_tokens=plan.chunk_tokens, segment_chunks=plan.segment_chunks)
        if with_fla:
            errors[gate]["fla_out"], errors[gate]["fla_state"] = fla_error(p)
    record = dict(test="accuracy", T=T, heads=heads, layout=layout, initial=initial, errors=errors)
    log(record)
    bounded = errors["lower_bound"]
    for gate in ("softplus", "log_decay"):
        e = errors[gate]
        assert e["out"] <= OUT_TOLERANCE and e["state"] <= STATE_TOLERANCE, record
        assert e["out"] <= RATIO * bounded["out"] + 1e-4, record
        assert e["state"] <= RATIO * bounded["state"] + 1e-4, record
