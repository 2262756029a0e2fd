# SPDX-License-Identifier: MIT
"""The native library through its C ABI: loading, arch tables, sizes, and errors that
must come back as messages before any launch (so they are testable without a GPU)."""

import ctypes
import re

import flash_kda
import pytest
import torch
from conftest import k1_fit
from flash_kda import _native, _sizes, dispatch, testing

KNOWN = {"sm_90a": 90, "sm_100a": 100, "sm_103a": 103, "sm_110a": 110, "sm_120a": 120, "sm_121a": 121}


@pytest.fixture(scope="module")
def lib():
    lib = _native.load()
    assert lib is not None, f"the installed package must carry its library: {_native.load_error()}"
    return lib


def test_library_loads_without_gpu_and_lists_arches(lib):
    assert lib.archs, "a build has at least one arch table"
    for arch in lib.archs:
        assert KNOWN[arch.name] == arch.compute_capability
        assert arch.features & _native.FEATURE_FWD and arch.features & _native.FEATURE_PROBES
    assert flash_kda.compiled_archs() == [a.name[3:] for a in lib.archs]
    assert len(set(flash_kda.compiled_archs())) == len(lib.archs)


def test_library_abi_version(lib):
    assert lib._lib.flash_kda_abi_version() == _native.ABI_VERSION


