# SPDX-License-Identifier: MIT
"""The eager launch in C (``libflash_kda_torch.so``, src/torch/eager.cpp; docs/dispatch.md):
an eager call of a signature that the Python path validated before reads its tensors and
launches from C, through the internal op ``flash_kda::eager_launch`` (torch's stable C ABI,
torch >= 2.10).

Nothing is loaded until the Python path has made a prepacked launch (:func:`learn`): then the
library is attached once, :data:`OP` becomes the op's callable, and each later call of a
learned signature (handed over by ``flash_kda::eager_learn``) is one op call. Where torch is
older than 2.10 or the library is missing, :data:`OP` stays None and the Python path runs
every call (with a torch without CUDA, every op call is a miss).
"""

import ctypes
import os
import threading
from typing import Optional

import torch

from . import _args, _native, _validate

_has_torch_function, _grad_enabled, _inference_enabled = (
    torch._C._has_torch_function, torch.is_grad_enabled, torch.is_inference_mode_enabled
)  # fmt: skip
_ENVIRON, _OFF = _validate.ENVIRON, b"0"
_SWITCH_KEY = _native.SWITCH_ENV.encode()

LIBRARY_NAME = "libflash_kda_torch.so"
MISS = -1  # the op's result for a call it leaves to the Python path (0: launched)

# The ops' scalars: those of flash_kda.fwd that vary with the call's sizes (None passed as 0),
# then `forms` (:func:`forms`: the rest, one int, as the op parses each argument at a cost).
_SCALARS = dict(scale="float", lower_bound="float", checkpoint_every="int", max_seqlen="int")
SLOTS = (*_args.TENSORS, *(a.name for a in _args.ARGS if a.name in _SCALARS), "forms")
_TYPES = {a.name: a.schema for a in _args.ARGS if a.name in _args.TENSORS} | _SCALARS | dict(forms="int")
# eager_launch_short: a call without a pool or checkpoints, four arguments fewer to parse
SHORT_SLOTS = tuple(n for n in SLOTS if n not in ("ssm_state_indices", "has_initial_state", "checkpoints",
                                                  "checkpoint_every"))  # fmt: skip


def _parameters(slots) -> str:
    return ", ".join(f"{_TYPES[name]} {name}" for name in slots)


SCHEMAS = (
    f"eager_launch({_parameters(SLOTS)}) -> int",
    f"eager_launch_short({_parameters(SHORT_SLOTS)}) -> int",
    f"eager_learn({_parameters(SLOTS)}, int learned) -> int",
)
_GATE_FORMS = {gate: code << 5 for gate, code in _native.GATE_CODES.items()}  # gate name -> its bits of forms


def forms(gate: str, beta_is_logit: bool, exact: bool, lower_bound, checkpoint_every, max_seqlen) -> int:
    """The op's ``forms``: the gate's code, beta_is_logit, the resolved mode, and which of
    lower_bound, checkpoint_every and max_seqlen are None (each a bit, so that None and 0 are
    distinct signatures)."""
    return (
        _GATE_FORMS[gate]
        | (16 if beta_is_logit else 0)
        | (8 if exact else 0)
        | (4 if lower_bound is None else 0)
        | (2 if checkpoint_every is None else 0)
        | (1 if max_seqlen is None else 0)
    )


class _Learned(ctypes.Structure):
    """eager.cpp's Learned: what a learn call hands the library."""

    _fields_ = [("args", ctypes.c_void_p), ("compute_capability", ctypes.c_int32), ("device", ctypes.c_int32),
                ("workspace_bytes", ctypes.c_int64)]  # fmt: skip


OP = None  # eager_launch's callable once attached
OP_SHORT = None  # eager_launch_short's
_LEARN = None  # eager_learn's
_state = dict(tried=False, library=None, error=None, definition=None, native=None)
_lock = threading.Lock()


def _torch_at_least_2_10() -> bool:
    try:
        major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 10)


def attach(lib: "_native.NativeLibrary") -> Optional[ctypes.CDLL]:
    """The attached library (loaded and its kernel registered once, calling ``lib``'s
    flash_kda_fwd), or None where it cannot be (:func:`attach_error` says why)."""
    global OP, OP_SHORT, _LEARN
    if not isinstance(lib, _native.NativeLibrary):  # a stand-in (flash_kda.testing): the Python path only
        return None
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
            if not _torch_at_least_2_10():
                _state["error"] = f"torch {torch.__version__}: the eager op needs torch >= 2.10"
            elif not os.path.exists(path):
                _state["error"] = f"{path} is not installed"
            else:
                try:
                    so = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
                    so.flash_kda_torch_attach.restype = ctypes.c_int32
                    so.flash_kda_torch_attach.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                    so.flash_kda_torch_set_workspace.argtypes = [ctypes.c_int32, ctypes.c_void_p,
                                                                 ctypes.c_void_p, ctypes.c_int64]  # fmt: skip
                    so.flash_kda_torch_slots.restype = ctypes.c_char_p
                    so.flash_kda_torch_launches.restype = ctypes.c_int64
                    if so.flash_kda_torch_slots().decode() != ",".join(SLOTS):
                        raise RuntimeError("its argument slots differ from this package's schema")
                    definition = torch.library.Library("flash_kda", "FRAGMENT")
                    for schema in SCHEMAS:
                        definition.define(schema)
                    status = so.flash_kda_torch_attach(lib.fwd_address, lib.plan_address)
                    if status:
                        raise RuntimeError(f"flash_kda_torch_attach failed at step {status}")
                    _state.update(library=so, definition=definition, native=lib)
                    ops = torch.ops.flash_kda
                    # the C++ callables, without a Python frame
                    _LEARN, OP_SHORT, OP = (
                        getattr(op, "_op", op)
                        for op in (ops.eager_learn.default, ops.eager_launch_short.default, ops.eager_launch.default)
                    )
                except (OSError, AttributeError, RuntimeError) as err:
                    _state["error"] = f"cannot attach {path}: {err}"
        return _state["library"]


