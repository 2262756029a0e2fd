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
"the plan decides". The other arches' code paths on the GPU at hand (:data:`TEST_MODES`)::

    testing.set_overrides(**testing.mode_overrides("sm120"))   # the whole process in a mode
    testing.launched(call, block_v=64)       # what the call ran: instantiations, ring depths
    testing.plan_on("sm120", args, sms=170)  # a plan for a reference device, no GPU asked
"""

import contextlib
import ctypes
import types
from typing import Optional

import torch

from . import _eager, _launch, _native, _numerics, _sizes, _validate, dispatch

OVERRIDES = tuple(name for name, _ in _native.OVERRIDE_FIELDS)  # block_v, segment_chunks, ..., launches
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
    32) or test switches set, on top of the process-wide ones (a test mode's)."""
    dispatch.run_native(call, workspace=workspace, overrides=make_overrides(**{**get_overrides(), **overrides}))


def plan_of(call: FwdCall, **overrides) -> _native.FwdPlan:
    """The library's plan (``flash_kda_fwd_plan_info``: chunk length, block_v, segments, K1
    overlap, workspace bytes) of a validated CUDA call on its device, with :func:`run_native`'s
    overrides (on top of the process-wide ones)."""
    index = dispatch._cuda_index(call.device)
    cc, num_sms = dispatch.device_facts(index)
    args, _ = _launch.native_struct(call, num_sms)
    given = make_overrides(**{**get_overrides(), **overrides})
    with torch.cuda.device(index):
        return _native.load().plan(cc, args, given)


# ------------------------------------------------------------------ every arch's code path here

# The test modes (tests/conftest.py reads FLASH_KDA_TEST_MODE): the other arches' code paths on
# the GPU at hand, and the reference device (src/costs.h) whose facts each mode reports on an
# H200: "generic" runs the other arches' passes (recurrence_kernel everywhere, records in
# fragment order), "sm120" those with sm_120's shared memory and threads per SM, "sm100" those
# with sm_100's SM count (the plan's: the launch takes at most the device's).
TEST_MODES = ("default", "generic", "sm120", "sm100")
MODE_DEVICES = {"default": "h200", "generic": "sm100", "sm120": "sm120", "sm100": "sm100"}
REFERENCE_DEVICES = tuple(name for name in _native.DEVICE_IDS if name != "current")


def _facts(facts: _native.TestingDevice) -> dict:
    return {name: [list(x) if hasattr(x, "__len__") else x for x in value] if hasattr(value, "__len__") else value
            for name, value in ((n, getattr(facts, n)) for n, _ in facts._fields_ if n != "struct_size")}  # fmt: skip


def reference_device(name: str) -> dict:
    """The facts the plan takes of a reference device (``flash_kda_testing_device``: compute
    capability, generic passes, SMs, shared memory, threads and registers per SM, K1's CTAs per
    SM alone and beside each width's pass, FlashKDA's K1 and the unbounded gates', the 16-row
    combine), without a GPU."""
    if name not in REFERENCE_DEVICES:
        raise ValueError(f"flash_kda.testing: device must be one of {', '.join(REFERENCE_DEVICES)}, got {name!r}")
    return _facts(_native.load().device_facts(0, make_overrides(device=_native.DEVICE_IDS[name])))


def device_facts(device=None, **overrides) -> dict:
    """The facts the plan takes of a CUDA device (default: the current one) under the test
    switches in ``overrides`` (a mode's: :func:`mode_overrides`)."""
    index = torch.cuda.current_device() if device is None else torch.device(device).index or 0
    cc = dispatch.device_facts(index)[0]
    with torch.cuda.device(index):
        return _facts(_native.load().device_facts(cc, make_overrides(**overrides)))


def mode_overrides(mode: str) -> dict:
    """The test switches of a test mode (:data:`TEST_MODES`), the limits taken from its
    reference device."""
    if mode not in TEST_MODES:
        raise ValueError(f"flash_kda.testing: mode must be one of {', '.join(TEST_MODES)}, got {mode!r}")
    if mode == "default":
        return {}
    ref = reference_device(MODE_DEVICES[mode])
    switches = dict(generic_passes=1)
    if mode == "sm120":
        switches.update(sim_smem_optin=ref["smem_optin"], sim_smem_sm=ref["smem_sm"], sim_threads_sm=ref["threads_sm"])
    if mode == "sm100":
        switches.update(sim_sms=ref["sms"])
    return switches


def launched(call: FwdCall, **overrides) -> list:
    """Run a validated call as :func:`run_native` does and return what it launched, kernel by
    kernel: dicts of ``name`` (the instantiation as the source names it), ``kind``, ``code``,
    ``blocks``, ``width``, ``stages`` (ring depth), ``resident`` (CTAs an SM), ``smem``
    (dynamic shared memory as launched), ``order`` (records' order) and ``ctas``."""
    record = _native.TestingLaunches()
    run_native(call, launches=ctypes.addressof(record), **overrides)
    out = []
    for k in record.kernels[: record.count]:
        entry = {name: getattr(k, name) for name, _ in k._fields_}
        entry["name"] = k.name.decode()
        entry["kind"] = _native.LAUNCH_KINDS.get(k.kind, k.kind)
        out.append(entry)
    return out


