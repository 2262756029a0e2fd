# SPDX-License-Identifier: MIT
"""The eager native path of a signature met before (a prepacked launch, _launch.prepacked),
on this machine through flash_kda.testing.simulated_native: CPU tensors take the native
path with the real library, whose checks then run on host pointers and which fails a valid
call only at its driver check (no GPU here). A cached signature still refuses each
data-dependent fault (misaligned pointer, overlapping output, bad CPU cu_seqlens) with the
full validation's error before anything is written; the prepacked struct equals the one the
validated path packs; empty calls; the workspace cache per stream and graph capture."""

import ctypes
import re

import flash_kda
import pytest
import torch
from conftest import call, make_problem, nan_like, pooled_problem
from flash_kda import _launch, _native, _validate, dispatch, testing

bf16, fp32 = torch.bfloat16, torch.float32
REACHED_THE_DRIVER = "flash_kda_fwd: the CUDA driver supports CUDA"  # every check passed


@pytest.fixture
def native(monkeypatch):
    """The real library behind the simulated native device (skips without one); strict, so
    that its refusal at the driver check raises instead of falling back (dispatch.recover)."""
    monkeypatch.setenv(dispatch.STRICT_ENV, "1")
    lib = testing.native_library()
    if lib is None:
        pytest.skip(f"no native library here: {testing.native_error()}")
    if not lib.archs:
        pytest.skip("the library has no arch table")
    with testing.simulated_native(lib, compute_capability=lib.archs[0].compute_capability) as lib:
        yield lib


class Recorder:
    """A stand-in library that records each launch's argument struct (bytes) and answers OK
    or a given status."""

    def __init__(self, status=0):
        stand_in = testing.stand_in_library(workspace_bytes=4096)
        self.archs, self.cuda_versions, self.plan, self.status = (
            stand_in.archs,
            stand_in.cuda_versions,
            stand_in.plan,
            status,
        )
        self.launches = []

    def fwd(self, cc, args, stream, overrides=None):
        self.launches.append(("validated", bytes(args), overrides))

    def fwd_by_address(self, cc, address, stream):
        self.launches.append(("prepacked", ctypes.string_at(address, ctypes.sizeof(_native.FwdArgs)), None))
        return self.status

    def error(self, status):
        return f"recorder: status {status}"


@pytest.fixture
def recorder():
    lib = Recorder()
    with testing.simulated_native(lib):
        yield lib


def misaligned(x, elements=1):
    buf = torch.full((x.numel() + elements,), float("nan"), dtype=x.dtype)
    return buf[elements:].view(x.shape).copy_(x)


def overlapping(p, writer, other, at=64):
    """p with ``other`` starting ``at`` bytes into ``writer``'s bytes of one buffer."""
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    buffer = torch.zeros(at + size(p[writer]) + size(p[other]), dtype=torch.uint8)

    def carve(offset, like):
        return buffer[offset : offset + size(like)].view(like.dtype).view(like.shape).copy_(like)

    return dict(p, **{writer: carve(0, p[writer]), other: carve(at, p[other])})


def fresh(p):
    """p with new NaN outputs (new pointers, the same signature)."""
    q = dict(p, out=nan_like(p["out"]))
    if p.get("final_state") is not None and p["final_state"] is not p.get("initial_state"):
        q["final_state"] = nan_like(p["final_state"])
    if p.get("checkpoints") is not None:
        q["checkpoints"] = nan_like(p["checkpoints"])
    return q


def reached_the_library(p, **overrides):
    """flash_kda.fwd(p) on the simulated device: every check passes, so the real library
    refuses only at its driver check (a RuntimeError naming the driver)."""
    with pytest.raises(RuntimeError, match=re.escape(REACHED_THE_DRIVER)):
        call(flash_kda.fwd, p, **overrides)


def serving_problem():
    """Varlen, cu_seqlens on the CPU (its contents checked on every call), a pool."""
    return pooled_problem(1, 0, 2, [1, 0], 2, lens=[20, 12], has_initial=[True, False], seed=3)


