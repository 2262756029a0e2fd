# SPDX-License-Identifier: MIT
"""The signature records of _validate.check_fwd: a call that hits them still runs every
pointer- and content-dependent check (alignment, aliasing, index tensors on the host) and
raises what the full validation raises; grad, inference tensors, FLASH_KDA_EXACT and the
scalars still count; a hit returns the call the full validation returns. Also the pieces of
the native call path (_launch: argument struct, field packers, stream, device switch);
tests/test_fast_path.py has the prepacked launch."""

import ctypes
import math
import re
import threading

import flash_kda
import pytest
import torch
from conftest import FWD_KEYWORDS, call, check, fused_projection_views, make_problem, pooled_problem
from flash_kda import _args, _launch, _layout, _native, _validate, dispatch

DEFAULTS = {a.name: a.default for a in _args.ARGS}  # the keyword-only arguments' defaults

bf16, fp32 = torch.bfloat16, torch.float32
NAN = float("nan")


@pytest.fixture
def full_checks(monkeypatch):
    """An empty cache, and the list of the full validations run since (one entry each)."""
    monkeypatch.setattr(_validate, "_records", {})
    monkeypatch.delenv(_validate.EXACT_ENV, raising=False)
    runs = []
    real = _validate._check_all

    def counting(*args, **keywords):
        runs.append(1)
        return real(*args, **keywords)

    monkeypatch.setattr(_validate, "_check_all", counting)
    return runs


def cache(p, **overrides):
    """Validate p twice: its signature's record is made at its second call."""
    check(p, **overrides)
    check(p, **overrides)
    key = signature(dict(p, **overrides))
    assert isinstance(_validate.record_of(key), _validate.SignatureRecord)


def outcome(fn, p, **overrides):
    """(exception type, message) of fn(p with overrides), or None when it returns."""
    try:
        call(fn, p, **overrides)
    except (TypeError, ValueError, RuntimeError) as err:
        return type(err), str(err)
    return None


def misaligned(x, elements=1):
    """x's values, contiguous, ``elements`` elements into a larger buffer (same signature)."""
    buf = torch.full((x.numel() + elements,), NAN, dtype=x.dtype)
    return buf[elements:].view(x.shape).copy_(x)


def carve(buffer, offset, like):
    """A tensor of like's shape, dtype and values at byte ``offset`` of a uint8 buffer."""
    nbytes = like.numel() * like.element_size()
    return buffer[offset : offset + nbytes].view(like.dtype).view(like.shape).copy_(like)


def serving_problem(seed=0):
    """Varlen on the CPU, an fp32 pool, has_initial_state and checkpoints."""
    p = pooled_problem(1, 0, 2, [1, 0], 2, lens=[20, 12], has_initial=[True, False], seed=seed)
    p.update(checkpoint_every=16, checkpoints=torch.full((1, 2, 128, 128), NAN))
    return p


def overlapping(p, writer, other, at=64):
    """p with ``other`` starting ``at`` bytes into ``writer``'s bytes of one buffer."""
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    buffer = torch.zeros(at + size(p[writer]) + size(p[other]), dtype=torch.uint8)
    return dict(p, **{writer: carve(buffer, 0, p[writer]), other: carve(buffer, at, p[other])})


def partial_states(p):
    """final_state one slot into initial_state's buffer (both [2, ...]): a partial overlap."""
    buffer = torch.zeros(3, *p["initial_state"].shape[1:])
    return dict(p, initial_state=buffer[:2].copy_(p["initial_state"]), final_state=buffer[1:])


