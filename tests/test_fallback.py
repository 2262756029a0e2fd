# SPDX-License-Identifier: MIT
"""The non-native paths: fla's Triton forward (called without recursion) and PyTorch.
Both keep native's in-place contract."""

import functools
import logging
import re
import sys
import types

import flash_kda
import pytest
import torch
from conftest import call, check, gold_of, make_problem, pooled_problem, rel_err
from flash_kda import dispatch, fallback, reference


@pytest.fixture
def fake_fla(monkeypatch):
    """A stand-in for fla.ops.kda.chunk whose public chunk_kda is wrapped by a dispatcher
    that, like fla's FlashKDA backend, routes back to flash_kda.fwd."""
    calls = {"impl": [], "dispatcher": 0}

    def chunk_kda(q, k, v, g, beta, **kwargs):
        calls["impl"].append(kwargs)
        N = kwargs["cu_seqlens"].numel() - 1 if kwargs["cu_seqlens"] is not None else q.shape[0]
        final = torch.full((N, q.shape[2], 128, 128), 0.25) if kwargs["output_final_state"] else None
        return torch.full_like(v, 0.5), final

    @functools.wraps(chunk_kda)
    def dispatched(*args, **kwargs):
        calls["dispatcher"] += 1
        raise AssertionError("fla's dispatching chunk_kda was called: this path can recurse")

    module = types.ModuleType("fla.ops.kda.chunk")
    module.chunk_kda = dispatched
    for name in ("fla", "fla.ops", "fla.ops.kda"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.kda.chunk", module)
    fallback.fla_chunk_kda.cache_clear()
    yield calls
    fallback.fla_chunk_kda.cache_clear()


def test_fla_path_calls_the_undispatched_implementation(fake_fla):
    p = make_problem(2, 20, 3, initial=torch.bfloat16, final=torch.bfloat16)
    fallback.fla_fwd(check(p))
    assert fake_fla["dispatcher"] == 0 and len(fake_fla["impl"]) == 1
    kw = fake_fla["impl"][0]
    for flag in (
        "use_qk_l2norm_in_kernel",
        "use_gate_in_kernel",
        "use_beta_sigmoid_in_kernel",
        "safe_gate",
        "state_v_first",
        "output_final_state",
    ):
        assert kw[flag] is True, flag
    assert kw["initial_state"].dtype == torch.float32  # fla takes an fp32 initial state
    assert kw["lower_bound"] == -5.0 and kw["dt_bias"].shape == (3 * 128,)
    # in place, in the caller's dtypes
    assert torch.all(p["out"] == 0.5) and p["out"].dtype == torch.bfloat16
    assert torch.all(p["final_state"] == 0.25) and p["final_state"].dtype == torch.bfloat16


def test_fla_path_unavailable_is_reported(monkeypatch):
    # import fla -> ImportError; its submodules too, which an earlier test of this process may
    # have imported (a submodule found in sys.modules is not imported through its package)
    for name in ["fla"] + [m for m in sys.modules if m.startswith("fla.")]:
        monkeypatch.setitem(sys.modules, name, None)
    fallback.fla_chunk_kda.cache_clear()
    try:
        assert not fallback.fla_available()
        with pytest.raises(RuntimeError, match="fla cannot be imported"):
            fallback.fla_fwd(check(make_problem(1, 4, 1)))
    finally:
        fallback.fla_chunk_kda.cache_clear()


def test_torch_path_writes_in_place_and_matches_gold():
    p = make_problem(1, 0, 2, lens=[33, 0, 20], initial=torch.float32, final=torch.float32, seed=3)
    fallback.torch_fwd(check(p))
    gold_out, gold_state = gold_of(p)
    assert rel_err(p["out"], gold_out) < 1e-2
    assert rel_err(p["final_state"], gold_state) < 1e-2


def test_cpu_fwd_takes_the_torch_path_and_equals_reference():
    p = make_problem(2, 21, 2, initial=torch.bfloat16, final=torch.bfloat16, seed=4)
    ref = dict(
        p, out=torch.full_like(p["out"], float("nan")), final_state=torch.full_like(p["final_state"], float("nan"))
    )
    assert flash_kda.backend_for("cpu") == "torch"
    call(flash_kda.fwd, p)
    call(reference.fwd, ref)
    assert torch.equal(p["out"], ref["out"]) and torch.equal(p["final_state"], ref["final_state"])


# ------------------------------------------------------------------------- on a GPU

GPU_CASES = [dict(batch=2, seqlen=1000, lens=None), dict(batch=1, seqlen=0, lens=[300, 17, 0, 513, 170])]


def gpu_case(case, dtype, seed):
    return make_problem(
        case["batch"], case["seqlen"], 4, lens=case["lens"], initial=dtype, final=dtype, device="cuda", seed=seed
    )


def check_against_gold(p, tol=1e-2):
    gold_out, gold_state = gold_of(p)
    e_out, e_state = rel_err(p["out"], gold_out), rel_err(p["final_state"], gold_state)
    assert e_out < tol and e_state < tol, (e_out, e_state)
    return e_out, e_state


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=["batched-T1000-H4", "varlen-H4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16state", "fp32state"])
def test_fla_path_on_cuda_matches_gold(monkeypatch, case, dtype):
    if not fallback.fla_available():
        pytest.skip("fla is not importable here")
    monkeypatch.setenv("FLA_FLASH_KDA", "0")
    assert flash_kda.backend_for("cuda") == "fla"
    p = gpu_case(case, dtype, seed=21)
    call(flash_kda.fwd, p)
    print("fla path", check_against_gold(p))


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=["batched-T1000-H4", "varlen-H4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16state", "fp32state"])
def test_torch_path_on_cuda_matches_gold(monkeypatch, case, dtype):
    monkeypatch.setenv("FLA_FLASH_KDA", "0")
    monkeypatch.setattr(fallback, "fla_available", lambda: False)
    assert flash_kda.backend_for("cuda") == "torch"
    p = gpu_case(case, dtype, seed=22)
    call(flash_kda.fwd, p)
    print("torch path", check_against_gold(p))


