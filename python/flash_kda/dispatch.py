# SPDX-License-Identifier: MIT
"""Choose and run the path of a ``fwd`` call: native kernels, fla's Triton kernels, or
pure PyTorch (docs/dispatch.md).

:func:`choose_path` is a pure function of the device facts, the library's tables and CUDA
versions, fla's presence and ``FLA_FLASH_KDA``; :func:`run` asks it for a validated call,
logs each (path, reason) once on the ``flash_kda`` logger, and runs the path.
:func:`run_native` (``_launch``) makes no host synchronisation and no host-to-device copy,
so a call with its index tensors on the device can be captured in a CUDA graph.
"""

import functools
import logging
import os
from collections.abc import Sequence
from typing import Callable, Optional, Union

import torch

from . import _launch, _native, _validate, fallback

logger = logging.getLogger("flash_kda")
ENV_SWITCH = _native.SWITCH_ENV
# FLASH_KDA_STRICT=1: a native call the library cannot run (a configuration the GPU cannot
# launch, a launch error, an unsupported device) raises its error instead of falling back.
STRICT_ENV = "FLASH_KDA_STRICT"

NATIVE, FLA, TORCH = "native", "fla", "torch"
_UNAVAILABLE = "native library unavailable"
_CHECKPOINTS = "fla's Triton forward cannot write checkpoints; using PyTorch for this call"
_NO_TOKENS = "a call without tokens copies the states on the PyTorch path"
_OLD_DRIVER = "CUDA driver "
_FLA_TAKES = "; using fla Triton"
_NO_FLA = "; fla is not importable, using PyTorch"
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
        return FLA, why + _FLA_TAKES
    return TORCH, why + _NO_FLA


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
    """``"native"``, ``"fla"`` or ``"torch"``: the path :func:`flash_kda.fwd` would take for
    tensors on ``device`` now (honouring ``FLA_FLASH_KDA`` and the driver's CUDA version).

    Raises ``ValueError`` when ``device`` is not a device (``torch.device("...")`` fails);
    a CUDA device this process cannot use is answered ``"torch"`` (see
    ``dispatch.explain(device)`` for the reason).
    """
    return explain(device)[0]


def _log_once(device, path: str, reason: str) -> None:
    """Log each (path, reason) once: INFO, or WARNING when a GPU that this build has
    kernels for cannot use them (the library failed to load, or the driver is too old)."""
    key = (path, reason)
    if key not in _logged:
        _logged.add(key)
        warn = reason.startswith((_UNAVAILABLE, _OLD_DRIVER, "the native kernels failed"))
        logger.log(logging.WARNING if warn else logging.INFO, "flash_kda.fwd on %s -> %s (%s)", device, path, reason)


def run_native(call: _validate.FwdCall, *, workspace=None, overrides=None) -> bool:
    """Run a validated call on the native path (``_launch.run``) on the current stream of its
    device: ``workspace`` (uint8 on the device, at least the plan's bytes) may be given to
    read the records afterwards, ``overrides`` (``_native.TestingOverrides``) force parts of
    the plan through the test entry point."""
    index = _cuda_index(call.device)
    return _launch.run(call, index, device_facts(index), ENV_SWITCH, workspace_tensor=workspace, overrides=overrides)


def forms_refusal(device: torch.device, gate: str, beta_is_logit: bool, g_dtype, beta_dtype) -> Optional[str]:
    """Why a native call of these gate and beta forms (other than FlashKDA's) would leave the
    native path on CUDA ``device``, or None: their kernels run where the device's arch table
    enables them (FEATURE_GATE_FORMS, once validated on that GPU) or the process-wide test
    overrides ask for them (``flash_kda.testing``)."""
    overrides = _native.overrides
    if overrides is not None and overrides.unvalidated_forms:
        return None
    lib = _native.load()
    cc = device_facts(_cuda_index(device))[0]
    if lib is not None and any(
        a.compute_capability == cc and a.features & _native.FEATURE_GATE_FORMS for a in lib.archs
    ):
        return None
    forms = [f"gate={gate!r}"] if gate != "lower_bound" else []
    forms += [] if beta_is_logit else ["beta_is_logit=False"]
    forms += [f"float32 {name}" for name, dtype in (("g", g_dtype), ("beta", beta_dtype)) if dtype == torch.float32]
    return f"native kernels for {', '.join(forms)} are built but not yet validated on sm_{cc}"


