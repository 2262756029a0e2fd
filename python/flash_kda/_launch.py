# SPDX-License-Identifier: MIT
"""The native path of a call (docs/dispatch.md): the argument struct of ``flash_kda.h``, the
workspace and the launch on the current stream of the call's device; and, per signature,
a prepacked launch that patches only the data pointers, with which an eager call of a
signature met before costs a few microseconds of host time.

Nothing here reads device memory on the host or copies from host to device, so a call whose
index tensors are on the GPU can be captured in a CUDA graph.
"""

import ctypes
import operator
import os
import threading
from typing import Optional

import torch

from . import _args, _eager, _native, _validate

_DTYPE_CODES = {
    None: _native.DTYPE_NONE,
    torch.bfloat16: _native.DTYPE_BF16,
    torch.float32: _native.DTYPE_FP32,
    torch.int32: _native.DTYPE_INT32,
    torch.int64: _native.DTYPE_INT64,
}
_STRIDED = ("q", "k", "v", "g", "out", "beta")  # FwdCall.strides' order

# The current stream, the device switch and the capture state through torch's C functions
# where this torch has them (~1 us a call less than torch.cuda.current_stream(device), which
# builds a Stream, and torch.cuda.device(device), which parses its argument), else the
# public API.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_exchange_device = getattr(torch.cuda, "_exchange_device", None)
_maybe_exchange_device = getattr(torch.cuda, "_maybe_exchange_device", None)
# () -> whether the current stream of the current device captures a graph
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)


def current_stream(index: int) -> int:
    """The ``cudaStream_t`` (as an int) of the current stream of CUDA device ``index``."""
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


# ------------------------------------------------------------------ the argument struct