@pytest.mark.gpu
def test_fla_path_on_unsupported_gpu_does_not_recurse(monkeypatch):
    """No table for this GPU and FLA_FLASH_KDA unset: fwd takes fla, whose public chunk_kda
    would offer the call back to flash_kda; the undispatched call must not."""
    if not fallback.fla_available():
        pytest.skip("fla is not importable here")
    monkeypatch.delenv("FLA_FLASH_KDA", raising=False)
    monkeypatch.setattr(dispatch, "device_facts", lambda index: (75, 132))  # no table for sm_75
    assert flash_kda.backend_for("cuda") == "fla"
    entered = []
    real = dispatch.run
    monkeypatch.setattr(dispatch, "run", lambda c: (entered.append(1), real(c))[1])
    p = gpu_case(GPU_CASES[0], torch.float32, seed=23)
    call(flash_kda.fwd, p)
    assert len(entered) == 1
    check_against_gold(p)


@pytest.mark.gpu
def test_fla_chunk_kda_routes_to_native(monkeypatch):
    """fla's public chunk_kda with FlashKDA's flags calls flash_kda.fwd: same bits as ours."""
    if not fallback.fla_available() or flash_kda.backend_for("cuda") != "native":
        pytest.skip("needs fla and native kernels")
    from fla.ops.kda import chunk_kda

    monkeypatch.delenv("FLA_FLASH_KDA", raising=False)
    p = make_problem(1, 0, 4, lens=[300, 17, 513], initial=torch.float32, final=torch.float32, device="cuda", seed=24)
    with torch.inference_mode():
        o, ht = chunk_kda(
            p["q"],
            p["k"],
            p["v"],
            p["g"],
            p["beta"],
            scale=p["scale"],
            initial_state=p["initial_state"],
            output_final_state=True,
            lower_bound=-5.0,
            cu_seqlens=p["cu_seqlens"],
            **fallback.FLASH_KDA_FLAGS,
            A_log=p["A_log"],
            dt_bias=p["dt_bias"],
        )
    call(flash_kda.fwd, p)
    assert torch.equal(o, p["out"]) and torch.equal(ht, p["final_state"])


