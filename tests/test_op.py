# SPDX-License-Identifier: MIT
"""The custom op flash_kda::fwd and its public wrapper: opcheck, torch.compile(fullgraph)
equal to eager, the traceable checks (grad refusal, inference tensors), the exact-mode
resolution and a cheap import."""

import inspect
import os
import subprocess
import sys

import flash_kda
import pytest
import torch
from conftest import (
    FWD_ARGS,
    FWD_KEYWORDS,
    assert_bitwise,
    call,
    fused_projection_views,
    make_problem,
    nan_like,
    pooled_problem,
)
from flash_kda import _op, dispatch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

bf16, fp32 = torch.bfloat16, torch.float32


def op_args(p, **overrides):
    """(args, kwargs) of torch.ops.flash_kda.fwd for problem p: FlashKDA's ten and the three
    optional positional arguments by position, the keyword-only ones of flash_kda.fwd by name."""
    q = dict(p, **overrides)
    in_place = q.get("state_in_place", False)
    args = (q["q"], q["k"], q["v"], q["g"], q["beta"], float(q["scale"]), q["out"], q["A_log"], q["dt_bias"],
            float(q["lower_bound"]), None if in_place else q["initial_state"], q["final_state"],
            q["cu_seqlens"])  # fmt: skip
    kwargs = {name: q[name] for name in FWD_KEYWORDS if q.get(name) is not None}
    if in_place:
        kwargs["state_in_place"] = True
    return args, kwargs


def samples(device="cpu"):
    """(id, problem) pairs covering every feature of the op."""
    batched = make_problem(2, 20, 2, initial=bf16, final=bf16, device=device, seed=1)
    varlen = make_problem(1, 0, 2, lens=[17, 0, 23], initial=fp32, final=fp32, device=device, seed=2)
    varlen["cu_seqlens"] = varlen["cu_seqlens"].int()
    varlen["max_seqlen"] = 23
    pool = pooled_problem(1, 0, 2, [2, -1, 0], 3, lens=[20, 5, 30], has_initial=[True, True, False],
                          in_place=True, device=device, seed=3)  # fmt: skip
    pool["state_in_place"] = True
    ckpt = make_problem(1, 0, 1, lens=[40, 33], initial=fp32, final=fp32, device=device, seed=4)
    ckpt.update(checkpoint_every=16, checkpoints=torch.full((4, 1, 128, 128), float("nan"), device=device))
    strided, _ = fused_projection_views(make_problem(2, 24, 2, final=fp32, device=device, seed=5))
    strided["exact"] = True
    return [("batched", batched), ("varlen-int32", varlen), ("pool-in-place", pool), ("checkpoints", ckpt),
            ("strided", strided)]  # fmt: skip


@pytest.mark.parametrize("index", range(5), ids=[name for name, _ in samples()])
def test_opcheck_on_cpu(index):
    _, p = samples()[index]
    result = torch.library.opcheck(torch.ops.flash_kda.fwd.default, *op_args(p))
    assert set(result.values()) == {"SUCCESS"}, result


def ten_arguments(device="cpu"):
    """FlashKDA's ten positional arguments of a small batched problem."""
    p = make_problem(2, 20, 2, device=device, seed=11)
    return tuple(p[name] for name in FWD_ARGS[:10])


def test_opcheck_with_flashkda_s_ten_arguments_alone():
    """The schema's defaults: the op takes FlashKDA's ten positional arguments and nothing
    else, and equals flash_kda.fwd on them."""
    args = ten_arguments()
    result = torch.library.opcheck(torch.ops.flash_kda.fwd.default, args)
    assert set(result.values()) == {"SUCCESS"}, result
    out = args[6]
    torch.ops.flash_kda.fwd(*args)
    expected = nan_like(out)
    flash_kda.fwd(*args[:6], expected, *args[7:])
    assert_bitwise(out, expected, "out of the op with ten arguments")


