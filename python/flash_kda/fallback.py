# SPDX-License-Identifier: MIT
"""The two non-native paths of :func:`flash_kda.fwd`, with native's in-place contract.

Both take a validated call (``_validate.FwdCall``), read its device index tensors on the
host (they synchronise anyway) and check them before writing anything.

* :func:`fla_fwd`: flash-linear-attention's Triton ``chunk_kda``, called through its
  undispatched implementation. fla's public ``chunk_kda`` would offer the call to its
  FlashKDA backend, i.e. back to ``flash_kda.fwd``; ``inspect.unwrap`` strips that
  dispatcher, so this path can never recurse. Pools are gathered before and scattered
  after; strided inputs are copied; rows past the last sequence are left untouched. It
  writes no checkpoints: the dispatcher sends checkpointed calls to the PyTorch path.
* :func:`torch_fwd`: pure PyTorch, the ledger of :mod:`flash_kda.reference` with exact
  math (it never loads the native library).
"""

import functools
import inspect
from typing import Callable, Optional

import torch

from . import _sequences, reference
from ._numerics import Ops

# The chunk_kda flags that give fla's forward FlashKDA's semantics (fused L2 norm, beta
# sigmoid and safe gate, V-first state); with them fla's own dispatcher also routes
# chunk_kda to flash_kda.fwd (design §1.7).
FLASH_KDA_FLAGS = dict(
    use_qk_l2norm_in_kernel=True,
    use_gate_in_kernel=True,
    use_beta_sigmoid_in_kernel=True,
    safe_gate=True,
    state_v_first=True,
)


@functools.cache
def fla_chunk_kda() -> Optional[Callable]:
    """fla's undispatched ``chunk_kda``, or ``None`` when fla cannot be imported."""
    try:
        from fla.ops.kda.chunk import chunk_kda
    except Exception:  # fla missing, or its own dependencies (triton, ...) broken
        return None
    return inspect.unwrap(chunk_kda)


def fla_available() -> bool:
    return fla_chunk_kda() is not None


def fla_forms(call) -> tuple:
    """``(g, beta, keywords)``: fla's arguments for the call's gate and beta forms. The bounded
    gate takes FLASH_KDA_FLAGS; the softplus gate fla's unbounded in-kernel gate (safe_gate
    off, no lower_bound); a log decay fla's precomputed gate (use_gate_in_kernel off), clamped
    to <= 0 as the kernels take it (NaN: 0); a probability beta fla's post-sigmoid beta, clamped
    to [0, 1] (NaN: 0)."""
    flags = dict(FLASH_KDA_FLAGS, A_log=call.A_log, lower_bound=call.lower_bound)
    flags["dt_bias"] = None if call.dt_bias is None else call.dt_bias.reshape(-1)
    g, beta = call.g.contiguous(), call.beta.contiguous()
    if call.gate == "softplus":
        flags.update(safe_gate=False, lower_bound=None)
    elif call.gate == "log_decay":
        flags.update(use_gate_in_kernel=False, safe_gate=False, lower_bound=None, A_log=None, dt_bias=None)
        g = torch.fmin(g, torch.zeros((), dtype=g.dtype, device=g.device))
    if not call.beta_is_logit:
        flags.update(use_beta_sigmoid_in_kernel=False)
        beta = torch.nan_to_num(beta, nan=0.0).clamp(0.0, 1.0)
    return g, beta, flags


def fla_fwd(call) -> None:
    """Run fla's Triton forward with FlashKDA's semantics on a validated call without
    checkpoints; write ``out`` (rows inside sequences) and ``final_state`` in place."""
    impl = fla_chunk_kda()
    if impl is None:
        raise RuntimeError("flash_kda: the fla path was chosen but fla cannot be imported")
    host = _sequences.read_host(call)
    if host.bounds is not None and host.bounds[-1] == 0:  # every sequence empty: the states alone
        reference.run(call, Ops(call.device, probes=False))
        return
    start = _sequences.initial_states(call, host)
    with torch.no_grad():
        g, beta, flags = fla_forms(call)
        o, ht = impl(
            call.q.contiguous(),
            call.k.contiguous(),
            call.v.contiguous(),
            g,
            beta,
            scale=call.scale,
            initial_state=None if start is None else start.float(),
            output_final_state=call.final_state is not None,
            cu_seqlens=None if call.cu_seqlens is None else call.cu_seqlens.long(),
            **flags,
        )
        if host.bounds is None:
            call.out.copy_(o)
        else:
            end = host.bounds[-1]
            call.out[:, :end].copy_(o[:, :end])
        if call.final_state is not None:
            _sequences.store_final_states(call, host, ht)


def torch_fwd(call) -> None:
    """The ledger with exact math on the call's device (never the native library)."""
    reference.run(call, Ops(call.device, probes=False))
