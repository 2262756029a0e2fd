# SPDX-License-Identifier: MIT
"""The eager launch in C (``libflash_kda_torch.so``, src/torch/eager.cpp; docs/dispatch.md):
an eager call of a signature that the Python path validated before reads its tensors and
launches from C, through one Python function the library makes (:data:`OP`), which reads
each tensor through torch's C functions (torch >= 2.10): no torch op, no dispatcher.

Nothing is loaded until the Python path has made a prepacked launch (:func:`learn`): then the
library is attached once, its reading of tensors is checked against a probe's metadata, and
:data:`OP` becomes its launch function; each later call of a learned signature (handed over
by the library's learn function) is one call of it. Where torch is older than 2.10, the
library is missing or the probe disagrees, :data:`OP` stays None and the Python path runs
every call (with a torch without CUDA, every call is a miss).
"""

import ctypes
import os
import threading
from typing import Optional

import torch

from . import _args, _native, _validate

_inference_enabled = torch.is_inference_mode_enabled
_ENVIRON, _OFF = _validate.ENVIRON, b"0"
_SWITCH_KEY = _native.SWITCH_ENV.encode()

LIBRARY_NAME = "libflash_kda_torch.so"
MISS = -1  # the launch's result for a call it leaves to the Python path (0: launched)

# The arguments of the library's functions: the tensors of flash_kda.fwd (None or a tensor),
# its scalars that vary with the call's sizes (None passed as 0; floats, then ints), then
# `forms` (:func:`forms`: the rest, one int); then the launch's inference-mode flag or the
# learn's address of a Learned.
_SCALARS = ("scale", "lower_bound", "checkpoint_every", "max_seqlen")
SLOTS = (*_args.TENSORS, *(a.name for a in _args.ARGS if a.name in _SCALARS), "forms")
_GATE_FORMS = {gate: code << 5 for gate, code in _native.GATE_CODES.items()}  # gate name -> its bits of forms


def forms(gate: str, beta_is_logit: bool, exact: bool, lower_bound, checkpoint_every, max_seqlen) -> int:
    """The library functions' ``forms``: the gate's code, beta_is_logit, the resolved mode, and which of
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


OP = None  # the library's launch function once attached
_LEARN = None  # its learn function
_state = dict(tried=False, library=None, error=None, native=None)
# What the library keeps (borrowed): the plain tensor types and the attribute names it reads.
_OBJECTS = (torch.Tensor, torch.nn.Parameter, None, True, "_cdata", "requires_grad", "is_inference")
_lock = threading.Lock()


def _torch_at_least_2_10() -> bool:
    try:
        major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 10)


def _probe_agrees(so: ctypes.CDLL) -> bool:
    """Whether the library reads a strided, offset probe tensor's metadata as torch gives it."""
    probe = torch.empty(3, 4, 5, 6).permute(2, 0, 3, 1)[1:, :, 2:]
    words = (ctypes.c_int64 * 11)()
    if so.flash_kda_torch_probe(probe, words) != 0:
        return False
    expect = [probe.data_ptr(), probe.dim(), *probe.shape, *probe.stride()]
    return list(words[:10]) == expect and so.flash_kda_torch_probe(object(), words) != 0


def attach(lib: "_native.NativeLibrary") -> Optional[ctypes.CDLL]:
    """The attached library (loaded, checked and its functions made once, calling ``lib``'s
    flash_kda_fwd), or None where it cannot be (:func:`attach_error` says why)."""
    global OP, _LEARN
    if not isinstance(lib, _native.NativeLibrary):  # a stand-in (flash_kda.testing): the Python path only
        return None
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
            if not _torch_at_least_2_10():
                _state["error"] = f"torch {torch.__version__}: the eager launch needs torch >= 2.10"
            elif not os.path.exists(path):
                _state["error"] = f"{path} is not installed"
            else:
                try:
                    so = ctypes.PyDLL(path, mode=ctypes.RTLD_LOCAL)  # its functions use the interpreter's
                    so.flash_kda_torch_attach.restype = ctypes.c_int32
                    so.flash_kda_torch_attach.argtypes = [ctypes.c_void_p] * 2 + [ctypes.py_object] * len(_OBJECTS)
                    so.flash_kda_torch_function.restype = ctypes.py_object
                    so.flash_kda_torch_function.argtypes = [ctypes.c_int32]
                    so.flash_kda_torch_probe.restype = ctypes.c_int32
                    so.flash_kda_torch_probe.argtypes = [ctypes.py_object, ctypes.c_void_p]
                    so.flash_kda_torch_set_workspace.argtypes = [ctypes.c_int32, ctypes.c_void_p,
                                                                 ctypes.c_void_p, ctypes.c_int64]  # fmt: skip
                    so.flash_kda_torch_slots.restype = ctypes.c_char_p
                    so.flash_kda_torch_launches.restype = ctypes.c_int64
                    if so.flash_kda_torch_slots().decode() != ",".join(SLOTS):
                        raise RuntimeError("its argument slots differ from this package's")
                    status = so.flash_kda_torch_attach(lib.fwd_address, lib.plan_address, *_OBJECTS)
                    if status:
                        raise RuntimeError(f"flash_kda_torch_attach failed at step {status}")
                    if not _probe_agrees(so):
                        raise RuntimeError("it reads torch's tensors otherwise than torch gives them")
                    OP, _LEARN = so.flash_kda_torch_function(0), so.flash_kda_torch_function(1)
                    _state.update(library=so, native=lib)
                except (OSError, AttributeError, RuntimeError, ValueError) as err:
                    OP = _LEARN = None
                    _state["error"] = f"cannot attach {path}: {err}"
        return _state["library"]


def launched(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
             ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, gate,
             beta_is_logit) -> bool:  # fmt: skip
    """Whether an eager call of flash_kda.fwd ran from C: a learned signature with the native
    path on. C leaves to the Python path (False) any call of a tensor that is not exactly a
    torch.Tensor, an input that requires grad in grad mode, an inference tensor to write
    outside inference mode, or a stream capturing a graph (a captured call takes the graph's
    workspace); so does any argument it cannot take."""
    mode = _validate.cached_mode(scale, lower_bound, checkpoint_every, exact, max_seqlen, gate, beta_is_logit)
    if mode is None or _native.overrides is not None or _ENVIRON is None or _ENVIRON.get(_SWITCH_KEY) == _OFF:
        return False
    try:
        return (
            OP(q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens, ssm_state_indices,
               has_initial_state, checkpoints, scale, 0.0 if lower_bound is None else lower_bound,
               0 if checkpoint_every is None else checkpoint_every, 0 if max_seqlen is None else max_seqlen,
               forms(gate, beta_is_logit, mode, lower_bound, checkpoint_every, max_seqlen), _inference_enabled())
            == 0
        )  # fmt: skip
    except Exception:
        return False


def learns() -> bool:
    """Whether the native path's launches teach the eager launch in C their signatures: it is
    attached to the library that runs them (not to a stand-in's calls, flash_kda.testing)."""
    return OP is not None and _native.load() is _state["native"]


def tried() -> bool:
    """Whether :func:`attach` has run (it attaches at most once)."""
    return _state["tried"]


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