@pytest.mark.gpu
@pytest.mark.usefixtures("native_gpu")
def test_opcheck_on_cuda():
    """opcheck of the op on the native path: the ten arguments alone and every feature."""
    result = torch.library.opcheck(torch.ops.flash_kda.fwd.default, ten_arguments("cuda"))
    assert set(result.values()) == {"SUCCESS"}, result
    for name, p in samples("cuda"):
        result = torch.library.opcheck(torch.ops.flash_kda.fwd.default, *op_args(p))
        assert set(result.values()) == {"SUCCESS"}, (name, result)


def test_the_op_takes_every_keyword_of_fwd_by_name():
    """Every keyword-only argument of flash_kda.fwd has the same name and default in the op."""
    schema = torch.ops.flash_kda.fwd.default._schema
    defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    signature = inspect.signature(flash_kda.fwd)
    for name, parameter in signature.parameters.items():
        if parameter.default is not inspect.Parameter.empty:
            assert name in defaults and defaults[name] == parameter.default, name
    assert [a.name for a in schema.arguments][:-1] == list(signature.parameters)


class Recording(TorchFunctionMode):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


class Dispatching(TorchDispatchMode):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_eager_fwd_takes_the_op_only_where_something_must_see_it(monkeypatch):
    """Plain eager calls (also inside torch.device's default-device context) run the op's
    implementation without the dispatcher; inside a torch function mode, a dispatch mode or
    the profiler the call is the op, which the mode (or the profile) sees, with the same
    result."""
    through_op = []
    real = _op.OP
    monkeypatch.setattr(_op, "OP", lambda *a, **k: through_op.append(1) or real(*a, **k))
    p = make_problem(1, 16, 2, final=fp32, seed=3)
    expected = dict(p, out=nan_like(p["out"]), final_state=nan_like(p["final_state"]))
    call(flash_kda.fwd, expected)
    with torch.device("cpu"):
        call(flash_kda.fwd, dict(p, out=nan_like(p["out"])))
    assert through_op == []
    seen = []
    for mode in (Recording(seen), Dispatching(seen), torch.profiler.profile()):
        q = dict(p, out=nan_like(p["out"]), final_state=nan_like(p["final_state"]))
        with mode:
            call(flash_kda.fwd, q)
        assert_bitwise(q["out"], expected["out"], f"out under {type(mode).__name__}")
        assert_bitwise(q["final_state"], expected["final_state"], "final_state")
    assert len(through_op) == 3
    assert "flash_kda.fwd" in seen and "flash_kda.fwd.default" in seen
    sub = dict(p, q=p["q"].as_subclass(Subclass), out=nan_like(p["out"]), final_state=nan_like(p["final_state"]))
    call(flash_kda.fwd, sub)  # a tensor subclass: the op, twice (a signature met before too)
    call(flash_kda.fwd, dict(sub, out=nan_like(p["out"])))
    assert len(through_op) == 5
    assert_bitwise(sub["out"], expected["out"], "out of a subclass")


class Subclass(torch.Tensor):
    pass


def compiled_step(q, k, v, g, beta, out, A_log, dt_bias, pool, cu_seqlens, indices, has_initial, checkpoints,
                  longest=None):  # fmt: skip
    """A serving-style prefill step: varlen, an in-place state pool, checkpoints, exact, and the
    longest sequence's length as the engine knows it (max_seqlen)."""
    flash_kda.fwd(
        q, k, v, g, beta, 128**-0.5, out, A_log, dt_bias, -5.0, pool, pool, cu_seqlens,
        ssm_state_indices=indices, has_initial_state=has_initial, checkpoint_every=16, checkpoints=checkpoints,
        exact=True, max_seqlen=longest,
    )  # fmt: skip


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fullgraph_compile_equals_eager(backend):
    torch._dynamo.reset()
    p = pooled_problem(1, 0, 2, [1, -1, 0], 2, lens=[20, 7, 33], has_initial=[True, True, False], in_place=True)
    names = ("q", "k", "v", "g", "beta", "out", "A_log", "dt_bias", "initial_state", "cu_seqlens")
    eager = {n: p[n].clone() for n in names}
    graph = {n: p[n].clone() for n in names}
    extra = (p["ssm_state_indices"], p["has_initial_state"])
    ck_eager, ck_graph = torch.full((3, 2, 128, 128), float("nan")), torch.full((3, 2, 128, 128), float("nan"))
    compiled_step(*[eager[n] for n in names], *extra, ck_eager, 33)
    step = torch.compile(compiled_step, fullgraph=True, backend=backend)
    step(*[graph[n] for n in names], *extra, ck_graph, 33)
    assert_bitwise(graph["out"], eager["out"], "out")
    assert_bitwise(graph["initial_state"], eager["initial_state"], "pool updated in place")
    assert_bitwise(ck_graph, ck_eager, "checkpoints")
    assert not torch.isnan(eager["out"]).any()


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("name", ["q", "beta", "A_log", "dt_bias", "initial_state"])
def test_inputs_requiring_grad_are_refused(name):
    p = make_problem(1, 16, 2, initial=fp32, final=fp32)
    p[name] = p[name].clone().requires_grad_()
    with pytest.raises(RuntimeError, match=f"flash_kda.fwd: {name} requires grad.*use fla's chunk_kda for training"):
        call(flash_kda.fwd, p)
    assert torch.isnan(p["out"]).all() and torch.isnan(p["final_state"]).all()
    with torch.no_grad():
        call(flash_kda.fwd, p)
    assert not torch.isnan(p["out"]).any()


