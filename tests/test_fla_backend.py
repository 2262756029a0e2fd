# SPDX-License-Identifier: MIT
"""fla's chunk_kda on this package (python/flash_kda/_fla_backend.py), on the CPU: the
registration in both import orders, its place before fla's own FlashKDA backend and
FLA_FLASH_KDA=0, in subprocesses against tests/fake_fla (fla 0.6.0's registry interface, since
fla is not installed here); the verifier's answer for each flag combination; and the mapping
of fla's arguments onto flash_kda.fwd against the fp64 recurrence of fla's own semantics."""

import json
import os
import pathlib
import subprocess
import sys
import types

import flash_kda
import pytest
import torch
from conftest import kimi_gates, make_problem, rel_err, softplus_log_decay
from flash_kda import _fla_backend, reference, testing

FAKE_FLA = pathlib.Path(__file__).resolve().parent / "fake_fla"
PACKAGE_ROOT = pathlib.Path(flash_kda.__file__).resolve().parents[1]
TESTS = pathlib.Path(__file__).resolve().parent


def run_script(code: str, **env) -> dict:
    """The JSON line a fresh interpreter prints for `code`, with tests/fake_fla as fla."""
    path = os.pathsep.join([str(FAKE_FLA), str(PACKAGE_ROOT), str(TESTS)])
    environ = {k: v for k, v in os.environ.items() if k != "FLA_FLASH_KDA"}
    environ.update(PYTHONPATH=path, **env)
    command = [sys.executable, "-c", code]
    done = subprocess.run(command, check=False, env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


REGISTRY = """
import json, sys
from fla.backends import registry_of
from fla.ops.kda.chunk import chunk_kda
backends = [[b.backend_type, b.priority] for b in registry_of(chunk_kda)._get_sorted_backends()]
hooked = any(type(f).__name__ == "_Hook" for f in sys.meta_path)
print(json.dumps(dict(before=before, backends=backends, hooked=hooked)))
"""


def test_import_flash_kda_imports_no_fla_and_loads_nothing():
    got = run_script(
        "import json, sys, flash_kda\n"
        "print(json.dumps(dict(fla=[m for m in sys.modules if m.split('.')[0] == 'fla'],"
        " loaded=flash_kda._native._state['loaded'],"
        " hooked=any(type(f).__name__ == '_Hook' for f in sys.meta_path))))"
    )
    assert got == dict(fla=[], loaded=False, hooked=True)


@pytest.mark.parametrize("first", ["flash_kda", "fla"])
def test_the_backend_registers_in_either_import_order(first):
    """flash_kda first: its import hook registers the backend when fla.ops.kda has been
    imported, then leaves sys.meta_path; fla first: flash_kda registers it at import. Either
    way it runs before fla's own FlashKDA backend."""
    if first == "flash_kda":
        prologue = "import sys, flash_kda\nbefore = [m for m in sys.modules if m.split('.')[0] == 'fla']\n"
        prologue += "import fla.ops.kda\n"
    else:
        prologue = "import fla.ops.kda\nbefore = []\nimport flash_kda\n"
    got = run_script(prologue + REGISTRY)
    assert got == dict(before=[], backends=[["flash_kda_bin", 2], ["flash_kda", 3]], hooked=False)


ROUTE = """
import json, torch
import flash_kda
from flash_kda import testing
from fla.ops.kda import chunk as fla_chunk
from fla.ops.kda.backends import flash_kda as fla_backend
from fla.backends import REJECTIONS
from test_fast_path import Recorder

def problem():
    g = torch.Generator().manual_seed(0)
    q, k, v, gate = (torch.randn(1, 40, 2, 128, generator=g).bfloat16() for _ in range(4))
    beta = torch.randn(1, 40, 2, generator=g).bfloat16()
    return q, k, v, gate, beta

def call(**flags):
    q, k, v, g, beta = problem()
    base = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                state_v_first=True, A_log=torch.zeros(2), dt_bias=torch.zeros(256))
    with torch.no_grad():
        out, _ = fla_chunk.chunk_kda(q, k, v, g, beta, **dict(base, **flags))
    return out if isinstance(out, str) else "flash_kda"

BOUNDED = dict(safe_gate=True, lower_bound=-5.0)
recorder = Recorder()
paths = dict(cpu=call(**BOUNDED))
with testing.simulated_native(recorder):
    paths["bounded"] = call(**BOUNDED)
    paths["softplus"] = call()
    paths["log_decay"] = call(use_gate_in_kernel=False)
    with testing.overrides(unvalidated_forms=1):
        paths["softplus unvalidated on"] = call()
        paths["probability unvalidated on"] = call(use_beta_sigmoid_in_kernel=False, **BOUNDED)
print(json.dumps(dict(paths=paths, launches=len(recorder.launches), triton=len(fla_chunk.CALLS),
                      fla_flashkda=len(fla_backend.CALLS), rejections=REJECTIONS)))
"""


def test_calls_route_here_where_flash_kda_would_run_them_natively():
    """On a simulated native device the backend takes FlashKDA's forms at once, the other forms
    once flash_kda.testing enables their kernels; until then it refuses them with the
    dispatcher's reason and fla's own path runs them (here: its FlashKDA backend takes the
    bounded gate, its Triton path the others). CPU tensors are refused too."""
    got = run_script(ROUTE)
    assert got["paths"] == {
        "cpu": "fla's flash_kda backend",
        "bounded": "flash_kda",
        "softplus": "fla triton",
        "log_decay": "fla triton",
        "softplus unvalidated on": "flash_kda",
        "probability unvalidated on": "flash_kda",
    }
    assert (got["launches"], got["triton"], got["fla_flashkda"]) == (3, 2, 1)
    ours = [reason for backend, reason in got["rejections"] if backend == "flash_kda_bin"]
    assert ours[0] == "cpu tensors run on the PyTorch path"
    assert ours[1] == "native kernels for gate='softplus' are built but not yet validated on a GPU"
    assert ours[2] == "native kernels for gate='log_decay' are built but not yet validated on a GPU"


def test_fla_flash_kda_0_turns_the_backend_off():
    got = run_script(ROUTE, FLA_FLASH_KDA="0")
    assert set(got["paths"].values()) == {"fla triton"} and got["launches"] == 0
    assert not any(backend == "flash_kda_bin" for backend, _ in got["rejections"])


# ------------------------------------------------------------------ the verifier


def fla_call(seed=0, **flags):
    """chunk_kda's arguments as fla's KDA layer passes them (FlashKDA's flags), with `flags`."""
    p = make_problem(1, 50, 2, seed=seed)
    g, A_log, dt_bias = kimi_gates(2, 50, seed=seed)
    a = dict(q=p["q"], k=p["k"], v=p["v"], g=g, beta=p["beta"], A_log=A_log, dt_bias=dt_bias.reshape(-1))
    a.update(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
             safe_gate=True, lower_bound=-5.0, state_v_first=True)  # fmt: skip
    a.update(flags)
    return a


def verdict(**flags):
    a = flash_kda._fla_backend.arguments((), fla_call(**flags))
    return _fla_backend.refusal(a)


ACCEPTED = {
    "flashkda": {},
    "bounded-unsafe": dict(safe_gate=False),
    "bounded-no-A_log": dict(A_log=None),
    "softplus": dict(safe_gate=False, lower_bound=None),
    "pre-activated": dict(use_gate_in_kernel=False, lower_bound=None, safe_gate=False),
    "pre-activated-safe": dict(use_gate_in_kernel=False),
    "probability": dict(use_beta_sigmoid_in_kernel=False),
    "k-first-without-states": dict(state_v_first=False),
    "graph": dict(use_graph=True, disable_recompute=True),
}
REFUSED = {
    "no-l2norm": (dict(use_qk_l2norm_in_kernel=False), "use_qk_l2norm_in_kernel must be True"),
    "neg-eigval": (dict(allow_neg_eigval=True), "allow_neg_eigval must be False"),
    "intermediate": (dict(return_intermediate_states=True), "does not return intermediate states"),
    "k-first-state": (dict(state_v_first=False, output_final_state=True), "K-first states need state_v_first"),
    "safe-no-bound": (dict(lower_bound=None), "safe_gate=True with use_gate_in_kernel=True needs lower_bound"),
    "softplus-no-A_log": (dict(safe_gate=False, lower_bound=None, A_log=None), "needs A_log"),
    "bound-below-5": (dict(lower_bound=-6.0), "lower_bound in [-5, 0], got -6.0"),
    "fp16": (dict(q=torch.zeros(1, 50, 2, 128, dtype=torch.float16)), "bfloat16"),
}


@pytest.mark.parametrize("flags", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_the_verifier_takes_every_combination_fwd_runs(flags):
    assert verdict(**flags) is None


@pytest.mark.parametrize("flags,reason", list(REFUSED.values()), ids=list(REFUSED))
def test_the_verifier_refuses_the_rest_with_a_reason(flags, reason):
    why = verdict(**flags)
    assert why is not None and reason in why, why


def test_the_verifier_refuses_shapes_grad_and_unknown_arguments():
    p = fla_call()
    gva = dict(p, v=torch.zeros(1, 50, 4, 128, dtype=torch.bfloat16))
    assert "no GVA" in _fla_backend.refusal(_fla_backend.arguments((), gva))
    narrow = {n: p[n][..., :64].contiguous() for n in ("q", "k", "v", "g")}
    assert "[B, T, H, 128]" in _fla_backend.refusal(_fla_backend.arguments((), dict(p, **narrow)))
    batched = dict(p, cu_seqlens=torch.tensor([0, 50]), q=p["q"].expand(2, -1, -1, -1))
    assert _fla_backend.refusal(_fla_backend.arguments((), batched)) is not None
    with torch.enable_grad():
        grad = dict(p, q=p["q"].clone().requires_grad_())
        assert "forward-only" in _fla_backend.refusal(_fla_backend.arguments((), grad))
    with pytest.raises(TypeError, match="does not know chunk_kda's argument 'new_flag'"):
        _fla_backend.arguments((), dict(p, new_flag=1))
    positional = [p[n] for n in ("q", "k", "v", "g", "beta")] + [None, None, False, True, True, True]
    assert _fla_backend.arguments(tuple(positional), dict(A_log=p["A_log"]))["use_beta_sigmoid_in_kernel"] is True


def test_a_cp_context_routes_to_flash_kda_distributed_where_its_conventions_fit(monkeypatch):
    from flash_kda import distributed

    zigzag = types.SimpleNamespace(layout="zigzag", cu_seqlens=torch.tensor([0, 50]), pre_num_ranks=0,
                                   post_num_ranks=0)  # fmt: skip
    assert verdict(cp_context=zigzag) == distributed.fla_refusal(zigzag) is not None
    context = types.SimpleNamespace(layout="contiguous", cu_seqlens=torch.tensor([0, 50]), pre_num_ranks=0,
                                    post_num_ranks=0)  # fmt: skip
    assert verdict(cp_context=context) is None
    seen = {}
    monkeypatch.setattr(distributed, "fla_chunk_kda", lambda *args, **kw: seen.update(kw) or ("cp", None))
    a = _fla_backend.arguments((), fla_call(cp_context=context, safe_gate=False, lower_bound=None,
                                            use_beta_sigmoid_in_kernel=False))  # fmt: skip
    assert _fla_backend.run(a) == ("cp", None)
    assert (seen["gate"], seen["beta_is_logit"], seen["cp_context"]) == ("softplus", False, context)


# ------------------------------------------------------------------ the mapping onto fwd


def fla_gold(a):
    """fla's semantics of chunk_kda's arguments in fp64 (reference.gold), V-first states."""
    q, k, v, g, beta = (a[n] for n in ("q", "k", "v", "g", "beta"))
    H = q.shape[2]
    A_log = torch.zeros(H) if a["A_log"] is None else a["A_log"]
    dt_bias = torch.zeros(H, 128) if a["dt_bias"] is None else a["dt_bias"].reshape(H, 128)
    if not a["use_gate_in_kernel"]:
        gate, lower_bound = "log_decay", None
    else:
        gate, lower_bound = ("lower_bound", a["lower_bound"]) if a["lower_bound"] is not None else ("softplus", None)
    keep = gate != "log_decay"
    return reference.gold(
        q, k, v, g, beta, a["scale"] or 128**-0.5, A_log if keep else None, dt_bias if keep else None, lower_bound,
        a["initial_state"], a["cu_seqlens"], gate=gate, beta_is_logit=a["use_beta_sigmoid_in_kernel"],
    )  # fmt: skip


MAPPED = {
    "flashkda": {},
    "bounded-no-A_log": dict(A_log=None, safe_gate=False),
    "softplus": dict(safe_gate=False, lower_bound=None),
    "pre-activated": "pre",
    "post-sigmoid-beta": dict(use_beta_sigmoid_in_kernel=False),
}


@pytest.mark.parametrize("case", list(MAPPED.values()), ids=list(MAPPED))
@pytest.mark.parametrize("varlen", [False, True], ids=["batched", "varlen"])
def test_the_backend_computes_fla_s_semantics(case, varlen):
    """Each flag combination, batched and varlen (cu_seqlens and cu_seqlens_cpu, an empty
    sequence), with a bf16 initial state and output_final_state: the backend's (o, final
    state) within 1% of the fp64 recurrence of what fla computes for those flags."""
    a = fla_call(seed=3)
    if case == "pre":  # vLLM's split: the gate precomputed (fused_kda_gate's softplus form)
        decay = softplus_log_decay(a["g"], a["A_log"], a["dt_bias"].reshape(2, 128))
        a.update(g=decay, use_gate_in_kernel=False, lower_bound=None, safe_gate=False)
    else:
        a.update(case)
    if not a["use_beta_sigmoid_in_kernel"]:
        a["beta"] = torch.sigmoid(a["beta"].float())
    N = 1
    if varlen:
        a["cu_seqlens"] = torch.tensor([0, 20, 20, 50])
        a["cu_seqlens_cpu"] = a["cu_seqlens"].clone()
        N = 3
    a.update(initial_state=(0.1 * torch.randn(N, 2, 128, 128)).bfloat16(), output_final_state=True)
    a = _fla_backend.arguments((), a)
    with torch.no_grad():
        out, final = _fla_backend.run(a)
    want_out, want_state = fla_gold(a)
    assert out.dtype == torch.bfloat16 and final.dtype == torch.float32 and final.shape == (N, 2, 128, 128)
    assert rel_err(out, want_out) < 0.01 and rel_err(final, want_state) < 0.01


def test_a_view_flash_kda_cannot_read_is_copied():
    """A q whose rows are 4 elements apart (a stride fwd cannot read in place) is copied, not
    refused: the result is that of the contiguous inputs."""
    a = fla_call(seed=5)
    wide = torch.zeros(1, 50, 2, 132, dtype=torch.bfloat16)
    wide[..., :128] = a["q"]
    with torch.no_grad():
        out, _ = _fla_backend.run(_fla_backend.arguments((), dict(a, q=wide[..., :128])))
        same, _ = _fla_backend.run(_fla_backend.arguments((), a))
    assert torch.equal(out, same)


def test_the_max_seqlen_hint_comes_from_cu_seqlens_cpu(monkeypatch):
    seen = {}
    monkeypatch.setattr(flash_kda._api, "fwd", lambda *args, **kw: seen.update(kw))
    a = fla_call(cu_seqlens=torch.tensor([0, 10, 50]), cu_seqlens_cpu=torch.tensor([0, 10, 50]))
    _fla_backend.run(_fla_backend.arguments((), a))
    assert seen["max_seqlen"] == 40 and (seen["gate"], seen["beta_is_logit"]) == ("lower_bound", True)
    assert testing is not None  # flash_kda.testing imports with the backend in place
