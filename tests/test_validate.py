# SPDX-License-Identifier: MIT
"""The input checks of flash_kda.fwd (_validate.check_fwd): the exception type, a message
naming the argument with the expected and the given value, and nothing written."""

import re
from itertools import product

import flash_kda
import pytest
import torch
from conftest import call, clone_outputs, make_problem, pooled_problem
from flash_kda import _layout, _validate

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
    ("q-H0", lambda p: dict(q=p["q"][:, :, :0]), ValueError, "q must have H >= 1 heads, got shape [1, 4, 0, 128]"),
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
    (
        "beta-fp64",
        lambda p: dict(beta=p["beta"].double()),
        TypeError,
        "beta must be bfloat16 or float32, got torch.float64",
    ),
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
        "cu_seqlens must be 1-D with N + 1 >= 1 entries, got shape [1, 2]",
    ),
    (
        "cu-none",
        lambda p: dict(cu_seqlens=torch.tensor([], dtype=torch.int64)),
        ValueError,
        "cu_seqlens must be 1-D with N + 1 >= 1 entries, got shape [0]",
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


MAX_SEQLEN_CASES = [
    ("max-seqlen-float", dict(max_seqlen=2.0), TypeError, "max_seqlen must be an int, got float"),
    ("max-seqlen-bool", dict(max_seqlen=True), TypeError, "max_seqlen must be an int, got bool"),
    ("max-seqlen-negative", dict(max_seqlen=-1), ValueError, "max_seqlen must be in [0, T = 4], got -1"),
    ("max-seqlen-beyond-T", dict(max_seqlen=5), ValueError, "max_seqlen must be in [0, T = 4], got 5"),
]
CASES += [(name, lambda p, o=overrides: o, exc, message) for name, overrides, exc, message in MAX_SEQLEN_CASES]


@pytest.mark.parametrize("overrides, exc, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejected(p, overrides, exc, message):
    expect_rejected(p, exc, message, **overrides(p))


def test_max_seqlen_reaches_the_plan_as_the_longest_sequence():
    """The validated call carries the longest sequence for the plan (C ABI max_seqlen): read
    from cu_seqlens on the CPU, whatever the hint says; the hint for a GPU cu_seqlens is
    test_segments_gpu's; 0 in batched mode, where every sequence has T tokens."""
    varlen = make_problem(1, 0, 2, lens=[5, 30, 0, 12], final=fp32)
    assert call(_validate.check_fwd, varlen).max_seqlen == 30
    assert call(_validate.check_fwd, varlen, max_seqlen=7).max_seqlen == 30
    assert call(_validate.check_fwd, varlen, max_seqlen=47).max_seqlen == 30
    batched = make_problem(2, 20, 2, final=fp32)
    assert call(_validate.check_fwd, batched, max_seqlen=3).max_seqlen == 0


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


# ------------------------------------------------------------------ values


@pytest.mark.parametrize("scale", [1e300, -1e300, 3.4e38, 3.3962e38], ids=str)
def test_scale_overflow_is_value_error(p, scale):
    expect_rejected(p, ValueError, "scale must be finite in bfloat16 (|scale| < 3.3961e38), got", scale=scale)


def test_scale_just_below_the_bf16_limit_is_accepted(p):
    run(p, scale=3.3960e38)


@pytest.mark.parametrize("name", ["scale", "lower_bound"])
def test_huge_int_scalars_are_value_errors_not_overflow_errors(p, name):
    expect_rejected(p, ValueError, f"{name} must be finite, got a value beyond the float64 range", **{name: 10**400})


def test_lower_bound_zero_is_accepted(p):
    out, final = run(p, lower_bound=0)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()


# ------------------------------------------------------------------ aliasing


def carve(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A tensor of like's shape, dtype and values at byte ``offset`` of a uint8 buffer."""
    nbytes = like.numel() * like.element_size()
    t = buffer[offset : offset + nbytes].view(like.dtype).view(like.shape)
    t.copy_(like)
    return t


def serving_problem():
    """Varlen, pools, has_initial_state and checkpoints: every argument is a tensor."""
    p = pooled_problem(1, 0, 2, [1, 0], 2, lens=[20, 12], has_initial=[True, False])
    p.update(checkpoint_every=16, checkpoints=torch.full((1, 2, 128, 128), float("nan")))
    return p


INPUTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens", "ssm_state_indices")
OUTPUTS = ("out", "final_state", "checkpoints")
OVERLAPS = (
    [("out", x) for x in (*INPUTS, "has_initial_state", "final_state", "checkpoints")]
    + [("final_state", x) for x in ("q", "beta", "dt_bias", "cu_seqlens", "has_initial_state", "checkpoints")]
    + [("checkpoints", x) for x in ("v", "A_log", "initial_state", "out")]
)


@pytest.mark.parametrize("writer,other", OVERLAPS, ids=[f"{w}-{o}" for w, o in OVERLAPS])
def test_overlapping_arguments_are_rejected(writer, other):
    p = serving_problem()
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    buffer = torch.zeros(64 + size(p[writer]) + size(p[other]), dtype=torch.uint8)
    p[writer] = carve(buffer, 0, p[writer])
    p[other] = carve(buffer, 64, p[other])  # starts inside the writer's bytes
    first, second = (
        (other, writer) if other in OUTPUTS and OUTPUTS.index(other) < OUTPUTS.index(writer) else (writer, other)
    )
    before = buffer.clone()
    with pytest.raises(ValueError, match=re.escape(f"flash_kda.fwd: {first} must not overlap {second} in memory")):
        call(flash_kda.fwd, p)
    assert torch.equal(buffer, before), "a rejected call wrote memory"


def test_out_overlapping_q_is_rejected(p):
    q = p["q"]
    buffer = torch.full((2 * q.numel(),), float("nan"), dtype=q.dtype)
    p["q"] = buffer[: q.numel()].view(q.shape).copy_(q)
    out = buffer[q.numel() // 2 : q.numel() // 2 + q.numel()].view(q.shape)  # the second half of q and beyond
    with pytest.raises(ValueError, match="out must not overlap q in memory"):
        call(flash_kda.fwd, p, out=out)
    assert torch.equal(p["q"], q), "q was written through out"


def test_final_state_partially_overlapping_initial_state_is_rejected():
    p = make_problem(2, 16, 1, initial=fp32)
    buffer = torch.zeros(3, 1, 128, 128)
    p["initial_state"] = buffer[:2].copy_(p["initial_state"])
    before = buffer.clone()
    with pytest.raises(ValueError, match="final_state must not overlap initial_state in memory; it may only be"):
        call(flash_kda.fwd, p, final_state=buffer[1:])
    assert torch.equal(buffer, before) and torch.isnan(p["out"]).all()


def test_final_state_may_be_a_view_identical_to_initial_state():
    p = make_problem(2, 16, 1, initial=fp32, seed=3)
    separate = dict(p, final_state=torch.full_like(p["initial_state"], float("nan")))
    call(flash_kda.fwd, separate)
    in_place = dict(p, out=torch.full_like(p["out"], float("nan")))
    in_place["final_state"] = in_place["initial_state"].view(2, 1, 128, 128)  # another object, same view
    assert in_place["final_state"] is not in_place["initial_state"]
    call(flash_kda.fwd, in_place)
    assert torch.equal(p["initial_state"], separate["final_state"])


def test_inputs_may_share_memory(p):
    out, final = run(p, k=p["q"], v=p["q"])
    assert out.shape == p["q"].shape and torch.isfinite(final).all()


def test_out_overlapping_itself_is_rejected(p):
    rows = torch.full((B * T * H * 128,), float("nan"), dtype=bf16)
    out = rows.as_strided((B, T, H, 128), (T * 64, 64, 8, 1))  # heads 8 elements apart: rows overlap
    expect_rejected(p, ValueError, "out must not overlap itself, got strides (256, 64, 8, 1)", out=out)


def test_beta_with_a_zero_stride_is_rejected(p):
    beta = p["beta"][:, :1].expand(B, T, H)
    expect_rejected(
        p, ValueError, "beta must have positive strides below 2**39 for dimensions longer than 1", beta=beta
    )


INDEX_CASES = [
    ("indices-float", dict(ssm_state_indices=torch.tensor([0.0])), TypeError,
     "ssm_state_indices must be int32 or int64, got torch.float32"),
    ("indices-shape", dict(ssm_state_indices=torch.tensor([0, 1])), ValueError,
     "ssm_state_indices must have shape [N] = [1], got [2]"),
    ("has-initial-int", dict(has_initial_state=torch.tensor([1])), TypeError,
     "has_initial_state must be bool, got torch.int64"),
    ("has-initial-shape", dict(has_initial_state=torch.tensor([[True]])), ValueError,
     "has_initial_state must have shape [N] = [1], got [1, 1]"),
    ("pool-P0", dict(ssm_state_indices=torch.tensor([0]), final_state=torch.zeros(0, H, 128, 128)), ValueError,
     "the state pools must have shape [P, H, V, K] with P in [1, 2**30], got [0, 2, 128, 128]"),
    ("pool-mismatch", dict(ssm_state_indices=torch.tensor([0]), initial_state=torch.zeros(3, H, 128, 128)), ValueError,
     "final_state must have shape [P, H, V, K] = [3, 2, 128, 128], got [1, 2, 128, 128]"),
    ("state-misaligned", dict(final_state=misaligned(nan_like((1, H, 128, 128), fp32))), ValueError,
     "final_state must be 16-byte aligned, got data_ptr % 16 = 4"),
]  # fmt: skip


@pytest.mark.parametrize("overrides,exc,message", [c[1:] for c in INDEX_CASES], ids=[c[0] for c in INDEX_CASES])
def test_index_and_state_arguments_are_checked(p, overrides, exc, message):
    expect_rejected(p, exc, message, **overrides)


@pytest.mark.parametrize(
    "shape, strides",
    [
        ((2, 3, 4), (12, 4, 1)),  # contiguous
        ((2, 1, 4), (4, 12345, 1)),  # contiguous, an odd stride on a dimension of extent one
        ((3, 4), (1, 3)),  # transposed
        ((2, 3, 2, 8), (96, 16, 8, 1)),  # a sliced view (gaps between rows)
        ((4, 2), (0, 1)),  # broadcast
        ((0, 3), (3, 1)),  # empty
    ],
)
def test_extent_is_the_span_of_the_elements_addresses(shape, strides):
    x = torch.empty(4096, dtype=torch.bfloat16).as_strided(shape, strides)
    offsets = [sum(i * s for i, s in zip(index, strides)) for index in product(*(range(n) for n in shape))]
    expected = (min(offsets) * 2, (max(offsets) + 1) * 2) if offsets else None
    assert _layout.extent(x) == expected


def test_widen_copies_only_what_is_not_already_fp32_contiguous_and_aligned():
    x = torch.randn(8, 128)
    assert _validate._widen(x) is x
    half = x.to(torch.bfloat16)
    widened = _validate._widen(half)
    assert widened.dtype == torch.float32 and widened.is_contiguous() and torch.equal(widened, half.float())
    strided = torch.randn(128, 8).t()
    assert _validate._widen(strided).is_contiguous() and torch.equal(_validate._widen(strided), strided)
    unaligned = torch.randn(8 * 128 + 1)[1:]  # data_ptr 4 bytes past an aligned one
    assert unaligned.data_ptr() % 16 and _validate._widen(unaligned).data_ptr() % 16 == 0
