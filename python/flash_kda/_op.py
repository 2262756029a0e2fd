# SPDX-License-Identifier: MIT
"""The custom op ``flash_kda::fwd`` behind :func:`flash_kda.fwd`.

Registered at import (cheap: no library is loaded). Its real implementation runs the full
validation (``_validate.check_fwd``: device pointers, index contents on the CPU, aliasing)
before anything is written, then the dispatcher; both run eagerly, outside any trace. The
fake implementation writes nothing, so ``torch.compile`` traces a call without reading data.

In-place state updates: a call whose final_state *is* its initial_state passes
``initial_state=None, state_in_place=True``, so that the schema's only mutated arguments
are out, final_state and checkpoints (no undeclared mutation of an input).
"""

from typing import Optional

import torch

from . import _validate, dispatch


@torch.library.custom_op("flash_kda::fwd", mutates_args=("out", "final_state", "checkpoints"))
def fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    lower_bound: float,
    initial_state: Optional[torch.Tensor],
    final_state: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    ssm_state_indices: Optional[torch.Tensor],
    has_initial_state: Optional[torch.Tensor],
    checkpoint_every: Optional[int],
    checkpoints: Optional[torch.Tensor],
    exact: Optional[bool],
    state_in_place: bool,
) -> None:
    """Validate the call completely, then run it on the path the dispatcher picks."""
    if state_in_place:
        initial_state = final_state
    call = _validate.check_fwd(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
        ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact,
    )  # fmt: skip
    dispatch.run(call)


OP = torch.ops.flash_kda.fwd  # what flash_kda.fwd calls


@fwd_op.register_fake
def _fwd_fake(*args, **kwargs) -> None:
    """Nothing to compute on fake tensors: the op returns nothing and writes in place."""
    return None
