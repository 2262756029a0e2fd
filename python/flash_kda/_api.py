# SPDX-License-Identifier: MIT
"""The public functions of ``flash_kda`` (re-exported by ``__init__``)."""

import torch

from . import _native, _op, _scalars, _validate, dispatch

_WHERE = "flash_kda.fwd"
_REQUIRED = ("q", "k", "v", "g", "beta", "out", "A_log", "dt_bias")


def _check_traceable(tensors: dict, outputs: dict) -> None:
    """The checks ``torch.compile`` can trace: Python types, devices, grad, inference.

    One pass decides whether anything is wrong; only then do the checks run one by one
    (:func:`_report_untraceable`), so that the first fault is reported as before."""
    q = tensors["q"]
    ok = isinstance(q, torch.Tensor)
    if ok:
        device = q.device
        grad = torch.is_grad_enabled()
        ok = device.type in ("cpu", "cuda")
        for name, x in tensors.items():
            if not ok:
                break
            if x is None:
                ok = name not in _REQUIRED
            elif not isinstance(x, torch.Tensor) or (grad and x.requires_grad):
                ok = False
            elif x.device != device:
                ok = name == "cu_seqlens" and x.device.type == "cpu"
        if ok and not torch.compiler.is_compiling() and not torch.is_inference_mode_enabled():
            for x in outputs.values():
                if x is not None and x.is_inference():
                    ok = False
    if not ok:
        _report_untraceable(tensors, outputs)


