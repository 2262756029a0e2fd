# SPDX-License-Identifier: MIT
"""Serving features on the CPU (the PyTorch path): state pools in place, strided inputs,
checkpoints, gate parameters in any float dtype. Each is compared bitwise with the
reference run on the contiguous / gathered / prefix equivalent."""

import re

import flash_kda
import pytest
import torch
from conftest import (
    NAN,
    assert_bitwise,
    call,
    fused_projection_views,
    gather_compute_scatter,
    make_problem,
    nan_like,
    pooled_problem,
    prefix_final_states,
)
from flash_kda import reference

bf16, fp32 = torch.bfloat16, torch.float32


def run_reference(p):
    call(reference.fwd, p)


# ------------------------------------------------------------------ pools

POOLS = [
    # (id, lens (None: batched B=3, T=21), slots, pool size, has_initial_state)
    ("batched", None, [4, 0, 2], 5, None),
    ("varlen-padding", [17, 0, 33, 5], [3, -1, 0, -7], 4, None),
    ("varlen-has-initial", [17, 20, 33], [1, 2, 0], 3, [True, False, True]),
    ("padding-and-fresh", [40, 3, 9], [-1, 5, 2], 6, [True, False, False]),
]


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "separate"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("dtype", [bf16, fp32], ids=["bf16pool", "fp32pool"])
@pytest.mark.parametrize("case", POOLS, ids=[c[0] for c in POOLS])
def test_pool_equals_gather_compute_scatter(case, dtype, index_dtype, in_place):
    _, lens, slots, pool_size, has = case
    p = pooled_problem(3, 21, 2, slots, pool_size, lens=lens, has_initial=has, dtype=dtype,
                       index_dtype=index_dtype, in_place=in_place, seed=len(slots))  # fmt: skip
    untouched = [s for s in range(pool_size) if s not in slots]
    before = p["final_state"][untouched].clone()
    expected_out, expected_pool = gather_compute_scatter(run_reference, p)
    call(flash_kda.fwd, p)
    assert_bitwise(p["out"], expected_out, "out")
    assert_bitwise(p["final_state"], expected_pool, "final pool")
    assert_bitwise(p["final_state"][untouched], before, "slots no sequence owns")


def test_padding_sequences_compute_rows_but_write_no_state():
    p = pooled_problem(1, 0, 1, [-1, 0], 1, lens=[20, 20], dtype=fp32)
    call(flash_kda.fwd, p)
    assert not torch.isnan(p["out"]).any(), "a padding sequence's rows must still be written"
    plain = make_problem(1, 0, 1, lens=[20, 20], final=fp32)
    call(flash_kda.fwd, plain)
    assert_bitwise(p["out"][0, :20], plain["out"][0, :20], "padding sequence rows (started from zero)")


BAD_SLOTS = [
    ([0, 3], "ssm_state_indices must be < the pool size P = 3 (or negative for padding), got ssm_state_indices[1] = 3"),
    ([1, 1], "ssm_state_indices must not repeat a slot, got ssm_state_indices[0] = ssm_state_indices[1] = 1"),
]


@pytest.mark.parametrize("slots,message", BAD_SLOTS, ids=["out-of-range", "duplicate"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "separate"])
def test_cpu_pool_indices_are_checked_before_writing(slots, message, in_place):
    p = pooled_problem(2, 16, 1, slots, 3, in_place=in_place)
    pool, out = p["final_state"].clone(), p["out"].clone()
    with pytest.raises(ValueError, match=re.escape(message)):
        call(flash_kda.fwd, p)
    assert_bitwise(p["final_state"], pool, "pool after a rejected call")
    assert_bitwise(p["out"], out, "out after a rejected call")


def test_pool_needs_a_state_tensor():
    p = make_problem(2, 16, 1)
    with pytest.raises(ValueError, match="ssm_state_indices needs initial_state or final_state"):
        call(flash_kda.fwd, p, ssm_state_indices=torch.tensor([0, 1]))


