# SPDX-License-Identifier: MIT
"""The public functions of ``flash_kda`` (re-exported by ``__init__``)."""

from . import _native, dispatch

# spec section 1.6, mirrored from src/kda/workspace.h for when the library is absent
# (tests/test_native.py checks that both agree).
_RECORD_BYTES = 13952


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
    exact=None,
) -> None:
    r"""Kimi Delta Attention forward (prefill); writes ``out`` and ``final_state`` in place.

    Per sequence and head, with :math:`\hat q, \hat k` the L2-normalised q, k,
    :math:`\beta_t = \sigma(\text{beta}_t)` and the per-channel decay
    :math:`\alpha_t = \exp(\text{lower\_bound}\cdot\sigma(e^{A_{log}}(g_t + dt_{bias})))`:

    .. math::
        S_t^\top = (I - \beta_t \hat k_t \hat k_t^\top)\,\mathrm{diag}(\alpha_t)\,S_{t-1}^\top
                   + \beta_t \hat k_t v_t^\top, \qquad o_t = \text{scale}\cdot S_t \hat q_t

    Same signature and semantics as FlashKDA's ``flash_kda.fwd`` (so fla's ``chunk_kda``
    routes here). Runs native kernels when this build has them for the GPU, else fla's
    Triton kernels, else pure PyTorch (CPU tensors always take PyTorch);
    ``FLA_FLASH_KDA=0`` turns the native kernels off. :func:`backend_for` tells which.

    Parameters
    ----------
    q, k, v, g : torch.Tensor
        bfloat16 ``[B, T, H, 128]``, contiguous. q and k raw (normalised inside), g the raw
        gate pre-activation.
    beta : torch.Tensor
        bfloat16 ``[B, T, H]``, raw logits (sigmoid applied inside).
    scale : float
        Output scale, usually ``128 ** -0.5``.
    out : torch.Tensor
        bfloat16 ``[B, T, H, 128]``; rows of tokens outside every sequence are not written.
    A_log : torch.Tensor
        float32 ``[H]``.
    dt_bias : torch.Tensor
        float32 ``[H, 128]`` (or ``[H * 128]``).
    lower_bound : float
        Gate lower bound in ``[-5, 0)``.
    initial_state, final_state : torch.Tensor, optional
        bfloat16 or float32 (the same dtype when both are given) ``[N, H, 128 (V),
        128 (K)]``, V-first. The state is kept in bf16 between chunks: an fp32 initial
        state is rounded to bf16, an fp32 final state is the exact widening. They may be
        the same tensor.
    cu_seqlens : torch.Tensor, optional
        int64 (or int32) ``[N + 1]`` for variable-length sequences packed into ``B = 1``;
        N = B without it. On the CPU its contents are checked; on the GPU they cannot be
        read without a sync, so inconsistent values give unspecified rows but never an
        out-of-bounds access.

    Raises
    ------
    TypeError
        A wrong argument type or dtype.
    ValueError
        A wrong shape, device, layout, value or cu_seqlens content.
    RuntimeError
        A failure inside the native library (with its message).

    Nothing is written when an argument is rejected. The call is asynchronous on the
    current CUDA stream and can be captured in a CUDA graph (native path).
    """
    dispatch.fwd(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens, exact
    )


def get_workspace_size(T_total: int, H: int, N: int = 1) -> int:
    """Bytes of scratch memory the native forward uses for ``T_total`` tokens (``B * T``),
    ``H`` heads and ``N`` sequences. ``fwd`` allocates it itself from PyTorch's allocator."""
    if T_total < 0 or H < 1 or N < 1:
        raise ValueError(f"get_workspace_size: need T_total >= 0, H >= 1, N >= 1, got {T_total}, {H}, {N}")
    lib = _native.load()
    if lib is not None:
        return lib.workspace_size(T_total, H, N)
    tiles = -(-T_total // 16) + N
    return H * tiles * _RECORD_BYTES + -(-4 * (N + 1) // 128) * 128


def compiled_archs() -> list[str]:
    """The arches with native kernels in the loaded library, e.g. ``["90a", "100a"]``;
    ``[]`` when the library could not be loaded."""
    return [arch.short_name for arch in _native.compiled_archs()]


def backend_for(device) -> str:
    """``"native"``, ``"fla"`` or ``"torch"``: the path :func:`fwd` would take for tensors
    on ``device`` now (honouring ``FLA_FLASH_KDA``)."""
    return dispatch.backend_for(device)
