# SPDX-License-Identifier: MIT
"""The native library through its C ABI: loading, arch tables, sizes, and errors that
must come back as messages before any launch (so they are testable without a GPU)."""

import ctypes
import re

import flash_kda
import pytest
from flash_kda import _native, _sizes

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
    the checks, so any 16-byte-aligned non-null integers do)."""
    fields = dict(
        block_v=0,
        batch=2,
        seqlen=100,
        heads=4,
        head_dim=128,
        num_seqs=2,
        q=0x1000,
        k=0x2000,
        v=0x3000,
        g=0x4000,
        beta=0x5000,
        out=0x6000,
        A_log=0x7000,
        dt_bias=0x8000,
        scale=0.088,
        lower_bound=-5.0,
        workspace=0x9000,
        workspace_bytes=1 << 40,
        num_sms=132,
    )
    fields.update(overrides)
    return _native.FwdArgs(**fields)


def test_unsupported_compute_capability_names_the_build(lib):
    with pytest.raises(RuntimeError) as err:
        lib.fwd(75, valid_args(), 0)
    have = ", ".join(a.name for a in lib.archs)
    assert f"flash_kda_fwd: no kernel for sm_75 in this build (has {have})" in str(err.value)
    assert "UNSUPPORTED_DEVICE" in str(err.value)


BAD_ARGS = [
    (dict(head_dim=64), "head_dim must be 128, got 64"),
    (dict(seqlen=0), "batch, seqlen and heads must be >= 1"),
    (dict(q=None), "q must not be NULL"),
    (dict(v=0x3008), "v must be 16-byte aligned"),
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
    (dict(workspace_bytes=100), "workspace must hold"),
    (dict(batch=1 << 20, seqlen=1 << 12, num_seqs=1 << 20), "batch * seqlen must be at most 2^31 - 1"),
]


@pytest.mark.parametrize(
    "overrides,message", BAD_ARGS, ids=[m.split(" ")[0] + str(i) for i, (_, m) in enumerate(BAD_ARGS)]
)
def test_invalid_arguments_are_rejected_before_launch(lib, overrides, message):
    cc = lib.archs[0].compute_capability
    with pytest.raises(RuntimeError) as err:
        lib.fwd(cc, valid_args(**overrides), 0)
    assert str(err.value).startswith("flash_kda_fwd: ")
    assert message in str(err.value) and "INVALID_ARGUMENT" in str(err.value)


def test_short_args_struct_is_rejected(lib):
    args = valid_args()
    status = lib._lib.flash_kda_fwd(lib.archs[0].compute_capability, ctypes.byref(args), None)
    assert status == 1  # struct_size 0 < the ABI 1 prefix: INVALID_ARGUMENT
    assert "struct_size must be in [" in lib._lib.flash_kda_last_error().decode()


def test_probe_arguments_are_checked(lib):
    cc = lib.archs[0].compute_capability
    with pytest.raises(RuntimeError, match="op must be EX2, SIGMOID or RSQRT, got 9"):
        lib.probe_unary(cc, 9, 0x1000, 0x2000, 4, 0)
    with pytest.raises(RuntimeError, match="multiples of 16, 8, 16; got 1, 16, 12, 16"):
        lib.probe_mma(cc, _native.PROBE_MMA_BF16_F32, 0x1000, 0x2000, 0x3000, 1, 16, 12, 16, 0)
    lib.probe_unary(cc, _native.PROBE_EX2, 0, 0, 0, 0)  # nothing to do: no launch, no error


def test_arch_info_index_is_checked(lib):
    desc = _native._ArchDesc()
    assert lib._lib.flash_kda_arch_info(len(lib.archs), ctypes.byref(desc)) == 1
    assert re.search(r"index must be in \[0, \d+\), got \d+", lib._lib.flash_kda_last_error().decode())
