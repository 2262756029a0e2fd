# SPDX-License-Identifier: MIT
"""Choose and run the path of a ``fwd`` call: native kernels, fla's Triton kernels, or
pure PyTorch (architecture.md, "The dispatcher").

:func:`choose_path` is a pure function of the device facts, the library's tables, fla's
presence and ``FLA_FLASH_KDA``; :func:`fwd` validates, asks it, logs each (path, reason)
once at INFO on the ``flash_kda`` logger, and runs the path.
"""

import logging
import os
from collections.abc import Sequence
from typing import Callable, NamedTuple, Optional, Union

import torch

from . import _native, _validate, fallback

logger = logging.getLogger("flash_kda")
ENV_SWITCH = "FLA_FLASH_KDA"

NATIVE, FLA, TORCH = "native", "fla", "torch"
_UNAVAILABLE = "native library unavailable"
_logged = set()


def choose_path(
    device_type: str,
    compute_capability: Optional[int],
    native_archs: Sequence[_native.ArchInfo],
    native_error: Optional[str],
    fla_present: Union[bool, Callable[[], bool]],
    switch: Optional[str],
) -> tuple[str, str]:
    """Return ``(path, reason)`` for a call on a device.

    ``compute_capability`` is 10 * major + minor (CUDA only); ``native_archs`` the
    library's tables, ``native_error`` why it could not load; ``fla_present`` whether fla
    can be imported (a callable is asked only when the native path is not taken, since
    importing fla is slow); ``switch`` the value of ``FLA_FLASH_KDA`` (``"0"`` turns the
    native kernels off).
    """
    if device_type != "cuda":
        return TORCH, f"{device_type} tensors run on the PyTorch path"
    tables = [a for a in native_archs if a.features & _native.FEATURE_FWD]
    if switch is not None and switch.strip() == "0":
        why = f"{ENV_SWITCH}=0 turns the native kernels off"
    elif native_error is not None:
        why = f"{_UNAVAILABLE}: {native_error}"
    elif not any(a.compute_capability == compute_capability for a in tables):
        have = ", ".join(a.name for a in tables) or "none"
        why = f"no kernel for sm_{compute_capability} in this build (has {have})"
    else:
        return NATIVE, f"native kernels for sm_{compute_capability}"
    if fla_present() if callable(fla_present) else fla_present:
        return FLA, f"{why}; using fla Triton"
    return TORCH, f"{why}; fla is not importable, using PyTorch"


def _device_capability(device: torch.device) -> Optional[int]:
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def explain(device) -> tuple[str, str]:
    """``(path, reason)`` that :func:`fwd` would take for tensors on ``device`` now."""
    device = torch.device(device)
    lib_error = _native.load_error() if device.type == "cuda" else None
    return choose_path(
        device.type,
        _device_capability(device),
        _native.compiled_archs(),
        lib_error,
        fallback.fla_available,
        os.environ.get(ENV_SWITCH),
    )


def backend_for(device) -> str:
    """``"native"``, ``"fla"`` or ``"torch"``: the path ``fwd`` would take on ``device``."""
    return explain(device)[0]


def _log_once(device, path: str, reason: str) -> None:
    """Log each (path, reason) once: INFO, or WARNING when a library that should serve this
    GPU failed to load (the call still runs, on the fallback)."""
    key = (path, reason)
    if key not in _logged:
        _logged.add(key)
        level = logging.WARNING if reason.startswith(_UNAVAILABLE) else logging.INFO
        logger.log(level, "flash_kda.fwd on %s -> %s (%s)", device, path, reason)


def _dtype_code(state) -> int:
    if state is None:
        return _native.DTYPE_NONE
    return _native.DTYPE_BF16 if state.dtype == torch.bfloat16 else _native.DTYPE_FP32


def _ptr(t) -> Optional[int]:
    return None if t is None else t.data_ptr()


class NativeCall(NamedTuple):
    """A validated call for the native path: its sizes, its 13 arguments and the mode."""

    problem: _validate.Problem
    args: tuple
    exact: bool


def validated(*args, exact: bool = True) -> NativeCall:
    """Validate the 13 fwd arguments for :func:`run_native` (tests and benchmarks)."""
    return NativeCall(_validate.check_fwd(*args), args, exact)


_props = {}


def _device_props(device):
    if device not in _props:
        _props[device] = torch.cuda.get_device_properties(device)
    return _props[device]


def _fwd_args(call: NativeCall, block_v: int, segment_chunks: int) -> _native.FwdArgs:
    problem = call.problem
    q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state = call.args[:12]
    return _native.FwdArgs(
        block_v=block_v,
        batch=problem.batch,
        seqlen=problem.seqlen,
        heads=problem.heads,
        head_dim=_validate.HEAD_DIM,
        num_seqs=problem.num_seqs,
        q=q.data_ptr(),
        k=k.data_ptr(),
        v=v.data_ptr(),
        g=g.data_ptr(),
        beta=beta.data_ptr(),
        out=out.data_ptr(),
        A_log=A_log.data_ptr(),
        dt_bias=dt_bias.data_ptr(),
        scale=float(scale),
        lower_bound=float(lower_bound),
        initial_state=_ptr(initial_state),
        final_state=_ptr(final_state),
        initial_state_dtype=_dtype_code(initial_state),
        final_state_dtype=_dtype_code(final_state),
        cu_seqlens=_ptr(problem.cu_seqlens),
        cu_seqlens_dtype=_native.DTYPE_INT64,
        num_sms=_device_props(q.device).multi_processor_count,
        mode=_native.MODE_EXACT if call.exact else _native.MODE_AUTO,
        segment_chunks=segment_chunks,
    )


def plan_of(call: NativeCall, block_v: int = 0, segment_chunks: int = 0) -> _native.FwdPlan:
    """The library's plan for a validated call."""
    return _native.load().plan(_fwd_args(call, block_v, segment_chunks))


def run_native(
    call: NativeCall, *, block_v: int = 0, segment_chunks: int = 0, workspace: Optional[torch.Tensor] = None
) -> None:
    """Call the C ABI on the current stream of q's device. ``block_v`` 0 lets the library
    pick; tests pass 32/64/128. ``segment_chunks`` > 0 forces the segment length of the
    automatic mode. ``workspace`` (uint8, on q's device) may be given to inspect the
    records afterwards; by default it comes from PyTorch's allocator."""
    lib = _native.load()
    device = call.args[0].device
    props = _device_props(device)
    args = _fwd_args(call, block_v, segment_chunks)
    size = lib.plan(args).workspace_bytes
    if workspace is None:
        workspace = torch.empty(size, dtype=torch.uint8, device=device)
    args.workspace = workspace.data_ptr()
    args.workspace_bytes = workspace.numel()
    with torch.cuda.device(device):
        lib.fwd(10 * props.major + props.minor, args, torch.cuda.current_stream(device).cuda_stream)


def fwd(
    q,
    k,
    v,
    g,
    beta,
    scale,
    out,
    A_log,
    dt_bias,
    lower_bound,
    initial_state=None,
    final_state=None,
    cu_seqlens=None,
    exact=None,
) -> None:
    """See :func:`flash_kda.fwd`."""
    problem = _validate.check_fwd(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens
    )
    path, reason = explain(q.device)
    _log_once(q.device, path, reason)
    if path == NATIVE:
        args = (q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens)
        exact = os.environ.get("FLASH_KDA_EXACT") == "1" if exact is None else bool(exact)
        run_native(NativeCall(problem, args, exact))
    elif path == FLA:
        fallback.fla_fwd(
            q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, problem.cu_seqlens
        )
    else:
        fallback.torch_fwd(
            q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens
        )
