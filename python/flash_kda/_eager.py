# SPDX-License-Identifier: MIT
"""The eager launch in C (``libflash_kda_torch.so``, src/torch/eager.cpp; docs/dispatch.md):
an eager call of a signature that the Python path validated before reads its tensors and
launches from C, through the internal op ``flash_kda::eager_launch`` (torch's stable C ABI,
torch >= 2.10).

Nothing is loaded until the Python path has made a prepacked launch (:func:`learn`): then
the library is attached once, :data:`OP` becomes the op's callable, and each later call of a
learned signature is one op call. Where torch is older than 2.10 or has no CUDA, or the
library is missing, :data:`OP` stays None and the Python path runs every call.
"""

import ctypes
import os
import threading
from typing import Optional

import torch

from . import _args, _native

LIBRARY_NAME = "libflash_kda_torch.so"
MISS = -1  # the op's result for a call it leaves to the Python path (0: launched)

# The op's scalars: the arguments of flash_kda.fwd that are not tensors, in its order, with
# the type the op takes them as (None passed as -1 for the ints); then its own `learn`.
_SCALARS = dict(scale="float", lower_bound="float?", checkpoint_every="int", exact="bool", max_seqlen="int",
                gate="int", beta_is_logit="bool")  # fmt: skip
SLOTS = (*_args.TENSORS, *(a.name for a in _args.ARGS if a.name in _SCALARS), "learn")
_TYPES = {a.name: a.schema for a in _args.ARGS if a.name in _args.TENSORS} | _SCALARS | dict(learn="int")
SCHEMA = f"eager_launch({', '.join(f'{_TYPES[name]} {name}' for name in SLOTS)}) -> int"
GATE_CODES = _native.GATE_CODES  # gate name -> flash_kda_gate


class _Learned(ctypes.Structure):
    """flash_kda_torch_learned of eager.cpp: what a learn call hands the library."""

    _fields_ = [("args", ctypes.c_void_p), ("compute_capability", ctypes.c_int32), ("device", ctypes.c_int32),
                ("workspace_bytes", ctypes.c_int64)]  # fmt: skip


OP = None  # the op's callable once attached
_state = dict(tried=False, library=None, error=None, definition=None)
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
    global OP
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
                    so.flash_kda_torch_attach.argtypes = [ctypes.c_void_p]
                    so.flash_kda_torch_set_workspace.argtypes = [ctypes.c_int32, ctypes.c_void_p,
                                                                 ctypes.c_void_p, ctypes.c_int64]  # fmt: skip
                    so.flash_kda_torch_slots.restype = ctypes.c_char_p
                    so.flash_kda_torch_launches.restype = ctypes.c_int64
                    if so.flash_kda_torch_slots().decode() != ",".join(SLOTS):
                        raise RuntimeError("its argument slots differ from this package's schema")
                    definition = torch.library.Library("flash_kda", "FRAGMENT")
                    definition.define(SCHEMA)
                    status = so.flash_kda_torch_attach(ctypes.cast(lib.fwd_by_address, ctypes.c_void_p))
                    if status:
                        raise RuntimeError(f"flash_kda_torch_attach failed at step {status}")
                    _state.update(library=so, definition=definition)
                    overload = torch.ops.flash_kda.eager_launch.default
                    OP = getattr(overload, "_op", overload)  # the C++ callable, without one Python frame
                except (OSError, AttributeError, RuntimeError) as err:
                    _state["error"] = f"cannot attach {path}: {err}"
        return _state["library"]


def attach_error() -> Optional[str]:
    return _state["error"]


def learn(so: ctypes.CDLL, template: ctypes.Structure, cc: int, index: int, nbytes: int, q, k, v, g, beta, scale,
          out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens, ssm_state_indices,
          has_initial_state, checkpoint_every, checkpoints, exact: bool, max_seqlen, gate, beta_is_logit) -> None:  # fmt: skip
    """Hand the library a validated call of a prepacked signature (``template``: its
    flash_kda_fwd_args; the call's own tensors, which give the library its key)."""
    learned = _Learned(ctypes.addressof(template), cc, index, nbytes)
    OP(
        q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens, ssm_state_indices,
        has_initial_state, checkpoints, scale, lower_bound, -1 if checkpoint_every is None else checkpoint_every,
        exact, -1 if max_seqlen is None else max_seqlen, GATE_CODES[gate], beta_is_logit, ctypes.addressof(learned),
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
