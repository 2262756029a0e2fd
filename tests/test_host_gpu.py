# SPDX-License-Identifier: MIT
"""The eager host path on the GPU: a repeated signature's prepacked launch and then its launch
from C (``_eager``, torch >= 2.10), and the launch from C of a learned signature's family (other
token and sequence counts), give the validated path's bits and still refuse data faults;
the cached workspace is safe across streams and next to CUDA-graph replays; calls without
tokens give the start states without a host synchronisation (so they can be captured)."""

import contextlib

import flash_kda
import pytest
import torch
from conftest import assert_bitwise, call, make_problem, nan_like, pooled_problem
from flash_kda import _validate, testing

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("native_gpu")]
DEV = "cuda"
bf16, fp32 = torch.bfloat16, torch.float32


EAGER_IN_C = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 10)


def through_c(p, **keywords):
    """One call of p's signature, after the calls that taught it to the eager launch in C,
    which must have launched it (where torch has the stable C ABI: >= 2.10)."""
    before = testing.eager_launches() or 0
    q = fresh(p)
    call(flash_kda.fwd, q, **keywords)
    if EAGER_IN_C:
        assert testing.eager_attach_error() is None, testing.eager_attach_error()
        assert testing.eager_launches() == before + 1, "the eager launch in C did not run the call"
    return q


def fresh(p):
    q = dict(p, out=nan_like(p["out"]))
    if p.get("final_state") is not None and p["final_state"] is not p.get("initial_state"):
        q["final_state"] = nan_like(p["final_state"])
    if p.get("checkpoints") is not None:
        q["checkpoints"] = nan_like(p["checkpoints"])
    return q


def problems():
    batched = make_problem(2, 300, 4, initial=bf16, final=bf16, device=DEV, seed=1)
    varlen = make_problem(1, 0, 4, lens=[100, 0, 156], initial=fp32, final=fp32, device=DEV, seed=2)
    varlen["max_seqlen"] = 156
    pool = pooled_problem(1, 0, 2, [2, -1, 0], 3, lens=[64, 5, 90], has_initial=[True, True, False], device=DEV)
    return dict(batched=batched, varlen=varlen, pool=pool)


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("name", ["batched", "varlen", "pool"])
def test_the_prepacked_launch_gives_the_validated_path_s_bits(name, exact):
    testing.clear_caches()
    p = problems()[name]
    call(flash_kda.fwd, fresh(p), exact=exact)  # validated: the signature's mark
    first = fresh(p)
    call(flash_kda.fwd, first, exact=exact)  # validated: makes the record and its launch
    record = _validate.record_of(call(_validate.signature, first, exact=exact))
    assert record is not None and record.launch is not None, "the signature got no prepacked launch"
    second = fresh(p)
    call(flash_kda.fwd, second, exact=exact)  # prepacked, which teaches the eager launch in C
    third = through_c(p, exact=exact)
    torch.cuda.synchronize()
    for later in (second, third):
        assert_bitwise(later["out"], first["out"], "out")
        if p.get("final_state") is not p.get("initial_state"):
            assert_bitwise(later["final_state"], first["final_state"], "final_state")


def misaligned(x):
    buf = torch.full((x.numel() + 8,), float("nan"), dtype=x.dtype, device=x.device)
    return buf[1 : 1 + x.numel()].view(x.shape).copy_(x)


def assert_refused(bad, message, launched):
    """flash_kda.fwd on ``bad`` raises the ValueError ``message`` without writing out or
    final_state (NaN, or the bytes of the input they overlap) and without a launch from C
    (``launched``: the count before)."""
    before = {name: bad[name].clone() for name in ("out", "final_state")}
    with pytest.raises(ValueError, match=message):
        call(flash_kda.fwd, bad)
    torch.cuda.synchronize()
    for name, x in before.items():
        assert torch.equal(bad[name].view(torch.int16), x.view(torch.int16)), f"a refused call wrote {name}"
    assert testing.eager_launches() == launched, "the eager launch in C ran a refused call"