FAULTS = [
    ("q-misaligned", lambda: make_problem(1, 32, 2, final=fp32), lambda p: dict(p, q=misaligned(p["q"])),
     "q must be 16-byte aligned"),
    ("out-misaligned", lambda: make_problem(1, 32, 2, final=fp32), lambda p: dict(p, out=misaligned(p["out"])),
     "out must be 16-byte aligned"),
    ("final-misaligned", lambda: make_problem(1, 32, 2, final=fp32),
     lambda p: dict(p, final_state=misaligned(p["final_state"])), "final_state must be 16-byte aligned"),
    ("out-overlaps-q", lambda: make_problem(1, 32, 2, final=fp32), lambda p: overlapping(p, "out", "q"),
     "out must not overlap q in memory"),
    ("out-overlaps-beta", lambda: make_problem(2, 32, 2, final=fp32), lambda p: overlapping(p, "out", "beta"),
     "out must not overlap beta in memory"),
    ("final-overlaps-dt_bias", lambda: make_problem(1, 32, 2, final=fp32),
     lambda p: overlapping(p, "final_state", "dt_bias"), "final_state must not overlap dt_bias in memory"),
    ("cu-decreasing", serving_problem, lambda p: dict(p, cu_seqlens=torch.tensor([0, 21, 20])),
     "cu_seqlens must be non-decreasing"),
    ("cu-beyond-T", serving_problem, lambda p: dict(p, cu_seqlens=torch.tensor([0, 20, 33])),
     "cu_seqlens must end at most at T = 32"),
]  # fmt: skip


