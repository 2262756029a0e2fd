# SPDX-License-Identifier: MIT
"""What tests and benchmarks reach inside ``flash_kda``: validated calls, the native path with
a given workspace or forced plan, the library's plan of a call, process-wide plan overrides,
the caches, and a simulated native device for machines without a GPU. Not for production
use: nothing here is needed to call :func:`flash_kda.fwd`, and the overrides go through the
library's test entry points (``flash_kda_testing.h``), outside its stable C ABI.

Validated calls::

    call = testing.validated(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, ...)
    testing.run_native(call, block_v=64, workspace=ws)   # forced width, records kept in ws
    testing.plan_of(call, segment_chunks=40).workspace_bytes

Overrides for every native call of the process (the dispatcher checks one module global)::

    with testing.overrides(chunk_tokens=32):
        flash_kda.fwd(...)

Override names are the fields of ``flash_kda_testing_overrides`` (:data:`OVERRIDES`); 0 is
"the plan decides".
"""

import contextlib
import ctypes
import types
from typing import Optional

import torch

from . import _launch, _native, _numerics, _sizes, _validate, dispatch

OVERRIDES = tuple(name for name, _ in _native.OVERRIDE_FIELDS)  # block_v, segment_chunks, overlap, chunk_tokens
SIGNATURE_CACHE_SIZE = _validate.SIGNATURE_CACHE_SIZE
RECORD_BYTES = _sizes.RECORD_BYTES  # one (head, 16-token chunk) record of the workspace (design §4.3)
OVERLAP_SYNC_BYTES = _sizes.OVERLAP_SYNC_BYTES  # K1's work counter after the ready flags
FwdCall = _validate.FwdCall
FwdArgs = _native.FwdArgs  # flash_kda_fwd_args (flash_kda.h) as a ctypes struct
Ops = _numerics.Ops  # the ledger's operations: exact on the CPU, the library's probes on a GPU with them


def make_overrides(**fields) -> Optional[_native.TestingOverrides]:
    """A ``flash_kda_testing_overrides`` with these fields (the rest 0), or None when every
    value is 0 or None (no override). ``TypeError`` for a name it does not have."""
    unknown = sorted(set(fields) - set(OVERRIDES))
    if unknown:
        raise TypeError(f"flash_kda.testing: unknown override {unknown[0]!r}; the overrides are {', '.join(OVERRIDES)}")
    values = {name: int(value) for name, value in fields.items() if value}
    if not values:
        return None
    return _native.TestingOverrides(struct_size=ctypes.sizeof(_native.TestingOverrides), **values)


# ------------------------------------------------------------------ validated calls


def validated(*args, **keywords) -> FwdCall:
    """``flash_kda.fwd``'s arguments validated (with the signature records): the call every
    path runs. Raises what ``flash_kda.fwd`` raises."""
    return _validate.check_fwd(*args, **keywords)


def validated_uncached(*args, **keywords) -> FwdCall:
    """Every check of ``flash_kda.fwd``'s arguments, without the signature records."""
    return _validate.check_all(*args, **keywords)


def run_native(call: FwdCall, *, workspace: Optional[torch.Tensor] = None, **overrides) -> None:
    """Run a validated call on the native path, on the current stream of its device, with
    ``workspace`` (uint8 on the device, at least :func:`plan_of`'s bytes) to read the
    records afterwards, and parts of the plan forced (:data:`OVERRIDES`: ``block_v`` 32 / 64 /
    128, ``segment_chunks`` > 0 in AUTO mode, ``overlap`` 1 / 2 / -1, ``chunk_tokens`` 16 /
    32); without overrides the process-wide ones apply."""
    dispatch.run_native(call, workspace=workspace, overrides=make_overrides(**overrides))


def plan_of(call: FwdCall, **overrides) -> _native.FwdPlan:
    """The library's plan (``flash_kda_fwd_plan_info``: chunk length, block_v, segments, K1
    overlap, workspace bytes) of a validated CUDA call, with :func:`run_native`'s overrides."""
    num_sms = dispatch.device_facts(dispatch._cuda_index(call.device))[1]
    args, _ = _launch.native_struct(call, num_sms)
    given = make_overrides(**overrides)
    return _native.load().plan(args, given if given is not None else _native.overrides)


def native_library():
    """The loaded library (``_native.NativeLibrary``: its C functions with argument types),
    or None; :func:`native_error` says why not."""
    return _native.load()


def native_error() -> Optional[str]:
    return _native.load_error()