@pytest.mark.parametrize("name", ["out", "final_state", "checkpoints"])
def test_inference_tensor_out_rejected_before_writing(name):
    p = make_problem(1, 32, 1, final=fp32)
    p.update(checkpoint_every=16, checkpoints=torch.full((2, 1, 128, 128), float("nan")))
    with torch.inference_mode():
        p[name] = torch.full_like(p[name], float("nan"))
    with pytest.raises(ValueError, match=f"flash_kda.fwd: {name} is an inference tensor"):
        call(flash_kda.fwd, p)
    for other in ("out", "final_state", "checkpoints"):
        assert torch.isnan(p[other]).all(), f"{other} was written by a rejected call"
    with torch.inference_mode():
        call(flash_kda.fwd, p)
    assert not torch.isnan(p[name]).any()


# ------------------------------------------------------------------ exact mode


@pytest.mark.parametrize(
    "exact,env,expected",
    [(None, None, False), (None, "1", True), (None, " 1", False), (None, "0", False), (False, "1", False),
     (True, None, True)],
)  # fmt: skip
def test_exact_resolves_from_argument_then_environment(monkeypatch, exact, env, expected):
    seen = []
    monkeypatch.setattr(dispatch, "run", lambda c: seen.append(c.exact))
    if env is None:
        monkeypatch.delenv("FLASH_KDA_EXACT", raising=False)
    else:
        monkeypatch.setenv("FLASH_KDA_EXACT", env)
    call(flash_kda.fwd, make_problem(1, 16, 1), exact=exact)
    assert seen == [expected]


def test_exact_must_be_a_bool():
    p = make_problem(1, 16, 1)
    with pytest.raises(TypeError, match="flash_kda.fwd: exact must be a bool or None, got int"):
        call(flash_kda.fwd, p, exact=1)


def test_import_is_cheap_and_needs_no_library():
    code = (
        "import sys, torch, flash_kda\n"
        "from flash_kda import _native\n"
        "assert not _native._state['loaded'], 'import loaded the library'\n"
        "assert 'fla' not in sys.modules, 'import imported fla'\n"
        "assert torch.ops.flash_kda.fwd.default is not None\n"
        "print('ok')\n"
    )
    env = dict(os.environ, FLASH_KDA_LIBRARY="/nonexistent/libflash_kda.so")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_state_in_place_is_not_an_undeclared_mutation():
    """final_state is initial_state: the op sees initial_state=None and state_in_place."""
    p = make_problem(2, 20, 1, initial=fp32, seed=7)
    p["final_state"] = p["initial_state"]
    separate = dict(p, out=nan_like(p["out"]), final_state=nan_like(p["initial_state"]))
    call(flash_kda.fwd, separate)
    call(flash_kda.fwd, p)
    assert_bitwise(p["initial_state"], separate["final_state"], "state updated in place")
    result = torch.library.opcheck(torch.ops.flash_kda.fwd.default, *op_args(p, state_in_place=True))
    assert set(result.values()) == {"SUCCESS"}, result