# (id, problem, the same signature with one pointer- or content-dependent fault)
FAULTS = [
    ("q-misaligned", lambda: make_problem(1, 4, 2, final=fp32), lambda p: dict(p, q=misaligned(p["q"]))),
    ("g-misaligned", lambda: make_problem(1, 4, 2, final=fp32), lambda p: dict(p, g=misaligned(p["g"], 4))),
    ("out-misaligned", lambda: make_problem(1, 4, 2, final=fp32), lambda p: dict(p, out=misaligned(p["out"]))),
    (
        "initial-misaligned",
        lambda: make_problem(1, 4, 2, initial=fp32, final=fp32),
        lambda p: dict(p, initial_state=misaligned(p["initial_state"])),
    ),
    (
        "final-misaligned",
        lambda: make_problem(1, 4, 2, final=fp32),
        lambda p: dict(p, final_state=misaligned(p["final_state"])),
    ),
    ("checkpoints-misaligned", serving_problem, lambda p: dict(p, checkpoints=misaligned(p["checkpoints"], 2))),
    ("out-overlaps-q", lambda: make_problem(1, 4, 2, final=fp32), lambda p: overlapping(p, "out", "q")),
    ("out-overlaps-beta", lambda: make_problem(2, 4, 2, final=fp32), lambda p: overlapping(p, "out", "beta")),
    ("final-overlaps-dt_bias", lambda: make_problem(1, 4, 2, final=fp32),
     lambda p: overlapping(p, "final_state", "dt_bias")),
    ("checkpoints-overlap-v", serving_problem, lambda p: overlapping(p, "checkpoints", "v")),
    ("out-overlaps-cu_seqlens", serving_problem, lambda p: overlapping(p, "out", "cu_seqlens")),
    ("final-overlaps-indices", serving_problem, lambda p: overlapping(p, "final_state", "ssm_state_indices")),
    ("out-overlaps-final", serving_problem, lambda p: overlapping(p, "out", "final_state")),
    ("states-partial", lambda: make_problem(2, 16, 1, initial=fp32, final=fp32), partial_states),
    ("cu-start", serving_problem, lambda p: dict(p, cu_seqlens=torch.tensor([1, 20, 32]))),
    ("cu-decreasing", serving_problem, lambda p: dict(p, cu_seqlens=torch.tensor([0, 21, 20]))),
    ("cu-beyond-T", serving_problem, lambda p: dict(p, cu_seqlens=torch.tensor([0, 20, 33]))),
    ("indices-repeat", serving_problem, lambda p: dict(p, ssm_state_indices=torch.tensor([1, 1]))),
    ("indices-beyond-P", serving_problem, lambda p: dict(p, ssm_state_indices=torch.tensor([0, 2]))),
]  # fmt: skip


def signature(p):
    return call(_validate.signature, p, **{name: p.get(name, DEFAULTS[name]) for name in FWD_KEYWORDS})


def same_signature(a, b):
    """The problems' keys are equal (so the second call is a cache hit)."""
    return signature(a) is not None and signature(a) == signature(b)


@pytest.mark.parametrize("make,fault", [c[1:] for c in FAULTS], ids=[c[0] for c in FAULTS])
def test_a_cached_signature_still_checks_pointers_and_contents(full_checks, make, fault):
    p = make()
    bad = fault(p)
    assert same_signature(p, bad), "the fault must keep the signature (else this tests nothing)"
    expected = outcome(_validate.check_all, bad)  # the full validation, uncached
    assert expected is not None and expected[0] is ValueError, expected
    full_checks.clear()
    cache(p)
    assert len(full_checks) == 2
    assert outcome(_validate.check_fwd, bad) == expected and len(full_checks) == 2  # a hit, same error
    # the public call: same error, nothing written
    watched = [bad[n] for n in ("out", "final_state", "checkpoints") if bad.get(n) is not None]
    before = [t.clone() for t in watched]
    with pytest.raises(ValueError, match=re.escape(expected[1])):
        call(flash_kda.fwd, bad)
    for t, b in zip(watched, before):
        assert torch.equal(t.view(torch.uint8), b.view(torch.uint8)), "a rejected call wrote"
    assert outcome(_validate.check_fwd, p) is None and len(full_checks) == 2  # the good call still passes, cached


