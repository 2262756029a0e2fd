# SPDX-License-Identifier: MIT
"""Every input check of ``flash_kda.fwd`` (spec section 1.5), shared by all paths.

Each check raises before anything is launched or written: ``TypeError`` for a wrong type
or dtype, ``ValueError`` for a wrong shape, device, layout, value or ``cu_seqlens``
content. Messages name the argument, what was expected and what was given.
"""

import math
import numbers
from typing import NamedTuple, Optional

import torch

HEAD_DIM = 128
MAX_TOKENS = 2**31  # the C ABI's bound on B * T (int32 token coordinates)
MAX_TOKENS_TIMES_HEADS = 2**40  # the C ABI's bound on (B * T) * H
_WHERE = "flash_kda.fwd"


class Problem(NamedTuple):
    """The sizes of a validated call."""

    batch: int  # B
    seqlen: int  # T
    heads: int  # H
    num_seqs: int  # N
    state_dtype: Optional[torch.dtype]  # dtype of the given state tensor(s), None if none
    cu_seqlens: Optional[torch.Tensor]  # int64 on q's device, or None (batched)
    seq_bounds: Optional[list[int]]  # host copy of cu_seqlens when it came from the host


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _tensor(name: str, x, dtypes, expected: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{_WHERE}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{_WHERE}: {name} must be {expected}, got {x.dtype}")
    return x


def _layout(name: str, x: torch.Tensor, device: torch.device) -> None:
    if x.device != device:
        raise ValueError(f"{_WHERE}: {name} must be on {device} like q, got {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{_WHERE}: {name} must be contiguous, got strides {tuple(x.stride())} for shape {_shape(x)}")
    if x.numel() > 0 and x.data_ptr() % 16 != 0:
        raise ValueError(f"{_WHERE}: {name} must be 16-byte aligned, got data_ptr % 16 = {x.data_ptr() % 16}")


def _expect_shape(name: str, x: torch.Tensor, shape: list[int], form: str) -> None:
    if _shape(x) != shape:
        raise ValueError(f"{_WHERE}: {name} must have shape {form} = {shape}, got {_shape(x)}")


def _real(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{_WHERE}: {name} must be a real number, got {type(x).__name__}")
    value = float(x)
    if not math.isfinite(value):
        raise ValueError(f"{_WHERE}: {name} must be finite, got {value}")
    return value


def _check_cu_seqlens(cu, device: torch.device, total: int):
    cu = _tensor("cu_seqlens", cu, (torch.int64, torch.int32), "int64 (or int32)")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{_WHERE}: cu_seqlens must be 1-D with N + 1 >= 2 entries, got shape {_shape(cu)}")
    if cu.device.type == "cpu":
        bounds = [int(b) for b in cu.tolist()]
        if bounds[0] != 0:
            raise ValueError(f"{_WHERE}: cu_seqlens must start at 0, got cu_seqlens[0] = {bounds[0]}")
        for i in range(1, len(bounds)):
            if bounds[i] < bounds[i - 1]:
                raise ValueError(
                    f"{_WHERE}: cu_seqlens must be non-decreasing, got cu_seqlens[{i}] = {bounds[i]} "
                    f"< cu_seqlens[{i - 1}] = {bounds[i - 1]}"
                )
        if bounds[-1] > total:
            raise ValueError(f"{_WHERE}: cu_seqlens must end at most at T = {total}, got cu_seqlens[-1] = {bounds[-1]}")
        return cu.to(device=device, dtype=torch.int64), bounds
    if cu.device != device:
        raise ValueError(f"{_WHERE}: cu_seqlens must be on {device} like q (or on the CPU), got {cu.device}")
    # On the device its contents cannot be read without a sync: the kernels clamp instead.
    return cu.to(torch.int64).contiguous(), None


def _check_states(initial_state, final_state, shape: list[int], device) -> Optional[torch.dtype]:
    dtypes = []
    for name, state in (("initial_state", initial_state), ("final_state", final_state)):
        if state is None:
            continue
        _tensor(name, state, (torch.bfloat16, torch.float32), "bfloat16 or float32")
        _expect_shape(name, state, shape, "[N, H, V, K]")
        _layout(name, state, device)
        dtypes.append(state.dtype)
    if len(dtypes) == 2 and dtypes[0] != dtypes[1]:
        raise TypeError(
            f"{_WHERE}: initial_state and final_state must have the same dtype, got {dtypes[0]} and {dtypes[1]}"
        )
    return dtypes[0] if dtypes else None


def check_fwd(
    q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None, cu_seqlens=None
) -> Problem:
    """Validate one ``fwd`` call; return its sizes. Raises ``TypeError``/``ValueError``."""
    q = _tensor("q", q, (torch.bfloat16,), "bfloat16")
    if q.dim() != 4 or q.shape[-1] != HEAD_DIM:
        raise ValueError(f"{_WHERE}: q must have shape [B, T, H, {HEAD_DIM}], got {_shape(q)}")
    B, T, H, _ = q.shape
    if B < 1 or T < 1 or H < 1:
        raise ValueError(f"{_WHERE}: q must have B, T, H >= 1, got shape {_shape(q)}")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{_WHERE}: q must be on a CUDA device or the CPU, got {q.device}")
    device = q.device
    _layout("q", q, device)
    for name, x in (("k", k), ("v", v), ("g", g), ("out", out)):
        _expect_shape(name, _tensor(name, x, (torch.bfloat16,), "bfloat16"), _shape(q), "[B, T, H, D]")
        _layout(name, x, device)
    _expect_shape("beta", _tensor("beta", beta, (torch.bfloat16,), "bfloat16"), [B, T, H], "[B, T, H]")
    _layout("beta", beta, device)
    _expect_shape("A_log", _tensor("A_log", A_log, (torch.float32,), "float32"), [H], "[H]")
    _layout("A_log", A_log, device)
    _tensor("dt_bias", dt_bias, (torch.float32,), "float32")
    if _shape(dt_bias) not in ([H, HEAD_DIM], [H * HEAD_DIM]):
        raise ValueError(
            f"{_WHERE}: dt_bias must have shape [H, D] = {[H, HEAD_DIM]} (or [H * D]), got {_shape(dt_bias)}"
        )
    _layout("dt_bias", dt_bias, device)
    _real("scale", scale)
    lb = _real("lower_bound", lower_bound)
    if not -5.0 <= lb < 0.0:
        raise ValueError(f"{_WHERE}: lower_bound must be in [-5, 0), got {lb}")
    if B * T >= MAX_TOKENS or B * T * H >= MAX_TOKENS_TIMES_HEADS:
        raise ValueError(
            f"{_WHERE}: B * T must be below 2**31 and B * T * H below 2**40, "
            f"got B * T = {B * T}, B * T * H = {B * T * H}"
        )

    bounds = None
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"{_WHERE}: q must have B = 1 when cu_seqlens is given, got B = {B}")
        cu_seqlens, bounds = _check_cu_seqlens(cu_seqlens, device, T)
        N = cu_seqlens.numel() - 1
    else:
        N = B
    state_dtype = _check_states(initial_state, final_state, [N, H, HEAD_DIM, HEAD_DIM], device)
    return Problem(B, T, H, N, state_dtype, cu_seqlens, bounds)
