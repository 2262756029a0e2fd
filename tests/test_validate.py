# SPDX-License-Identifier: MIT
"""The input checks of flash_kda.fwd (_validate.check_fwd): the exception type, a message
naming the argument with the expected and the given value, and nothing written."""

import re

import flash_kda
import pytest
import torch
from conftest import call, clone_outputs, make_problem

B, T, H = 1, 4, 2
bf16, fp32 = torch.bfloat16, torch.float32


@pytest.fixture
def p():
    return make_problem(B, T, H, final=fp32)


def nan_like(shape, dtype=bf16):
    return torch.full(shape, float("nan"), dtype=dtype)


def expect_rejected(p, exc, pattern, **overrides):
    """fwd(p with overrides) raises exc whose message contains ``pattern`` (literal text),
    and leaves every out / final_state it was given (and p's own) all NaN."""
    args = dict(p, **overrides)
    with pytest.raises(exc, match=re.escape(pattern)):
        call(flash_kda.fwd, args)
    for name in ("out", "final_state"):
        for t in (p[name], args[name]):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                assert torch.isnan(t).all(), f"{name} was written by a rejected call"


def misaligned(x):
    """A contiguous copy of x starting one element into a larger buffer."""
    buf = torch.empty(x.numel() + 1, dtype=x.dtype)
    y = buf[1:].view(x.shape)
    y.copy_(x)
    return y


def transposed(x):
    """A non-contiguous tensor of x's shape and values (dims 1 and 2 swapped in memory)."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def padded_rows(x, row):
    """x's values in a buffer whose rows of 128 are ``row`` elements apart."""
    buf = torch.full((*x.shape[:-1], row), float("nan"), dtype=x.dtype)
    buf[..., :128] = x
    return buf[..., :128]


# (id, overrides as a function of p, exception, message)
CASES = [
    ("q-list", lambda p: dict(q=p["q"].tolist()), TypeError, "q must be a torch.Tensor, got list"),
    ("q-fp16", lambda p: dict(q=p["q"].half()), TypeError, "q must be bfloat16, got torch.float16"),
    ("q-rank3", lambda p: dict(q=p["q"][0]), ValueError, "q must have shape [B, T, H, 128], got [4, 2, 128]"),
    (
        "q-dim64",
        lambda p: dict(q=p["q"][..., :64].contiguous()),
        ValueError,
        "q must have shape [B, T, H, 128], got [1, 4, 2, 64]",
    ),
    ("q-T0", lambda p: dict(q=p["q"][:, :0]), ValueError, "q must have B, T, H >= 1, got shape [1, 0, 2, 128]"),
    ("q-meta", lambda p: dict(q=p["q"].to("meta")), ValueError, "q must be on a CUDA device or the CPU, got meta"),
    ("k-meta", lambda p: dict(k=p["k"].to("meta")), ValueError, "k must be on cpu like q, got meta"),
    *[
        (f"{n}-fp32", lambda p, n=n: {n: p[n].float()}, TypeError, f"{n} must be bfloat16, got torch.float32")
        for n in ("k", "v", "g", "out")
    ],
    *[
        (
            f"{n}-shape",
            lambda p, n=n: {n: nan_like((B, T + 1, H, 128))},
            ValueError,
            f"{n} must have shape [B, T, H, D] = [1, 4, 2, 128], got [1, 5, 2, 128]",
        )
        for n in ("k", "v", "g", "out")
    ],
    ("beta-fp32", lambda p: dict(beta=p["beta"].float()), TypeError, "beta must be bfloat16, got torch.float32"),
    (
        "beta-shape",
        lambda p: dict(beta=p["beta"][..., 0]),
        ValueError,
        "beta must have shape [B, T, H] = [1, 4, 2], got [1, 4]",
    ),
    (
        "A_log-fp64",
        lambda p: dict(A_log=p["A_log"].double()),
        TypeError,
        "A_log must be bfloat16, float16 or float32, got torch.float64",
    ),
    ("A_log-shape", lambda p: dict(A_log=torch.zeros(H + 1)), ValueError, "A_log must have shape [H] = [2], got [3]"),
    (
        "dt_bias-fp64",
        lambda p: dict(dt_bias=p["dt_bias"].double()),
        TypeError,
        "dt_bias must be bfloat16, float16 or float32, got torch.float64",
    ),
    (
        "dt_bias-shape",
        lambda p: dict(dt_bias=torch.zeros(H, 64)),
        ValueError,
        "dt_bias must have shape [H, D] = [2, 128] (or [H * D]), got [2, 64]",
    ),
    (
        "dt_bias-flat-wrong",
        lambda p: dict(dt_bias=torch.zeros(H * 64)),
        ValueError,
        "dt_bias must have shape [H, D] = [2, 128] (or [H * D]), got [128]",
    ),
    (
        "q-head-stride-132",
        lambda p: dict(q=padded_rows(p["q"], 132)),
        ValueError,
        "q must have strides (batch, token, head, 1) with each stride of a dimension longer than 1 a positive "
        "multiple of 8 elements below 2**39, got strides (1056, 264, 132, 1) for shape [1, 4, 2, 128]",
    ),
    (
        "q-misaligned",
        lambda p: dict(q=misaligned(p["q"])),
        ValueError,
        "q must be 16-byte aligned, got data_ptr % 16 = 2",
    ),
    ("scale-str", lambda p: dict(scale="0.1"), TypeError, "scale must be a real number, got str"),
    ("scale-bool", lambda p: dict(scale=True), TypeError, "scale must be a real number, got bool"),
    ("scale-nan", lambda p: dict(scale=float("nan")), ValueError, "scale must be finite, got nan"),
    ("scale-inf", lambda p: dict(scale=float("inf")), ValueError, "scale must be finite, got inf"),
    *[
        (
            f"lower_bound-{lb}",
            lambda p, lb=lb: dict(lower_bound=lb),
            ValueError,
            f"lower_bound must be in [-5, 0], got {lb}",
        )
        for lb in (-5.5, 1.0, 1e-300)
    ],
    ("lower_bound--inf", lambda p: dict(lower_bound=float("-inf")), ValueError, "lower_bound must be finite, got -inf"),
    (
        "lower_bound-None",
        lambda p: dict(lower_bound=None),
        TypeError,
        "lower_bound must be a real number, got NoneType",
    ),
    (
        "initial-fp16",
        lambda p: dict(initial_state=torch.zeros(1, H, 128, 128, dtype=torch.float16)),
        TypeError,
        "initial_state must be bfloat16 or float32, got torch.float16",
    ),
    (
        "initial-shape",
        lambda p: dict(initial_state=torch.zeros(2, H, 128, 128)),
        ValueError,
        "initial_state must have shape [N, H, V, K] = [1, 2, 128, 128], got [2, 2, 128, 128]",
    ),
    (
        "final-shape",
        lambda p: dict(final_state=nan_like((1, H, 128, 64), fp32)),
        ValueError,
        "final_state must have shape [N, H, V, K] = [1, 2, 128, 128], got [1, 2, 128, 64]",
    ),
    (
        "initial-bf16-final-fp32",
        lambda p: dict(initial_state=torch.zeros(1, H, 128, 128, dtype=bf16)),
        TypeError,
        "initial_state and final_state must have the same dtype, got torch.bfloat16 and torch.float32",
    ),
    (
        "cu-float",
        lambda p: dict(cu_seqlens=torch.tensor([0.0, 4.0])),
        TypeError,
        "cu_seqlens must be int64 (or int32), got torch.float32",
    ),
    (
        "cu-2d",
        lambda p: dict(cu_seqlens=torch.tensor([[0, 4]])),
        ValueError,
        "cu_seqlens must be 1-D with N + 1 >= 2 entries, got shape [1, 2]",
    ),
    (
        "cu-one",
        lambda p: dict(cu_seqlens=torch.tensor([0])),
        ValueError,
        "cu_seqlens must be 1-D with N + 1 >= 2 entries, got shape [1]",
    ),
    (
        "cu-start",
        lambda p: dict(cu_seqlens=torch.tensor([1, 4])),
        ValueError,
        "cu_seqlens must start at 0, got cu_seqlens[0] = 1",
    ),
    (
        "cu-decreasing",
        lambda p: dict(cu_seqlens=torch.tensor([0, 3, 2, 4])),
        ValueError,
        "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 2 < cu_seqlens[1] = 3",
    ),
    (
        "cu-beyond-T",
        lambda p: dict(cu_seqlens=torch.tensor([0, 2, 5])),
        ValueError,
        "cu_seqlens must end at most at T = 4, got cu_seqlens[-1] = 5",
    ),
]


