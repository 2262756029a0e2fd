# SPDX-License-Identifier: MIT
"""fla routes its KDA calls here on a GPU (issue 37's acceptance; python/flash_kda/_fla_backend.py),
with fla installed: fla's chunk_kda in each flag combination the backend takes (the softplus gate
in kernel, the gate precomputed by fla's fused_kda_gate, post-sigmoid betas) runs the native
kernels (counted) and stays within 2x of the bounded gate's routed-vs-Triton difference on the
same inputs; fla's KDAForCausalLM with its default config (the unbounded gate) prefills through
the native path, one call a layer, with logits within 2x of the bounded model's routed-vs-Triton
difference and the same greedy tokens on most positions.

The forms' kernels are not enabled by default until these pass (flash_kda.h's feature bits): the
fixture turns them on through flash_kda.testing. One command:

    python3 -m pytest -p no:cacheprovider -q -rfs tests/test_fla_backend_gpu.py

``FLASH_KDA_GATES_LOG`` (a path) appends each measured difference as a JSON line."""

import pytest
import torch
from conftest import rel_err
from flash_kda import fallback
from test_gates_gpu import log, unvalidated_kernels  # noqa: F401 (a fixture)
from test_serving_gpu import native_calls  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.usefixtures("native_gpu", "unvalidated_kernels")]
DEV = "cuda"
RATIO = 2.0  # the acceptance's bound on a form's routed-vs-Triton difference, against the bounded gate's
GREEDY = 0.75  # "the same greedy tokens on most positions"


@pytest.fixture(autouse=True)
def fla_only():
    if not fallback.fla_available():
        pytest.skip("fla is not importable here")


def routed_and_triton(monkeypatch, fn):
    """fn() routed here (FLA_FLASH_KDA unset) and on fla's Triton path (FLA_FLASH_KDA=0)."""
    monkeypatch.delenv("FLA_FLASH_KDA", raising=False)
    with torch.inference_mode():
        routed = fn()
    monkeypatch.setenv("FLA_FLASH_KDA", "0")
    with torch.inference_mode():
        triton = fn()
    monkeypatch.delenv("FLA_FLASH_KDA")
    return routed, triton


def chunk_inputs(T=4096, H=4, seed=0):
    """Kimi-Linear-like inputs of fla's KDA layer: raw q, k, v, g and beta logits, A_log =
    log U(1, 16), dt_bias as fla initialises it, a V-first fp32 initial state."""
    gen = torch.Generator(device=DEV).manual_seed(seed)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device=DEV).to(dtype)

    q, k, v, g = (randn(1, T, H, 128) for _ in range(4))
    beta = randn(1, T, H)
    A_log = torch.log(1 + 15 * torch.rand(H, generator=gen, device=DEV))
    dt_bias = 0.1 * randn(H * 128, dtype=torch.float32)
    h0 = 0.1 * randn(1, H, 128, 128, dtype=torch.float32)
    return dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=h0)


def forms_of(x):
    """(name, chunk_kda keywords) of each flag combination, on inputs x."""
    from fla.ops.kda.gate import fused_kda_gate

    base = dict(q=x["q"], k=x["k"], v=x["v"], initial_state=x["initial_state"], output_final_state=True,
                use_qk_l2norm_in_kernel=True, state_v_first=True)  # fmt: skip
    raw = dict(base, g=x["g"], beta=x["beta"], A_log=x["A_log"], dt_bias=x["dt_bias"], use_gate_in_kernel=True,
               use_beta_sigmoid_in_kernel=True)  # fmt: skip
    H = x["q"].shape[2]
    softplus_g = fused_kda_gate(x["g"], x["A_log"], x["dt_bias"].view(H, 128))
    bounded_g = fused_kda_gate(x["g"], x["A_log"], x["dt_bias"].view(H, 128), lower_bound=-5.0)
    probability = x["beta"].float().sigmoid()
    pre = dict(base, use_gate_in_kernel=False)
    return [
        ("bounded", dict(raw, safe_gate=True, lower_bound=-5.0)),
        ("softplus-in-kernel", dict(raw, safe_gate=False)),
        ("softplus-precomputed", dict(pre, g=softplus_g, beta=x["beta"], use_beta_sigmoid_in_kernel=True)),
        ("softplus-precomputed-post-sigmoid", dict(pre, g=softplus_g, beta=probability)),
        ("bounded-precomputed-post-sigmoid", dict(pre, g=bounded_g, beta=probability)),
        ("bounded-post-sigmoid",
         dict(raw, beta=probability, use_beta_sigmoid_in_kernel=False, safe_gate=True, lower_bound=-5.0)),
    ]  # fmt: skip