@pytest.mark.parametrize("fault", ["q-misaligned", "out-overlaps-k", "final-overlaps-initial", "A_log-misaligned"])
def test_a_prepacked_signature_refuses_data_faults_before_writing(fault):
    testing.clear_caches()
    p = make_problem(1, 256, 4, initial=fp32, final=fp32, device=DEV, seed=3)
    call(flash_kda.fwd, fresh(p))
    call(flash_kda.fwd, fresh(p))  # the record and its prepacked launch
    call(flash_kda.fwd, fresh(p))  # prepacked: teaches the eager launch in C
    through_c(p)
    bad = fresh(p)
    if fault == "q-misaligned":
        bad["q"], message = misaligned(p["q"]), "q must be 16-byte aligned"
    elif fault == "out-overlaps-k":
        bad["out"], message = bad["k"], "out must not overlap k in memory"
    elif fault == "final-overlaps-initial":  # the same bytes shifted by one state row
        pool = torch.full((p["final_state"].numel() + 128,), float("nan"), dtype=fp32, device=DEV)
        bad["initial_state"] = pool[:-128].view(p["final_state"].shape).copy_(p["initial_state"])
        bad["final_state"] = pool[128:].view(p["final_state"].shape)
        message = "final_state must not overlap initial_state|initial_state must not overlap final_state"
    else:  # widened by the validated path, so the launch from C leaves it there
        bad["A_log"], message = misaligned(p["A_log"]), None
    assert call(_validate.signature, bad) == call(_validate.signature, p)
    launched = testing.eager_launches()
    if message is None:
        call(flash_kda.fwd, bad)
        expected = fresh(p)
        call(flash_kda.fwd, expected)
        torch.cuda.synchronize()
        assert_bitwise(bad["out"], expected["out"], "out with a misaligned A_log")
        assert testing.eager_launches() == (None if launched is None else launched + 1)
        return
    assert_refused(bad, message, launched)


class _Marked(torch.Tensor):
    """A tensor subclass (the Python path must give it torch's dispatch)."""


@pytest.mark.parametrize("case", ["requires-grad", "requires-grad-out", "requires-grad-no-grad", "inference-out",
                                  "inference-mode", "subclass", "parameter"])  # fmt: skip
def test_the_launch_from_c_refuses_what_the_python_path_must_see(case):
    """After a signature is learned, C leaves to the Python path a tensor that requires grad
    in grad mode (its RuntimeError), an inference tensor to write outside inference mode (its
    ValueError) and a tensor subclass; under no_grad, in inference mode and for a Parameter it
    launches the call itself, with the validated path's bits."""
    if not EAGER_IN_C:
        pytest.skip("the eager launch in C needs torch >= 2.10")
    testing.clear_caches()
    p = make_problem(1, 256, 4, initial=bf16, final=bf16, device=DEV, seed=11)
    learned(p)
    through_c(p)
    expected = fresh(p)
    call(flash_kda.fwd, expected)
    launched, q = testing.eager_launches(), fresh(p)
    context, error, from_c = contextlib.nullcontext(), None, False
    if case == "requires-grad":
        q["k"], error = p["k"].clone().requires_grad_(), (RuntimeError, "requires grad")
    elif case == "requires-grad-out":
        q["out"], error = nan_like(p["out"]).requires_grad_(), (RuntimeError, "requires grad")
    elif case == "requires-grad-no-grad":
        q["A_log"], context, from_c = p["A_log"].clone().requires_grad_(), torch.no_grad(), True
    elif case == "inference-out":
        with torch.inference_mode():
            q["out"] = nan_like(p["out"])
        error = (ValueError, "inference")
    elif case == "inference-mode":
        with torch.inference_mode():
            q["out"] = nan_like(p["out"])
        context, from_c = torch.inference_mode(), True
    elif case == "subclass":
        q["v"] = p["v"].as_subclass(_Marked)
    else:
        q["dt_bias"], from_c = torch.nn.Parameter(p["dt_bias"].clone(), requires_grad=False), True
    with context:
        if error is not None:
            with pytest.raises(error[0], match=error[1]):
                call(flash_kda.fwd, q)
        else:
            call(flash_kda.fwd, q)
    torch.cuda.synchronize()
    assert testing.eager_launches() == launched + from_c, f"{case}: launched from C {not from_c}"
    if error is None:
        assert_bitwise(q["out"], expected["out"], f"out ({case})")
    else:
        assert torch.isnan(q["out"]).all(), f"a refused call wrote out ({case})"