def test_first_fault_wins_on_a_hit_as_in_the_full_validation(full_checks):
    """Two pointer faults at once: the hit reports the one the full validation reports."""
    p = make_problem(1, 4, 2, initial=fp32, final=fp32)
    bad = overlapping(dict(p, initial_state=misaligned(p["initial_state"])), "out", "q")
    expected = outcome(_validate.check_all, bad)
    assert "initial_state must be 16-byte aligned" in expected[1]
    cache(p)
    assert outcome(_validate.check_fwd, bad) == expected and len(full_checks) == 3


def fwd_call_fields(c):
    """A FwdCall as comparable values: tensors by data_ptr, view, dtype, device and bytes."""
    out = []
    for name, value in zip(c._fields, c):
        if name == "record":  # the signature's record, which the uncached validation leaves out
            continue
        if isinstance(value, torch.Tensor):
            data = value.contiguous().view(torch.uint8).tolist()
            where = None if name in ("A_log", "dt_bias") else value.data_ptr()  # widened copies: new each call
            value = (where, value.dtype, tuple(value.shape), value.stride(), value.device, data)
        out.append((name, value))
    return out


def samples():
    batched = make_problem(2, 20, 2, initial=bf16, final=bf16, seed=1)
    varlen = make_problem(1, 0, 2, lens=[17, 0, 23], initial=fp32, final=fp32, seed=2)
    varlen["cu_seqlens"] = varlen["cu_seqlens"].int()
    pool = pooled_problem(1, 0, 2, [2, -1, 0], 3, lens=[20, 5, 30], has_initial=[True, True, False], in_place=True)
    ckpt = make_problem(1, 0, 1, lens=[40, 33], initial=fp32, final=fp32, seed=4)
    ckpt.update(checkpoint_every=16, checkpoints=torch.full((4, 1, 128, 128), NAN))
    strided, _ = fused_projection_views(make_problem(2, 24, 2, final=fp32, seed=5))
    gates = make_problem(1, 8, 3, final=fp32, seed=6)
    gates.update(A_log=gates["A_log"].to(bf16), dt_bias=gates["dt_bias"].reshape(-1))
    unaligned = make_problem(1, 8, 3, seed=7)
    unaligned.update(A_log=misaligned(unaligned["A_log"]), dt_bias=misaligned(unaligned["dt_bias"]))
    return dict(batched=batched, varlen=varlen, pool=pool, ckpt=ckpt, strided=strided, gates=gates, unaligned=unaligned)


@pytest.mark.parametrize("name", list(samples()))
@pytest.mark.parametrize("exact", [None, True, False])
def test_a_hit_returns_the_call_of_the_full_validation(full_checks, name, exact):
    p = dict(samples()[name], exact=exact)
    uncached = call(_validate.check_all, p)
    first, second, third = check(p), check(p), check(p)
    assert len(full_checks) == 3  # check_all above, then the first two check_fwd: the third is a hit
    assert fwd_call_fields(first) == fwd_call_fields(uncached) == fwd_call_fields(second) == fwd_call_fields(third)
    assert uncached.record is first.record is None and second.record is third.record is not None
    for c in (first, second, third):  # the widened gate parameters as the kernels need them
        assert c.A_log.dtype == c.dt_bias.dtype == fp32 and c.dt_bias.shape == (c.heads, 128)
        assert c.A_log.is_contiguous() and c.dt_bias.is_contiguous()
        assert c.A_log.data_ptr() % 16 == 0 and c.dt_bias.data_ptr() % 16 == 0
        if name not in ("gates", "unaligned"):  # fp32, contiguous, aligned: no copy
            assert c.A_log.data_ptr() == p["A_log"].data_ptr() and c.dt_bias.data_ptr() == p["dt_bias"].data_ptr()


def test_a_misaligned_fp32_gate_parameter_is_copied_on_a_hit(full_checks):
    p = make_problem(1, 8, 3, seed=8)
    cache(p)
    bad = dict(p, A_log=misaligned(p["A_log"]), dt_bias=misaligned(p["dt_bias"]))
    c = check(bad)
    assert len(full_checks) == 2
    assert c.A_log.data_ptr() % 16 == 0 and c.dt_bias.data_ptr() % 16 == 0
    assert torch.equal(c.A_log, p["A_log"]) and torch.equal(c.dt_bias, p["dt_bias"])


