# SPDX-License-Identifier: MIT
"""Serving features on the native GPU path, bit for bit in exact mode: state pools (in
place, padding, has_initial_state), strided views, checkpoints, the custom op under
opcheck and torch.compile, CUDA-graph replay with new index contents, an fla KDA model
cast to bf16, fla's chunk_kda under torch.compile, and garbage device cu_seqlens that must
stay inside guard regions."""

import flash_kda
import pytest
import torch
from conftest import (
    NAN,
    assert_bitwise,
    call,
    check,
    fused_projection_views,
    gather_compute_scatter,
    make_problem,
    nan_like,
    pooled_problem,
    prefix_final_states,
    rel_err,
)
from flash_kda import fallback, reference, testing

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("native_gpu")]
DEV = "cuda"
bf16, fp32 = torch.bfloat16, torch.float32


def run_exact(p):
    call(flash_kda.fwd, p, exact=True)


class _Calls(list):
    """The native calls a test made: those of the Python paths (its items) and the launches
    from C since it was made (its length counts both)."""

    def __init__(self):
        super().__init__()
        self.start = testing.eager_launches() or 0

    def __len__(self):
        return super().__len__() + (testing.eager_launches() or 0) - self.start


@pytest.fixture
def native_calls(monkeypatch):
    """Counts the calls that reach the native library's forward, through the validated path
    (NativeLibrary.fwd), a signature's prepacked launch (fwd_by_address) or the eager launch in C."""
    calls = _Calls()
    lib = testing.native_library()
    testing.clear_caches()  # a prepacked launch made before holds the uncounted function
    real_fwd, real_by_address = lib.fwd, lib.fwd_by_address
    monkeypatch.setattr(lib, "fwd", lambda *args, **kwargs: calls.append(args) or real_fwd(*args, **kwargs))
    monkeypatch.setattr(lib, "fwd_by_address", lambda *args: calls.append(args) or real_by_address(*args))
    yield calls
    testing.clear_caches()  # drop the launches that hold the counting functions


# ------------------------------------------------------------------ pools

POOLS = [
    ("varlen-padding-fresh", [300, 17, 0, 513, 64], [5, -1, 0, 2, -3], 7, [True, True, False, True, True]),
    ("batched", None, [2, 0, 3], 4, None),
]


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "separate"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("dtype", [bf16, fp32], ids=["bf16pool", "fp32pool"])
@pytest.mark.parametrize("case", POOLS, ids=[c[0] for c in POOLS])
def test_native_pool_bitwise_equals_gather_compute_scatter(case, dtype, index_dtype, in_place, native_calls):
    _, lens, slots, pool_size, has = case
    p = pooled_problem(3, 200, 4, slots, pool_size, lens=lens, has_initial=has, dtype=dtype,
                       index_dtype=index_dtype, in_place=in_place, device=DEV, seed=31)  # fmt: skip
    expected_out, expected_pool = gather_compute_scatter(run_exact, p)
    run_exact(p)
    assert len(native_calls) == 2, "both calls must run the native kernels"
    assert_bitwise(p["out"], expected_out, "out")
    assert_bitwise(p["final_state"], expected_pool, "final pool (padding slots and unowned slots untouched)")


@pytest.mark.parametrize("segment_chunks", [2, 5])
def test_native_pool_in_auto_mode_equals_gathered_auto_call(segment_chunks):
    """AUTO mode with forced segments: the pool changes where states live, not the math."""
    p = pooled_problem(1, 0, 2, [1, -1, 0], 3, lens=[700, 40, 333], has_initial=[True, True, False],
                       in_place=True, device=DEV, seed=32)  # fmt: skip

    def run_auto(q):
        testing.run_native(check(q, exact=False), segment_chunks=segment_chunks)

    expected_out, expected_pool = gather_compute_scatter(run_auto, p)
    run_auto(p)
    assert_bitwise(p["out"], expected_out, "out")
    assert_bitwise(p["final_state"], expected_pool, "final pool")


# ------------------------------------------------------------------ strided views


@pytest.mark.parametrize("lens", [None, [300, 17, 0, 513]], ids=["batched", "varlen"])
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "auto"])
def test_native_strided_bitwise_equals_contiguous(lens, exact, native_calls):
    p = make_problem(2, 700, 4, lens=lens, initial=fp32, final=fp32, device=DEV, seed=33)
    strided, out_buffer = fused_projection_views(p)
    call(flash_kda.fwd, strided, exact=exact)
    call(flash_kda.fwd, p, exact=exact)
    assert len(native_calls) == 2
    assert_bitwise(strided["out"].contiguous(), p["out"], "out from fused-projection views")
    assert torch.isnan(out_buffer[..., 128:]).all(), "out's row padding was written"