def test_has_initial_state_without_pool():
    p = make_problem(3, 18, 2, initial=bf16, final=bf16, seed=9)
    has = torch.tensor([True, False, True])
    expected = dict(p, out=nan_like(p["out"]), final_state=nan_like(p["final_state"]))
    expected["initial_state"] = p["initial_state"] * has[:, None, None, None]
    run_reference(expected)
    call(flash_kda.fwd, p, has_initial_state=has)
    assert_bitwise(p["out"], expected["out"], "out")
    assert_bitwise(p["final_state"], expected["final_state"], "final_state")


# ------------------------------------------------------------------ strided inputs


@pytest.mark.parametrize("lens", [None, [13, 0, 30]], ids=["batched", "varlen"])
def test_strided_inputs_equal_contiguous(lens):
    p = make_problem(2, 43, 3, lens=lens, initial=fp32, final=fp32, seed=5)
    strided, out_buffer = fused_projection_views(p)
    assert not any(strided[n].is_contiguous() for n in ("q", "k", "v", "g", "beta", "out"))
    call(flash_kda.fwd, strided)
    call(flash_kda.fwd, p)
    assert_bitwise(strided["out"].contiguous(), p["out"], "out from strided views")
    assert torch.isnan(out_buffer[..., 128:]).all(), "out's row padding was written"


def test_transposed_heads_equal_contiguous():
    p = make_problem(1, 30, 2, final=bf16, seed=6)
    t = {n: p[n].transpose(1, 2).contiguous().transpose(1, 2) for n in ("q", "k", "v", "g", "out")}
    q = dict(p, **t, final_state=nan_like(p["final_state"]))
    call(flash_kda.fwd, q)
    call(flash_kda.fwd, p)
    assert_bitwise(q["out"].contiguous(), p["out"], "out")
    assert_bitwise(q["final_state"], p["final_state"], "final_state")


# ------------------------------------------------------------------ checkpoints

CHECKPOINTS = [("varlen", [37, 0, 64, 15, 50], 16), ("varlen-every32", [70, 33], 32), ("batched", None, 16)]