def _report_untraceable(tensors: dict, outputs: dict) -> None:
    """:func:`_check_traceable` check by check: raises for the first fault."""
    for name, x in tensors.items():
        if (x is not None or name in _REQUIRED) and not isinstance(x, torch.Tensor):
            raise TypeError(f"flash_kda.fwd: {name} must be a torch.Tensor, got {type(x).__name__}")
    device = tensors["q"].device
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"flash_kda.fwd: q must be on a CUDA device or the CPU, got {device}")
    for name, x in tensors.items():
        if x is not None and x.device != device and not (name == "cu_seqlens" and x.device.type == "cpu"):
            raise ValueError(f"flash_kda.fwd: {name} must be on {device} like q, got {x.device}")
    _validate.refuse_grad(tensors)
    if not torch.compiler.is_compiling():  # inference tensors do not reach a trace
        _validate.refuse_inference_outputs(outputs)


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
) -> None:
    r"""Kimi Delta Attention forward (prefill); writes ``out``, ``final_state`` and
    ``checkpoints`` in place.

    Per sequence and head, with :math:`\hat q, \hat k` the L2-normalised q, k,
    :math:`\beta_t = \sigma(\text{beta}_t)` and the per-channel decay
    :math:`\alpha_t = \exp(\text{lower\_bound}\cdot\sigma(e^{A_{log}}(g_t + dt_{bias})))`:

    .. math::
        S_t^\top = (I - \beta_t \hat k_t \hat k_t^\top)\,\mathrm{diag}(\alpha_t)\,S_{t-1}^\top
                   + \beta_t \hat k_t v_t^\top, \qquad o_t = \text{scale}\cdot S_t \hat q_t

    FlashKDA's ``flash_kda.fwd`` signature and semantics (so fla's ``chunk_kda`` routes
    here), plus keyword-only serving features. Runs native kernels when this build has
    them for the GPU, else fla's Triton kernels, else pure PyTorch (CPU tensors always take
    PyTorch); ``FLA_FLASH_KDA=0`` turns the native kernels off (:func:`backend_for` tells
    which). The call is the custom op ``torch.ops.flash_kda.fwd``: ``torch.compile(...,
    fullgraph=True)`` traces it, and with its index tensors on the GPU the native path makes
    no host synchronisation, so it can be captured in a CUDA graph and replayed with new
    contents of ``cu_seqlens``, ``ssm_state_indices`` and ``has_initial_state``.

    Parameters
    ----------
    q, k, v, g : torch.Tensor
        bfloat16 ``[B, T, H, 128]``: q and k raw (normalised inside), g the raw gate
        pre-activation. Strided views are read without copies on the native path: last
        stride 1, every other stride of a dimension longer than one a positive multiple of
        8 elements, base 16-byte aligned (e.g. slices of one fused projection).
    beta : torch.Tensor
        bfloat16 ``[B, T, H]``, raw logits (sigmoid applied inside); any positive strides.
    scale : float
        Output scale, usually ``128 ** -0.5``; finite in bfloat16 (``|scale| < 3.3961e38``).
    out : torch.Tensor
        bfloat16 ``[B, T, H, 128]``, same stride rules as q, not overlapping itself or any
        other argument. Rows of tokens outside every sequence are not written.
    A_log : torch.Tensor
        ``[H]``, bfloat16, float16 or float32 (widened to float32 exactly).
    dt_bias : torch.Tensor
        ``[H, 128]`` or ``[H * 128]``, bfloat16, float16 or float32 (widened exactly).
    lower_bound : float
        Gate lower bound in ``[-5, 0]``.
    initial_state, final_state : torch.Tensor, optional
        Contiguous bfloat16 or float32 (the same dtype when both are given)
        ``[N, H, 128 (V), 128 (K)]``, V-first; ``[P, H, 128, 128]`` pools with
        ``ssm_state_indices``. The state is kept in bf16 between chunks: an fp32 initial
        state is rounded to bf16, an fp32 final state is the exact widening. final_state
        may be initial_state itself (updated in place) but must not overlap it otherwise.
    cu_seqlens : torch.Tensor, optional
        int64 or int32 ``[N + 1]`` for variable-length sequences packed into ``B = 1``;
        N = B without it. On the CPU its contents are checked (start 0, non-decreasing,
        last <= T). On the GPU they are not read on the native path (that would
        synchronise): invalid contents give unspecified rows and states but never an
        out-of-bounds access; the fallback paths read and check them.
    ssm_state_indices : torch.Tensor, optional
        int32 or int64 ``[N]`` on q's device: sequence i reads ``initial_state[idx[i]]``
        and writes ``final_state[idx[i]]`` (fla's and vLLM's state-pool convention). A
        negative index is padding: it starts from zero and writes no state (its rows of
        ``out`` are still computed). Non-negative indices must be distinct and < P; this
        is checked where the indices are read on the host (CPU tensors, fallback paths);
        the native GPU path treats indices >= P as padding.
    has_initial_state : torch.Tensor, optional
        bool ``[N]`` on q's device: False starts that sequence from zero whatever its
        initial state (slot) holds.
    checkpoint_every : int, optional
        With ``checkpoints``: write the state after every ``checkpoint_every`` tokens of
        each sequence (a positive multiple of 16).
    checkpoints : torch.Tensor, optional
        Contiguous ``[S, H, 128, 128]`` in the states' dtype (bfloat16 or float32),
        V-first. Sequence i owns slots ``[first_i, first_i + len_i // checkpoint_every)``
        with ``first_i = sum(len_j // checkpoint_every for j < i)``; slot ``first_i + m``
        holds the state after ``(m + 1) * checkpoint_every`` of its tokens; slots >= S are
        not written. :func:`checkpoint_layout` computes S and the first slots.
    exact : bool, optional
        True: bit-exact FlashKDA numerics (out, final_state and checkpoints bitwise equal
        to :func:`flash_kda.reference.fwd` on the same GPU; a checkpoint at token t equals
        the final_state of the first t tokens). False: where the library's plan predicts
        a gain, long sequences with few heads are split into segments whose start states
        are combined in fp32, and chains may run 32-token chunks (docs/design.md §4.8):
        deterministic, within the accuracy contract, not bit-exact. None (default): True
        when the environment variable ``FLASH_KDA_EXACT`` is ``"1"``, else False.
    max_seqlen : int, optional
        Varlen calls: the longest sequence's tokens (``max(cu_seqlens[1:] - cu_seqlens[:-1])``,
        which a serving engine knows on the host), in ``[0, T]``. A hint for the plan, which
        cannot read a GPU ``cu_seqlens`` without synchronising and otherwise plans for the
        mean length: a batch whose longest sequence holds most of its tokens then runs that
        sequence as one chain (H200: ``[7000] + [100] * 10`` tokens at H = 6 0.27 ms without
        it, 0.11 with it). Any value gives correct results; only the automatic path's plan
        follows it (its speed and bits; the exact path ignores it). None or 0: unknown. With
        ``cu_seqlens`` on the CPU the lengths are read there and the hint is not needed.
        Ignored in batched mode.

    Raises
    ------
    TypeError
        A wrong argument type or dtype.
    ValueError
        A wrong shape, device, layout (strides, alignment, overlap), value or index
        content, or an inference tensor to write outside inference mode.
    RuntimeError
        An input that requires grad while grad mode is on (use fla's ``chunk_kda`` for
        training), or a failure inside the native library (with its message).

    Nothing is written when an argument is rejected. The call is asynchronous on the
    current CUDA stream on the native path.
    """
    tensors = dict(q=q, k=k, v=v, g=g, beta=beta, out=out, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state)
    tensors.update(final_state=final_state, cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices)
    tensors.update(has_initial_state=has_initial_state, checkpoints=checkpoints)
    _check_traceable(tensors, dict(out=out, final_state=final_state, checkpoints=checkpoints))
    scale, lower_bound = _scalars.as_real(_WHERE, "scale", scale), _scalars.as_real(_WHERE, "lower_bound", lower_bound)
    if checkpoint_every is not None:
        checkpoint_every = _scalars.as_count(_WHERE, "checkpoint_every", checkpoint_every)
        if not 0 < checkpoint_every < 2**31:
            raise ValueError(
                f"flash_kda.fwd: checkpoint_every must be a positive multiple of 16 below 2**31, got {checkpoint_every}"
            )
    if exact is not None and not isinstance(exact, bool):
        raise TypeError(f"flash_kda.fwd: exact must be a bool or None, got {type(exact).__name__}")
    if max_seqlen is not None:  # an int for the op's schema; its range is checked against T
        max_seqlen = _scalars.as_count(_WHERE, "max_seqlen", max_seqlen)
    in_place = initial_state is not None and final_state is initial_state
    _op.OP(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, None if in_place else initial_state, final_state,
        cu_seqlens, ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact, max_seqlen, in_place,
    )  # fmt: skip


def compiled_archs() -> list[str]:
    """The arches with native kernels in the loaded library, e.g. ``["90a", "100a"]``;
    ``[]`` when the library could not be loaded."""
    return [arch.short_name for arch in _native.compiled_archs()]


def backend_for(device) -> str:
    """``"native"``, ``"fla"`` or ``"torch"``: the path :func:`fwd` would take for tensors
    on ``device`` now (honouring ``FLA_FLASH_KDA`` and the driver's CUDA version).

    Raises ``ValueError`` when ``device`` is not a device (``torch.device("...")`` fails);
    a CUDA device this process cannot use is answered ``"torch"`` (see
    ``dispatch.explain(device)`` for the reason).
    """
    return dispatch.explain(device)[0]
