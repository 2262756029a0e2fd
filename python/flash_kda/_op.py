# SPDX-License-Identifier: MIT
"""The custom op ``flash_kda::fwd`` behind :func:`flash_kda.fwd`, for ``torch.compile``,
torch function and dispatch modes and the profiler.

Registered at import (cheap: no library is loaded), with the schema of ``_args.schema()``:
FlashKDA's ten arguments, then the rest with ``flash_kda.fwd``'s names and defaults, and
``state_in_place``. Its real implementation (:func:`fwd_op`) runs the full validation
before anything is written, then the dispatcher; the fake implementation writes nothing, so
``torch.compile`` traces a call without reading data. An eager call of ``flash_kda.fwd``
outside any mode runs the same implementation without the dispatcher's hop (``_api``).

In-place state updates: a call whose final_state *is* its initial_state passes
``initial_state=None, state_in_place=True``, so that the schema's only mutated arguments
are out, final_state and checkpoints (no undeclared mutation of an input).
"""

import torch

from . import _args, _validate, dispatch

# Registered through torch.library's schema API rather than torch.library.custom_op: the
# latter wraps every eager call in Python layers (autograd, in-place view, default filling,
# dynamo disable) that cost ~120 us a call on the CPU; a schema op dispatches to the same
# Python kernel in ~4 us.
_LIBRARY = torch.library.Library("flash_kda", "DEF")
_LIBRARY.define(_args.schema())


def fwd_op(
    q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None, cu_seqlens=None,
    ssm_state_indices=None, has_initial_state=None, checkpoint_every=None, checkpoints=None, exact=None,
    max_seqlen=None, gate="lower_bound", beta_is_logit=True, state_in_place=False,
) -> None:  # fmt: skip
    """Validate the call completely, then run it on the path the dispatcher picks."""
    if state_in_place:
        initial_state = final_state
    call = _validate.check_fwd(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
        ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, gate, beta_is_logit,
    )  # fmt: skip
    dispatch.run(call)


_LIBRARY.impl("fwd", fwd_op, "CompositeExplicitAutograd")
OP = torch.ops.flash_kda.fwd  # what flash_kda.fwd calls inside a trace or a mode


@torch.library.register_fake("flash_kda::fwd")
def _fwd_fake(*args, **kwargs) -> None:
    """Nothing to compute on fake tensors: the op returns nothing and writes in place."""
    return None


def call(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
         ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, gate,
         beta_is_logit) -> None:  # fmt: skip
    """``flash_kda.fwd`` through the op: the traceable checks, the scalars as the schema takes
    them, and the in-place state as ``state_in_place``."""
    tensors = dict(q=q, k=k, v=v, g=g, beta=beta, out=out, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state,
                   final_state=final_state, cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
                   has_initial_state=has_initial_state, checkpoints=checkpoints)  # fmt: skip
    _validate.check_forms(gate, beta_is_logit)
    _validate.check_traceable(tensors, dict(out=out, final_state=final_state, checkpoints=checkpoints), gate)
    scale, lower_bound, checkpoint_every, exact, max_seqlen = _validate.traceable_scalars(
        scale, lower_bound, checkpoint_every, exact, max_seqlen
    )
    in_place = initial_state is not None and final_state is initial_state
    OP(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, None if in_place else initial_state, final_state,
        cu_seqlens, ssm_state_indices=ssm_state_indices, has_initial_state=has_initial_state,
        checkpoint_every=checkpoint_every, checkpoints=checkpoints, exact=exact, max_seqlen=max_seqlen, gate=gate,
        beta_is_logit=beta_is_logit, state_in_place=in_place,
    )  # fmt: skip