# ------------------------------------------------------------------ hardening (CPU)

GARBAGE_CU = [
    ([1, 10, 20], "cu_seqlens must start at 0, got cu_seqlens[0] = 1"),
    ([0, 12, 5], "cu_seqlens must be non-decreasing, got cu_seqlens[2] = 5 < cu_seqlens[1] = 12"),
    ([0, 10, 21], "cu_seqlens must end at most at T = 20, got cu_seqlens[-1] = 21"),
    ([0, 10, 2**62], "cu_seqlens must end at most at T = 20, got cu_seqlens[-1] = 4611686018427387904"),
    ([0, -3, 20], "cu_seqlens must be non-decreasing, got cu_seqlens[1] = -3 < cu_seqlens[0] = 0"),
]


def unchecked(p, bounds):
    """p's validated call (two sequences) with cu_seqlens replaced by contents nobody has
    read yet, as a device tensor's would be."""
    return check(p)._replace(cu_seqlens=torch.tensor(bounds), seq_bounds=None)


@pytest.mark.parametrize("bounds,message", GARBAGE_CU, ids=["start", "decreasing", "past-end", "2^62", "negative"])
def test_torch_path_checks_device_cu_seqlens(bounds, message):
    p = make_problem(1, 0, 1, lens=[10, 10], final=torch.float32)
    with pytest.raises(ValueError, match=re.escape(message)):
        fallback.torch_fwd(unchecked(p, bounds))
    assert torch.isnan(p["out"]).all() and torch.isnan(p["final_state"]).all()


@pytest.mark.parametrize("bounds,message", GARBAGE_CU, ids=["start", "decreasing", "past-end", "2^62", "negative"])
def test_fla_path_checks_device_cu_seqlens(fake_fla, bounds, message):
    p = make_problem(1, 0, 1, lens=[10, 10])
    with pytest.raises(ValueError, match=re.escape(message)):
        fallback.fla_fwd(unchecked(p, bounds))
    assert fake_fla["impl"] == [] and torch.isnan(p["out"]).all()


def test_torch_path_checks_device_pool_indices():
    p = pooled_problem(2, 16, 1, [0, 1], 2, in_place=True)
    pool = p["final_state"].clone()
    bad = check(p)._replace(state_indices=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="ssm_state_indices must not repeat a slot"):
        fallback.torch_fwd(bad)
    assert torch.equal(p["final_state"], pool) and torch.isnan(p["out"]).all()


def test_fla_path_writes_only_rows_inside_sequences(fake_fla):
    p = make_problem(1, 0, 2, lens=[7, 20], final=torch.float32)
    p = dict(p, **{n: torch.cat([p[n], p[n][:, :5]], 1) for n in ("q", "k", "v", "g", "beta")})
    p["out"] = torch.full_like(p["q"], float("nan"))  # T = 32, sequences end at 27
    fallback.fla_fwd(check(p))
    assert torch.all(p["out"][0, :27] == 0.5) and torch.isnan(p["out"][0, 27:]).all()


def test_fla_path_gathers_and_scatters_pools(fake_fla):
    p = pooled_problem(1, 0, 1, [2, -1, 0], 4, lens=[5, 6, 7], has_initial=[True, True, False], in_place=True)
    pool = p["initial_state"].clone()
    fallback.fla_fwd(check(p))
    start = fake_fla["impl"][0]["initial_state"]
    assert torch.equal(start[0], pool[2]) and not start[1:].any()  # padding and has_initial_state False: zero
    assert torch.all(p["final_state"][[2, 0]] == 0.25)  # the fake's final state, scattered
    assert torch.equal(p["final_state"][[1, 3]], pool[[1, 3]])  # no sequence owns these