def test_cpu_index_contents_are_read_on_every_hit(full_checks):
    p = serving_problem()
    cache(p)
    assert check(p).seq_bounds == [0, 20, 32]
    other = dict(p, cu_seqlens=torch.tensor([0, 5, 30]), ssm_state_indices=torch.tensor([0, -1]))
    c = check(other)
    assert len(full_checks) == 2 and c.seq_bounds == [0, 5, 30] and c.cu_seqlens.tolist() == [0, 5, 30]
    assert c.state_indices is other["ssm_state_indices"]


def test_flash_kda_exact_is_read_on_every_call(full_checks, monkeypatch):
    p = make_problem(1, 4, 2, final=fp32)
    modes = []
    monkeypatch.setattr(dispatch, "run", lambda c: modes.append(c.exact))
    cache(p, exact=True)
    cache(p, exact=False)
    full_checks.clear()
    for value, expected in [(None, False), ("1", True), ("0", False), ("1", True), ("true", False)]:
        if value is None:
            monkeypatch.delenv(_validate.EXACT_ENV, raising=False)
        else:
            monkeypatch.setenv(_validate.EXACT_ENV, value)
        assert check(p).exact is expected
        call(flash_kda.fwd, p)
        assert modes[-1] is expected
        assert check(p, exact=True).exact is True and check(p, exact=False).exact is False
    assert not full_checks  # the key holds the resolved mode: every call above was a hit


def test_grad_is_refused_after_a_hit(full_checks):
    p = make_problem(1, 4, 2, final=fp32)
    cache(p)
    for name in ("q", "beta", "A_log", "dt_bias"):
        leaf = p[name].clone().requires_grad_(True)
        with pytest.raises(RuntimeError, match=f"flash_kda.fwd: {name} requires grad"):
            check(p, **{name: leaf})
        with pytest.raises(RuntimeError, match=f"flash_kda.fwd: {name} requires grad"):
            call(flash_kda.fwd, p, **{name: leaf})
        with torch.no_grad():
            check(p, **{name: leaf})  # allowed without grad mode
    with torch.no_grad():
        check(p, A_log=torch.nn.Parameter(p["A_log"].clone()))


def test_inference_outputs_are_refused_after_a_hit(full_checks):
    p = make_problem(1, 4, 2, final=fp32)
    cache(p)
    with torch.inference_mode():
        out = torch.full_like(p["out"], NAN)
    with pytest.raises(ValueError, match="flash_kda.fwd: out is an inference tensor"):
        check(p, out=out)
    with torch.inference_mode():
        check(p, out=out)


@pytest.mark.parametrize("name", ["scale", "lower_bound"])
def test_the_sign_of_a_zero_scalar_is_the_call_s_own(full_checks, name):
    p = make_problem(1, 4, 2)
    cache(p, **{name: 0.0})
    assert math.copysign(1, getattr(check(p, **{name: -0.0}), name)) == -1
    assert math.copysign(1, getattr(check(p, **{name: 0.0}), name)) == 1
    assert len(full_checks) == 2  # 0.0 == -0.0: one signature, but the value is the call's


def test_scalars_of_other_types_are_still_checked(full_checks):
    p = make_problem(1, 4, 2)
    cache(p, scale=1.0, exact=True)
    with pytest.raises(TypeError, match="scale must be a real number, got bool"):
        check(p, scale=True, exact=True)
    with pytest.raises(TypeError, match="exact must be a bool or None, got int"):
        check(p, scale=1.0, exact=1)
    assert check(p, scale=1, exact=True).scale == 1.0
    s = serving_problem()
    cache(s)
    with pytest.raises(TypeError, match="checkpoint_every must be an int, got bool"):
        check(s, checkpoint_every=True)
    with pytest.raises(ValueError, match="checkpoint_every must be a positive multiple of 16"):
        check(s, checkpoint_every=24)