def test_chunk_kda_forms_route_natively_and_match_triton(monkeypatch, native_calls):  # noqa: F811
    """Each combination: one native call when routed, none with FLA_FLASH_KDA=0; its
    routed-vs-Triton difference (out and final state) within 2x the bounded gate's."""
    from fla.ops.kda import chunk_kda

    x = chunk_inputs()
    diffs = {}
    for name, keywords in forms_of(x):
        before = len(native_calls)
        (o, h), (o_t, h_t) = routed_and_triton(monkeypatch, lambda kw=keywords: chunk_kda(**kw))
        assert len(native_calls) == before + 1, f"{name}: not routed to the native path"
        diffs[name] = (rel_err(o, o_t.double()), rel_err(h, h_t.double()))
        log(dict(test="fla_chunk_kda_routed_vs_triton", form=name, out=diffs[name][0], state=diffs[name][1]))
    bound_out, bound_state = (RATIO * d for d in diffs["bounded"])
    for name, (d_out, d_state) in diffs.items():
        assert torch.isfinite(torch.tensor([d_out, d_state])).all(), name
        assert d_out <= max(bound_out, 1e-3) and d_state <= max(bound_state, 1e-3), (name, diffs)


def model_logits(monkeypatch, native_calls, **gate):  # noqa: F811
    """(routed, Triton) logits of fla's KDAForCausalLM with the default config (and `gate`), its
    weights seeded, one prefill of 2048 tokens; the native calls of the routed prefill."""
    from fla.models import KDAConfig, KDAForCausalLM

    torch.manual_seed(0)
    config = KDAConfig(fuse_cross_entropy=False, **gate)
    model = KDAForCausalLM(config).to(DEV, torch.bfloat16).eval()
    ids = torch.randint(0, config.vocab_size, (1, 2048), device=DEV, generator=torch.Generator(DEV).manual_seed(1))
    before = len(native_calls)
    routed, triton = routed_and_triton(monkeypatch, lambda: model(ids, use_cache=False).logits.float())
    calls = len(native_calls) - before
    model.cpu()
    torch.cuda.empty_cache()
    return routed, triton, calls, config.num_hidden_layers


def test_kda_model_with_the_default_unbounded_gate_prefills_natively(monkeypatch, native_calls):  # noqa: F811
    unbounded = model_logits(monkeypatch, native_calls)  # KDAConfig's default: safe_gate=False, lower_bound=None
    bounded = model_logits(monkeypatch, native_calls, safe_gate=True, lower_bound=-5.0)
    for name, (routed, _, calls, layers) in (("unbounded", unbounded), ("bounded", bounded)):
        assert calls == layers, f"{name}: {calls} native calls for {layers} KDA layers"
        assert torch.isfinite(routed).all(), name
    diff = {name: rel_err(r, t.double()) for name, (r, t, _, _) in (("unbounded", unbounded), ("bounded", bounded))}
    greedy = {name: (r.argmax(-1) == t.argmax(-1)).float().mean().item()
              for name, (r, t, _, _) in (("unbounded", unbounded), ("bounded", bounded))}  # fmt: skip
    log(dict(test="kda_model_routed_vs_triton", logits=diff, greedy_agreement=greedy))
    assert diff["unbounded"] <= RATIO * diff["bounded"], diff
    assert greedy["unbounded"] >= GREEDY, greedy