def test_native_transposed_heads_bitwise_equal_contiguous():
    p = make_problem(1, 333, 3, initial=bf16, final=bf16, device=DEV, seed=34)
    t = {n: p[n].transpose(1, 2).contiguous().transpose(1, 2) for n in ("q", "k", "v", "g", "out")}
    strided = dict(p, **t, final_state=nan_like(p["final_state"]))
    run_exact(strided)
    run_exact(p)
    assert_bitwise(strided["out"].contiguous(), p["out"], "out")
    assert_bitwise(strided["final_state"], p["final_state"], "final_state")


# ------------------------------------------------------------------ checkpoints

CHECKPOINTS = [
    ("varlen-every16", [300, 17, 0, 513, 64], 16),
    ("varlen-every64", [300, 17, 0, 513, 64], 64),
    ("batched-every32", None, 32),
]


@pytest.mark.parametrize("dtype", [bf16, fp32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("case", CHECKPOINTS, ids=[c[0] for c in CHECKPOINTS])
def test_native_checkpoints_bitwise_equal_prefix_runs(case, dtype):
    _, lens, every = case
    p = make_problem(2, 200, 2, lens=lens, initial=dtype, final=dtype, device=DEV, seed=35)
    layout = dict(cu_seqlens=p["cu_seqlens"]) if lens else dict(batch=2, seqlen=200)
    shape, _ = flash_kda.checkpoint_layout(every, 2, **layout)
    checkpoints = torch.full(shape, NAN, dtype=dtype, device=DEV)
    expected = prefix_final_states(run_exact, p, every, dtype)
    run_exact(dict(p, checkpoint_every=every, checkpoints=checkpoints))
    assert_bitwise(checkpoints, expected, "checkpoints")
    plain = dict(p, out=nan_like(p["out"]), final_state=nan_like(p["final_state"]))
    run_exact(plain)
    assert_bitwise(p["out"], plain["out"], "out with checkpoints")
    assert_bitwise(p["final_state"], plain["final_state"], "final_state with checkpoints")


def test_native_checkpoints_equal_the_reference_ledger():
    p = make_problem(1, 0, 3, lens=[130, 47, 96], initial=bf16, final=bf16, device=DEV, seed=36)
    native = torch.full((10, 3, 128, 128), NAN, dtype=bf16, device=DEV)
    ledger = native.clone()
    run_exact(dict(p, checkpoint_every=32, checkpoints=native))
    call(reference.fwd, dict(p, out=nan_like(p["out"]), final_state=nan_like(p["final_state"])),
         checkpoint_every=32, checkpoints=ledger)  # fmt: skip
    assert_bitwise(native, ledger, "checkpoints: native vs reference (probes)")


# ------------------------------------------------------------------ the custom op


def test_opcheck_on_cuda():
    from test_op import op_args, samples

    for name, p in samples(DEV):
        result = torch.library.opcheck(torch.ops.flash_kda.fwd.default, *op_args(p))
        assert set(result.values()) == {"SUCCESS"}, (name, result)


def test_fullgraph_compile_on_cuda_equals_eager(native_calls):
    from test_op import compiled_step

    torch._dynamo.reset()
    p = pooled_problem(1, 0, 2, [1, -1, 0], 2, lens=[200, 7, 333], has_initial=[True, True, False],
                       in_place=True, device=DEV, seed=37)  # fmt: skip
    names = ("q", "k", "v", "g", "beta", "out", "A_log", "dt_bias", "initial_state", "cu_seqlens")
    eager = {n: p[n].clone() for n in names}
    graph = {n: p[n].clone() for n in names}
    extra = (p["ssm_state_indices"], p["has_initial_state"])
    ck_eager = torch.full((33, 2, 128, 128), NAN, device=DEV)
    ck_graph = ck_eager.clone()
    compiled_step(*[eager[n] for n in names], *extra, ck_eager)
    torch.compile(compiled_step, fullgraph=True)(*[graph[n] for n in names], *extra, ck_graph)
    assert len(native_calls) == 2
    assert_bitwise(graph["out"], eager["out"], "out")
    assert_bitwise(graph["initial_state"], eager["initial_state"], "pool updated in place")
    assert_bitwise(ck_graph, ck_eager, "checkpoints")


def test_graph_replay_with_new_index_contents():
    """Captured once; replayed after cu_seqlens, ssm_state_indices and has_initial_state
    change in place: equal to eager calls with the new contents (exact mode)."""
    H, P = 3, 6
    p = pooled_problem(1, 0, H, [4, -1, 0, 2], P, lens=[200, 37, 0, 403], has_initial=[True, True, False, True],
                       in_place=True, device=DEV, seed=38)  # fmt: skip
    p["cu_seqlens"] = p["cu_seqlens"].int()
    pool0 = p["initial_state"].clone()
    contents = [
        ([0, 200, 237, 237, 640], [4, -1, 0, 2], [True, True, False, True]),
        ([0, 50, 450, 451, 600], [1, 3, -2, 5], [False, True, True, True]),
        ([0, 0, 640, 640, 640], [0, 5, 1, -1], [True, True, True, True]),
    ]

    def set_contents(q, bounds, slots, has):
        q["cu_seqlens"].copy_(torch.tensor(bounds, dtype=torch.int32))
        q["ssm_state_indices"].copy_(torch.tensor(slots))
        q["has_initial_state"].copy_(torch.tensor(has))
        q["initial_state"].copy_(pool0)
        q["out"].fill_(NAN)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_exact(p)  # warm-up outside capture (library load, device facts)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_exact(p)
    for bounds, slots, has in contents:
        set_contents(p, bounds, slots, has)
        graph.replay()
        eager = {n: p[n].clone() for n in ("cu_seqlens", "ssm_state_indices", "has_initial_state", "out")}
        eager = dict(p, **eager, initial_state=pool0.clone())
        eager["final_state"] = eager["initial_state"]
        set_contents(eager, bounds, slots, has)
        run_exact(eager)
        torch.cuda.synchronize()
        assert_bitwise(p["out"], eager["out"], f"replayed out, cu_seqlens {bounds}")
        assert_bitwise(p["initial_state"], eager["initial_state"], f"replayed pool, slots {slots}")


# ------------------------------------------------------------------ fla


def fla_or_skip():
    if not fallback.fla_available():
        pytest.skip("fla is not importable here")


def test_fla_kda_model_cast_to_bf16_prefills_natively(monkeypatch, native_calls):
    """A KDA model cast wholly to bf16 (A_log and dt_bias too) runs prefill through the
    native path and matches fla's Triton path (FLA_FLASH_KDA=0)."""
    fla_or_skip()
    try:
        from fla.models import KDAConfig, KDAForCausalLM
    except Exception as err:  # transformers missing or too old
        pytest.skip(f"fla.models is not importable: {err}")
    torch.manual_seed(0)
    config = KDAConfig(hidden_size=256, num_heads=2, head_dim=128, num_hidden_layers=2, vocab_size=1000,
                       safe_gate=True, lower_bound=-5.0, fuse_cross_entropy=False)  # fmt: skip
    model = KDAForCausalLM(config).to(DEV, torch.bfloat16).eval()
    gates = [t for name, t in model.named_parameters() if name.endswith(("A_log", "dt_bias"))]
    assert len(gates) == 2 * config.num_hidden_layers and all(t.dtype == bf16 for t in gates)
    ids = torch.randint(0, 1000, (2, 200), device=DEV)  # > 64 tokens: fla's chunk mode
    monkeypatch.delenv("FLA_FLASH_KDA", raising=False)
    with torch.no_grad():
        native = model(ids, use_cache=False).logits.float()
    assert len(native_calls) == config.num_hidden_layers
    monkeypatch.setenv("FLA_FLASH_KDA", "0")
    with torch.no_grad():
        triton = model(ids, use_cache=False).logits.float()
    assert len(native_calls) == config.num_hidden_layers, "FLA_FLASH_KDA=0 must keep fla off flash_kda"
    err = rel_err(native, triton.double())
    print(f"logits relative error native vs Triton: {err:.4f}")
    assert err < 0.05


def test_fla_chunk_kda_under_torch_compile_equals_eager(monkeypatch, native_calls):
    """fla's dispatcher is torch.compiler.disable'd, so fullgraph=True cannot hold around
    chunk_kda; a plain torch.compile must still route to flash_kda and equal eager."""
    fla_or_skip()
    from fla.ops.kda import chunk_kda

    monkeypatch.delenv("FLA_FLASH_KDA", raising=False)
    monkeypatch.setenv("FLASH_KDA_EXACT", "1")
    p = make_problem(1, 0, 4, lens=[300, 17, 513], initial=fp32, device=DEV, seed=39)

    def step(q, k, v, g, beta, A_log, dt_bias, h0, cu):
        options = dict(scale=128**-0.5, initial_state=h0, output_final_state=True, lower_bound=-5.0, cu_seqlens=cu)
        return chunk_kda(q, k, v, g, beta, **options, **fallback.FLASH_KDA_FLAGS, A_log=A_log, dt_bias=dt_bias)

    args = [p[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state", "cu_seqlens")]
    torch._dynamo.reset()
    with torch.no_grad():
        o_eager, h_eager = step(*args)
        o_graph, h_graph = torch.compile(step)(*args)
    assert len(native_calls) == 2
    assert_bitwise(o_graph, o_eager, "out")
    assert_bitwise(h_graph, h_eager, "final state")


# ------------------------------------------------------------------ garbage cu_seqlens (issue 9.5)

GUARD = 4096  # elements of sentinel before and after each output


def guarded(shape, dtype, sentinel):
    """(buffer, view): ``view`` of ``shape`` in the middle of one allocation whose GUARD
    elements on either side hold ``sentinel``."""
    n = torch.Size(shape).numel()
    buffer = torch.full((GUARD + n + GUARD,), sentinel, dtype=dtype, device=DEV)
    return buffer, buffer[GUARD : GUARD + n].view(shape)


def assert_guards(buffer, before, what):
    n = buffer.numel() - 2 * GUARD
    assert_bitwise(buffer[:GUARD], before[:GUARD], f"guard before {what}")
    assert_bitwise(buffer[GUARD + n :], before[GUARD + n :], f"guard after {what}")


GARBAGE = {
    "non-monotone": [0, 300, 100, 640],
    "negative": [0, -200, 300, 640],
    "past-the-end": [0, 300, 900, 5000],
    "2^62": [0, 2**62, 2**62, 2**62],
    "all-wrong": [-7, 2**62, -(2**62), 3],
}


@pytest.mark.parametrize("mode", ["exact", "auto-segments-2", "auto-32"])
@pytest.mark.parametrize("pooled", [False, True], ids=["states", "pool"])
@pytest.mark.parametrize("name", list(GARBAGE))
def test_garbage_device_cu_seqlens_stays_in_bounds(name, pooled, mode):
    H, T = 2, 640
    p = make_problem(1, 0, H, lens=[300, 40, 300], device=DEV, seed=40)
    p["cu_seqlens"] = torch.tensor(GARBAGE[name], dtype=torch.int64, device=DEV)
    out_buffer, p["out"] = guarded((1, T, H, 128), bf16, -1111.0)
    rows = 5 if pooled else 3
    state_buffer, p["final_state"] = guarded((rows, H, 128, 128), fp32, 2222.0)
    p["initial_state"] = (0.1 * torch.randn(rows, H, 128, 128, device=DEV)).float()
    if pooled:
        p["ssm_state_indices"] = torch.tensor([4, 99, -1], device=DEV)  # 99 >= P: treated as padding
    ckpt_buffer, checkpoints = guarded((7, H, 128, 128), fp32, 3333.0)
    before = [b.clone() for b in (out_buffer, state_buffer, ckpt_buffer)]
    fwd_call = check(p, checkpoint_every=64, checkpoints=checkpoints, exact=mode == "exact")
    chunk = 32 if mode == "auto-32" else 0  # 32-token chunks (design section 4.8)
    testing.run_native(fwd_call, segment_chunks=2 if mode == "auto-segments-2" else 0, chunk_tokens=chunk)
    torch.cuda.synchronize()
    for buffer, old, what in zip((out_buffer, state_buffer, ckpt_buffer), before, ("out", "final_state", "ckpts")):
        assert_guards(buffer, old, what)
    # the next valid call is still right
    valid = make_problem(1, 0, H, lens=[300, 40, 300], initial=fp32, final=fp32, device=DEV, seed=41)
    expected = dict(valid, out=nan_like(valid["out"]), final_state=nan_like(valid["final_state"]))
    call(reference.fwd, expected)
    run_exact(valid)
    assert_bitwise(valid["out"], expected["out"], "out of the next valid call")
    assert_bitwise(valid["final_state"], expected["final_state"], "final_state of the next valid call")