def _present(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """x, or None where it has no elements (the library takes NULL for those)."""
    return x if x is not None and x.numel() else None


def _address(x: Optional[torch.Tensor]) -> int:
    return 0 if x is None else x.data_ptr()


def _code(x: Optional[torch.Tensor]) -> int:
    return _DTYPE_CODES[None if x is None else x.dtype]


def _word_aligned(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """An index tensor contiguous and 8-byte aligned for the library (a device copy when
    it is not: no synchronisation, captured like the rest in a CUDA graph)."""
    if x is None or (x.is_contiguous() and x.data_ptr() % 8 == 0):
        return x
    return x.clone(memory_format=torch.contiguous_format)


# Every scalar of flash_kda_fwd_args in layout order (strides as "q_strides.batch", ...) and
# one struct.Struct writing them all: a validated call's struct in ~1 us.
_PACKER, _LAYOUT = _native.flat_layout(_native.FwdArgs)
_IN_LAYOUT_ORDER = operator.itemgetter(*_LAYOUT)
_DISPATCHER = dict.fromkeys(_args.DISPATCH_FIELDS, 0)  # workspace, reserved: 0 until the launch
_DISPATCHER["struct_size"] = ctypes.sizeof(_native.FwdArgs)
_STRIDE_NAMES = tuple(f"{name}_strides.{d}" for name in _STRIDED for d in ("batch", "token", "head"))


def native_fields(call: _validate.FwdCall, num_sms: int) -> tuple[dict, tuple]:
    """``(fields, tensors to keep alive until the launch)``: every scalar of
    ``flash_kda_fwd_args`` by name (its strides as ``q_strides.batch``, ...): those the
    table's arguments fill (``_args.ARGS``' ``abi``), ``num_sms``, and the dispatcher's own
    as 0 (the workspace is the launch's)."""
    cu, indices = _word_aligned(call.cu_seqlens), _word_aligned(_present(call.state_indices))
    has_initial = _present(call.has_initial_state)
    if has_initial is not None:
        has_initial = has_initial.contiguous()
    checkpoints, initial, final = _present(call.checkpoints), _present(call.initial_state), _present(call.final_state)
    tokens = call.batch * call.seqlen > 0
    fields = dict(
        _DISPATCHER, batch=call.batch, seqlen=call.seqlen, heads=call.heads, head_dim=_validate.HEAD_DIM,
        num_seqs=call.num_seqs, scale=call.scale, lower_bound=call.lower_bound, A_log=_address(call.A_log),
        dt_bias=_address(call.dt_bias), initial_state=_address(initial), initial_state_dtype=_code(initial),
        final_state=_address(final), final_state_dtype=_code(final), cu_seqlens=_address(cu),
        cu_seqlens_dtype=_code(cu), state_indices=_address(indices), state_indices_dtype=_code(indices),
        state_pool_size=call.pool_size if indices is not None else 0, has_initial_state=_address(has_initial),
        checkpoints=_address(checkpoints), checkpoints_dtype=_code(checkpoints),
        checkpoint_every=call.checkpoint_every if checkpoints is not None else 0,
        checkpoint_slots=checkpoints.shape[0] if checkpoints is not None else 0,
        mode=_native.MODE_EXACT if call.exact else _native.MODE_AUTO, max_seqlen=call.max_seqlen, num_sms=num_sms,
        q=call.q.data_ptr() if tokens else 0, k=call.k.data_ptr() if tokens else 0,
        v=call.v.data_ptr() if tokens else 0, g=call.g.data_ptr() if tokens else 0,
        out=call.out.data_ptr() if tokens else 0, beta=call.beta.data_ptr() if tokens else 0,
        gate=_native.GATE_CODES[call.gate], g_dtype=_code(call.g), beta_dtype=_code(call.beta),
        beta_form=_native.BETA_LOGIT if call.beta_is_logit else _native.BETA_PROBABILITY,
    )  # fmt: skip
    q, k, v, g, out, beta = call.strides  # (batch, token, head) each, in _STRIDED's order
    fields.update(zip(_STRIDE_NAMES, (*q, *k, *v, *g, *out, *beta)))
    return fields, (cu, indices, has_initial)


def native_struct(call: _validate.FwdCall, num_sms: int) -> tuple[_native.FwdArgs, tuple]:
    """``(flash_kda_fwd_args, tensors to keep alive until the launch)`` of a call."""
    fields, keep = native_fields(call, num_sms)
    args = _native.FwdArgs()
    _PACKER.pack_into(args, 0, *_IN_LAYOUT_ORDER(fields))
    return args, keep


# ------------------------------------------------------------------ the workspace

# One workspace per (device, stream), reused by the calls outside graph capture: calls on one
# stream run in its order, so they may share it (a call on another stream gets its own). A
# capture takes its own from torch's allocator (the graph's pool), as do workspaces larger
# than this, whose allocation costs little beside their calls' GPU time.
WORKSPACE_CACHE_BYTES = 64 << 20
_workspaces: dict = {}  # (device index, stream) -> uint8 tensor


def workspace(device: torch.device, index: int, stream: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor of at least ``nbytes`` on ``device`` for a launch on ``stream``, which
    must be the current stream (its capture state decides)."""
    if nbytes > WORKSPACE_CACHE_BYTES or _capturing():
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    key = (index, stream)
    cached = _workspaces.get(key)
    if cached is None or cached.numel() < nbytes:
        # a power of two: the calls of a growing varlen batch reallocate it (and leave the launch
        # from C, which only takes a workspace it has been given) a few times, not at each step
        size = min(WORKSPACE_CACHE_BYTES, 1 << max(nbytes - 1, 1).bit_length())
        cached = _workspaces[key] = torch.empty(size, dtype=torch.uint8, device=device)
        _eager.set_workspace(index, stream, cached)
    return cached


def clear_workspaces() -> None:
    _eager.forget()
    _workspaces.clear()


# ------------------------------------------------------------------ the launch


def _switch(index: int) -> int:
    """Make CUDA device ``index`` current; returns the previous one (restore with _restore)."""
    if _exchange_device is not None and _maybe_exchange_device is not None:
        return _exchange_device(index)
    previous = torch.cuda.current_device()
    torch.cuda.set_device(index)
    return previous


def _restore(previous: int, index: int) -> None:
    """Make device ``previous`` current again after :func:`_switch` to ``index``."""
    if previous == index:
        return
    if _exchange_device is not None and _maybe_exchange_device is not None:
        _maybe_exchange_device(previous)
    else:
        torch.cuda.set_device(previous)


def run(call: _validate.FwdCall, index: int, facts: tuple, switch: str, *, workspace_tensor=None,
        overrides=None) -> bool:  # fmt: skip
    """Run a validated call on CUDA device ``index`` (``facts``: its compute capability and
    SMs) on its current stream, with the device made current for the call (as ``with
    torch.cuda.device(index)``); ``switch``: the environment variable whose value "0" makes
    the prepacked launch leave a call to the dispatcher. ``workspace_tensor`` (uint8, at least the plan's bytes) may
    be given to read the records afterwards; ``overrides`` (a ``_native.TestingOverrides``)
    go through the test entry point; by default the process-wide ones, if any. True once
    launched; the eager launch in C is attached at the first launch (``_eager``)."""
    lib = _native.load()
    if _eager.OP is None and not _eager.tried() and _eager.attach(lib) is not None:
        for (device_index, stream), tensor in list(_workspaces.items()):  # those cached before it attached
            _eager.set_workspace(device_index, stream, tensor)
    cc, num_sms = facts
    if overrides is None:
        overrides = _native.overrides
    args, keep_alive = native_struct(call, num_sms)
    previous = _switch(index)  # the plan is the current device's (its facts)
    try:
        nbytes = lib.plan(cc, args, overrides).workspace_bytes
        if overrides is None and workspace_tensor is None and call.record is not None and call.record.launch is None:
            call.record.launch = prepacked(call, args, nbytes, lib, index, cc, switch)
        stream = current_stream(index)
        if workspace_tensor is None:
            workspace_tensor = workspace(call.device, index, stream, nbytes)
        args.workspace, args.workspace_bytes = workspace_tensor.data_ptr(), workspace_tensor.numel()
        lib.fwd(cc, args, stream, overrides)
    finally:
        _restore(previous, index)
    del keep_alive  # only now: the stream orders any reuse of their memory after the launch
    return True


# ------------------------------------------------------------------ the prepacked launch

_HEAD = _native.field_packer(_native.FwdArgs, "q", "workspace_bytes")  # pointers, scalars, states
_POOL = _native.field_packer(_native.FwdArgs, "state_indices", "checkpoints")  # pool, checkpoints


def _eligible(call: _validate.FwdCall) -> bool:
    """Whether the calls of this signature can run as a prepacked launch: tokens, exact torch
    tensors, the gate parameters fp32 and contiguous (used as they are), index tensors on the
    device and contiguous, checkpoints with slots; pointer facts are checked per call."""
    record, tensors = call.record, [getattr(call, name, None) for name in _STRIDED]
    tensors += [call.initial_state, call.final_state, call.cu_seqlens, call.state_indices, call.has_initial_state]
    return (
        call.has_tokens
        and not record.cu_on_host
        and not record.indices_on_host
        and all(x is None or type(x) in (torch.Tensor, torch.nn.Parameter) for x in tensors)
        and all(x is None or x.is_contiguous() for x in tensors[8:])
        and (call.checkpoints is None or call.checkpoints.numel() > 0)
    )


def prepacked(call: _validate.FwdCall, args: _native.FwdArgs, nbytes: int, lib, index: int, cc: int, switch: str):
    """The launch of the calls of ``call``'s signature, or None where it cannot run them
    (:func:`_eligible`): ``launch(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
    initial_state, final_state, cu_seqlens, ssm_state_indices, has_initial_state,
    checkpoints)`` returns True once it has launched, False for a call it leaves to the
    validated path (test overrides set, ``FLA_FLASH_KDA=0``, gate parameters or index tensors
    that the validated path copies to align them). The library checks every pointer (NULL,
    alignment, overlap) before it launches; when it refuses a call, the full validation
    raises what is wrong."""
    if not _eligible(call) or not call.record.gates_as_given or _native.overrides is not None:
        return None
    template = _native.FwdArgs.from_buffer_copy(args)
    address, lock, device = ctypes.addressof(template), threading.Lock(), call.device
    launch_fn, (head_at, head, _), (pool_at, pool, _) = lib.fwd_by_address, _HEAD, _POOL
    states, pool_size = (args.initial_state_dtype, args.final_state_dtype), args.state_pool_size
    pooled = call.state_indices is not None or call.has_initial_state is not None or call.checkpoints is not None
    env, switch_key, off = _validate.ENVIRON, switch.encode(), b"0"
    # the gates without parameters or a bound: NULL and 0.0, as the validated path passes them
    parameters, bounded = call.A_log is not None, call.gate == "lower_bound"

    def launch(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
               ssm_state_indices, has_initial_state, checkpoints) -> bool:  # fmt: skip
        if _native.overrides is not None or (env.get(switch_key) == off if env is not None else _off(switch)):
            return False
        a, d = (A_log.data_ptr(), dt_bias.data_ptr()) if parameters else (0, 0)
        cu = 0 if cu_seqlens is None else cu_seqlens.data_ptr()
        si = 0 if ssm_state_indices is None else ssm_state_indices.data_ptr()
        if (a | d) & 15 or (cu | si) & 7:
            return False
        previous = _switch(index)
        try:
            stream = current_stream(index)
            ws = workspace(device, index, stream, nbytes)
            with lock:
                head.pack_into(
                    template, head_at, q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(),
                    out.data_ptr(), a, d, scale, lower_bound if bounded else 0.0,
                    0 if initial_state is None else initial_state.data_ptr(),
                    0 if final_state is None else final_state.data_ptr(), *states, cu, ws.data_ptr(), ws.numel(),
                )  # fmt: skip
                if pooled:
                    pool.pack_into(
                        template, pool_at, si, pool_size,
                        0 if has_initial_state is None else has_initial_state.data_ptr(),
                        0 if checkpoints is None else checkpoints.data_ptr(),
                    )  # fmt: skip
                status = launch_fn(cc, address, stream)
        finally:
            _restore(previous, index)
        if status:
            _refused(lib, status, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state,
                     final_state, cu_seqlens, ssm_state_indices, has_initial_state, checkpoints, call)  # fmt: skip
        return True

    def learn(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
              ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, gate,
              beta_is_logit) -> None:  # fmt: skip
        """After a launch of this signature: hand it to the eager launch in C (_eager), which
        then runs the signature's next calls."""
        so = _eager.attach(lib)  # attached by run() before this launch was made, or never
        if so is not None:
            _eager.learn(so, template, cc, index, nbytes, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound,
                         initial_state, final_state, cu_seqlens, ssm_state_indices, has_initial_state,
                         checkpoint_every, checkpoints, exact, max_seqlen, gate, beta_is_logit)  # fmt: skip

    launch.learn = learn
    return launch


def _off(switch: str) -> bool:
    return os.environ.get(switch) == "0"


def _refused(lib, status, q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
             cu_seqlens, ssm_state_indices, has_initial_state, checkpoints, call) -> None:  # fmt: skip
    """A call the library refused: the full validation's error where it finds one, else the
    library's (``_native.NativeError``; nothing was launched either way)."""
    message = lib.error(status)
    if status == _native.STATUS_INVALID_ARGUMENT:
        _validate.check_all(
            q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
            ssm_state_indices, has_initial_state, call.checkpoint_every if checkpoints is not None else None,
            checkpoints, call.exact, gate=call.gate, beta_is_logit=call.beta_is_logit,
        )  # fmt: skip
    raise _native.NativeError(message, status)