def test_fla_path_sends_checkpointed_calls_to_torch(fake_fla, monkeypatch, caplog):
    monkeypatch.setattr(
        dispatch, "explain", lambda device: ("fla", "no kernel for sm_89 in this build; using fla Triton")
    )
    monkeypatch.setattr(dispatch, "_logged", set())
    p = make_problem(1, 0, 1, lens=[20, 13], final=torch.float32)
    checkpoints = torch.full((1, 1, 128, 128), float("nan"))
    with caplog.at_level(logging.INFO, logger="flash_kda"):
        call(flash_kda.fwd, p, checkpoint_every=16, checkpoints=checkpoints)
    assert fake_fla["impl"] == [] and not torch.isnan(checkpoints).any()
    assert "fla's Triton forward cannot write checkpoints; using PyTorch for this call" in caplog.text
    assert [r.levelno for r in caplog.records] == [logging.INFO]


# ------------------------------------------------------------------ the native path failing


def _failing_library(status):
    """A stand-in library (flash_kda.testing) whose forward fails with `status`, as one that
    cannot run a configuration on its GPU would."""
    from flash_kda import _native, testing

    lib = testing.stand_in_library(workspace_bytes=4096)
    message = f"flash_kda_fwd: recurrence_kernel ring (too little shared memory) failed [{status}]"

    def fwd(cc, args, stream, overrides=None):
        raise _native.NativeError(message, status)

    lib.fwd, lib.error = fwd, lambda got: message
    lib.fwd_by_address = lambda cc, address, stream: status  # the prepacked launch fails alike
    return lib


def _fresh(p):
    q = dict(p, out=torch.full_like(p["out"], float("nan")))
    q["final_state"] = torch.full_like(p["final_state"], 7.0)
    return q


@pytest.mark.parametrize("status", [2, 3, 4], ids=["unsupported-device", "cuda-error", "internal"])
def test_a_native_failure_falls_back_with_one_warning(monkeypatch, caplog, status):
    """The library cannot run the call (a configuration the GPU cannot launch, a launch
    error): fwd runs it on the PyTorch path (fla is not importable here), the same bits as
    that path, with one warning naming the reason, on the validated and the prepacked
    launch alike; FLASH_KDA_STRICT=1 raises the error."""
    from flash_kda import testing

    monkeypatch.setattr(fallback, "fla_available", lambda: False)
    monkeypatch.delenv(dispatch.STRICT_ENV, raising=False)
    p = make_problem(2, 40, 2, initial=torch.float32, final=torch.float32, seed=5)
    expected = _fresh(p)
    fallback.torch_fwd(check(expected))
    with testing.simulated_native(_failing_library(status)), caplog.at_level(logging.WARNING, logger="flash_kda"):
        for _ in range(3):  # validated, then prepacked launches
            got = _fresh(p)
            call(flash_kda.fwd, got)
            assert torch.equal(got["out"], expected["out"]) and torch.equal(got["final_state"], expected["final_state"])
        warnings = [r for r in caplog.records if "the native kernels failed" in r.getMessage()]
        assert len(warnings) == 1 and "too little shared memory" in warnings[0].getMessage(), caplog.text
        assert "-> torch" in warnings[0].getMessage()
        monkeypatch.setenv(dispatch.STRICT_ENV, "1")
        with pytest.raises(RuntimeError, match="too little shared memory"):
            call(flash_kda.fwd, _fresh(p))


def test_an_argument_the_library_refuses_is_raised_not_fallen_back(monkeypatch):
    from flash_kda import testing

    monkeypatch.delenv(dispatch.STRICT_ENV, raising=False)
    p = make_problem(1, 40, 2, seed=6)
    with testing.simulated_native(_failing_library(1)), pytest.raises(RuntimeError, match="shared memory"):
        call(flash_kda.fwd, p)
