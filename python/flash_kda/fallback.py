# SPDX-License-Identifier: MIT
"""The two non-native paths of :func:`flash_kda.fwd`, with native's in-place contract.

* :func:`fla_fwd`: flash-linear-attention's Triton ``chunk_kda``, called through its
  undispatched implementation. fla's public ``chunk_kda`` would offer the call to its
  FlashKDA backend, i.e. back to ``flash_kda.fwd``; ``inspect.unwrap`` strips that
  dispatcher, so this path can never recurse.
* :func:`torch_fwd`: pure PyTorch, the ledger of :mod:`flash_kda.reference`.
"""

import functools
import inspect
from typing import Callable, Optional

import torch

from . import reference

torch_fwd = reference.fwd

# The chunk_kda flags that give fla's forward FlashKDA's semantics (fused L2 norm, beta
# sigmoid and safe gate, V-first state); with them fla's own dispatcher also routes
# chunk_kda to flash_kda.fwd (spec section 1.7).
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


def fla_fwd(
    q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None, cu_seqlens=None
) -> None:
    """Run fla's Triton forward with FlashKDA's semantics (fused L2 norm, beta sigmoid and
    safe gate, V-first state) and write ``out`` / ``final_state`` in place. Inputs must
    already be validated."""
    impl = fla_chunk_kda()
    if impl is None:
        raise RuntimeError("flash_kda: the fla path was chosen but fla cannot be imported")
    H = q.shape[2]
    with torch.no_grad():
        o, ht = impl(
            q,
            k,
            v,
            g,
            beta,
            scale=float(scale),
            initial_state=None if initial_state is None else initial_state.float(),
            output_final_state=final_state is not None,
            lower_bound=float(lower_bound),
            cu_seqlens=cu_seqlens,
            **FLASH_KDA_FLAGS,
            A_log=A_log,
            dt_bias=dt_bias.reshape(H * reference.D),
        )
        out.copy_(o)
        if final_state is not None:
            final_state.copy_(ht)