def with_checkpoints(p, every):
    shape, _ = flash_kda.checkpoint_layout(every, p["q"].shape[2], cu_seqlens=p["cu_seqlens"])
    return dict(p, checkpoint_every=every, checkpoints=torch.full(shape, float("nan"), dtype=fp32, device=DEV))


def families():
    """(a learned problem, another of its family): batch 1, other token and sequence counts, no
    more chunks than the first (a workspace the first's fits)."""
    batched = [make_problem(1, t, 4, initial=bf16, final=bf16, device=DEV, seed=6 + t) for t in (300, 173)]
    varlen = [make_problem(1, 0, 4, lens=lens, initial=fp32, final=fp32, device=DEV, seed=8) for lens in
              ([100, 0, 156], [40, 150, 1, 27])]  # fmt: skip
    varlen[0]["max_seqlen"], varlen[1]["max_seqlen"] = 156, 150
    pool = [
        pooled_problem(1, 0, 2, [2, -1, 0], 3, lens=[64, 5, 90], has_initial=[True, True, False], device=DEV),
        pooled_problem(1, 0, 2, [1, 4], 5, lens=[33, 100], has_initial=[False, True], device=DEV, seed=9),
    ]
    checkpoints = [with_checkpoints(make_problem(1, 0, 2, lens=lens, initial=fp32, final=fp32, device=DEV, seed=10),
                                    32) for lens in ([70, 200], [150, 17, 64])]  # fmt: skip
    return dict(batched=batched, varlen=varlen, pool=pool, checkpoints=checkpoints)


def learned(p, **keywords):
    """p's signature taught to the eager launch in C (its mark, record and prepacked launch)."""
    for _ in range(3):
        call(flash_kda.fwd, fresh(p), **keywords)


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("name", ["batched", "varlen", "pool", "checkpoints"])
def test_a_learned_family_runs_other_sizes_from_c_with_the_validated_path_s_bits(name, exact):
    base, member = families()[name]
    testing.clear_caches()  # the member's bits on the validated path: nothing learned
    expected = fresh(member)
    call(flash_kda.fwd, expected, exact=exact)
    testing.clear_caches()
    learned(base, exact=exact)
    first = through_c(member, exact=exact)  # a member of the family, checked and planned in C
    again = through_c(member, exact=exact)  # its own signature, learned by the call before
    torch.cuda.synchronize()
    for got in (first, again):
        for what in ("out", "final_state", "checkpoints"):
            if member.get(what) is not None and member[what] is not member.get("initial_state"):
                assert_bitwise(got[what], expected[what], what)


def test_a_family_member_beyond_the_workspace_grows_it_on_the_validated_path():
    """The launch from C takes only a workspace it was given: a member needing more runs on the
    validated path, which grows the stream's workspace, and the next member of that size runs
    from C."""
    testing.clear_caches()
    small, large = (make_problem(1, t, 4, initial=fp32, final=fp32, device=DEV, seed=14) for t in (64, 8192))
    learned(small)
    launched = testing.eager_launches()
    call(flash_kda.fwd, fresh(large))
    assert testing.eager_launches() == launched, "a workspace too small for the call was used"
    through_c(make_problem(1, 8000, 4, initial=fp32, final=fp32, device=DEV, seed=15))


def family_fault(fault, p):
    """A call of p's family (other sizes) with one fault, and the error the validation gives."""
    bad = fresh(make_problem(1, 0, 4, lens=[50, 150], initial=fp32, final=fp32, device=DEV, seed=11))
    if fault == "k-shorter":
        return dict(bad, k=bad["k"][:, :-16].contiguous()), "k must have shape"
    if fault == "states-of-another-N":
        return dict(bad, initial_state=p["initial_state"]), "initial_state must have shape"
    if fault == "max_seqlen-above-T":
        return dict(bad, max_seqlen=bad["q"].shape[1] + 1), "max_seqlen must be in"
    if fault == "q-misaligned":
        return dict(bad, q=misaligned(bad["q"])), "q must be 16-byte aligned"
    if fault == "out-overlaps-v":
        return dict(bad, out=bad["v"]), "out must not overlap v in memory"
    cu = bad["cu_seqlens"].cpu()  # on the host, contents checked: never the family's (device) signature
    cu[1] = cu[2] + 1
    return dict(bad, cu_seqlens=cu), "cu_seqlens"