@pytest.mark.parametrize("dtype", [bf16, fp32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("case", CHECKPOINTS, ids=[c[0] for c in CHECKPOINTS])
def test_checkpoints_equal_prefix_runs(case, dtype):
    _, lens, every = case
    p = make_problem(2, 40, 2, lens=lens, initial=dtype, final=dtype, seed=every)
    shape, firsts = flash_kda.checkpoint_layout(every, 2, cu_seqlens=p["cu_seqlens"], batch=None if lens else 2,
                                                seqlen=None if lens else 40)  # fmt: skip
    expected = prefix_final_states(run_reference, p, every, dtype)
    assert tuple(expected.shape) == shape
    checkpoints = torch.full(shape, NAN, dtype=dtype)
    call(flash_kda.fwd, p, checkpoint_every=every, checkpoints=checkpoints)
    assert_bitwise(checkpoints, expected, "checkpoints")
    plain = dict(p, out=nan_like(p["out"]), final_state=nan_like(p["final_state"]))
    call(flash_kda.fwd, plain)
    assert_bitwise(p["out"], plain["out"], "out with checkpoints")
    assert_bitwise(p["final_state"], plain["final_state"], "final_state with checkpoints")


def test_checkpoint_slots_past_the_buffer_are_not_written():
    p = make_problem(1, 0, 1, lens=[40, 64], final=fp32, seed=3)
    full = torch.full((6, 1, 128, 128), NAN)
    call(flash_kda.fwd, dict(p, out=nan_like(p["out"])), checkpoint_every=16, checkpoints=full)
    short = torch.full((3, 1, 128, 128), NAN)
    call(flash_kda.fwd, p, checkpoint_every=16, checkpoints=short)
    assert_bitwise(short, full[:3], "the slots that fit")


def test_checkpoint_layout():
    cu = torch.tensor([0, 37, 37, 101, 116])
    assert flash_kda.checkpoint_layout(16, 3, cu_seqlens=cu) == ((6, 3, 128, 128), [0, 2, 2, 6])
    assert flash_kda.checkpoint_layout(32, 1, cu_seqlens=[0, 64, 100]) == ((3, 1, 128, 128), [0, 2])
    assert flash_kda.checkpoint_layout(16, 2, batch=3, seqlen=40) == ((6, 2, 128, 128), [0, 2, 4])
    with pytest.raises(ValueError, match="checkpoint_every must be a multiple of 16, got 24"):
        flash_kda.checkpoint_layout(24, 1, batch=1, seqlen=1)
    with pytest.raises(TypeError, match="heads must be an int, got float"):
        flash_kda.checkpoint_layout(16, 1.0, batch=1, seqlen=1)
    with pytest.raises(ValueError, match="give either cu_seqlens or both batch and seqlen"):
        flash_kda.checkpoint_layout(16, 1, batch=1)
    with pytest.raises(ValueError, match=re.escape("checkpoint_layout: cu_seqlens must be non-decreasing")):
        flash_kda.checkpoint_layout(16, 1, cu_seqlens=[0, 5, 3])


CHECKPOINT_ERRORS = [
    (dict(checkpoint_every=16), ValueError, "checkpoint_every and checkpoints must be given together"),
    (dict(checkpoint_every=24, checkpoints=torch.zeros(1, 1, 128, 128)), ValueError,
     "checkpoint_every must be a positive multiple of 16 below 2**31, got 24"),
    (dict(checkpoint_every=0, checkpoints=torch.zeros(1, 1, 128, 128)), ValueError,
     "checkpoint_every must be a positive multiple of 16 below 2**31, got 0"),
    (dict(checkpoint_every=16.0, checkpoints=torch.zeros(1, 1, 128, 128)), TypeError,
     "checkpoint_every must be an int, got float"),
    (dict(checkpoint_every=16, checkpoints=torch.zeros(1, 2, 128, 128)), ValueError,
     "checkpoints must have shape [S, H, V, K] = [S, 1, 128, 128], got [1, 2, 128, 128]"),
    (dict(checkpoint_every=16, checkpoints=torch.zeros(1, 1, 128, 128, dtype=bf16)), TypeError,
     "checkpoints must have the states' dtype torch.float32, got torch.bfloat16"),
    (dict(checkpoint_every=16, checkpoints=torch.zeros(1, 1, 128, 128, dtype=torch.float16)), TypeError,
     "checkpoints must be bfloat16 or float32, got torch.float16"),
]  # fmt: skip


@pytest.mark.parametrize("overrides,exc,message", CHECKPOINT_ERRORS, ids=[c[2][:30] for c in CHECKPOINT_ERRORS])
def test_checkpoint_arguments_are_checked(overrides, exc, message):
    p = make_problem(1, 32, 1, final=fp32)
    with pytest.raises(exc, match=re.escape(message)):
        call(flash_kda.fwd, p, **overrides)
    assert torch.isnan(p["out"]).all() and torch.isnan(p["final_state"]).all()


# ------------------------------------------------------------------ gate parameters


@pytest.mark.parametrize("dtype", [bf16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("flat", [False, True], ids=["dt_bias-2d", "dt_bias-flat"])
def test_gate_parameters_in_any_float_dtype(dtype, flat):
    """A model cast wholly to bf16 (or fp16): A_log and dt_bias are widened exactly."""
    p = make_problem(2, 20, 2, initial=fp32, final=fp32, seed=8)
    A_log, dt_bias = p["A_log"].to(dtype), p["dt_bias"].to(dtype)
    narrow = dict(p, A_log=A_log, dt_bias=dt_bias.reshape(-1) if flat else dt_bias)
    call(flash_kda.fwd, narrow)
    wide = dict(p, A_log=A_log.float(), dt_bias=dt_bias.float(), out=nan_like(p["out"]))
    wide["final_state"] = nan_like(p["final_state"])
    call(flash_kda.fwd, wide)
    assert_bitwise(narrow["out"], wide["out"], "out")
    assert_bitwise(narrow["final_state"], wide["final_state"], "final_state")


def test_fp32_contiguous_gate_parameters_are_not_copied():
    from flash_kda import testing

    p = make_problem(1, 16, 2)
    fwd_call = call(testing.validated, p)
    assert fwd_call.A_log.data_ptr() == p["A_log"].data_ptr()
    assert fwd_call.dt_bias.data_ptr() == p["dt_bias"].data_ptr()