@pytest.mark.parametrize("total,heads,seqs", [(1, 1, 1), (8192, 96, 1), (8192, 4, 6), (100, 3, 7), (0, 2, 1)])
def test_workspace_size_agrees_with_python_formula(lib, total, heads, seqs, monkeypatch):
    from_lib = flash_kda.get_workspace_size(total, heads, seqs)
    monkeypatch.setattr(_native, "load", lambda: None)  # the formula used without a library
    assert flash_kda.get_workspace_size(total, heads, seqs) == from_lib
    tiles = -(-total // 16) + seqs
    assert from_lib >= heads * tiles * _sizes.RECORD_BYTES


def test_workspace_size_rejects_bad_sizes(lib):
    with pytest.raises(ValueError, match=re.escape("H must be in [1, 65535], got 0")):
        flash_kda.get_workspace_size(10, 0)
    assert lib._lib.flash_kda_workspace_size(-1, 1, 1) == -1


@pytest.mark.parametrize("pairs,expected", [(1, 32), (6, 32), (33, 32), (34, 64), (66, 64), (67, 128), (500, 128)])
def test_block_v_fills_one_wave(lib, pairs, expected):
    assert lib.pick_block_v(1, pairs, 132) == expected
    assert lib.pick_block_v(pairs, 1, 132) == expected


def valid_args(**overrides):
    """An argument struct that passes every check (pointers are never dereferenced before
    the checks, so any 16-byte-aligned non-null integers do, 4 GiB apart so that no two
    arguments overlap; the workspace 1 TiB at 16 TiB). Plan overrides (block_v,
    segment_chunks, overlap, chunk_tokens) are not fields of the struct since ABI 6: they
    ride along as ``args.overrides`` for the test entry point (plan_for, fwd_for)."""
    fields = dict(
        batch=2,
        seqlen=100,
        heads=4,
        head_dim=128,
        num_seqs=2,
        q=1 << 32,
        k=2 << 32,
        v=3 << 32,
        g=4 << 32,
        beta=5 << 32,
        out=6 << 32,
        A_log=7 << 32,
        dt_bias=8 << 32,
        scale=0.088,
        lower_bound=-5.0,
        workspace=1 << 44,
        workspace_bytes=1 << 40,
        num_sms=132,
    )
    forced = {name: overrides.pop(name) for name in testing.OVERRIDES if name in overrides}
    fields.update(overrides)
    unknown = set(fields) - {name for name, _ in _native.FwdArgs._fields_}
    assert not unknown, unknown  # the ctypes constructor would take them silently
    args = _native.FwdArgs(**fields)
    args.overrides = testing.make_overrides(**forced)
    return args


def plan_for(lib, args, device="h200"):
    """The plan of valid_args' struct, with its overrides, through the test entry point on a
    reference device (the H200's facts: no GPU asked)."""
    forced = {name: getattr(args.overrides, name) for name in testing.OVERRIDES} if args.overrides else {}
    return testing.plan_on(device, args, **{name: value for name, value in forced.items() if value})


def fwd_for(lib, cc, args):
    lib.fwd(cc, args, 0, args.overrides)


def test_unsupported_compute_capability_names_the_build(lib):
    with pytest.raises(RuntimeError) as err:
        lib.fwd(75, valid_args(), 0)
    have = ", ".join(a.name for a in lib.archs)
    assert f"flash_kda_fwd: no kernel for sm_75 in this build (has {have})" in str(err.value)
    assert "UNSUPPORTED_DEVICE" in str(err.value)


BAD_ARGS = [
    (dict(head_dim=64), "head_dim must be 128, got 64"),
    (dict(heads=0), "batch and seqlen must be >= 0 and heads >= 1"),
    (dict(q=None), "q must not be NULL"),
    (dict(v=(3 << 32) + 8), "v must be 16-byte aligned"),
    (dict(num_seqs=3), "num_seqs must be batch"),
    (dict(cu_seqlens=0xA000, num_seqs=2), "batch must be 1 when cu_seqlens is given, got 2"),
    (dict(initial_state_dtype=1), "initial_state pointer and dtype disagree"),
    (
        dict(initial_state=0xB000, initial_state_dtype=1, final_state=0xC000, final_state_dtype=2),
        "initial_state and final_state must have the same dtype",
    ),
    (dict(final_state_dtype=7, final_state=0xC000), "final_state dtype must be NONE, BF16 or FP32, got 7"),
    (dict(lower_bound=0.5), "lower_bound must be in [-5, 0], got 0.5"),
    (dict(scale=float("inf")), "scale must be finite"),
    (dict(block_v=48), "block_v must be 0, 32, 64 or 128, got 48"),
    (dict(num_sms=0), "num_sms must be >= 1"),
    (dict(batch=1 << 20, seqlen=1 << 12, num_seqs=1 << 20), "batch * seqlen must be at most 2^31 - 1"),
    (dict(gate=3), "gate must be LOWER_BOUND (0), SOFTPLUS (1) or LOG_DECAY (2), got 3"),
    (dict(gate=2), "A_log and dt_bias must be NULL with gate LOG_DECAY"),
    (dict(gate=2, A_log=None), "A_log and dt_bias must be NULL with gate LOG_DECAY"),
    (dict(gate=1, A_log=None), "A_log must not be NULL"),
    (dict(g_dtype=2), "g_dtype must be NONE or BF16 (FP32 with gate LOG_DECAY), got 2"),
    (dict(gate=1, g_dtype=2), "g_dtype must be NONE or BF16 (FP32 with gate LOG_DECAY), got 2"),
    (dict(beta_form=2), "beta_form must be LOGIT (0) or PROBABILITY (1), got 2"),
    (dict(beta_dtype=4), "beta_dtype must be NONE, BF16 or FP32, got 4"),
    (dict(beta_dtype=2, beta=0x5002), "beta must be 4-byte aligned"),
    (
        dict(gate=2, A_log=None, dt_bias=None, g_dtype=2, g_strides=_native.Strides(0, 4 * 128 + 2, 128)),
        "g strides must be positive multiples of 4",
    ),
    (dict(g_strides=_native.Strides(0, 4 * 128 + 4, 128)), "g strides must be positive multiples of 8"),
]


@pytest.mark.parametrize(
    "overrides,message", BAD_ARGS, ids=[m.split(" ")[0] + str(i) for i, (_, m) in enumerate(BAD_ARGS)]
)
def test_invalid_arguments_are_rejected_before_launch(lib, overrides, message):
    cc = lib.archs[0].compute_capability
    args = valid_args(**overrides)
    with pytest.raises(RuntimeError) as err:
        fwd_for(lib, cc, args)
    assert str(err.value).startswith("flash_kda_testing_fwd: " if args.overrides else "flash_kda_fwd: ")
    assert message in str(err.value) and "INVALID_ARGUMENT" in str(err.value)


@pytest.mark.gpu
def test_a_workspace_below_the_devices_plan_is_rejected_before_launch(lib):
    """The workspace check needs the plan, and the plan the device's facts: on a GPU."""
    cc = dispatch.device_facts(0)[0]
    with pytest.raises(RuntimeError) as err:
        fwd_for(lib, cc, valid_args(workspace_bytes=100))
    assert "workspace must hold" in str(err.value) and "INVALID_ARGUMENT" in str(err.value)


def test_short_args_struct_is_rejected(lib):
    args = valid_args()
    status = lib._lib.flash_kda_fwd(lib.archs[0].compute_capability, ctypes.byref(args), None)
    assert status == 1  # struct_size 0 < the ABI 1 prefix: INVALID_ARGUMENT
    assert "struct_size must be in [" in lib._lib.flash_kda_last_error().decode()


def test_probe_arguments_are_checked(lib):
    cc = lib.archs[0].compute_capability
    with pytest.raises(RuntimeError, match="op must be EX2, SIGMOID, RSQRT or LG2, got 9"):
        lib.probe_unary(cc, 9, 0x1000, 0x2000, 4, 0)
    with pytest.raises(RuntimeError, match="multiples of 16, 8, 16; got 1, 16, 12, 16"):
        lib.probe_mma(cc, _native.PROBE_MMA_BF16_F32, 0x1000, 0x2000, 0x3000, 1, 16, 12, 16, 0)
    lib.probe_unary(cc, _native.PROBE_EX2, 0, 0, 0, 0)  # nothing to do: no launch, no error


def test_arch_info_index_is_checked(lib):
    desc = _native._ArchDesc()
    assert lib._lib.flash_kda_arch_info(len(lib.archs), ctypes.byref(desc)) == 1
    assert re.search(r"index must be in \[0, \d+\), got \d+", lib._lib.flash_kda_last_error().decode())


# ------------------------------------------------------------------ ABI 2: layout and limits


def test_python_struct_matches_the_c_layout(lib):
    """sizeof and the ABI 1 prefix, as the library reports them in its struct_size message."""
    args = valid_args()
    args.struct_size = 0
    assert (
        lib._lib.flash_kda_fwd_plan(lib.archs[0].compute_capability, ctypes.byref(args), ctypes.byref(plan_info())) == 1
    )
    prefix = _native.FwdArgs.q_strides.offset
    expected = f"args->struct_size must be in [{prefix}, {ctypes.sizeof(_native.FwdArgs)}], got 0"
    assert expected in lib._lib.flash_kda_last_error().decode()


def test_record_bytes_constant_matches_the_library(lib):
    assert lib.record_bytes() == _sizes.RECORD_BYTES


def plan_info():
    return _native.FwdPlan(struct_size=ctypes.sizeof(_native.FwdPlan))


def raw_plan(lib, args, struct_size, device=None):
    """(status, message) of flash_kda_fwd_plan with args.struct_size = struct_size, or of the
    test entry's plan on a reference device (`device`: the same struct, no GPU asked; the
    stable entry plans a valid call for the current device, so needs a GPU)."""
    args.struct_size = struct_size
    if device is None:
        status = lib._lib.flash_kda_fwd_plan(lib.archs[0].compute_capability, ctypes.byref(args),
                                             ctypes.byref(plan_info()))  # fmt: skip
    else:
        on = testing.make_overrides(device=_native.DEVICE_IDS[device])
        status = lib._lib.flash_kda_testing_plan(0, ctypes.byref(args), ctypes.byref(on), ctypes.byref(plan_info()))
    return status, lib._lib.flash_kda_last_error().decode() if status else ""


def raw_fwd(lib, args, struct_size, cc=None):
    """(status, message) of flash_kda_fwd on compute capability ``cc`` (default: the build's
    first arch); a call that fails before any launch."""
    args.struct_size = struct_size
    cc = lib.archs[0].compute_capability if cc is None else cc
    status = lib._lib.flash_kda_fwd(cc, ctypes.byref(args), None)
    return status, lib._lib.flash_kda_last_error().decode() if status else ""


TOO_MANY_TOKENS = "batch * seqlen must be at most 2^31 - 1"
EXTREME_SIZES = [
    ("batch3-seqlen-wraps-to-2", dict(batch=3, seqlen=(2**64 + 2) // 3, num_seqs=3), TOO_MANY_TOKENS),
    ("batch2-seqlen-2^62", dict(batch=2, seqlen=2**62, num_seqs=2), TOO_MANY_TOKENS),
    ("batch4-seqlen-2^62", dict(batch=4, seqlen=2**62, num_seqs=4), TOO_MANY_TOKENS),
    ("num_seqs-2^63-1", dict(num_seqs=2**63 - 1), "num_seqs must be batch (batched) or numel(cu_seqlens) - 1"),
    ("varlen-num_seqs-2^63-1", dict(batch=1, num_seqs=2**63 - 1, cu_seqlens=0xA000), "num_seqs must be batch"),
    ("heads-2^40", dict(heads=2**40), "heads must be <= 65535, got 1099511627776"),
]


@pytest.mark.parametrize("overrides,message", [c[1:] for c in EXTREME_SIZES], ids=[c[0] for c in EXTREME_SIZES])
def test_extreme_sizes_are_invalid_arguments(lib, overrides, message):
    assert (2**64 + 2) // 3 < 2**63  # passed as is: only the product B * T wraps (to 2)
    for fn, name in ((raw_plan, "flash_kda_fwd_plan"), (raw_fwd, "flash_kda_fwd")):
        status, error = fn(lib, valid_args(**overrides), ctypes.sizeof(_native.FwdArgs))
        assert status == 1, name  # INVALID_ARGUMENT
        assert error.startswith(f"{name}: ") and message in error, error


@pytest.mark.parametrize(
    "sizes", [(2**62, 1, 1), (1, 2**40, 1), (1, 1, 2**62), (-(2**63), 1, 1), (2**31 - 1, 65535, 2**30)]
)
def test_workspace_size_of_extreme_sizes_is_minus_one(lib, sizes):
    assert lib._lib.flash_kda_workspace_size(*sizes) == -1


@pytest.mark.parametrize("delta", [-1, ctypes.sizeof(_native.FwdArgs) + 1], ids=["below-abi1-prefix", "above-sizeof"])
def test_struct_size_out_of_range_is_rejected(lib, delta):
    size = _native.FwdArgs.q_strides.offset + delta if delta < 0 else delta
    for fn in (raw_plan, raw_fwd):
        status, error = fn(lib, valid_args(), size)
        assert status == 1 and f"struct_size must be in [{_native.FwdArgs.q_strides.offset}, " in error
        assert error.endswith(f"got {size}")


def abi2_garbage(**overrides):
    """Valid ABI 1 fields, invalid ABI 2 fields (read only when struct_size covers them)."""
    args = valid_args(mode=7, cu_seqlens_dtype=9, **overrides)
    args.q_strides = _native.Strides(3, 3, 3)
    return args


def test_abi1_sized_struct_is_accepted_as_abi1(lib):
    prefix = _native.FwdArgs.q_strides.offset
    assert raw_plan(lib, abi2_garbage(), prefix, device="h200") == (0, "")
    status, error = raw_plan(lib, abi2_garbage(), ctypes.sizeof(_native.FwdArgs))
    assert status == 1 and "mode must be EXACT (0) or AUTO (1), got 7" in error
    # flash_kda_fwd reads the same prefix: every check passes up to the (too small) workspace,
    # which needs the device's plan (without a GPU the driver check stops the call first)
    status, error = raw_fwd(lib, abi2_garbage(workspace_bytes=100), prefix)
    if torch.cuda.is_available():
        assert status == 1 and "workspace must hold" in error, error
    else:
        assert status == 2 and "driver" in error, error


# ------------------------------------------------------------------ get_workspace_size


@pytest.mark.parametrize("bad", [10.0, True, "10", None], ids=["float", "bool", "str", "None"])
@pytest.mark.parametrize("position", [0, 1, 2], ids=["T_total", "H", "N"])
def test_get_workspace_size_rejects_floats(bad, position):
    args = [100, 2, 1]
    args[position] = bad
    name = ("T_total", "H", "N")[position]
    with pytest.raises(TypeError, match=f"get_workspace_size: {name} must be an int, got {type(bad).__name__}"):
        flash_kda.get_workspace_size(*args)


OUT_OF_RANGE = [
    ((-1, 2, 1), "T_total must be in [0, 2147483647], got -1"),
    ((2**31, 2, 1), "T_total must be in [0, 2147483647], got 2147483648"),
    ((1, 0, 1), "H must be in [1, 65535], got 0"),
    ((1, 65536, 1), "H must be in [1, 65535], got 65536"),
    ((1, 1, 0), "N must be in [1, 1073741824], got 0"),
    ((1, 1, 2**30 + 1), "N must be in [1, 1073741824], got 1073741825"),
]


@pytest.mark.parametrize("with_library", [True, False], ids=["library", "formula"])
@pytest.mark.parametrize("sizes,message", OUT_OF_RANGE, ids=[m.split(" ")[0] + str(s) for s, m in OUT_OF_RANGE])
def test_get_workspace_size_bounds_are_value_errors(monkeypatch, lib, with_library, sizes, message):
    if not with_library:
        monkeypatch.setattr(_native, "load", lambda: None)
    with pytest.raises(ValueError, match=re.escape(message)):
        flash_kda.get_workspace_size(*sizes)


@pytest.mark.parametrize("with_library", [True, False], ids=["library", "formula"])
def test_get_workspace_size_beyond_2_pow_50_is_a_value_error(monkeypatch, lib, with_library):
    if not with_library:
        monkeypatch.setattr(_native, "load", lambda: None)
    with pytest.raises(ValueError, match=re.escape("would exceed 2**50 bytes")):
        flash_kda.get_workspace_size(2**31 - 1, 65535, 2**30)
    assert flash_kda.get_workspace_size(2**31 - 1, 1, 1) > 0


@pytest.mark.parametrize(
    "seqlen,heads,segmented",
    [(8192, 1, True), (8192, 6, True), (8192, 12, True), (131072, 4, True), (8192, 96, False), (1024, 8, False)]
    + [(2048, 4, True), (1048576, 16, True), (1048576, 20, False), (131072, 24, False)]
    + [(4096, 12, True), (8192, 14, True), (32768, 16, True), (131072, 16, True)]
    + [(32768, 20, False), (65536, 18, False), (131072, 18, False)],
)
def test_auto_plan_segments_only_chain_bound_calls(lib, seqlen, heads, segmented):
    """The cost model (design §6.3) on an H200-sized GPU: few heads with long
    sequences are split into at least three segments, many heads or short sequences are
    not, and exact mode never is. At 16-24 heads the segments must beat 32-token chunks by
    kSegmentsOver32Margin: T = 1M H = 20 and T = 131072 H = 24 measured slower segmented
    on the H200, T = 1M H = 16 and T = 2048 H = 4 faster. Where
    the 32-token forward has K1 leave the pass's SMs, segments of up to 512 chunks need only
    kSegmentsOver32LeavingMargin: T = 4096 H = 12, T = 8192 H = 14 and T = 32768 - 131072
    H = 16 measured 6-16% faster segmented, T = 65536 H = 18 (820-chunk segments) and
    T = 32768 H = 20 (K1 beside the 32-token pass) not."""
    sizes = dict(batch=1, seqlen=seqlen, heads=heads, num_seqs=1)
    auto = plan_for(lib, valid_args(mode=1, **sizes))
    assert auto.chunk_tokens in (16, 32), auto.chunk_tokens
    chunks = -(-seqlen // auto.chunk_tokens)
    if segmented:
        assert auto.segment_chunks >= 8 and -(-chunks // auto.segment_chunks) >= 3, auto
        assert auto.max_segments == -(-chunks // auto.segment_chunks)
    else:
        assert auto.segment_chunks == 0 and auto.max_segments == 0, auto
    exact = plan_for(lib, valid_args(mode=0, **sizes))
    assert exact.segment_chunks == 0 and exact.chunk_tokens == 16
    forced = plan_for(lib, valid_args(mode=1, segment_chunks=40, **sizes))  # forced segments: 16 tokens
    chunks = -(-seqlen // 16)
    assert forced.chunk_tokens == 16 and forced.segment_chunks == 40 and forced.max_segments == -(-chunks // 40)


@pytest.mark.parametrize(
    "seqlen,heads,block_v",
    [(8192, 32, 64), (32768, 30, 64), (8192, 28, 64), (1024, 32, 64), (2048, 28, 32), (8192, 36, 64), (8192, 48, 64)],
)
@pytest.mark.parametrize("mode", [0, 1])
def test_plan_takes_a_wider_whole_pass_where_predicted_faster(lib, seqlen, heads, block_v, mode):
    """pick_block_v gives the narrowest width whose chains fit one wave (block_v 32 up to
    33 heads on 132 SMs); the plan takes block_v 64 at 28-33 heads where its model predicts
    the call kWiderMargin faster (K1 on the SMs the pass leaves free): on the H200 T = 8192
    H = 32 0.343 -> 0.307 ms, T = 2048 H = 28 slower and kept at 32. Exact mode alike: every
    width gives the same bits."""
    sizes = dict(batch=1, seqlen=seqlen, heads=heads, num_seqs=1)
    plan = plan_for(lib, valid_args(mode=mode, **sizes))
    assert plan.segment_chunks == 0 and plan.block_v == block_v, plan
    assert lib.pick_block_v(1, heads, 132) == (32 if heads <= 33 else 64)
    # With checkpoints the pass is recurrence_kernel's (no warpgroup form): the narrowest width.
    checkpoints = dict(checkpoints=0xA000, checkpoints_dtype=1, checkpoint_slots=1 << 20, checkpoint_every=64)
    checkpointed = plan_for(lib, valid_args(mode=mode, **sizes, **checkpoints))
    assert checkpointed.block_v == lib.pick_block_v(1, heads, 132), checkpointed


@pytest.mark.parametrize(
    "batch,seqlen,heads,chunk_tokens",
    [(1, 2048, 8, 16), (2, 2048, 4, 16), (8, 2048, 1, 16), (1, 2560, 9, 16), (1, 3072, 11, 16)]
    + [(1, 2048, 12, 32), (1, 4096, 16, 32), (1, 1024, 24, 32), (1, 8192, 24, 32), (1, 1024, 28, 32)],
)
def test_auto_plan_short_segments_need_no_margin_over_32_token_chunks(lib, batch, seqlen, heads, chunk_tokens):
    """Segments of at most 32 chunks are taken wherever predicted faster than the 32-token
    forward, without kSegmentsOver32Margin (kShortSegmentChunks): on the H200 T = 2048 H = 8
    ran 48.8 us segmented against 64.5 in 32-token chunks, T = 2560 H = 9 60.0 against 79.3;
    where the 32-token forward is predicted faster it stays."""
    plan = plan_for(lib, valid_args(mode=1, batch=batch, seqlen=seqlen, heads=heads, num_seqs=batch))
    assert plan.chunk_tokens == chunk_tokens, plan
    if chunk_tokens == 16:
        assert 0 < plan.segment_chunks <= 32, plan
    else:
        assert plan.segment_chunks == 0, plan


@pytest.mark.parametrize(
    "seqlen,heads,segment_block_v",
    [(8192, 6, 64), (8192, 12, 64), (32768, 14, 64), (32768, 6, 64), (131072, 4, 128), (1048576, 1, 128)],
)
def test_auto_plan_runs_the_segment_pass_at_64_columns_where_it_is_faster(lib, seqlen, heads, segment_block_v):
    """At block_v 64 the segment pass runs two CTAs an SM. The plan takes that width where the
    pass's CTAs fit one such wave on the 132 SMs, or where its chains are at most 128 links
    over more waves (T = 32768 H = 6, L = 94: 0.3044 -> 0.3003 ms on one H200 (machine A), 0.305 ->
    0.311 on a hotter one (machine B): at 79-128 links the widths' order follows the power headroom), and keeps
    block_v 128 for longer chains over more than one wave (slower at 64 there: T = 131072
    H = 4 with L = 249, T = 1M with L = 512)."""
    auto = plan_for(lib, valid_args(mode=1, batch=1, seqlen=seqlen, heads=heads, num_seqs=1))
    assert auto.segment_block_v == segment_block_v, auto
    chunks = -(-seqlen // 16)
    segments = -(-chunks // auto.segment_chunks)
    # Value columns of segments 0 .. P-2 and transition columns of 1 .. P-2, 64 a CTA.
    ctas_at_64 = heads * 2 * ((segments - 1) + (segments - 2))
    assert (ctas_at_64 <= 2 * 132 or auto.segment_chunks <= 128) == (segment_block_v == 64), (ctas_at_64, auto)


@pytest.mark.parametrize(
    "mode,batch,seqlen,heads,varlen,expect",
    [
        (0, 1, 8192, 6, False, "runs"),  # exact, few heads: K1 hides behind the 512-link chain
        (0, 1, 8192, 24, False, "leaves"),  # 36 free SMs write the records after K1's lead
        (1, 8, 1024, 8, False, "runs"),  # block_v 64: four K1 CTAs fit beside the warpgroup pass
        (0, 1, 8192, 96, False, "leaves"),  # block_v 128: no room beside; 36 SMs after a lead
        (1, 1, 8192, 64, False, "runs"),  # 128 pass CTAs: K1 needs room beside them
        (1, 1, 8192, 6, False, "never"),  # segmented: the segment pass fills the GPU
        (0, 64, 512, 8, False, "never"),  # 512 block_v 128 CTAs in four waves: K1 first
        (0, 1, 8192, 6, True, "never"),  # varlen: records by sequence
    ],
)
def test_plan_overlaps_k1_only_where_it_pays(lib, mode, batch, seqlen, heads, varlen, expect):
    """K1 beside the whole-sequence pass (design section 4.7) on an H200-sized GPU. The
    plan's overlap_min_ctas is the fewest K1 CTAs per SM beside the pass with which the
    overlap pays; on the H200 three fit beside the <1, 4> pass (block_v 32), four beside the
    warpgroup pass at block_v 64, none beside it at block_v 128 (its twelve warps hold the
    register file), and every call here needs at most that many. overlap_max_ctas
    (>= overlap_min_ctas) is how many the first K1 grid keeps beside the pass: one where
    the SMs the pass leaves free can carry K1 (T=8192 H=48: 96 pass CTAs on 132 SMs), all
    that fit where the pass fills the GPU (H=64 at block_v 64: 128 CTAs).
    Where the free SMs can write the records after a lead, K1 leaves the pass's SMs instead
    (overlap_max_ctas 0; T=8192 H=24 exact, 96 pass CTAs at block_v 32).
    Varlen and segmented calls never overlap. overlap=1 forces it where it can run, -1
    turns it off, 2 forces K1 to leave the pass's SMs where the pass leaves SMs free
    (overlap_max_ctas 0), and 3 is refused."""
    sizes = dict(batch=batch, seqlen=seqlen, heads=heads, num_seqs=batch)
    if varlen:
        sizes.update(cu_seqlens=0xA000, num_seqs=3)
    plan = plan_for(lib, valid_args(mode=mode, **sizes))
    k, fit = plan.overlap_min_ctas, 4 if plan.block_v == 64 else 3
    assert {"runs": 1 <= k <= fit, "leaves": k == 1, "never": k == 0}[expect], (k, plan.block_v)
    free_sms = 132 - batch * heads * (128 // plan.block_v)
    if expect == "never":
        assert plan.overlap_max_ctas == 0
    elif expect == "leaves":
        assert plan.overlap_max_ctas == 0 and plan.overlap_lead > 0, plan
    elif free_sms >= 36:
        assert plan.overlap_max_ctas == k == 1, (plan.overlap_max_ctas, k, free_sms)
    else:
        assert plan.overlap_max_ctas >= fit, (plan.overlap_max_ctas, free_sms)
    assert plan_for(lib, valid_args(mode=mode, overlap=-1, **sizes)).overlap_min_ctas == 0
    forced = plan_for(lib, valid_args(mode=mode, overlap=1, **sizes)).overlap_min_ctas
    assert forced == (0 if expect == "never" else 1)
    leaving = plan_for(lib, valid_args(mode=mode, overlap=2, **sizes))
    assert leaving.overlap_min_ctas == (0 if expect == "never" else 1)
    if expect != "never":
        assert (leaving.overlap_max_ctas == 0) == (free_sms > 0), (leaving.overlap_max_ctas, free_sms)
    with pytest.raises(RuntimeError, match=re.escape("overlap must be -1, 0, 1 or 2, got 3")):
        plan_for(lib, valid_args(mode=mode, overlap=3, **sizes))


@pytest.mark.parametrize(
    "sizes",
    [
        dict(mode=1, batch=1, num_seqs=1, seqlen=8192, heads=6),  # segments
        dict(mode=1, batch=1, num_seqs=1, seqlen=8192, heads=96),  # K1 leaving after a lead
        dict(mode=1, batch=1, num_seqs=1, seqlen=8192, heads=24),  # 32-token chunks, K1 beside
        dict(mode=0, batch=4, num_seqs=4, seqlen=1000, heads=8, checkpoint_every=256),
        dict(mode=1, batch=1, num_seqs=5, seqlen=9000, heads=6, cu_seqlens=0xA000, max_seqlen=5000),
    ],
    ids=["segments", "leave", "chunk32", "checkpoints", "varlen"],
)
def test_the_plan_reads_only_the_plan_inputs(lib, sizes):
    """The library remembers plans by their inputs (src/plan_cache.cpp: the sizes, the mode,
    num_sms, checkpoint_every, max_seqlen, the gate and whether cu_seqlens is set), and a signature
    record keeps its workspace size: so no other field of the argument struct (pointers,
    strides, dtypes, scalars, pools, checkpoints) may change the plan. Each such field is
    changed alone."""
    keyed = {"batch", "seqlen", "heads", "num_seqs", "checkpoint_every", "max_seqlen", "mode", "num_sms", "gate"}
    keyed |= {"cu_seqlens", "head_dim", "struct_size", "reserved0", "reserved1", "reserved2", "reserved3"}
    base = valid_args(**sizes)
    want = plan_values(plan_for(lib, base))
    changed = 0
    for name, kind in _native.FwdArgs._fields_:
        if name in keyed:
            continue
        args = valid_args(**sizes)
        old = getattr(args, name)
        if kind is _native.Strides:
            new = _native.Strides(batch=1 << 20, token=4096, head=128)
        elif isinstance(old, float):
            new = old + 0.5
        else:  # integers and pointers (None for NULL)
            new = (old or 0) + 0x100
        setattr(args, name, new)
        assert plan_values(plan_for(lib, args)) == want, name
        changed += 1
    assert changed >= 30  # every pointer, stride, dtype and scalar outside the key
    assert plan_values(plan_for(lib, valid_args(**{**sizes, "heads": sizes["heads"] + 40}))) != want


@pytest.mark.parametrize("mode", [0, 1], ids=["exact", "auto"])
def test_k1_leaves_the_pass_sms_where_the_free_sms_carry_it(lib, mode):
    """K1 leaving the pass's SMs (design section 4.7) on an H200-sized GPU: the plan takes
    it at T=8192 H=40 (block_v 64: 80 pass CTAs leave 52 SMs free, which write most of the
    records while the pass reads them, after a lead) and at H=96 (block_v 128, whose pass
    leaves no room for a K1 CTA beside it: 36 free SMs after a longer lead), runs K1 first
    at 64 x 512 tokens H=8 (block_v 128 in four waves: no SM free), and reports a lead where
    the free SMs need one (H=24 with 16-token chunks; with 32-token chunks the automatic
    path keeps K1 beside that pass, as the next test shows)."""

    def plan(**sizes):
        return plan_for(lib, valid_args(mode=mode, batch=1, num_seqs=1, seqlen=8192, **sizes))

    h40 = plan(heads=40)
    assert (h40.overlap_min_ctas, h40.overlap_max_ctas) == (1, 0) and 0 < h40.overlap_lead < 40 * 512 // 2, h40
    h96 = plan(heads=96)
    assert (h96.block_v, h96.overlap_min_ctas, h96.overlap_max_ctas) == (128, 1, 0), h96
    assert 40 * 512 // 2 < h96.overlap_lead < 96 * 512, h96
    waves = plan_for(lib, valid_args(mode=mode, batch=64, num_seqs=64, seqlen=512, heads=8))
    assert (waves.block_v, waves.overlap_min_ctas, waves.overlap_max_ctas) == (128, 0, 0), waves
    h24 = plan(heads=24, chunk_tokens=16)
    assert h24.overlap_max_ctas == 0 and h24.overlap_lead > 0, h24
    # H=48 at block_v 64: 96 CTAs of the warpgroup pass (sm_90a, 0.56 us a link), one K1
    # CTA kept on each of their SMs (H200: 0.425 ms against 0.436 with K1 leaving after a
    # lead).
    h48 = plan(heads=48)
    assert (h48.block_v, h48.overlap_max_ctas, h48.overlap_lead) == (64, 1, 0), h48


def test_32_token_k1_runs_beside_only_the_pass_it_fits_beside(lib):
    """K1's 32-token CTAs (80 registers, 8 warps) fit beside one CTA of the 32-token <1, 4>
    pass (block_v 32) and beside none of <1, 8> (block_v 64; config.h prepare32_beside):
    wherever a plan with 32-token chunks keeps K1 beside the pass on its SMs
    (overlap_max_ctas > 0), block_v is 32; at block_v 64, also where the overlap is forced
    (1), K1 leaves the pass's SMs (overlap_max_ctas 0) or runs first."""
    beside = leaving = 0
    for seqlen in (1024, 2048, 8192, 32768):
        for heads in (1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48):
            for overlap in (0, 1, 2):
                for block_v in (0, 32, 64):
                    sizes = dict(batch=1, num_seqs=1, seqlen=seqlen, heads=heads)
                    if block_v and heads * 128 // block_v > 132:
                        continue
                    args = valid_args(mode=1, overlap=overlap, chunk_tokens=32, block_v=block_v, **sizes)
                    plan = plan_for(lib, args)
                    assert plan.chunk_tokens == 32
                    if plan.overlap_min_ctas == 0:
                        continue
                    if plan.overlap_max_ctas > 0:
                        beside += 1
                        assert plan.block_v == 32 and overlap != 2, (sizes, overlap, plan)
                    else:
                        leaving += 1
                    if plan.block_v == 64 and overlap == 1:
                        assert plan.overlap_max_ctas == 0, (sizes, plan)
    assert beside > 0 and leaving > 0


@pytest.mark.parametrize("device", testing.REFERENCE_DEVICES)
def test_every_gates_plan_keeps_beside_the_pass_only_the_k1_ctas_that_fit(lib, device):
    """K1 beside the whole-sequence pass (design section 4.7) needs overlap_min_ctas of the
    call's K1 CTAs to fit beside each pass CTA, or the launch runs K1 first: so every gate's
    plan that keeps K1 beside the pass asks for at most the CTAs of its K1 that fit there,
    the device's k1_beside for the bounded gate and k1_beside_unbounded for softplus and the
    log decay (their 16-token overlap kernel holds 64 registers against 40: two beside the
    H200's block_v 32 and 64 passes, not three and four). At T=8192 H=64 the bounded gate
    keeps K1 beside the block_v 64 pass and the unbounded gates take block_v 128 with K1
    leaving the pass's SMs (H200, 2026-12-04: 1.063-1.076x the bounded gate, against
    1.13-1.16x with K1 first at block_v 64)."""
    facts = testing.reference_device(device)
    forms = {gate: dict(gate=code, **(dict(A_log=None, dt_bias=None) if gate == "log_decay" else {}))
             for gate, code in _native.GATE_CODES.items()}  # fmt: skip
    beside = 0
    for gate, form in forms.items():
        for batch, seqlen in ((1, 2048), (1, 8192), (4, 8192)):
            for heads in (8, 14, 16, 24, 28, 32, 48, 56, 64, 96):
                sizes = dict(batch=batch, num_seqs=batch, seqlen=seqlen, heads=heads)
                plan = plan_for(lib, valid_args(mode=1, **sizes, **form), device)
                if plan.overlap_min_ctas == 0 or plan.overlap_max_ctas == 0:
                    continue  # K1 first, or leaving the pass's SMs
                beside += 1
                fit = k1_fit(facts, plan.block_v, plan.chunk_tokens // 16, unbounded=gate != "lower_bound")
                assert plan.overlap_min_ctas <= fit, (gate, sizes, plan.block_v, plan.overlap_min_ctas, fit)
    assert beside > 0 or device == "sm120"  # no K1 CTA fits beside a pass under sm_120's limits
    if device == "h200":
        h64 = {gate: plan_for(lib, valid_args(mode=1, batch=1, num_seqs=1, seqlen=8192, heads=64, **form))
               for gate, form in forms.items()}  # fmt: skip
        assert (h64["lower_bound"].block_v, h64["lower_bound"].overlap_max_ctas) == (64, 12), h64
        for gate in ("softplus", "log_decay"):
            assert (h64[gate].block_v, h64[gate].overlap_min_ctas, h64[gate].overlap_max_ctas) == (128, 1, 0), gate


def test_chunk_length_rules(lib):
    """Chunks are 16 tokens in exact mode and with segments; AUTO mode may pick 32 (design
    section 4.8) only where checkpoint_every is a multiple of 32, and only for the widths
    built for them (block_v 32, 64); a forced length outside those rules is refused with
    the reason."""
    sizes = dict(batch=1, seqlen=8192, heads=6, num_seqs=1)
    assert plan_for(lib, valid_args(mode=0, **sizes)).chunk_tokens == 16
    assert plan_for(lib, valid_args(mode=1, chunk_tokens=16, **sizes)).chunk_tokens == 16
    assert plan_for(lib, valid_args(mode=1, chunk_tokens=32, **sizes)).chunk_tokens == 32
    assert plan_for(lib, valid_args(mode=1, segment_chunks=40, **sizes)).chunk_tokens == 16
    with_checkpoints = dict(sizes, checkpoints=0xA000, checkpoints_dtype=1, checkpoint_slots=1 << 20)
    assert plan_for(lib, valid_args(mode=1, checkpoint_every=48, **with_checkpoints)).chunk_tokens == 16
    for overrides, reason in [
        (dict(mode=0, chunk_tokens=32), "chunk_tokens 32 needs mode AUTO, got mode 0"),
        (dict(mode=1, chunk_tokens=24), "chunk_tokens must be 0, 16 or 32, got 24"),
        (dict(mode=1, chunk_tokens=32, checkpoint_every=48, **with_checkpoints), "multiple of 32 (or 0), got 48"),
        (dict(mode=1, chunk_tokens=32, segment_chunks=8), "segment_chunks needs 16-token chunks"),
        (dict(mode=1, chunk_tokens=32, block_v=128), "chunk_tokens 32 needs block_v 32 or 64"),
        (dict(mode=1, chunk_tokens=32, heads=96), "no 32-token kernel is built for 128"),
    ]:
        args = valid_args(**dict(sizes, **overrides))
        with pytest.raises(RuntimeError, match=re.escape(reason)):
            plan_for(lib, args)


def test_every_gate_plans_32_token_chunks_alike(lib):
    """The unbounded gates have 32-token records too (design section 2.5), at the bounded
    gate's rates: each gate's plan is the bounded gate's where AUTO mode picks 32-token chunks
    and where they are forced."""
    sizes = dict(mode=1, batch=1, seqlen=8192, heads=24, num_seqs=1)
    assert plan_for(lib, valid_args(**sizes)).chunk_tokens == 32
    for gate in (1, 2):
        for extra in ({}, dict(chunk_tokens=32)):
            got = plan_for(lib, valid_args(gate=gate, **sizes, **extra))
            assert plan_values(got) == plan_values(plan_for(lib, valid_args(**sizes, **extra)))


def test_unbounded_gates_plan_with_their_own_k1_rates(lib):
    """The unbounded gates' 16-token K1 is slowest as a lone CTA beside a pass CTA (costs.h
    k1_16_unbounded): at T=8192 H=48 the bounded gate keeps one K1 CTA beside each block_v 64
    pass CTA, the unbounded gates run the block_v 128 pass with K1 on the SMs it leaves free."""
    sizes = dict(mode=1, batch=1, seqlen=8192, heads=48, num_seqs=1)
    bounded = plan_for(lib, valid_args(**sizes))
    assert (bounded.chunk_tokens, bounded.block_v, bounded.overlap_max_ctas) == (16, 64, 1)
    for gate in (1, 2):
        got = plan_for(lib, valid_args(gate=gate, **sizes))
        assert (got.chunk_tokens, got.block_v, got.overlap_min_ctas, got.overlap_max_ctas) == (16, 128, 1, 0)


def test_32_token_workspace_holds_its_records(lib):
    """A 32-token plan's workspace holds H (ceil(T / 32) + N) records of 28,288 bytes
    (workspace.h RecordLayout<2>) besides its flags and segment buffers."""
    for batch, seqlen, heads in [(1, 8192, 6), (3, 1000, 2), (1, 1, 1)]:
        sizes = dict(batch=batch, seqlen=seqlen, heads=heads, num_seqs=batch)
        plan = plan_for(lib, valid_args(mode=1, chunk_tokens=32, **sizes))
        records = heads * (-(-batch * seqlen // 32) + batch) * 28288
        assert plan.workspace_bytes >= records, (plan.workspace_bytes, records)


def test_plan_info_of_abi_3_callers(lib):
    """A caller built against ABI 3 passes the shorter plan struct: it gets the fields it
    has, and nothing past its struct_size is written."""
    buf = (ctypes.c_uint8 * ctypes.sizeof(_native.FwdPlan))(*([0xAB] * ctypes.sizeof(_native.FwdPlan)))
    plan = _native.FwdPlan.from_buffer(buf)
    plan.struct_size = _native.FwdPlan.chunk_tokens.offset
    args = valid_args(mode=1)
    args.struct_size = ctypes.sizeof(_native.FwdArgs)
    on = testing.make_overrides(device=_native.DEVICE_IDS["h200"])  # the H200's facts, no GPU asked
    assert lib._lib.flash_kda_testing_plan(0, ctypes.byref(args), ctypes.byref(on), ctypes.byref(plan)) == 0
    assert plan.block_v in (32, 64, 128) and plan.workspace_bytes > 0
    assert bytes(buf[_native.FwdPlan.chunk_tokens.offset :]) == b"\xab" * (
        len(buf) - _native.FwdPlan.chunk_tokens.offset
    )


# ------------------------------------------------------------------ ABI 5: the longest sequence


def plan_values(plan):
    """Every field of a flash_kda_fwd_plan_info, for comparing two plans."""
    return [getattr(plan, name) for name, _ in _native.FwdPlan._fields_]


SKEWED = dict(batch=1, seqlen=8000, num_seqs=11, cu_seqlens=0xA000)  # [7000] + [100] * 10 tokens


@pytest.mark.parametrize("heads", [4, 6, 8, 12])
def test_varlen_plan_follows_the_longest_sequence_hint(lib, heads):
    """Without max_seqlen a varlen plan sees the mean length: [7000] + [100] * 10 tokens look
    like eleven chains of 46 chunks, so it runs one whole pass, and the 7000-token sequence is a
    chain of 438 links (H200, H = 6: 0.267 ms). With the hint it plans for that chain and splits
    it into segments."""
    mean = plan_for(lib, valid_args(mode=1, heads=heads, **SKEWED))
    hinted = plan_for(lib, valid_args(mode=1, heads=heads, max_seqlen=7000, **SKEWED))
    assert mean.segment_chunks == 0, mean
    assert hinted.chunk_tokens == 16 and -(-438 // hinted.segment_chunks) >= 3, hinted
    # varlen grids are sized from the total and the count, whatever the hint
    assert hinted.max_segments == -(-(500 + 11) // hinted.segment_chunks) + 11, hinted
    # EXACT mode's plan (widths only) is not measured with the hint and ignores it
    exact = plan_for(lib, valid_args(mode=0, heads=heads, **SKEWED))
    exact_hinted = plan_for(lib, valid_args(mode=0, heads=heads, max_seqlen=7000, **SKEWED))
    assert plan_values(exact_hinted) == plan_values(exact)


@pytest.mark.parametrize("heads", [2, 6, 24, 96])
def test_hint_at_the_mean_length_or_in_batched_mode_changes_nothing(lib, heads):
    """A hint no longer than the mean (equal lengths) gives the mean's plan, and batched calls
    ignore it."""
    varlen = dict(batch=1, seqlen=8192, heads=heads, num_seqs=4, cu_seqlens=0xA000)
    plan = plan_for(lib, valid_args(mode=1, **varlen))
    for hint in (1, 2048):
        assert plan_values(plan_for(lib, valid_args(mode=1, max_seqlen=hint, **varlen))) == plan_values(plan), hint
    batched = dict(batch=4, seqlen=2048, heads=heads, num_seqs=4)
    plan = plan_for(lib, valid_args(mode=1, **batched))
    assert plan_values(plan_for(lib, valid_args(mode=1, max_seqlen=17, **batched))) == plan_values(plan)


def test_max_seqlen_is_checked_and_absent_for_abi_4_callers(lib):
    """max_seqlen must be in [0, seqlen]; a caller built against ABI 4 passes the struct
    without it, which reads as 0 (unknown)."""
    for bad in (-1, 8001):
        with pytest.raises(RuntimeError, match=re.escape(f"max_seqlen must be in [0, seqlen 8000], got {bad}")):
            plan_for(lib, valid_args(mode=1, heads=6, max_seqlen=bad, **SKEWED))
    args = valid_args(mode=1, heads=6, max_seqlen=-1, **SKEWED)
    assert raw_plan(lib, args, _native.FwdArgs.max_seqlen.offset, device="h200") == (0, "")
    assert raw_plan(lib, args, ctypes.sizeof(_native.FwdArgs))[0] == 1


# ------------------------------------------------------------------ ABI 6


@pytest.mark.parametrize("index,field", list(enumerate(["block_v", "segment_chunks", "overlap", "chunk_tokens"])))
def test_the_retired_plan_overrides_must_be_zero(lib, index, field):
    """ABI 6 moved the plan overrides to flash_kda_testing.h; their slots in flash_kda_fwd_args
    stay, reserved: a caller of ABI 5 that sets one is refused with the reason, one that
    leaves them 0 (or passes a struct without them) runs unchanged."""
    args = valid_args()
    setattr(args, f"reserved{index}", 64)
    for fn, name in ((raw_plan, "flash_kda_fwd_plan"), (raw_fwd, "flash_kda_fwd")):
        status, error = fn(lib, args, ctypes.sizeof(_native.FwdArgs))
        assert status == 1 and error.startswith(f"{name}: args->reserved{index} must be 0, got 64"), error
        assert f"ABI 5's {field}" in error and "flash_kda_testing.h" in error
    offset = getattr(_native.FwdArgs, f"reserved{index}").offset
    if offset >= _native.FwdArgs.q_strides.offset:  # a shorter struct without the slot reads it as 0
        assert raw_plan(lib, args, offset, device="h200") == (0, "")


def raw_testing_plan(lib, args, overrides):
    """(status, message) of flash_kda_testing_plan (overrides.device names the device)."""
    args.struct_size = ctypes.sizeof(_native.FwdArgs)
    plan = plan_info()
    status = lib._lib.flash_kda_testing_plan(0, ctypes.byref(args), ctypes.byref(overrides), ctypes.byref(plan))
    return status, lib._lib.flash_kda_last_error().decode() if status else "", plan


def test_the_testing_entry_points(lib):
    """flash_kda_testing.h: its own version; NULL overrides is the stable entry's plan; the
    overrides' prefix rule (fields past struct_size read as 0, a larger struct is refused);
    and the testing forward runs the same checks as flash_kda_fwd."""
    assert lib._lib.flash_kda_testing_version() == _native.TESTING_VERSION
    sizes = dict(mode=1, batch=1, num_seqs=1, seqlen=8192, heads=6)
    own = plan_values(plan_for(lib, valid_args(**sizes)))
    args = valid_args(**sizes)
    args.struct_size = ctypes.sizeof(_native.FwdArgs)
    h200 = _native.TestingOverrides(
        struct_size=ctypes.sizeof(_native.TestingOverrides), device=_native.DEVICE_IDS["h200"]
    )
    status, error, plan = raw_testing_plan(lib, args, h200)
    assert status == 0 and plan_values(plan) == own, error
    if torch.cuda.is_available():  # NULL overrides: the stable entry's plan, for this GPU
        stable, mine = plan_info(), plan_info()
        cc = dispatch.device_facts(0)[0]
        assert lib._lib.flash_kda_testing_plan(cc, ctypes.byref(args), None, ctypes.byref(mine)) == 0
        assert lib._lib.flash_kda_fwd_plan(cc, ctypes.byref(args), ctypes.byref(stable)) == 0
        assert plan_values(mine) == plan_values(stable)
    # The device comes last in the struct: a prefix of block_v alone would leave it 0 (the GPU).
    forced = _native.TestingOverrides(block_v=32, segment_chunks=40, overlap=-1, chunk_tokens=16,
                                      device=_native.DEVICE_IDS["h200"])  # fmt: skip
    forced.struct_size = ctypes.sizeof(_native.TestingOverrides)
    status, error, plan = raw_testing_plan(lib, args, forced)
    assert status == 0 and (plan.block_v, plan.segment_chunks) == (32, 40)
    for size in (0, 3, ctypes.sizeof(_native.TestingOverrides) + 4):
        forced.struct_size = size
        status, error, _ = raw_testing_plan(lib, args, forced)
        assert status == 1 and "overrides->struct_size must be in [4, " in error and error.endswith(f"got {size}")
    with pytest.raises(RuntimeError, match="flash_kda_testing_fwd: v must be 16-byte aligned"):
        fwd_for(lib, lib.archs[0].compute_capability, valid_args(v=(3 << 32) + 8, block_v=64))


# (id, fields, the message): each output placed across another argument's bytes. valid_args'
# activations are [2, 100, 4, 128] bf16 (204,800 bytes each) unless moved.
ACT = 2 * 100 * 4 * 128 * 2
OVERLAPS = [
    ("out-on-q", dict(q=0x100000, out=0x100000 + ACT - 16), "out must not overlap q in memory"),
    ("q-on-out", dict(q=0x100000 + ACT - 16, out=0x100000), "out must not overlap q in memory"),
    ("out-on-beta", dict(beta=0x200000, out=0x200000 - ACT + 16), "out must not overlap beta in memory"),
    ("final-on-dt_bias", dict(dt_bias=0x300000, final_state=0x300000 - 16, final_state_dtype=2),
     "final_state must not overlap dt_bias in memory"),
    ("states-partial", dict(initial_state=0x400000, initial_state_dtype=1, final_state=0x400000 + 1024,
                            final_state_dtype=1), "final_state must not overlap initial_state in memory"),
    ("workspace-on-out", dict(out=0x500000, workspace=0x500000 + 4096), "out must not overlap workspace in memory"),
    ("checkpoints-on-v", dict(v=0x600000, checkpoints=0x600000 + 64, checkpoints_dtype=1, checkpoint_every=16,
                              checkpoint_slots=1), "checkpoints must not overlap v in memory"),
    ("out-on-cu_seqlens", dict(batch=1, seqlen=200, num_seqs=3, cu_seqlens=0x700000, out=0x700000 - ACT + 16),
     "out must not overlap cu_seqlens in memory"),
]  # fmt: skip


@pytest.mark.parametrize("fields,message", [c[1:] for c in OVERLAPS], ids=[c[0] for c in OVERLAPS])
def test_outputs_overlapping_another_argument_are_refused(lib, fields, message):
    """Since ABI 6 the library itself checks, on every call, that no output (out,
    final_state, checkpoints, workspace) shares a byte with another argument, from each
    pointer and the extent its sizes and strides give; nothing is launched."""
    base = dict(workspace=1 << 44, workspace_bytes=1 << 30)
    status, error = raw_fwd(lib, valid_args(**{**base, **fields}), ctypes.sizeof(_native.FwdArgs))
    assert status == 1 and error == f"flash_kda_fwd: {message}", error


def test_in_place_states_and_adjacent_arguments_pass_the_overlap_check(lib):
    """final_state at initial_state itself (in place) and arguments that touch without
    sharing a byte are accepted: the call gets past every pointer check to the driver check
    (UNSUPPORTED_DEVICE on a machine without a driver) or, on a GPU, to the workspace check,
    which its 16-byte workspace fails. (With a workspace that passes it the call launched on
    these made-up pointers, and the faulted context failed the GPU tests after it.)"""
    fields = dict(q=0x100000, out=0x100000 + ACT, initial_state=0x400000, initial_state_dtype=1,
                  final_state=0x400000, final_state_dtype=1, workspace_bytes=16)  # fmt: skip
    status, error = raw_fwd(lib, valid_args(**fields), ctypes.sizeof(_native.FwdArgs))
    assert status != 1 or "workspace must hold" in error, error


@pytest.mark.parametrize(
    "sizes",
    [dict(batch=0, num_seqs=0), dict(seqlen=0), dict(batch=1, seqlen=0, num_seqs=3, cu_seqlens=0xA000),
     dict(batch=1, seqlen=64, num_seqs=0, cu_seqlens=0xA000)],
    ids=["B0", "T0", "varlen-T0", "varlen-N0"],
)  # fmt: skip
def test_calls_without_tokens_or_sequences_need_no_workspace(lib, sizes):
    """A call without tokens (or without sequences) has the empty plan: no workspace; its
    activations and workspace may be NULL (a tensor without elements). One without
    sequences returns at once; one with sequences gets to the driver check or launches the
    state copy."""
    for mode in (0, 1):
        plan = plan_for(lib, valid_args(mode=mode, **sizes))
        assert plan.workspace_bytes == 0 and plan.chunk_tokens == 16, plan_values(plan)
    nulls = dict(q=None, k=None, v=None, g=None, beta=None, out=None, workspace=None, workspace_bytes=0)
    tokens = sizes.get("batch", 2) * sizes.get("seqlen", 100)
    if tokens:
        nulls = dict(workspace=None, workspace_bytes=0)
    status, error = raw_fwd(lib, valid_args(**sizes, **nulls), ctypes.sizeof(_native.FwdArgs))
    if sizes.get("num_seqs", 2) == 0:
        assert (status, error) == (0, "")
    else:
        assert status != 1, error


# ------------------------------------------------------------------ kernels not yet enabled

UNVALIDATED_FORMS = [
    dict(gate=1),
    dict(gate=2, A_log=None, dt_bias=None),
    dict(gate=2, A_log=None, dt_bias=None, g_dtype=2),
    dict(beta_form=1),
    dict(beta_dtype=2),
]


def test_only_validated_arches_enable_the_gate_forms_and_stable_inverse(lib):
    """The gate and beta forms' kernels and the stable inverse run by default only where their
    GPU tests have passed (src/kda/launch.cuh validated_features): sm_90a sets both feature
    bits, every other arch table neither."""
    both = _native.FEATURE_GATE_FORMS | _native.FEATURE_STABLE_INVERSE
    for arch in lib.archs:
        assert arch.features & both == (both if arch.compute_capability == 90 else 0), arch


@pytest.mark.parametrize("fields", UNVALIDATED_FORMS, ids=lambda f: "-".join(f"{k}{v}" for k, v in f.items()))
def test_forms_not_enabled_are_refused_unless_the_test_entry_asks(lib, fields):
    """flash_kda_fwd refuses a valid call of a form its table does not enable with
    UNSUPPORTED_DEVICE, after every argument check and before anything runs; the test entry
    point's unvalidated_forms takes it (a call without sequences, which returns there). A
    table that enables the forms takes the same call without it."""
    off = [a for a in lib.archs if not a.features & _native.FEATURE_GATE_FORMS]
    on = [a for a in lib.archs if a.features & _native.FEATURE_GATE_FORMS]
    for arch in on:
        fwd_for(lib, arch.compute_capability, valid_args(batch=0, num_seqs=0, **fields))
    if not off:
        pytest.skip(f"every arch of this build ({', '.join(a.name for a in lib.archs)}) enables the forms")
    cc = off[0].compute_capability
    for args in (valid_args(**fields), valid_args(batch=0, num_seqs=0, **fields)):
        status, error = raw_fwd(lib, args, ctypes.sizeof(_native.FwdArgs), cc)
        assert status == 2 and f"built but not yet validated on {off[0].name}" in error, error
    fwd_for(lib, cc, valid_args(batch=0, num_seqs=0, unvalidated_forms=1, **fields))


@pytest.mark.parametrize("field,value", [("unvalidated_forms", 2), ("unvalidated_forms", -1), ("stable_inverse", 2)])
def test_the_kernel_switches_take_their_values_only(lib, field, value):
    args = valid_args(batch=0, num_seqs=0)
    overrides = _native.TestingOverrides(struct_size=ctypes.sizeof(_native.TestingOverrides), **{field: value})
    with pytest.raises(RuntimeError, match=re.escape(f"overrides->{field} must be")):
        lib.fwd(lib.archs[0].compute_capability, args, 0, overrides)