FAMILY_FAULTS = ["k-shorter", "states-of-another-N", "max_seqlen-above-T", "q-misaligned", "out-overlaps-v",
                 "host-cu_seqlens-decreasing"]  # fmt: skip


@pytest.mark.parametrize("fault", FAMILY_FAULTS)
def test_a_family_member_still_refuses_data_faults_before_writing(fault):
    testing.clear_caches()
    p = make_problem(1, 0, 4, lens=[100, 28, 128], initial=fp32, final=fp32, device=DEV, seed=12)
    learned(p)
    bad, message = family_fault(fault, p)
    assert_refused(bad, message, testing.eager_launches())


def strided_out(p, token_stride):
    """p with out a view of token stride ``token_stride`` (elements) into a NaN buffer."""
    _, T, H, D = p["out"].shape
    buffer = torch.full(((T - 1) * token_stride + H * D,), float("nan"), dtype=bf16, device=DEV)
    return dict(p, out=buffer.as_strided(p["out"].shape, (buffer.numel(), token_stride, D, 1))), buffer


def test_a_family_member_whose_out_would_overlap_itself_is_left_to_the_validation():
    """A single-token call may give out any token stride; a longer call of its family with that
    stride would write elements twice, so the launch from C leaves it to the validation."""
    testing.clear_caches()
    base, _ = strided_out(make_problem(1, 1, 4, initial=fp32, final=fp32, device=DEV, seed=13), 8)
    for _ in range(3):
        call(flash_kda.fwd, base)
    bad, buffer = strided_out(make_problem(1, 261, 4, initial=fp32, final=fp32, device=DEV, seed=13), 8)
    launched, before = testing.eager_launches(), buffer.clone()
    with pytest.raises(ValueError, match="out must not overlap itself"):
        call(flash_kda.fwd, bad)
    torch.cuda.synchronize()
    assert torch.equal(buffer.view(torch.int16), before.view(torch.int16)), "a refused call wrote out"
    assert testing.eager_launches() == launched, "the eager launch in C ran a refused call"


def test_the_cached_workspace_is_safe_across_streams_and_graph_replays():
    """The same signature on two streams at once (each its own workspace) and eagerly between
    replays of a graph that captured it (the graph's own workspace): every result equals the
    serial one."""
    testing.clear_caches()
    p = make_problem(1, 2048, 8, initial=fp32, final=fp32, device=DEV, seed=4)
    expected = fresh(p)
    call(flash_kda.fwd, expected)
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in range(2)]
    runs = [[fresh(p) for _ in range(3)] for _ in streams]
    for _ in range(3):
        for stream, run in zip(streams, runs):
            with torch.cuda.stream(stream):
                for q in run:
                    call(flash_kda.fwd, q)
    torch.cuda.synchronize()
    assert testing.cached_workspaces() >= 2
    for run in runs:
        for q in run:
            assert_bitwise(q["out"], expected["out"], "out on a second stream")
            assert_bitwise(q["final_state"], expected["final_state"], "final_state on a second stream")
    captured = fresh(p)
    call(flash_kda.fwd, captured)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(flash_kda.fwd, captured)
    eager = [fresh(p) for _ in range(3)]
    for q in eager:
        captured["out"].fill_(float("nan"))
        graph.replay()
        call(flash_kda.fwd, q)  # eager, the cached workspace, between replays
    torch.cuda.synchronize()
    assert_bitwise(captured["out"], expected["out"], "graph replay")
    for q in eager:
        assert_bitwise(q["out"], expected["out"], "eager between replays")


# Shapes whose plans launch each sequence the library has (on the H200): K1 then the pass;
# the ready flags' memset, K1 beside the pass and K1's extra grid; the segment pass, the
# combine and the rerun; the same after the varlen prefix.
REPLAYED = dict(
    tiny=lambda seed: make_problem(1, 256, 4, initial=bf16, final=bf16, device=DEV, seed=seed),
    overlap=lambda seed: make_problem(4, 1024, 8, initial=bf16, final=bf16, device=DEV, seed=seed),
    overlap_kept=lambda seed: make_problem(1, 2048, 64, device=DEV, seed=seed),
    segments=lambda seed: make_problem(1, 2048, 8, initial=fp32, final=fp32, device=DEV, seed=seed),
    varlen_segments=lambda seed: make_problem(1, 0, 8, lens=[1000, 3000], final=fp32, device=DEV, seed=seed),
)


