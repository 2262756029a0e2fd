# SPDX-License-Identifier: MIT
"""Choose and run the path of a ``fwd`` call: native kernels, fla's Triton kernels, or
pure PyTorch (docs/dispatch.md).

:func:`choose_path` is a pure function of the device facts, the library's tables and CUDA
versions, fla's presence and ``FLA_FLASH_KDA``; :func:`run` asks it for a validated call,
logs each (path, reason) once on the ``flash_kda`` logger, and runs the path.
:func:`run_native` makes no host synchronisation and no host-to-device copy, so a call
with its index tensors on the device can be captured in a CUDA graph.
"""

import ctypes
import functools
import logging
import operator
import os
from collections.abc import Sequence
from typing import Callable, Optional, Union

import torch

from . import _native, _validate, fallback

logger = logging.getLogger("flash_kda")
ENV_SWITCH = "FLA_FLASH_KDA"

NATIVE, FLA, TORCH = "native", "fla", "torch"
_UNAVAILABLE = "native library unavailable"
_CHECKPOINTS = "fla's Triton forward cannot write checkpoints; using PyTorch for this call"
_OLD_DRIVER = "CUDA driver "
_logged = set()


def cuda_version_text(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def choose_path(
    device_type: str,
    compute_capability: Optional[int],
    native_archs: Sequence[_native.ArchInfo],
    native_error: Optional[str],
    fla_present: Union[bool, Callable[[], bool]],
    switch: Optional[str],
    cuda_versions: Optional[tuple[int, int]] = None,
) -> tuple[str, str]:
    """Return ``(path, reason)`` for a call on a device.

    ``compute_capability`` is 10 * major + minor (CUDA only); ``native_archs`` the
    library's tables, ``native_error`` why it could not load, ``cuda_versions`` its
    ``(runtime, driver)`` versions as 1000 * major + 10 * minor; ``fla_present`` whether fla
    can be imported (a callable is asked only when the native path is not taken, since
    importing fla is slow); ``switch`` the value of ``FLA_FLASH_KDA``: exactly ``"0"`` turns
    the native kernels off, as fla reads it.
    """
    if device_type != "cuda":
        return TORCH, f"{device_type} tensors run on the PyTorch path"
    tables = [a for a in native_archs if a.features & _native.FEATURE_FWD]
    runtime, driver = cuda_versions if cuda_versions is not None else (0, 0)
    if switch == "0":
        why = f"{ENV_SWITCH}=0 turns the native kernels off"
    elif native_error is not None:
        why = f"{_UNAVAILABLE}: {native_error}"
    elif not any(a.compute_capability == compute_capability for a in tables):
        have = ", ".join(a.name for a in tables) or "none"
        why = f"no kernel for sm_{compute_capability} in this build (has {have})"
    elif driver // 1000 < runtime // 1000:
        why = (
            f"{_OLD_DRIVER}{cuda_version_text(driver)} is older than the CUDA {cuda_version_text(runtime)} runtime "
            "this library was built with"
        )
    else:
        return NATIVE, f"native kernels for sm_{compute_capability}"
    if fla_present() if callable(fla_present) else fla_present:
        return FLA, f"{why}; using fla Triton"
    return TORCH, f"{why}; fla is not importable, using PyTorch"


@functools.cache
def device_facts(index: int) -> tuple[int, int]:
    """``(compute capability, multiprocessors)`` of CUDA device ``index``, asked once."""
    props = torch.cuda.get_device_properties(index)
    return 10 * props.major + props.minor, props.multi_processor_count


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _no_cuda_reason(device: torch.device) -> Optional[str]:
    """Why tensors cannot live on ``device`` (a CUDA device) in this process, or None."""
    if not torch.cuda.is_available():
        return "CUDA is not available to this torch (torch.cuda.is_available() is False)"
    count = torch.cuda.device_count()
    if device.index is not None and not 0 <= device.index < count:
        return f"{device} does not exist ({count} CUDA device(s) visible)"
    return None


def explain(device) -> tuple[str, str]:
    """``(path, reason)`` that :func:`fwd` would take for tensors on ``device`` now.

    ``device`` is a ``torch.device`` or anything ``torch.device()`` accepts; ``ValueError``
    when it cannot be parsed. A CUDA device this process cannot use is answered, not raised.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"flash_kda.backend_for: device must be a torch.device or a device string such as 'cuda:0', got {device!r}"
        ) from None
    if device.type != "cuda":
        return choose_path(device.type, None, [], None, False, None)
    unusable = _no_cuda_reason(device)
    if unusable is not None:
        return TORCH, f"{unusable}; no CUDA path can run here"
    return _cuda_path(device)


def _cuda_path(device: torch.device) -> tuple[str, str]:
    """:func:`explain` for a CUDA device this process can use."""
    lib = _native.load()
    return choose_path(
        "cuda",
        device_facts(_cuda_index(device))[0],
        lib.archs if lib is not None else [],
        _native.load_error(),
        fallback.fla_available,
        os.environ.get(ENV_SWITCH),
        lib.cuda_versions() if lib is not None else None,
    )


def backend_for(device) -> str:
    """``"native"``, ``"fla"`` or ``"torch"``: the path ``fwd`` would take on ``device``."""
    return explain(device)[0]


def _log_once(device, path: str, reason: str) -> None:
    """Log each (path, reason) once: INFO, or WARNING when a GPU that this build has
    kernels for cannot use them (the library failed to load, or the driver is too old)."""
    key = (path, reason)
    if key not in _logged:
        _logged.add(key)
        warn = reason.startswith((_UNAVAILABLE, _OLD_DRIVER))
        logger.log(logging.WARNING if warn else logging.INFO, "flash_kda.fwd on %s -> %s (%s)", device, path, reason)


_DTYPE_CODES = {
    None: _native.DTYPE_NONE,
    torch.bfloat16: _native.DTYPE_BF16,
    torch.float32: _native.DTYPE_FP32,
    torch.int32: _native.DTYPE_INT32,
    torch.int64: _native.DTYPE_INT64,
}
# flash_kda_fwd_args filled by one pack (dispatch cost ~2 us a call with the keyword
# constructor): native_args gives the values in this order, which the import checks.
_ARGS_PACKER, _ARGS_ORDER = _native.flat_layout(_native.FwdArgs)
_STRIDED = ("q", "k", "v", "g", "out", "beta")  # FwdCall.strides' order
_STRIDE_NAMES = tuple(f"{t}_strides.{d}" for t in _STRIDED for d in ("batch", "token", "head"))
assert _ARGS_ORDER == (
    "struct_size", "block_v", "batch", "seqlen", "heads", "head_dim", "num_seqs",
    "q", "k", "v", "g", "beta", "out", "A_log", "dt_bias", "scale", "lower_bound",
    "initial_state", "final_state", "initial_state_dtype", "final_state_dtype", "cu_seqlens",
    "workspace", "workspace_bytes", "num_sms", "reserved", *_STRIDE_NAMES,
    "cu_seqlens_dtype", "state_indices_dtype", "state_indices", "state_pool_size", "has_initial_state",
    "checkpoints", "checkpoints_dtype", "checkpoint_every", "checkpoint_slots",
    "mode", "segment_chunks", "overlap", "chunk_tokens", "max_seqlen",
), _ARGS_ORDER  # fmt: skip


def _dtype_code(x: Optional[torch.Tensor]) -> int:
    return _DTYPE_CODES[None if x is None else x.dtype]


def _address(x: Optional[torch.Tensor]) -> int:
    return 0 if x is None else x.data_ptr()


def _word_aligned(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """An index tensor contiguous and 8-byte aligned for the library (a device copy when
    it is not: no synchronisation, captured like the rest in a CUDA graph)."""
    if x is None or (x.is_contiguous() and x.data_ptr() % 8 == 0):
        return x
    return x.clone(memory_format=torch.contiguous_format)


def native_args(
    call: _validate.FwdCall, num_sms: int, block_v: int = 0, segment_chunks: int = 0, overlap: int = 0, chunk: int = 0
):
    """``(flash_kda_fwd_args, tensors to keep alive until the launch)`` of a call."""
    cu, indices = call.cu_seqlens, call.state_indices
    if cu is not None:
        cu = _word_aligned(cu)
    if indices is not None:
        indices = _word_aligned(indices)
    has_initial = call.has_initial_state
    if has_initial is not None:
        has_initial = has_initial.contiguous()
    checkpoints = call.checkpoints
    if checkpoints is not None and not checkpoints.numel():
        checkpoints = None
    initial, final = call.initial_state, call.final_state
    (q, k, v, g, out, beta) = call.strides  # (batch, token, head) of each
    stored = checkpoints is not None
    args = _native.FwdArgs()
    _ARGS_PACKER.pack_into(
        args, 0, ctypes.sizeof(_native.FwdArgs), block_v, call.batch, call.seqlen, call.heads, _validate.HEAD_DIM,
        call.num_seqs, call.q.data_ptr(), call.k.data_ptr(), call.v.data_ptr(), call.g.data_ptr(),
        call.beta.data_ptr(), call.out.data_ptr(), call.A_log.data_ptr(), call.dt_bias.data_ptr(), call.scale,
        call.lower_bound, _address(initial), _address(final), _dtype_code(initial), _dtype_code(final),
        _address(cu), 0, 0, num_sms, 0, *q, *k, *v, *g, *out, *beta,
        _dtype_code(cu), _dtype_code(indices), _address(indices), call.pool_size if indices is not None else 0,
        _address(has_initial), _address(checkpoints), _dtype_code(checkpoints),
        call.checkpoint_every if stored else 0, checkpoints.shape[0] if stored else 0,
        _native.MODE_EXACT if call.exact else _native.MODE_AUTO, segment_chunks, overlap, chunk, call.max_seqlen,
    )  # fmt: skip
    return args, (cu, indices, has_initial)


def validated(*args, exact: bool = True, **keywords) -> _validate.FwdCall:
    """Test and benchmark hook: ``check_fwd`` of fwd's arguments, exact mode by default."""
    return _validate.check_fwd(*args, exact=exact, **keywords)


def plan_of(
    call: _validate.FwdCall, block_v: int = 0, segment_chunks: int = 0, overlap: int = 0, chunk: int = 0
) -> _native.FwdPlan:
    """The library's plan (chunk length, block_v, segments, K1 overlap, workspace bytes) for
    a validated CUDA call."""
    args, _ = native_args(call, device_facts(_cuda_index(call.device))[1], block_v, segment_chunks, overlap, chunk)
    return _native.load().plan(args)


_plans = {}  # plan inputs -> workspace bytes: the plan is a pure function of the sizes

# The fields of flash_kda_fwd_args that the library's plan reads besides head_dim (always
# 128 here) and whether cu_seqlens is set (api.cpp sizes_of, request_of). Every other field
# leaves the plan as it is (tests/test_native.py changes each one), so these key it.
PLAN_INPUTS = ("batch", "seqlen", "heads", "num_seqs", "checkpoint_every", "max_seqlen", "mode", "block_v",
               "segment_chunks", "num_sms", "overlap", "chunk_tokens")  # fmt: skip
_plan_inputs = operator.attrgetter(*PLAN_INPUTS)


def _workspace_bytes(lib, args) -> int:
    """``lib.plan(args).workspace_bytes``, remembered per plan input (a plan call and its
    argument struct cost ~25 us of the ~120 us a call spends on the CPU)."""
    key = (_plan_inputs(args), bool(args.cu_seqlens))
    size = _plans.get(key)
    if size is None:
        if len(_plans) >= 4096:
            _plans.clear()
        size = _plans[key] = lib.plan(args).workspace_bytes
    return size


# The current stream and device switch of run_native, through torch's C functions where this
# torch has them (~1 us a call; torch.cuda.current_stream(device) builds a Stream object and
# torch.cuda.device(device) parses its argument in Python), else the public API.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_exchange_device = getattr(torch.cuda, "_exchange_device", None)
_maybe_exchange_device = getattr(torch.cuda, "_maybe_exchange_device", None)


def current_stream(index: int) -> int:
    """The ``cudaStream_t`` (as an int) of the current stream of CUDA device ``index``."""
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _launch(lib, cc: int, args, index: int) -> None:
    """``lib.fwd`` on the current stream of CUDA device ``index``, with ``index`` the
    current device during the call (as ``with torch.cuda.device(index)``)."""
    if _exchange_device is None or _maybe_exchange_device is None:
        with torch.cuda.device(index):
            lib.fwd(cc, args, current_stream(index))
        return
    previous = _exchange_device(index)
    try:
        lib.fwd(cc, args, current_stream(index))
    finally:
        _maybe_exchange_device(previous)


def run_native(
    call: _validate.FwdCall,
    *,
    block_v: int = 0,
    segment_chunks: int = 0,
    overlap: int = 0,
    chunk: int = 0,
    workspace: Optional[torch.Tensor] = None,
) -> None:
    """Call the C ABI on the current stream of the call's device.

    ``block_v`` 0 lets the library pick (tests force 32/64/128); ``segment_chunks`` > 0
    forces the segment length of AUTO mode (``call.exact`` False); ``overlap`` 1 / 2 / -1
    forces K1 beside the whole-sequence pass / K1 leaving the pass's SMs / no overlap (0:
    the plan decides, design section 4.7; no result changes); ``chunk`` 16 or 32 forces
    the chunk length (32: AUTO mode only; 0: the plan decides); ``workspace`` (uint8 on
    the device, at least ``lib.plan(args).workspace_bytes``) may be given to inspect the
    records afterwards; by default it comes from PyTorch's allocator.
    """
    lib = _native.load()
    device = call.device
    index = _cuda_index(device)
    cc, num_sms = device_facts(index)
    args, keep_alive = native_args(call, num_sms, block_v, segment_chunks, overlap, chunk)
    if workspace is None:
        workspace = torch.empty(_workspace_bytes(lib, args), dtype=torch.uint8, device=device)
    args.workspace = workspace.data_ptr()
    args.workspace_bytes = workspace.numel()
    _launch(lib, cc, args, index)
    del keep_alive  # only now: the stream orders any reuse of their memory after the launch


def run(call: _validate.FwdCall) -> None:
    """Run a validated call on the path :func:`explain` picks (logged once per reason). Its
    tensors live on its device, so a CUDA call skips explain's availability checks (with
    native_args' single pack, 4-6 us less host time a call on the H200 machine)."""
    device = call.device
    path, reason = _cuda_path(device) if device.type == "cuda" else explain(device)
    if path == FLA and call.checkpoint_every:
        path, reason = TORCH, f"{reason}; {_CHECKPOINTS}"
    _log_once(device, path, reason)
    if path == NATIVE:
        run_native(call)
    elif path == FLA:
        fallback.fla_fwd(call)
    else:
        fallback.torch_fwd(call)
