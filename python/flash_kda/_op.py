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

import torch

from . import _validate, dispatch

# Registered through torch.library's schema API rather than torch.library.custom_op: the
# latter wraps every eager call in Python layers (autograd, in-place view, default filling,
# dynamo disable) that cost ~120 us a call on the CPU, more than the whole forward at
# 8 x 1024 tokens; a schema op dispatches to the same Python kernel in ~4 us.
_LIBRARY = torch.library.Library("flash_kda", "DEF")
_LIBRARY.define(
    "fwd(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float scale, Tensor(a!) out, Tensor A_log, "
    "Tensor dt_bias, float lower_bound, Tensor? initial_state, Tensor(b!)? final_state, Tensor? cu_seqlens, "
    "Tensor? ssm_state_indices, Tensor? has_initial_state, int? checkpoint_every, Tensor(c!)? checkpoints, "
    "bool? exact, int? max_seqlen, bool state_in_place) -> ()"
)


def fwd_op(
    q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
    ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, state_in_place,
) -> None:  # fmt: skip
    """Validate the call completely, then run it on the path the dispatcher picks."""
    if state_in_place:
        initial_state = final_state
    call = _validate.check_fwd(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
        ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen,
    )  # fmt: skip
    dispatch.run(call)


_LIBRARY.impl("fwd", fwd_op, "CompositeExplicitAutograd")
OP = torch.ops.flash_kda.fwd  # what flash_kda.fwd calls


@torch.library.register_fake("flash_kda::fwd")
def _fwd_fake(*args, **kwargs) -> None:
    """Nothing to compute on fake tensors: the op returns nothing and writes in place."""
    return None