@pytest.mark.parametrize("make,fault,message", [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_a_cached_signature_refuses_each_data_fault_before_writing(native, make, fault, message):
    """The signature is met first (its record, and where it can its prepacked launch, are
    made); then the same signature with one data-dependent fault: the full validation's
    ValueError, nothing written; then a good call still reaches the library."""
    p = make()
    reached_the_library(p)
    reached_the_library(fresh(p))  # the second call makes the record (and the prepacked launch)
    key = call(_validate.signature, p)
    record = _validate.record_of(key)
    assert record is not None
    bad = fault(fresh(p))
    assert call(_validate.signature, bad) == call(_validate.signature, p), "the fault must keep the signature"
    watched = [bad[n] for n in ("out", "final_state") if bad.get(n) is not None]
    before = [t.clone() for t in watched]
    with pytest.raises(ValueError, match=re.escape(f"flash_kda.fwd: {message}")):
        call(flash_kda.fwd, bad)
    for t, b in zip(watched, before):
        assert torch.equal(t.view(torch.uint8), b.view(torch.uint8)), "a refused call wrote"
    reached_the_library(fresh(p))
    assert _validate.record_of(key) is record  # the signature stayed cached


def test_a_repeated_signature_takes_the_prepacked_launch(native):
    p = make_problem(1, 32, 2, initial=fp32, final=fp32)
    reached_the_library(p)
    reached_the_library(fresh(p))
    record = _validate.record_of(call(_validate.signature, p))
    assert record is not None and record.launch is not None
    calls = []
    real = _validate.check_fwd
    try:
        _validate.check_fwd = lambda *a, **k: calls.append(1) or real(*a, **k)
        reached_the_library(fresh(p))
    finally:
        _validate.check_fwd = real
    assert calls == [], "a repeated signature ran the validation"


def problems():
    batched = make_problem(2, 40, 2, initial=bf16, final=bf16, seed=1)
    ckpt = make_problem(2, 40, 1, initial=fp32, final=fp32, seed=4)
    ckpt.update(checkpoint_every=16, checkpoints=torch.full((4, 1, 128, 128), float("nan")))
    plain = make_problem(1, 64, 3, seed=5)
    in_place = make_problem(1, 48, 2, initial=fp32, seed=6)
    in_place["final_state"] = in_place["initial_state"]
    return dict(batched=batched, ckpt=ckpt, plain=plain, in_place=in_place)


@pytest.mark.parametrize("name", list(problems()))
def test_the_prepacked_struct_is_the_validated_one(recorder, name):
    """Each call of a cached signature patches only the pointers: its struct equals, byte for
    byte, the one the validated path packs for the same call (with the workspace's pointer
    and size as the launch sets them)."""
    p = problems()[name]
    call(flash_kda.fwd, p)
    call(flash_kda.fwd, fresh(p))  # the second call makes the record and its launch
    assert [kind for kind, _, _ in recorder.launches] == ["validated", "validated"]
    second = fresh(p)
    call(flash_kda.fwd, second)
    kind, got, _ = recorder.launches[-1]
    assert kind == "prepacked", name
    expected, _ = _launch.native_struct(call(testing.validated_uncached, second), 132)
    workspace = _launch._workspaces[(0, 0)]
    expected.workspace, expected.workspace_bytes = workspace.data_ptr(), workspace.numel()
    assert got == bytes(expected)


def test_index_tensors_on_the_host_are_read_on_every_call(recorder):
    """cu_seqlens on the CPU (the simulated device's too) is checked and copied on every
    call: its signature gets no prepacked launch."""
    p = make_problem(1, 0, 2, lens=[17, 0, 23], initial=fp32, final=fp32, seed=2)
    for _ in range(3):
        call(flash_kda.fwd, fresh(p))
    assert [k for k, _, _ in recorder.launches] == ["validated"] * 3
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        call(flash_kda.fwd, fresh(p), cu_seqlens=torch.tensor([0, 30, 17, 40]))


def test_process_wide_overrides_route_every_native_call_through_the_testing_entry(recorder):
    p = make_problem(1, 32, 2, final=fp32)
    for _ in range(3):
        call(flash_kda.fwd, fresh(p))
    assert [k for k, _, _ in recorder.launches] == ["validated", "validated", "prepacked"]
    with testing.overrides(block_v=64, chunk_tokens=16):
        assert testing.get_overrides() == dict(block_v=64, chunk_tokens=16)
        call(flash_kda.fwd, fresh(p))
        call(flash_kda.fwd, fresh(p))
        for kind, _, overrides in recorder.launches[-2:]:
            assert kind == "validated" and (overrides.block_v, overrides.chunk_tokens) == (64, 16)
    assert testing.get_overrides() == {} and _native.overrides is None
    with pytest.raises(TypeError, match="unknown override 'block'"):
        testing.set_overrides(block=64)


def test_an_unknown_c_refusal_is_the_library_s_error(native):
    """Where the library refuses what the Python checks accept, the call raises the library's
    message (here: an unsupported compute capability)."""
    p = make_problem(1, 32, 2, final=fp32)
    with testing.simulated_native(native, compute_capability=75):
        for _ in range(3):  # validated, validated (making the prepacked launch), prepacked
            with pytest.raises(RuntimeError, match="no kernel for sm_75 in this build"):
                call(flash_kda.fwd, fresh(p))


# ------------------------------------------------------------------ calls without tokens


def empty_problem(kind):
    """(problem, N) without tokens: T = 0, B = 0, varlen sequences all empty (T = 0), or T > 0
    tokens that no sequence holds (cu_seqlens all zero)."""
    if kind == "T0":
        return make_problem(2, 0, 2, initial=fp32, final=fp32, seed=9)
    if kind == "B0":
        return make_problem(0, 16, 2, initial=fp32, final=fp32, seed=9)
    if kind == "varlen-empty":
        return make_problem(1, 0, 2, lens=[0, 0, 0], initial=fp32, final=fp32, seed=9)
    p = make_problem(1, 24, 2, seed=9)
    p.update(cu_seqlens=torch.tensor([0, 0, 0]), initial_state=0.1 * torch.randn(2, 2, 128, 128),
             final_state=torch.full((2, 2, 128, 128), float("nan")))  # fmt: skip
    return p


EMPTY = ["T0", "B0", "varlen-empty", "tokens-outside-sequences"]


@pytest.mark.parametrize("kind", EMPTY)
@pytest.mark.parametrize("states", ["none", "plain", "pool"])
def test_calls_without_tokens_give_the_start_states(kind, states):
    """T = 0, B = 0 or only empty sequences: each sequence's final state is its start state
    (bf16-rounded like any state; zero without one and where has_initial_state is False;
    padding writes nothing), out is untouched (PyTorch path here)."""
    p = empty_problem(kind)
    N = p["final_state"].shape[0]
    if states == "none":
        p["initial_state"] = None
    if states == "pool":
        slots = list(range(1, N)) + [-1] if N else []  # the last sequence is padding
        pool = 0.1 * torch.randn(N + 1, 2, 128, 128)
        p.update(initial_state=pool, final_state=pool.clone(), ssm_state_indices=torch.tensor(slots, dtype=torch.int64))
        p["has_initial_state"] = torch.tensor([i % 2 == 0 for i in range(N)], dtype=torch.bool)
    out_before, final_before = p["out"].clone(), p["final_state"].clone()
    call(flash_kda.fwd, p)
    assert torch.equal(p["out"].view(torch.int16), out_before.view(torch.int16)), "out was written"
    expected = final_before.clone()
    for i in range(N):
        slot = i if p.get("ssm_state_indices") is None else int(p["ssm_state_indices"][i])
        if slot < 0:
            continue
        has = p.get("has_initial_state") is None or bool(p["has_initial_state"][i])
        start = p["initial_state"][slot] if p["initial_state"] is not None and has else torch.zeros(2, 128, 128)
        expected[slot] = start.to(bf16).float()
    assert torch.equal(p["final_state"], expected)


def test_a_call_without_sequences_writes_nothing():
    p = make_problem(1, 24, 2, seed=3)
    p["cu_seqlens"] = torch.tensor([0])
    before = p["out"].clone()
    call(flash_kda.fwd, p)
    assert torch.equal(p["out"].view(torch.int16), before.view(torch.int16))


@pytest.mark.parametrize("kind", EMPTY[:3])
def test_calls_without_tokens_pass_the_library_s_checks(native, kind):
    """On the native path a call without tokens reaches the library (its state copy), with
    NULL pointers for the tensors without elements; one without sequences returns at once."""
    p = empty_problem(kind)
    if p["final_state"].shape[0]:
        reached_the_library(p)
    else:
        call(flash_kda.fwd, p)


# ------------------------------------------------------------------ the workspace cache


def test_the_workspace_is_one_per_stream_and_not_reused_inside_a_capture(monkeypatch):
    """Calls on one stream share its workspace (their order is the stream's); a call on
    another stream gets its own; inside a graph capture every call takes a new one from
    torch's allocator (the graph's pool); one larger than the cache's bound too."""
    device = torch.device("cpu")
    testing.clear_caches()
    monkeypatch.setattr(_launch, "_capturing", lambda: False)
    a = _launch.workspace(device, 0, 11, 1000)
    assert _launch.workspace(device, 0, 11, 800) is a
    b = _launch.workspace(device, 0, 22, 1000)
    assert b is not a and _launch.workspace(device, 1, 11, 1000) is not a
    grown = _launch.workspace(device, 0, 11, 5000)
    assert grown is not a and grown.numel() >= 5000 and _launch.workspace(device, 0, 11, 10) is grown
    monkeypatch.setattr(_launch, "_capturing", lambda: True)
    captured = [_launch.workspace(device, 0, 11, 100) for _ in range(2)]
    assert captured[0] is not grown and captured[1] is not captured[0]
    monkeypatch.setattr(_launch, "_capturing", lambda: False)
    big = _launch.WORKSPACE_CACHE_BYTES + 1
    monkeypatch.setattr(_launch, "WORKSPACE_CACHE_BYTES", 4096)
    assert _launch.workspace(device, 0, 11, 8192) is not _launch.workspace(device, 0, 11, 8192)
    assert big > 4096 and testing.cached_workspaces() == 3
    testing.clear_caches()
    assert testing.cached_workspaces() == 0