def test_a_signature_gets_its_record_at_its_second_call(full_checks):
    p = make_problem(1, 4, 2)
    assert _validate.record_of(signature(p)) is None
    first = check(p)
    assert _validate._records[signature(p)] is _validate._SEEN  # met once: a mark, no record
    assert _validate.record_of(signature(p)) is None and first.record is None
    second = check(p)
    assert isinstance(_validate.record_of(signature(p)), _validate.SignatureRecord)
    assert second.record is _validate.record_of(signature(p))
    check(p)
    assert len(full_checks) == 2


def test_the_cache_is_bounded(full_checks):
    for T in range(1, 2 * _validate.SIGNATURE_CACHE_SIZE + 2):
        check(make_problem(1, T, 1))
        assert len(_validate._records) <= _validate.SIGNATURE_CACHE_SIZE
    assert len(full_checks) == 2 * _validate.SIGNATURE_CACHE_SIZE + 1


def test_threads_sharing_the_cache_never_skip_a_check(full_checks, monkeypatch):
    """Threads validating good and faulty calls of a few signatures while a tiny cache is
    emptied again and again: every good call passes, every faulty one raises."""
    monkeypatch.setattr(_validate, "SIGNATURE_CACHE_SIZE", 2)
    problems = [make_problem(1, T, 1, final=fp32) for T in (3, 4, 5, 6)]
    faulty = [dict(p, q=misaligned(p["q"])) for p in problems]
    errors = []

    def work(offset):
        try:
            for i in range(150):
                j = (i + offset) % len(problems)
                call(_validate.check_fwd, problems[j])
                with pytest.raises(ValueError, match="q must be 16-byte aligned"):
                    call(_validate.check_fwd, faulty[j])
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# ------------------------------------------------------------------ aliasing: pairs, then pointers


def brute_range(t):
    """[first, last + 1) byte addresses of t from its elements' offsets, independently."""
    if t.numel() == 0:
        return None
    offsets = torch.zeros((), dtype=torch.int64)
    for n, s in zip(t.shape, t.stride()):
        offsets = offsets.unsqueeze(-1) + torch.arange(n) * s
    base, size = t.data_ptr(), t.element_size()
    return base + int(offsets.min()) * size, base + (int(offsets.max()) + 1) * size