def plan_on(device: str, args: FwdArgs, sms: Optional[int] = None, library=None, **overrides) -> _native.FwdPlan:
    """The plan of a ``flash_kda_fwd_args`` on a reference device with ``sms`` SMs (default:
    ``args.num_sms``), without a GPU, by ``library`` (default: the loaded one): what
    benchmarks/plan_grid.py evaluates."""
    if device not in REFERENCE_DEVICES:
        raise ValueError(f"flash_kda.testing: device must be one of {', '.join(REFERENCE_DEVICES)}, got {device!r}")
    given = make_overrides(device=_native.DEVICE_IDS[device], sim_sms=sms or 0, **overrides)
    return (library or _native.load()).plan(0, args, given)


def debug_waits() -> bool:
    """Whether the package's library was built with ``FLASH_KDA_DEBUG_WAITS=ON`` (its
    ``_build_info``): bounded waits that trap instead of hanging, and the planted stall
    (``stall``). A release build has neither and refuses ``stall``."""
    try:
        from . import _build_info
    except ImportError:
        return False
    return bool(getattr(_build_info, "DEBUG_WAITS", False))


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


def library_call(call: FwdCall):
    """A function that runs ``call`` (validated, on CUDA) through ``flash_kda_fwd`` alone: its
    struct packed once, the cached workspace, the current stream; for timing the library."""
    index = dispatch._cuda_index(call.device)
    cc, num_sms = dispatch.device_facts(index)
    lib = _native.load()
    args, keep = _launch.native_struct(call, num_sms)
    stream = _launch.current_stream(index)
    nbytes = lib.plan(cc, args, None).workspace_bytes
    ws = _launch.workspace(call.device, index, stream, nbytes)
    args.workspace, args.workspace_bytes = ws.data_ptr(), ws.numel()
    address, fwd = ctypes.addressof(args), lib.fwd_by_address

    def run(keep=keep, ws=ws, args=args):
        status = fwd(cc, address, stream)
        if status:
            raise _native.NativeError(lib.error(status), status)

    return run


def eager_op():
    """The eager launch's function once attached (its arguments: ``_eager.SLOTS``, then
    whether inference mode is on), else None."""
    return _eager.OP


def eager_forms(gate="lower_bound", beta_is_logit=True, exact=False, lower_bound=-5.0, checkpoint_every=None,
                max_seqlen=None) -> int:  # fmt: skip
    """The eager launch's ``forms`` argument of a call of these arguments."""
    return _eager.forms(gate, beta_is_logit, exact, lower_bound, checkpoint_every, max_seqlen)


def eager_launches() -> Optional[int]:
    """Calls the eager launch in C (``_eager``) has run, or None while it is not attached."""
    return _eager.launches()


def eager_attach_error() -> Optional[str]:
    """Why the eager launch in C is not attached (None: attached, or not tried yet)."""
    return _eager.attach_error()


def graph_replays() -> int:
    """Calls of ``flash_kda_fwd`` launched as one graph: a repeated signature's launches,
    recorded at its first repeat on a stream and replayed with each call's parameters."""
    return _native.load().replays()


@contextlib.contextmanager
def replays(on: bool):
    """For the ``with`` block, repeated calls replay their signature's graph (``on``, the
    default) or launch kernel by kernel."""
    lib = _native.load()
    previous = lib.set_replays(on)
    try:
        yield
    finally:
        lib.set_replays(previous)


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
    at the driver check (``UNSUPPORTED_DEVICE``) without a GPU, planning with the facts of
    the reference device of that compute capability (``plan_on``); or a stand-in with the
    attributes the dispatcher uses (``archs``, ``cuda_versions()``, ``plan(cc, args, overrides)``,
    ``fwd(cc, args, stream, overrides)``, ``fwd_by_address(cc, address, stream)``,
    ``error(status)``). The signature records and workspaces are cleared on entry and exit."""
    lib = library if library is not None else _native.load()
    if lib is None:
        raise RuntimeError(f"flash_kda.testing.simulated_native: no library ({_native.load_error()})")
    if isinstance(lib, _native.NativeLibrary):  # its plans on the simulated device's facts
        lib = _PlannedOn(lib, _REFERENCE_OF_CC.get(compute_capability, "sm100"))
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


# The reference device whose facts stand in for a simulated device's (simulated_native).
_REFERENCE_OF_CC = {90: "h200", 120: "sm120", 121: "sm120"}


class _PlannedOn:
    """A loaded library whose plans are those of a reference device (no GPU asked): the
    simulated device's facts, for :func:`simulated_native`."""

    def __init__(self, lib, device):
        self._lib, self._device = lib, device

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def plan(self, compute_capability, args, overrides=None):
        fields = {name: getattr(overrides, name) for name in OVERRIDES} if overrides is not None else {}
        fields["device"] = _native.DEVICE_IDS[self._device]
        return self._lib.plan(compute_capability, args, make_overrides(**{k: v for k, v in fields.items() if v}))


def stand_in_library(workspace_bytes: int = 256, compute_capability: int = 90):
    """A library that checks nothing and launches nothing, answering at once: with
    :func:`simulated_native`, the host time of a native call without the C entry's own."""

    def fwd(cc, args, stream, overrides=None):
        return None

    return types.SimpleNamespace(
        archs=[_native.ArchInfo(f"sm_{compute_capability}a", compute_capability, _native.FEATURE_FWD)],
        cuda_versions=lambda: (13000, 13000),
        plan=lambda cc, args, overrides=None: types.SimpleNamespace(workspace_bytes=workspace_bytes),
        fwd=fwd,
        fwd_by_address=lambda cc, address, stream: 0,
        error=lambda status: f"stand-in library: status {status}",
    )
