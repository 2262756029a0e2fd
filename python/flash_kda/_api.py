# SPDX-License-Identifier: MIT
"""The public functions of ``flash_kda`` (re-exported by ``__init__``)."""

import torch

from . import _args, _eager, _native, _op, _validate, dispatch

# Whether an eager call may skip the op: nothing that must see the op (a dispatch mode such
# as FakeTensorMode, a torch function mode other than torch.device's default-device context,
# the profiler) is active. A torch without these functions always takes the op.
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
_function_modes = getattr(torch._C, "_len_torch_function_stack", None)
_function_mode_at = getattr(torch._C, "_get_function_stack_at", None)
_profiling = getattr(torch.autograd, "_profiler_enabled", None)
_PLAIN = (torch.Tensor, torch.nn.Parameter, type(None))  # tensors without a __torch_function__ of their own
try:
    from torch.utils._device import DeviceContext as _DeviceContext
except ImportError:  # pragma: no cover - torch without a default-device mode
    _DeviceContext = None


def _plain_eager() -> bool:
    if None in (_dispatch_modes, _function_modes, _function_mode_at, _profiling):
        return False
    if _dispatch_modes() or _profiling():
        return False
    modes = _function_modes()
    return not modes or all(type(_function_mode_at(i)) is _DeviceContext for i in range(modes))


def fwd(
    q,
    k,
    v,
    g,
    beta,
    scale,
    out,
    A_log,
    dt_bias,
    lower_bound,
    initial_state=None,
    final_state=None,
    cu_seqlens=None,
    *,
    ssm_state_indices=None,
    has_initial_state=None,
    checkpoint_every=None,
    checkpoints=None,
    exact=None,
    max_seqlen=None,
    gate="lower_bound",
    beta_is_logit=True,
) -> None:
    r"""Kimi Delta Attention forward (prefill); writes ``out``, ``final_state`` and
        ``checkpoints`` in place.

        Per sequence and head, with :math:`\hat q, \hat k` the L2-normalised q, k,
        :math:`\beta_t = \sigma(\text{beta}_t)` and the per-channel decay
        :math:`\alpha_t = \exp(\text{lower\_bound}\cdot\sigma(e^{A_{log}}(g_t + dt_{bias})))`
        (FlashKDA's forms; ``gate`` and ``beta_is_logit`` take the others):

        .. math::
            S_t^\top = (I - \beta_t \hat k_t \hat k_t^\top)\,\mathrm{diag}(\alpha_t)\,S_{t-1}^\top
                       + \beta_t \hat k_t v_t^\top, \qquad o_t = \text{scale}\cdot S_t \hat q_t

        FlashKDA's ``flash_kda.fwd`` signature and semantics (so fla's ``chunk_kda`` routes
        here), plus keyword-only serving features. Runs native kernels when this build has
        them for the GPU, else fla's Triton kernels, else pure PyTorch (CPU tensors always take
        PyTorch); ``FLA_FLASH_KDA=0`` turns the native kernels off (:func:`backend_for` tells
        which). Inside ``torch.compile``, a torch function or dispatch mode or the profiler the
        call is the custom op ``torch.ops.flash_kda.fwd`` (same arguments): ``torch.compile(...,
        fullgraph=True)`` traces it; an eager call runs the op's implementation without the
        dispatcher's hop, and a call of a signature met before (shapes, strides, dtypes,
        devices, flags) costs a few microseconds on the host (docs/dispatch.md). With its index
        tensors on the GPU the native path makes no host synchronisation, so it can be captured
        in a CUDA graph and replayed with new contents of ``cu_seqlens``, ``ssm_state_indices``
        and ``has_initial_state``.

    PARAMETERS

        Raises
        ------
        TypeError
            A wrong argument type or dtype.
        ValueError
            A wrong shape, device, layout (strides, alignment, overlap), value or index
            content, or an inference tensor to write outside inference mode.
        RuntimeError
            An input that requires grad while grad mode is on (use fla's ``chunk_kda`` for
            training), or, with ``FLASH_KDA_STRICT=1``, a call the native library cannot run
            (with its message; otherwise fla's or the PyTorch path runs it, with one warning
            on the ``flash_kda`` logger).

        Nothing is written when an argument is rejected. The call is asynchronous on the
        current CUDA stream on the native path.
    """
    if torch.compiler.is_compiling() or not _plain_eager():
        return _op.call(
            q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
            ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, gate, beta_is_logit,
        )  # fmt: skip
    if _eager.OP is not None and _eager.launched(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
        ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, gate, beta_is_logit,
    ):  # fmt: skip
        return
    key = _validate.signature(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
        ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, gate, beta_is_logit,
    )  # fmt: skip
    record = _validate.record_of(key)
    if record is not None and record.launch is not None:
        try:
            if record.launch(
                q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
                ssm_state_indices, has_initial_state, checkpoints,
            ):  # fmt: skip
                record.launch.learn(
                    q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
                    ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, key[-1], max_seqlen, gate,
                    beta_is_logit,
                )  # fmt: skip
                return
        except _native.NativeError as error:  # nothing launched: fla or PyTorch (dispatch.recover)
            if not dispatch.falls_back(error):
                raise
            dispatch.recover(
                _validate.check_fwd(
                    q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
                    cu_seqlens, ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact,
                    max_seqlen, key=key,
                ),
                error,
            )  # fmt: skip
            return
    elif not all(
        [
            type(x) in _PLAIN
            for x in (
                q,
                k,
                v,
                g,
                beta,
                out,
                A_log,
                dt_bias,
                initial_state,
                final_state,
                cu_seqlens,
                ssm_state_indices,
                has_initial_state,
                checkpoints,
            )
        ]
    ):
        # a tensor subclass must see the op (such calls never get a prepacked launch)
        return _op.call(
            q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
            ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, gate, beta_is_logit,
        )  # fmt: skip
    # once the eager launch in C is attached, a signature's first call makes its record, so that
    # its launch teaches C the signature's family (the next varlen step is one of it)
    call = _validate.check_fwd(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
        ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, gate, beta_is_logit,
        key=key, mark_first=not _eager.learns(),
    )  # fmt: skip
    if dispatch.run(call) and call.record is not None and call.record.launch is not None:
        call.record.launch.learn(
            q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
            ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, key[-1], max_seqlen, gate,
            beta_is_logit,
        )  # fmt: skip


if fwd.__doc__ is not None:  # python -OO drops docstrings
    fwd.__doc__ = fwd.__doc__.replace("    PARAMETERS", _args.parameters_doc())


def compiled_archs() -> list[str]:
    """The arches with native kernels in the loaded library, e.g. ``["90a", "100a"]``;
    ``[]`` when the library could not be loaded."""
    return [arch.short_name for arch in _native.compiled_archs()]


backend_for = dispatch.backend_for