def native_refusal(device, *, gate="lower_bound", beta_is_logit=True, g_dtype=torch.bfloat16,
                   beta_dtype=torch.bfloat16) -> Optional[str]:  # fmt: skip
    """Why :func:`flash_kda.fwd` would not run a call of these forms with tensors on ``device``
    on its native kernels (None: it would), as :func:`run` decides: the path's reason, or the
    forms' (:func:`forms_refusal`). fla's chunk_kda backend asks it before taking a call."""
    device = torch.device(device)
    path, reason = _path_of(device)
    if path != NATIVE:
        return reason
    default = gate == "lower_bound" and beta_is_logit and g_dtype == beta_dtype == torch.bfloat16
    return None if default else forms_refusal(device, gate, beta_is_logit, g_dtype, beta_dtype)


def _path_of(device: torch.device) -> tuple[str, str]:
    """:func:`explain` for the device of a validated call: its tensors live there, so a CUDA
    call skips explain's availability checks (4-6 us less host time a call on the H200
    machine)."""
    return _cuda_path(device) if device.type == "cuda" else explain(device)


def _fallback_path(call: _validate.FwdCall, path: str, reason: str) -> tuple[str, str]:
    """fla cannot write checkpoints and calls without tokens are the state copy alone, which
    the PyTorch path makes."""
    if path == FLA and call.checkpoint_every:
        return TORCH, f"{reason}; {_CHECKPOINTS}"
    if path == FLA and not call.has_tokens:
        return TORCH, f"{reason}; {_NO_TOKENS}"
    return path, reason


def _run_fallback(call: _validate.FwdCall, path: str) -> None:
    if path == FLA:
        fallback.fla_fwd(call)
    else:
        fallback.torch_fwd(call)


def falls_back(error: "_native.NativeError") -> bool:
    """Whether :func:`recover` runs a call the library could not (anything but a refused
    argument, unless FLASH_KDA_STRICT=1) rather than raise its error."""
    return error.status != _native.STATUS_INVALID_ARGUMENT and os.environ.get(STRICT_ENV) != "1"


def recover(call: _validate.FwdCall, error: "_native.NativeError") -> None:
    """After the native library could not run a validated call (anything but an argument it
    refuses: a configuration the GPU cannot launch, a launch error, an unsupported device),
    run it on fla's or the PyTorch path, warning once per reason; with FLASH_KDA_STRICT=1,
    raise the error. The library launches nothing that writes the outputs when it fails
    (launch.cuh launch_fwd), so the fallback starts from the caller's inputs, states included.
    Where the fallback fails too (a CUDA context the failure left unusable) the error names
    both."""
    if not falls_back(error):
        raise error
    path = FLA if fallback.fla_available() else TORCH
    path, reason = _fallback_path(call, path, f"the native kernels failed ({error}; {STRICT_ENV}=1 raises it)")
    _log_once(call.device, path, reason)
    try:
        _run_fallback(call, path)
    except Exception as failed:
        raise RuntimeError(f"{error}; the {path} fallback failed too: {failed}") from failed


def run(call: _validate.FwdCall) -> bool:
    """Run a validated call on the path :func:`explain` picks (logged once per reason); calls
    of other gate or beta forms than FlashKDA's leave the native path until their kernels are
    enabled (:func:`forms_refusal`); where the native library cannot run a call it falls back
    (:func:`recover`). True where the native kernels ran it."""
    device = call.device
    path, reason = _path_of(device)
    if path == NATIVE and not call.default_forms:
        why = forms_refusal(device, call.gate, call.beta_is_logit, call.g.dtype, call.beta.dtype)
        if why is not None:
            path, reason = (FLA, why + _FLA_TAKES) if fallback.fla_available() else (TORCH, why + _NO_FLA)
    path, reason = _fallback_path(call, path, reason)
    _log_once(device, path, reason)
    if path != NATIVE:
        _run_fallback(call, path)
        return False
    try:
        return run_native(call)
    except _native.NativeError as error:
        recover(call, error)
        return False