@pytest.mark.parametrize("seed", range(30))
def test_no_aliasing_equals_a_brute_force_range_test(seed):
    gen = torch.Generator().manual_seed(seed)
    buffer = torch.zeros(8192, dtype=torch.uint8)

    def view(dtype):
        size = torch.tensor([], dtype=dtype).element_size()
        shape = [int(torch.randint(0, 4, (), generator=gen)) for _ in range(3)]
        strides = [int(torch.randint(1, 40, (), generator=gen)) for _ in range(3)]
        offset = int(torch.randint(0, 512, (), generator=gen))
        return buffer.view(dtype)[: 8192 // size].as_strided(shape, strides, offset)

    outputs = dict(out=view(bf16), final_state=view(fp32), checkpoints=view(fp32) if seed % 3 else None)
    inputs = dict(q=view(bf16), A_log=view(fp32), initial_state=view(fp32), cu_seqlens=view(torch.int64))
    if seed % 5 == 0:
        inputs["initial_state"] = outputs["final_state"]  # the allowed in-place case
    expected = None
    outs = [n for n, t in outputs.items() if t is not None]
    others = outs + [n for n, t in inputs.items() if t is not None]
    for i, name in enumerate(outs):
        a = brute_range(outputs[name])
        for other in others[i + 1 :]:
            u = {**outputs, **inputs}[other]
            b = brute_range(u)
            if expected or a is None or b is None or not (a[0] < b[1] and b[0] < a[1]):
                continue
            if (name, other) == ("final_state", "initial_state") and _layout.same_view(outputs[name], u):
                continue
            expected = f"{name} must not overlap {other} in memory"
    if expected is None:
        _layout.no_aliasing(outputs, inputs)
    else:
        with pytest.raises(ValueError, match=re.escape(expected)):
            _layout.no_aliasing(outputs, inputs)


@pytest.mark.parametrize("writer_first", [True, False])
@pytest.mark.parametrize("gap", [-1, 0, 1])  # bytes between the views: -1 is a one-byte overlap
def test_no_aliasing_at_the_boundary(writer_first, gap):
    buffer = torch.zeros(64, dtype=torch.uint8)
    first, second = buffer[:10], buffer[10 + gap : 20 + gap]
    out, q = (first, second) if writer_first else (second, first)
    if gap < 0:
        with pytest.raises(ValueError, match="out must not overlap q in memory"):
            _layout.no_aliasing(dict(out=out), dict(q=q))
    else:
        _layout.no_aliasing(dict(out=out), dict(q=q))


# ------------------------------------------------------------------ the native call path


def keyword_struct(c, num_sms):
    """flash_kda_fwd_args of validated call c built field by field from the C header's
    meaning of each field: what _launch.native_struct must equal, byte for byte."""
    ptr = lambda x: 0 if x is None or not x.numel() else x.data_ptr()  # noqa: E731
    code = lambda x: {None: 0, bf16: 1, fp32: 2, torch.int32: 3, torch.int64: 4}[  # noqa: E731
        None if x is None or not x.numel() else x.dtype
    ]
    ckpt = c.checkpoints if c.checkpoints is not None and c.checkpoints.numel() else None
    strides = {f"{n}_strides": _native.Strides(*s) for n, s in zip(("q", "k", "v", "g", "out", "beta"), c.strides)}
    return _native.FwdArgs(
        struct_size=ctypes.sizeof(_native.FwdArgs), batch=c.batch, seqlen=c.seqlen, heads=c.heads,
        head_dim=128, num_seqs=c.num_seqs, q=ptr(c.q), k=ptr(c.k), v=ptr(c.v), g=ptr(c.g), beta=ptr(c.beta),
        out=ptr(c.out), A_log=ptr(c.A_log), dt_bias=ptr(c.dt_bias), scale=c.scale, lower_bound=c.lower_bound,
        initial_state=ptr(c.initial_state), final_state=ptr(c.final_state),
        initial_state_dtype=code(c.initial_state), final_state_dtype=code(c.final_state),
        cu_seqlens=ptr(c.cu_seqlens), num_sms=num_sms, cu_seqlens_dtype=code(c.cu_seqlens),
        state_indices=ptr(c.state_indices), state_indices_dtype=code(c.state_indices),
        state_pool_size=c.pool_size if c.state_indices is not None else 0, has_initial_state=ptr(c.has_initial_state),
        checkpoints=ptr(ckpt), checkpoints_dtype=code(ckpt), checkpoint_every=c.checkpoint_every if ckpt is not None
        else 0, checkpoint_slots=ckpt.shape[0] if ckpt is not None else 0,
        mode=_native.MODE_EXACT if c.exact else _native.MODE_AUTO, max_seqlen=c.max_seqlen,
        gate=_native.GATE_CODES[c.gate], g_dtype={bf16: 1, fp32: 2}[c.g.dtype],
        beta_form=_native.BETA_LOGIT if c.beta_is_logit else _native.BETA_PROBABILITY,
        beta_dtype={bf16: 1, fp32: 2}[c.beta.dtype], **strides,
    )  # fmt: skip


@pytest.mark.parametrize("name", list(samples()))
@pytest.mark.parametrize("exact", [True, False])
def test_native_struct_equals_the_field_by_field_struct(name, exact):
    """Every byte of _launch.native_struct equals the struct built field by field, for each
    kind of call (varlen with int32 cu_seqlens, whose longest sequence is the call's
    max_seqlen, pools with indices and has_initial_state, checkpoints, strided views)."""
    c = check(samples()[name], exact=exact)
    for num_sms in (132, 78):
        args, _ = _launch.native_struct(c, num_sms)
        assert bytes(args) == bytes(keyword_struct(c, num_sms)), num_sms


def test_native_struct_strides_and_fields_read_back():
    p, _ = fused_projection_views(make_problem(2, 24, 2, initial=fp32, final=fp32, seed=9))
    p["beta"] = p["beta"][:1].expand(2, 24, 2).clone().transpose(1, 2).contiguous().transpose(1, 2)
    c = check(p, exact=False)
    args, keep = _launch.native_struct(c, 132)
    for name, strides in zip(("q", "k", "v", "g", "out", "beta"), c.strides):
        got = getattr(args, f"{name}_strides")
        assert (got.batch, got.token, got.head) == strides, name
    assert (args.batch, args.seqlen, args.heads, args.head_dim, args.num_seqs) == (2, 24, 2, 128, 2)
    assert (args.num_sms, args.mode) == (132, _native.MODE_AUTO)
    assert (args.reserved0, args.reserved1, args.reserved2, args.reserved3) == (0, 0, 0, 0)
    assert (args.q, args.out, args.A_log) == (c.q.data_ptr(), c.out.data_ptr(), c.A_log.data_ptr())
    assert args.initial_state_dtype == args.final_state_dtype == _native.DTYPE_FP32
    assert (args.cu_seqlens, args.cu_seqlens_dtype, args.checkpoints, args.checkpoint_slots) == (None, 0, None, 0)
    assert (args.scale, args.lower_bound) == (c.scale, c.lower_bound)


@pytest.mark.parametrize("first,last", [("q", "workspace_bytes"), ("state_indices", "checkpoints")])
def test_field_packer_writes_exactly_its_fields(first, last):
    """The packers of the prepacked launch: each value lands in its field, and no byte
    outside the fields first..last is written."""
    at, packer, names = _native.field_packer(_native.FwdArgs, first, last)
    start = getattr(_native.FwdArgs, first).offset
    end = getattr(_native.FwdArgs, last).offset + getattr(_native.FwdArgs, last).size
    assert at == start and packer.size == end - start
    for i, name in enumerate(names):
        args = _native.FwdArgs.from_buffer_copy(b"\xab" * ctypes.sizeof(_native.FwdArgs))
        values = [0] * len(names)
        values[i] = 3
        packer.pack_into(args, at, *values)
        assert getattr(args, name) == 3, name
        raw = bytes(args)
        assert raw[:start] == b"\xab" * start and raw[end:] == b"\xab" * (len(raw) - end), name


def test_current_stream_falls_back_to_the_public_api(monkeypatch):
    asked = []

    class Stream:
        cuda_stream = 1234

    monkeypatch.setattr(_launch, "_raw_stream", None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: asked.append(device) or Stream)
    assert _launch.current_stream(3) == 1234 and asked == [3]
    monkeypatch.setattr(_launch, "_raw_stream", lambda index: 100 + index)
    assert _launch.current_stream(3) == 103


@pytest.mark.parametrize("previous", [0, 1])
def test_the_launch_switches_the_device_and_restores_it(monkeypatch, previous):
    events = []
    monkeypatch.setattr(_launch, "_exchange_device", lambda index: events.append(("set", index)) or previous)
    monkeypatch.setattr(_launch, "_maybe_exchange_device", lambda index: events.append(("restore", index)) or 1)
    old = _launch._switch(1)
    _launch._restore(old, 1)
    assert old == previous
    assert events == [("set", 1)] + ([("restore", 0)] if previous != 1 else [])


def test_the_launch_without_torch_s_device_functions_uses_set_device(monkeypatch):
    events = []
    monkeypatch.setattr(_launch, "_exchange_device", None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: events.append(index))
    _launch._restore(_launch._switch(2), 2)
    assert events == [2, 0]
