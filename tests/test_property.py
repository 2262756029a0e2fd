# SPDX-License-Identifier: MIT
"""Property test of flash_kda.fwd on the CPU (the PyTorch path): over random tiny shapes,
dtypes, strides, state variants (plain, pools with padding, has_initial_state, in place),
cu_seqlens, checkpoints and scalar values, with at most one injected fault, every call
either equals reference.fwd run on the contiguous / gathered equivalent, bit for bit, or
raises the documented exception with out, final_state and checkpoints untouched."""

import os

import flash_kda
import pytest
import torch
from conftest import NAN, assert_bitwise, make_problem
from flash_kda import reference
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("FLASH_KDA_PROPERTY_EXAMPLES", "6000"))
bf16, fp32 = torch.bfloat16, torch.float32
STATE_DTYPES = [None, bf16, fp32]

# fault -> (exception, what it needs of the drawn problem)
FAULTS = {
    "scale-nan": (ValueError, "any"),
    "scale-huge": (ValueError, "any"),
    "scale-bool": (TypeError, "any"),
    "lower-bound-positive": (ValueError, "any"),
    "lower-bound-huge-int": (ValueError, "any"),
    "beta-fp64": (TypeError, "any"),
    "q-head-stride-132": (ValueError, "rows"),  # with one row of 128 every stride is free
    "q-misaligned": (ValueError, "any"),
    "out-overlaps-k": (ValueError, "any"),
    "cu-start": (ValueError, "varlen"),
    "cu-decreasing": (ValueError, "varlen-2"),
    "cu-past-end": (ValueError, "varlen"),
    "slot-duplicate": (ValueError, "pool-2"),
    "slot-out-of-range": (ValueError, "pool"),
    "state-dtype-mismatch": (TypeError, "two-plain-states"),
    "every-24": (ValueError, "checkpoints"),
}