@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("name", sorted(REPLAYED))
def test_repeated_calls_replay_one_graph_with_the_kernel_by_kernel_bits(name, exact):
    """A signature's repeats on a stream are graph launches (the first records the graph),
    each with its own inputs and outputs, bit for bit the calls launched kernel by kernel;
    a capture of the caller's on that stream still takes the kernels themselves."""
    testing.clear_caches()
    problems = [REPLAYED[name](seed) for seed in (1, 2, 3)]
    with testing.replays(False):
        expected = [fresh(p) for p in problems]
        for q in expected:
            call(flash_kda.fwd, q, exact=exact)
    before = testing.graph_replays()
    runs = [fresh(p) for p in problems + problems[:1]]
    for q in runs:
        call(flash_kda.fwd, q, exact=exact)
    torch.cuda.synchronize()
    assert testing.graph_replays() == before + len(runs), "the repeated calls were not replayed"
    for q, e in zip(runs, expected + expected[:1]):
        assert_bitwise(q["out"], e["out"], "out of a replay")
        if e.get("final_state") is not None:
            assert_bitwise(q["final_state"], e["final_state"], "final_state of a replay")
    captured = fresh(problems[1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(flash_kda.fwd, captured, exact=exact)
    assert testing.graph_replays() == before + len(runs), "a call inside a capture was replayed"
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise(captured["out"], expected[1]["out"], "out of the caller's graph")


def empty_problem(kind):
    """A problem without tokens (NaN final states): T = 0, B = 0, empty varlen sequences,
    tokens no sequence holds (cu_seqlens all zero, on the device: the kernels cannot know),
    or a pool with padding and has_initial_state."""
    if kind == "T0":
        return make_problem(2, 0, 2, initial=fp32, final=fp32, device=DEV, seed=5)
    if kind == "B0":
        return make_problem(0, 16, 2, initial=fp32, final=fp32, device=DEV, seed=5)
    if kind == "varlen-empty":
        return make_problem(1, 0, 2, lens=[0, 0, 0], initial=bf16, final=bf16, device=DEV, seed=5)
    if kind == "tokens-outside-sequences":
        p = make_problem(1, 0, 2, lens=[20, 12], initial=fp32, final=fp32, device=DEV, seed=5)
        p["cu_seqlens"] = torch.zeros(3, dtype=torch.int64, device=DEV)
        return p
    return pooled_problem(1, 0, 2, [2, -1, 0], 3, lens=[0, 0, 0], has_initial=[True, True, False], device=DEV)


def start_states(p):
    """p's final_state as a call without tokens must leave it."""
    expected = p["final_state"].clone()
    indices, has = p.get("ssm_state_indices"), p.get("has_initial_state")
    n = len(indices) if indices is not None else expected.shape[0]
    for i in range(n):
        slot = i if indices is None else int(indices[i])
        if slot < 0:
            continue
        fresh_start = has is not None and not bool(has[i])
        start = torch.zeros_like(expected[slot]) if fresh_start else p["initial_state"][slot]
        expected[slot] = start.to(bf16).to(expected.dtype)
    return expected


@pytest.mark.parametrize("kind", ["T0", "B0", "varlen-empty", "tokens-outside-sequences", "pool"])
def test_calls_without_tokens_give_the_start_states_and_can_be_captured(kind):
    """Native: each sequence's final state is its start state (bf16; zero where
    has_initial_state is False; padding writes nothing), out untouched, and no host
    synchronisation: the call is captured in a CUDA graph and replayed."""
    p = empty_problem(kind)
    call(flash_kda.fwd, fresh(p))  # its signature's record, outside the capture
    q = fresh(p)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(flash_kda.fwd, q)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(q["out"]).all(), "out was written"
    assert_bitwise(q["final_state"], start_states(p), "final states")