@pytest.mark.parametrize("overrides, exc, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejected(p, overrides, exc, message):
    expect_rejected(p, exc, message, **overrides(p))


def test_cu_seqlens_needs_batch_one():
    p = make_problem(2, T, H, final=fp32)
    expect_rejected(
        p, ValueError, "q must have B = 1 when cu_seqlens is given, got B = 2", cu_seqlens=torch.tensor([0, T])
    )


def test_test_helpers_build_what_they_claim(p):
    """The layout cases above test what they say: right shape, only the layout is wrong."""
    t, m, r = transposed(p["q"]), misaligned(p["q"]), padded_rows(p["q"], 132)
    assert t.shape == m.shape == r.shape == p["q"].shape
    assert torch.equal(t, p["q"]) and torch.equal(m, p["q"]) and torch.equal(r, p["q"])
    assert not t.is_contiguous() and m.is_contiguous() and m.data_ptr() % 16 != 0 and r.stride(2) == 132


def run(p, **overrides):
    """fwd(p with overrides) on fresh NaN outputs; checks every element got written."""
    q = clone_outputs(p)
    call(flash_kda.fwd, q, **overrides)
    assert not torch.isnan(q["out"]).any() and not torch.isnan(q["final_state"]).any()
    return q["out"], q["final_state"]


def test_flat_dt_bias_is_accepted(p):
    out, final = run(p)
    out_flat, final_flat = run(p, dt_bias=p["dt_bias"].reshape(H * 128))
    assert torch.equal(out, out_flat) and torch.equal(final, final_flat)


def test_int32_cu_seqlens_is_accepted():
    p = make_problem(B, T, H, lens=[3, 1], final=fp32)
    out, final = run(p)
    out32, final32 = run(p, cu_seqlens=p["cu_seqlens"].int())
    assert torch.equal(out, out32) and torch.equal(final, final32)


@pytest.mark.parametrize("lower_bound", [-5.0, -1e-6, 0.0, -0.0])
def test_lower_bound_edges_are_accepted(p, lower_bound):
    run(p, lower_bound=lower_bound)


def test_transposed_but_valid_q_is_accepted(p):
    out, final = run(p)
    out_t, final_t = run(p, q=transposed(p["q"]))
    assert torch.equal(out, out_t) and torch.equal(final, final_t)
