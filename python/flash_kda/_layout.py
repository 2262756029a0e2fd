# SPDX-License-Identifier: MIT
"""Memory layout checks of a call: strides, alignment, self-overlap and aliasing between
arguments, from ``data_ptr()`` and the byte extent of each strided view (no data read).

All raise ``ValueError`` naming the argument and what it got.
"""

from typing import Optional

import torch

_WHERE = "flash_kda.fwd"
MAX_STRIDE = 2**39  # elements: the library's tensor copies take byte strides below 2**40
VECTOR = 8  # elements of 16 bytes (bf16): the unit of an activation stride


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def aligned(name: str, x: torch.Tensor, multiple: int) -> None:
    if x.numel() > 0 and x.data_ptr() % multiple != 0:
        raise ValueError(
            f"{_WHERE}: {name} must be {multiple}-byte aligned, got data_ptr % {multiple} = {x.data_ptr() % multiple}"
        )


def contiguous(name: str, x: torch.Tensor, multiple: int = 16) -> None:
    if not x.is_contiguous():
        raise ValueError(f"{_WHERE}: {name} must be contiguous, got strides {tuple(x.stride())} for shape {_shape(x)}")
    aligned(name, x, multiple)


def activation_strides(name: str, x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, token, head) element strides of ``x`` [B, T, H, 128] for the C ABI.

    The last stride must be 1; a dimension longer than one needs a positive stride that is
    a multiple of 8 elements (16 bytes) below 2**39; the base must be 16-byte aligned.
    Dimensions of extent one get stride 0 (the library ignores them; all zero = contiguous).
    """
    strides = x.stride()
    ok = strides[3] == 1 and all(
        n == 1 or (0 < s < MAX_STRIDE and s % VECTOR == 0) for n, s in zip(x.shape[:3], strides[:3])
    )
    if not ok:
        raise ValueError(
            f"{_WHERE}: {name} must have strides (batch, token, head, 1) with each stride of a dimension longer "
            f"than 1 a positive multiple of {VECTOR} elements below 2**39, got strides {tuple(strides)} "
            f"for shape {_shape(x)}"
        )
    aligned(name, x, 16)
    return tuple(0 if n == 1 else s for n, s in zip(x.shape[:3], strides[:3]))


def beta_strides(x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, token, head) element strides of beta [B, T, H]: positive below 2**39 for
    every dimension longer than one."""
    if not all(n == 1 or 0 < s < MAX_STRIDE for n, s in zip(x.shape, x.stride())):
        raise ValueError(
            f"{_WHERE}: beta must have positive strides below 2**39 for dimensions longer than 1, "
            f"got strides {tuple(x.stride())} for shape {_shape(x)}"
        )
    return tuple(0 if n == 1 else s for n, s in zip(x.shape, x.stride()))


def no_self_overlap(name: str, x: torch.Tensor) -> None:
    """Distinct elements of ``x`` at distinct addresses (sufficient test: sorted by stride,
    each stride exceeds the span of the smaller ones)."""
    span = 0
    for stride, size in sorted((abs(s), n) for n, s in zip(x.shape, x.stride()) if n > 1):
        if stride <= span:
            raise ValueError(
                f"{_WHERE}: {name} must not overlap itself, got strides {tuple(x.stride())} for shape {_shape(x)}"
            )
        span += stride * (size - 1)


def byte_range(x: torch.Tensor) -> Optional[tuple[int, int]]:
    """``[first, last + 1)`` byte addresses covered by the view ``x``; None when empty."""
    if x.numel() == 0:
        return None
    low = high = 0
    for n, s in zip(x.shape, x.stride()):
        if s < 0:
            low += (n - 1) * s
        else:
            high += (n - 1) * s
    base = x.data_ptr()
    return base + low * x.element_size(), base + (high + 1) * x.element_size()


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same elements in the same order: data_ptr, shape, strides, dtype and device."""
    return (
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def no_aliasing(outputs: dict, inputs: dict) -> None:
    """``outputs`` (name -> tensor or None: out, checkpoints, final_state) must not overlap
    each other nor any of ``inputs``, except that final_state may be initial_state itself.
    Each view's byte range is computed once (this runs on every call)."""
    ranges = {}
    for name, t in list(outputs.items()) + list(inputs.items()):
        if t is not None and name not in ranges:
            ranges[name] = (t, t.device, byte_range(t))
    outs = [n for n, t in outputs.items() if t is not None]
    others = outs + [n for n, t in inputs.items() if t is not None]
    for i, name in enumerate(outs):
        t, device, (low, high) = ranges[name][0], ranges[name][1], ranges[name][2] or (0, 0)
        for other in others[i + 1 :]:
            u, u_device, u_range = ranges[other]
            if u_range is None or u_device != device or not (low < u_range[1] and u_range[0] < high):
                continue
            if name == "final_state" and other == "initial_state" and same_view(t, u):
                continue
            hint = (
                "; it may only be initial_state itself (same storage offset, shape, strides and dtype)"
                if {name, other} == {"final_state", "initial_state"}
                else ""
            )
            raise ValueError(f"{_WHERE}: {name} must not overlap {other} in memory{hint}")