def launched(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
             ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, gate,
             beta_is_logit) -> bool:  # fmt: skip
    """Whether an eager call of flash_kda.fwd ran from C: a learned signature of plain tensors
    none of which needs grad or is an inference tensor written outside inference mode, with
    the native path on, on a stream that is not capturing a graph (the C side asks: a
    captured call takes the graph's workspace). False for anything else (including an
    argument the op cannot take): the Python path runs it."""
    mode = _validate.cached_mode(scale, lower_bound, checkpoint_every, exact, max_seqlen, gate, beta_is_logit)
    if mode is None or _native.overrides is not None or _ENVIRON is None or _ENVIRON.get(_SWITCH_KEY) == _OFF:
        return False
    try:
        if (
            _has_torch_function((q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens,
                                 ssm_state_indices, has_initial_state, checkpoints))  # fmt: skip
            or (
                _grad_enabled()
                and (
                    q.requires_grad
                    or k.requires_grad
                    or v.requires_grad
                    or g.requires_grad
                    or beta.requires_grad
                    or (A_log is not None and A_log.requires_grad)
                    or (dt_bias is not None and dt_bias.requires_grad)
                    or (initial_state is not None and initial_state.requires_grad)
                )
            )
            or (
                not _inference_enabled()
                and (
                    out.is_inference()
                    or (final_state is not None and final_state.is_inference())
                    or (checkpoints is not None and checkpoints.is_inference())
                )
            )
        ):
            return False
        code = forms(gate, beta_is_logit, mode, lower_bound, checkpoint_every, max_seqlen)
        bound, longest = 0.0 if lower_bound is None else lower_bound, 0 if max_seqlen is None else max_seqlen
        if ssm_state_indices is None and has_initial_state is None and checkpoints is None and checkpoint_every is None:
            status = OP_SHORT(q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens,
                              scale, bound, longest, code)  # fmt: skip
            return status == 0
        status = OP(q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens, ssm_state_indices,
                    has_initial_state, checkpoints, scale, bound, 0 if checkpoint_every is None else checkpoint_every,
                    longest, code)  # fmt: skip
        return status == 0
    except Exception:
        return False


def learns() -> bool:
    """Whether the native path's launches teach the eager launch in C their signatures: it is
    attached to the library that runs them (not to a stand-in's calls, flash_kda.testing)."""
    return OP is not None and _native.load() is _state["native"]


def attach_error() -> Optional[str]:
    return _state["error"]


def learn(so: ctypes.CDLL, template: ctypes.Structure, cc: int, index: int, nbytes: int, q, k, v, g, beta, scale,
          out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens, ssm_state_indices,
          has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, gate,
          beta_is_logit) -> None:  # fmt: skip
    """Hand the library a validated call of a prepacked signature (``template``: its
    flash_kda_fwd_args; the call's own tensors, which give the library its key)."""
    learned = _Learned(ctypes.addressof(template), cc, index, nbytes)
    _LEARN(
        q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens, ssm_state_indices,
        has_initial_state, checkpoints, scale, 0.0 if lower_bound is None else lower_bound,
        0 if checkpoint_every is None else checkpoint_every, 0 if max_seqlen is None else max_seqlen,
        forms(gate, beta_is_logit, exact, lower_bound, checkpoint_every, max_seqlen), ctypes.addressof(learned),
    )  # fmt: skip


def set_workspace(index: int, stream: int, tensor: torch.Tensor) -> None:
    """The workspace of the library's calls on (device ``index``, ``stream``)."""
    so = _state["library"]
    if so is not None:
        so.flash_kda_torch_set_workspace(index, stream, tensor.data_ptr(), tensor.numel())


def launches() -> Optional[int]:
    """The calls the library has launched, or None while it is not attached."""
    so = _state["library"]
    return None if so is None else so.flash_kda_torch_launches()


def forget() -> None:
    """Forget the learned signatures and workspaces (the Python path learns them again)."""
    so = _state["library"]
    if so is not None:
        so.flash_kda_torch_forget()
