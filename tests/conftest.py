# SPDX-License-Identifier: MIT
"""Shared fixtures and helpers: GPU skipping, random problems, the bitwise comparison."""

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

# The seven state variants of spec section 1.4: (initial dtype, final dtype).
STATE_VARIANTS = [
    (None, None),
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float32),
    (None, torch.bfloat16),
    (None, torch.float32),
    (torch.bfloat16, None),
    (torch.float32, None),
]


def state_id(variant) -> str:
    names = {None: "none", torch.bfloat16: "bf16", torch.float32: "fp32"}
    return f"{names[variant[0]]}in-{names[variant[1]]}out"


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


from flash_kda import _validate  # noqa: E402
from flash_kda.reference import FWD_ARGS, FWD_KEYWORDS, GOLD_ARGS, rel_err  # noqa: E402, F401 (re-exported)
from flash_kda.reference import random_problem as make_problem  # noqa: E402, F401 (re-exported)


def call(fn, p, **overrides):
    """fn(*the positional fwd arguments of problem p, **its keyword ones), with overrides."""
    q = dict(p, **overrides)
    return fn(*[q[name] for name in FWD_ARGS], **{name: q[name] for name in FWD_KEYWORDS if name in q})


def check(p, **overrides) -> _validate.FwdCall:
    """The validated call of problem p (with overrides)."""
    return call(_validate.check_fwd, p, **overrides)


def gold_of(p):
    """reference.gold on problem p: (out, final_state) in fp64."""
    from flash_kda import reference

    return reference.gold(*[p[name] for name in GOLD_ARGS])


def clone_outputs(p):
    """A copy of p whose out / final_state are fresh NaN-filled tensors."""
    q = dict(p)
    q["out"] = torch.full_like(p["out"], float("nan"))
    if p["final_state"] is not None:
        q["final_state"] = torch.full_like(p["final_state"], float("nan"))
    return q


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """torch.equal, else fail naming the first differing index, the number of
    mismatches and the largest gap in units in the last place."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (
        f"{what}: {actual.dtype}{list(actual.shape)} vs {expected.dtype}{list(expected.shape)}"
    )
    if torch.equal(actual, expected):
        return
    int_type = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[actual.dtype]
    a = actual.contiguous().view(int_type).long()
    e = expected.contiguous().view(int_type).long()
    sign = 1 << (15 if int_type == torch.int16 else 31)

    def order(x):  # sign-magnitude bits -> integers ordered like the floats
        x = x & (2 * sign - 1)
        return torch.where(x & sign != 0, -(x & (sign - 1)), x & (sign - 1))

    diff = ~((actual == expected) | (torch.isnan(actual) & torch.isnan(expected)))
    idx = diff.nonzero()
    gap = (order(a) - order(e)).abs()[diff].max().item()
    first = tuple(idx[0].tolist())
    raise AssertionError(
        f"{what}: {int(diff.sum())} of {actual.numel()} elements differ; first at {first}: "
        f"{actual[first].item()!r} vs {expected[first].item()!r}; max gap {gap} ulp"
    )
