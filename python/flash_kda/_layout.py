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
    a multiple of 16 bytes (8 bf16 or 4 fp32 elements) below 2**39; the base must be 16-byte
    aligned. Dimensions of extent one get stride 0 (the library ignores them; all zero =
    contiguous).
    """
    shape, strides = x.shape, x.stride()
    (n0, n1, n2, _), (s0, s1, s2, s3) = shape, strides  # written out: this runs on every new signature
    vector = VECTOR if x.dtype == torch.bfloat16 else 16 // x.element_size()
    ok = (
        s3 == 1
        and (n0 == 1 or (0 < s0 < MAX_STRIDE and not s0 % vector))
        and (n1 == 1 or (0 < s1 < MAX_STRIDE and not s1 % vector))
        and (n2 == 1 or (0 < s2 < MAX_STRIDE and not s2 % vector))
    )
    if not ok:
        raise ValueError(
            f"{_WHERE}: {name} must have strides (batch, token, head, 1) with each stride of a dimension longer "
            f"than 1 a positive multiple of {vector} elements below 2**39, got strides {tuple(strides)} "
            f"for shape {_shape(x)}"
        )
    if x.data_ptr() % 16:
        aligned(name, x, 16)
    return (0 if n0 == 1 else s0, 0 if n1 == 1 else s1, 0 if n2 == 1 else s2)


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
    each stride exceeds the span of the smaller ones; a contiguous view passes at once)."""
    if x.is_contiguous():
        return
    span = 0
    for stride, size in sorted((abs(s), n) for n, s in zip(x.shape, x.stride()) if n > 1):
        if stride <= span:
            raise ValueError(
                f"{_WHERE}: {name} must not overlap itself, got strides {tuple(x.stride())} for shape {_shape(x)}"
            )
        span += stride * (size - 1)


def extent(x: torch.Tensor) -> Optional[tuple[int, int]]:
    """``[low, high)`` byte offsets, relative to ``x.data_ptr()``, covered by the view ``x``
    (a function of its shape, strides and dtype only); None when empty."""
    if x.numel() == 0:
        return None
    if x.is_contiguous():  # its elements are its first nbytes bytes
        return 0, x.nbytes
    low = high = 0
    for n, s in zip(x.shape, x.stride()):
        if s < 0:
            low += (n - 1) * s
        else:
            high += (n - 1) * s
    size = x.element_size()
    return low * size, (high + 1) * size


def byte_range(x: torch.Tensor) -> Optional[tuple[int, int]]:
    """``[first, last + 1)`` byte addresses covered by the view ``x``; None when empty."""
    offsets = extent(x)
    if offsets is None:
        return None
    base = x.data_ptr()
    return base + offsets[0], base + offsets[1]


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same elements in the same order: data_ptr, shape, strides, dtype and device."""
    return (
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def overlap_pairs(outputs: dict, inputs: dict, slots: Optional[dict] = None) -> tuple:
    """The pointer-independent part of :func:`no_aliasing`: every pair of a non-empty output
    (name -> tensor or None: out, final_state, checkpoints) with a later non-empty output or
    a non-empty input on the same device, in the order :func:`no_aliasing` reports them.

    Each pair is a tuple ``(writer, other, low, high, may_be_same, writer name, other
    name)``: ``writer`` and ``other`` index the pointer sequence given to
    :func:`check_overlaps` (``slots`` maps each name to its index; by default the position
    in ``outputs`` then ``inputs``); with ``d`` = writer's data_ptr - other's, the two views
    intersect exactly when ``low < d < high`` (from their :func:`extent`); ``may_be_same``
    marks final_state against an initial_state of the same shape, strides, dtype and
    device, which is allowed at ``d == 0``. Plain tuples: this runs on every call that
    is not a cache hit."""
    if slots is None:
        slots = {n: i for i, n in enumerate([*outputs, *inputs])}
    present = [(n, t, t.device, extent(t)) for n, t in [*outputs.items(), *inputs.items()] if t is not None]
    pairs = []
    for i in range(sum(t is not None for t in outputs.values())):
        name, t, device, span = present[i]
        if span is None:
            continue
        writer, (low, high) = slots[name], span
        for other, u, u_device, u_span in present[i + 1 :]:
            if u_span is None or u_device != device:
                continue
            may_be_same = (
                name == "final_state"
                and other == "initial_state"
                and t.shape == u.shape
                and t.stride() == u.stride()
                and t.dtype == u.dtype
            )
            # [base + low, base + high) meets [u_base + u_span) iff u_span[0] - high < base - u_base < u_span[1] - low
            pairs.append((writer, slots[other], u_span[0] - high, u_span[1] - low, may_be_same, name, other))
    return tuple(pairs)


def pointers(tensors) -> list:
    """``data_ptr()`` of each tensor, 0 for None: the pointer sequence of :func:`check_overlaps`."""
    return [0 if t is None else t.data_ptr() for t in tensors]


def check_overlaps(pairs: tuple, pointers) -> None:
    """The pointer-dependent part of :func:`no_aliasing`: ``ValueError`` for the first pair
    whose byte ranges at ``pointers`` (data_ptr of each argument, indexed as the pairs say)
    intersect, unless it is final_state at initial_state's own view."""
    for writer, other, low, high, may_be_same, name, other_name in pairs:
        d = pointers[writer] - pointers[other]
        if low < d < high and not (may_be_same and d == 0):
            hint = (
                "; it may only be initial_state itself (same storage offset, shape, strides and dtype)"
                if {name, other_name} == {"final_state", "initial_state"}
                else ""
            )
            raise ValueError(f"{_WHERE}: {name} must not overlap {other_name} in memory{hint}")


def no_aliasing(outputs: dict, inputs: dict) -> None:
    """``outputs`` (name -> tensor or None: out, checkpoints, final_state) must not overlap
    each other nor any of ``inputs``, except that final_state may be initial_state itself.
    Each view's byte extent is computed once; :func:`overlap_pairs` is the part a cached
    validation keeps, :func:`check_overlaps` the part that runs on every call."""
    check_overlaps(overlap_pairs(outputs, inputs), pointers([*outputs.values(), *inputs.values()]))