def draw_problem(draw):
    """A valid problem dict (positional fwd arguments plus keywords) and its facts."""
    H = draw(st.integers(1, 2))
    varlen = draw(st.booleans())
    if varlen:
        lens = draw(st.lists(st.integers(0, 20), min_size=1, max_size=3))
        T = max(1, sum(lens) + draw(st.integers(0, 3)))
        B = 1
    else:
        lens, B, T = None, draw(st.integers(1, 2)), draw(st.integers(1, 40))
    p = make_problem(B, T, H, seed=draw(st.integers(0, 2**16)))
    if varlen:
        p["cu_seqlens"] = torch.tensor([0] + [sum(lens[: i + 1]) for i in range(len(lens))])
        p["cu_seqlens"] = p["cu_seqlens"].to(draw(st.sampled_from([torch.int32, torch.int64])))
    N = len(lens) if varlen else B
    p["scale"] = draw(st.sampled_from([128**-0.5, 1.0, -0.25, 3.0e38, 2]))
    p["lower_bound"] = draw(st.sampled_from([-5.0, -1.0, 0.0, -0.0, -5, -2.5]))
    p["exact"] = draw(st.sampled_from([None, True, False]))
    dtype = draw(st.sampled_from([bf16, fp32]))
    kind = draw(st.sampled_from(["none", "initial", "final", "both", "in-place", "pool", "pool-in-place"]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    rows = N
    if kind.startswith("pool"):
        rows = N + draw(st.integers(0, 2))
        slots = draw(st.permutations(list(range(rows))))[:N]
        slots = [s if draw(st.integers(0, 3)) else -1 - draw(st.integers(0, 5)) for s in slots]
        p["ssm_state_indices"] = torch.tensor(slots, dtype=draw(st.sampled_from([torch.int32, torch.int64])))
    if kind != "none" and kind != "final":
        p["initial_state"] = (0.1 * torch.randn(rows, H, 128, 128, generator=gen)).to(dtype)
    if kind in ("final", "both", "pool"):
        p["final_state"] = torch.full((rows, H, 128, 128), NAN, dtype=dtype)
    if kind.endswith("in-place"):
        p["final_state"] = p["initial_state"]
    if draw(st.booleans()):
        p["has_initial_state"] = torch.tensor(draw(st.lists(st.booleans(), min_size=N, max_size=N)), dtype=torch.bool)
    if draw(st.booleans()):
        every = draw(st.sampled_from([16, 32]))
        lengths = lens if varlen else [T] * B
        slots_needed = sum(n // every for n in lengths)
        p["checkpoint_every"] = every
        state = p["initial_state"] if p["initial_state"] is not None else p["final_state"]
        p["checkpoints"] = torch.full((slots_needed + draw(st.integers(-1, 1)) if slots_needed else 0, H, 128, 128),
                                      NAN, dtype=state.dtype if state is not None else dtype)  # fmt: skip
    layout = draw(st.sampled_from(["contiguous", "fused", "transposed"]))
    return p, dict(varlen=varlen, N=N, kind=kind, layout=layout, T=T)


def relayout(p, layout):
    """The same values with another valid memory layout (copies for the oracle)."""
    if layout == "contiguous":
        return p
    B, T, H, D = p["q"].shape
    if layout == "transposed":
        views = {n: p[n].transpose(1, 2).contiguous().transpose(1, 2) for n in ("q", "k", "v", "g", "out")}
        views["beta"] = p["beta"].transpose(0, 2).contiguous().transpose(0, 2)
        return dict(p, **views)
    fused = torch.cat([p[n].reshape(B, T, H * D) for n in ("q", "k", "v", "g")], dim=-1)
    views = {n: fused[..., i * H * D : (i + 1) * H * D].unflatten(-1, (H, D)) for i, n in enumerate("qkvg")}
    views["out"] = torch.full((B, T, H, 136), NAN, dtype=bf16)[..., :D]
    return dict(p, **views)


def inject(p, fault):
    """p with one fault (a new dict; tensors shared except the one replaced)."""
    p = dict(p)
    if fault.startswith("scale") or fault.startswith("lower"):
        name = "scale" if fault.startswith("scale") else "lower_bound"
        p[name] = {"scale-nan": NAN, "scale-huge": 1e300, "scale-bool": True, "lower-bound-positive": 0.5,
                   "lower-bound-huge-int": -(10**400)}[fault]  # fmt: skip
    elif fault == "beta-fp64":  # fp32 is a beta dtype (design section 2.2)
        p["beta"] = p["beta"].double()
    elif fault == "q-head-stride-132":
        buf = torch.zeros(*p["q"].shape[:3], 132, dtype=bf16)
        p["q"] = buf[..., :128]
    elif fault == "q-misaligned":
        p["q"] = torch.zeros(p["q"].numel() + 1, dtype=bf16)[1:].view(p["q"].shape)
    elif fault == "out-overlaps-k":
        p["k"] = p["out"].clone()
        p["out"] = p["k"][:]  # another view of k's memory
    elif fault.startswith("cu-"):
        cu = p["cu_seqlens"].clone()
        if fault == "cu-start":
            cu[0] = 1
        elif fault == "cu-decreasing":
            cu[1] = cu[2] + 1
        else:
            cu[-1] = p["q"].shape[1] + 1
        p["cu_seqlens"] = cu
    elif fault.startswith("slot-"):
        idx = p["ssm_state_indices"].clone()
        pool = p["initial_state"] if p["initial_state"] is not None else p["final_state"]
        if fault == "slot-duplicate":
            idx[0] = idx[1] = 0
        else:
            idx[0] = pool.shape[0]
        p["ssm_state_indices"] = idx
    elif fault == "state-dtype-mismatch":
        p["final_state"] = p["final_state"].to(fp32 if p["final_state"].dtype == bf16 else bf16)
    elif fault == "every-24":
        p["checkpoint_every"] = 24
    return p


def applicable(fault, p, facts):
    need = FAULTS[fault][1]
    pooled = p.get("ssm_state_indices") is not None
    plain_states = p["initial_state"] is not None and p["final_state"] is not None and not pooled
    return {
        "any": True,
        "rows": p["q"].shape[:3].numel() > 1,
        "varlen": facts["varlen"],
        "varlen-2": facts["varlen"] and facts["N"] >= 2,
        "pool": pooled,
        "pool-2": pooled and facts["N"] >= 2,
        "two-plain-states": plain_states and p["final_state"] is not p["initial_state"],
        "checkpoints": p.get("checkpoints") is not None,
    }[need]


def fwd_kwargs(p):
    return {n: p[n] for n in reference.FWD_KEYWORDS if p.get(n) is not None}


def expected_outputs(p, facts):
    """Reference on contiguous copies, pools gathered and scattered by hand."""
    plain = {n: (p[n].contiguous() if isinstance(p[n], torch.Tensor) else p[n]) for n in reference.FWD_ARGS}
    plain["out"] = p["out"].contiguous().clone()
    slots = p["ssm_state_indices"].tolist() if p.get("ssm_state_indices") is not None else None
    has = p["has_initial_state"].tolist() if p.get("has_initial_state") is not None else [True] * facts["N"]
    init, final = p["initial_state"], p["final_state"]
    final_before = final.clone() if final is not None else None
    if init is not None:
        rows = init if slots is None else torch.stack([init[s] if s >= 0 else torch.zeros_like(init[0]) for s in slots])
        plain["initial_state"] = torch.stack([r if h else torch.zeros_like(r) for r, h in zip(rows, has)])
    if final is not None:
        plain["final_state"] = torch.full((facts["N"], *final.shape[1:]), NAN, dtype=final.dtype)
    checkpoints = None
    if p.get("checkpoints") is not None:
        checkpoints = p["checkpoints"].clone()
    reference.fwd(*[plain[n] for n in reference.FWD_ARGS],
                  checkpoint_every=p.get("checkpoint_every"), checkpoints=checkpoints)  # fmt: skip
    if final is not None:
        if slots is None:
            final_before = plain["final_state"]
        else:
            for i, s in enumerate(slots):
                if s >= 0:
                    final_before[s] = plain["final_state"][i]
    return plain["out"], final_before, checkpoints


def snapshot(p):
    return {n: p[n].clone() for n in ("out", "final_state", "checkpoints") if p.get(n) is not None}


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(st.data())
def test_every_call_equals_the_reference_or_raises_before_writing(data):
    p, facts = draw_problem(data.draw)
    p = relayout(p, facts["layout"])
    faults = [f for f in FAULTS if applicable(f, p, facts)]
    fault = data.draw(st.sampled_from([None] * len(faults) + faults), label="fault")  # half valid
    event(f"fault: {fault}")
    event(f"states: {facts['kind']}, layout: {facts['layout']}, varlen: {facts['varlen']}")
    if fault is not None:
        p = inject(p, fault)
        before = snapshot(p)
        with pytest.raises(FAULTS[fault][0]):
            flash_kda.fwd(*[p[n] for n in reference.FWD_ARGS], **fwd_kwargs(p))
        for name, value in before.items():
            assert_bitwise(p[name], value, f"{name} after a rejected call ({fault})")
        return
    out, final, checkpoints = expected_outputs(p, facts)
    flash_kda.fwd(*[p[n] for n in reference.FWD_ARGS], **fwd_kwargs(p))
    assert_bitwise(p["out"].contiguous(), out, "out")
    if final is not None:
        assert_bitwise(p["final_state"], final, "final_state")
    if checkpoints is not None:
        assert_bitwise(p["checkpoints"], checkpoints, "checkpoints")