def load_library(path: str):
    """Another build of the library (``_native.NativeLibrary``), e.g. to compare its plans."""
    return _native.NativeLibrary(path)


# ------------------------------------------------------------------ process-wide overrides


def set_overrides(**fields) -> None:
    """Route every native call of the process through the test entry point with these
    overrides (every value 0, or none given: back to the stable entry point). Clears the
    signature records, whose launches were prepacked without them."""
    _native.overrides = make_overrides(**fields)
    clear_caches()


def get_overrides() -> dict:
    """The process-wide overrides, by name (empty when none are set)."""
    current = _native.overrides
    return {} if current is None else {name: getattr(current, name) for name in OVERRIDES if getattr(current, name)}


@contextlib.contextmanager
def overrides(**fields):
    """:func:`set_overrides` for the ``with`` block; the previous overrides after it."""
    previous = get_overrides()
    set_overrides(**fields)
    try:
        yield
    finally:
        set_overrides(**previous)


# ------------------------------------------------------------------ caches


def signature_cache_size() -> int:
    """Signatures whose records the validation holds (at most :data:`SIGNATURE_CACHE_SIZE`)."""
    return len(_validate._records)


def signature_record(*args, **keywords):
    """The record of a call's signature (``_validate.SignatureRecord``: what the validation
    derived, and the prepacked launch if any), or None; arguments as ``flash_kda.fwd``."""
    return _validate.record_of(_validate.signature(*args, **keywords))


def cached_workspaces() -> int:
    """Workspaces the native path holds for reuse (one per device and stream)."""
    return len(_launch._workspaces)


def clear_caches() -> None:
    """Forget every signature record and every held workspace."""
    _validate.clear_records()
    _launch.clear_workspaces()


# ------------------------------------------------------------------ a simulated native device


@contextlib.contextmanager
def simulated_native(library=None, compute_capability: int = 90, num_sms: int = 132):
    """For the ``with`` block, calls of CPU tensors take the native path as on CUDA device 0
    of ``compute_capability`` with ``num_sms`` SMs, the current stream being 0, outside graph
    capture: the Python of a native call on a machine without a GPU. ``library``: the loaded
    library (default), whose checks then run on the host pointers and which fails a valid call
    at the driver check (``UNSUPPORTED_DEVICE``) without a GPU; or a stand-in with the
    attributes the dispatcher uses (``archs``, ``cuda_versions()``, ``plan(args, overrides)``,
    ``fwd(cc, args, stream, overrides)``, ``fwd_by_address(cc, address, stream)``,
    ``error(status)``). The signature records and workspaces are cleared on entry and exit."""
    lib = library if library is not None else _native.load()
    if lib is None:
        raise RuntimeError(f"flash_kda.testing.simulated_native: no library ({_native.load_error()})")
    reason = f"native kernels for sm_{compute_capability} (simulated by flash_kda.testing)"
    saved = [
        (dispatch, "_path_of", lambda device: (dispatch.NATIVE, reason)),
        (dispatch, "device_facts", lambda index: (compute_capability, num_sms)),
        (dispatch, "_cuda_index", lambda device: 0),
        (_launch, "_exchange_device", lambda index: index),
        (_launch, "_maybe_exchange_device", lambda index: index),
        (_launch, "_raw_stream", lambda index: 0),
        (_launch, "_capturing", lambda: False),
        (_native, "load", lambda: lib),
    ]
    saved = [(module, name, getattr(module, name), value) for module, name, value in saved]
    clear_caches()
    for module, name, _, value in saved:
        setattr(module, name, value)
    try:
        yield lib
    finally:
        for module, name, old, _ in saved:
            setattr(module, name, old)
        clear_caches()


def stand_in_library(workspace_bytes: int = 256, compute_capability: int = 90):
    """A library that checks nothing and launches nothing, answering at once: with
    :func:`simulated_native`, the host time of a native call without the C entry's own."""

    def fwd(cc, args, stream, overrides=None):
        return None

    return types.SimpleNamespace(
        archs=[_native.ArchInfo(f"sm_{compute_capability}a", compute_capability, _native.FEATURE_FWD)],
        cuda_versions=lambda: (13000, 13000),
        plan=lambda args, overrides=None: types.SimpleNamespace(workspace_bytes=workspace_bytes),
        fwd=fwd,
        fwd_by_address=lambda cc, address, stream: 0,
        error=lambda status: f"stand-in library: status {status}",
    )
