# SPDX-License-Identifier: MIT
"""The contents of the index tensors of a call, read on the host: sequence bounds
(``cu_seqlens``), state-pool slots (``ssm_state_indices``) and the checkpoint layout.

The native path never reads them (that would synchronise); ``_validate`` checks them when
they are on the CPU, and the fallback paths check them after the synchronisation they
make anyway. Every check raises ``ValueError`` naming the argument and the bad entry.
"""

from typing import NamedTuple, Optional

import torch

from . import _scalars

_WHERE = "flash_kda.fwd"


class HostIndices(NamedTuple):
    """The index tensors of a call, read and checked on the host."""

    bounds: Optional[list[int]]  # cu_seqlens, or None (batched)
    slots: Optional[list[int]]  # pool slot of each sequence (negative: padding), or None
    has_initial: Optional[list[bool]]  # has_initial_state, or None


def host_list(x: torch.Tensor) -> list[int]:
    """The entries of a 1-D integer tensor as Python ints (a device tensor synchronises)."""
    return [int(b) for b in x.tolist()]


def check_bounds(bounds: list[int], total: int, where: str = _WHERE) -> list[int]:
    """``cu_seqlens`` contents: start 0, non-decreasing, last <= ``total`` (= B * T)."""
    if bounds[0] != 0:
        raise ValueError(f"{where}: cu_seqlens must start at 0, got cu_seqlens[0] = {bounds[0]}")
    for i in range(1, len(bounds)):
        if bounds[i] < bounds[i - 1]:
            raise ValueError(
                f"{where}: cu_seqlens must be non-decreasing, got cu_seqlens[{i}] = {bounds[i]} "
                f"< cu_seqlens[{i - 1}] = {bounds[i - 1]}"
            )
    if bounds[-1] > total:
        raise ValueError(f"{where}: cu_seqlens must end at most at T = {total}, got cu_seqlens[-1] = {bounds[-1]}")
    return bounds


def check_slots(slots: list[int], pool_size: int) -> list[int]:
    """``ssm_state_indices`` contents: each entry negative (padding) or a distinct slot
    below ``pool_size``."""
    seen = {}
    for i, slot in enumerate(slots):
        if slot < 0:
            continue
        if slot >= pool_size:
            raise ValueError(
                f"{_WHERE}: ssm_state_indices must be < the pool size P = {pool_size} (or negative for padding), "
                f"got ssm_state_indices[{i}] = {slot}"
            )
        if slot in seen:
            raise ValueError(
                f"{_WHERE}: ssm_state_indices must not repeat a slot, got ssm_state_indices[{seen[slot]}] = "
                f"ssm_state_indices[{i}] = {slot}"
            )
        seen[slot] = i
    return slots


def spans(batch: int, seqlen: int, bounds: Optional[list[int]]) -> list[tuple[int, int]]:
    """``(first token, length)`` of every sequence in the flattened ``[B * T]`` tokens."""
    if bounds is None:
        return [(i * seqlen, seqlen) for i in range(batch)]
    return [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(len(bounds) - 1)]


def checkpoint_firsts(lengths: list[int], every: int) -> list[int]:
    """First checkpoint slot of each sequence, then the total slot count (flash_kda.h)."""
    firsts = [0]
    for n in lengths:
        firsts.append(firsts[-1] + n // every)
    return firsts


def _count(name: str, x, low: int) -> int:
    value = _scalars.as_count("flash_kda.checkpoint_layout", name, x)
    if value < low:
        raise ValueError(f"flash_kda.checkpoint_layout: {name} must be >= {low}, got {value}")
    return value


def checkpoint_layout(checkpoint_every, heads, *, cu_seqlens=None, batch=None, seqlen=None):
    """The checkpoint buffer of a call: ``(shape, first_slots)``.

    Sequence ``i`` owns slots ``[first_slots[i], first_slots[i] + len_i // checkpoint_every)``;
    slot ``first_slots[i] + m`` receives the state after ``(m + 1) * checkpoint_every`` of its
    tokens. Allocate ``torch.empty(shape, dtype=...)`` (bf16 or fp32, V-first) and pass it
    as ``checkpoints``.

    Parameters
    ----------
    checkpoint_every : int
        Tokens between checkpoints, a positive multiple of 16.
    heads : int
        H.
    cu_seqlens : torch.Tensor or sequence of int, optional
        Varlen bounds ``[N + 1]``. Read on the host: a CUDA tensor synchronises, so compute
        the layout where the lengths are known on the host (the scheduler) when serving.
    batch, seqlen : int, optional
        B and T of a batched call (without ``cu_seqlens``).

    Returns
    -------
    shape : tuple of int
        ``(S, heads, 128, 128)`` with ``S = sum(len_i // checkpoint_every)``.
    first_slots : list of int
        ``[N]``: the first slot of each sequence.

    Raises
    ------
    TypeError
        A count that is not an int.
    ValueError
        A count out of range, neither or both of ``cu_seqlens`` and ``batch``/``seqlen``,
        or ``cu_seqlens`` that is not a valid bounds list.
    """
    every = _count("checkpoint_every", checkpoint_every, 1)
    if every % 16:
        raise ValueError(f"flash_kda.checkpoint_layout: checkpoint_every must be a multiple of 16, got {every}")
    heads = _count("heads", heads, 1)
    if (cu_seqlens is None) == (batch is None or seqlen is None):
        raise ValueError("flash_kda.checkpoint_layout: give either cu_seqlens or both batch and seqlen")
    if cu_seqlens is None:
        lengths = [_count("seqlen", seqlen, 0)] * _count("batch", batch, 1)
    else:
        bounds = host_list(cu_seqlens) if isinstance(cu_seqlens, torch.Tensor) else [int(b) for b in cu_seqlens]
        if len(bounds) < 2:
            raise ValueError(f"flash_kda.checkpoint_layout: cu_seqlens needs N + 1 >= 2 entries, got {len(bounds)}")
        check_bounds(bounds, bounds[-1], "flash_kda.checkpoint_layout")
        lengths = [n for _, n in spans(1, 0, bounds)]
    firsts = checkpoint_firsts(lengths, every)
    return (firsts[-1], heads, 128, 128), firsts[:-1]


def read_host(call) -> HostIndices:
    """The index tensors of a validated call (``FwdCall``), read on the host (one
    synchronisation per device tensor) and checked: ``ValueError`` before anything is
    written when cu_seqlens or the pool slots are invalid."""
    bounds = call.seq_bounds
    if call.cu_seqlens is not None and bounds is None:
        bounds = check_bounds(host_list(call.cu_seqlens), call.batch * call.seqlen)
    slots = None
    if call.state_indices is not None:
        slots = check_slots(host_list(call.state_indices), call.pool_size)
    has_initial = None
    if call.has_initial_state is not None:
        has_initial = [bool(x) for x in call.has_initial_state.tolist()]
    return HostIndices(bounds, slots, has_initial)


def _pooled(host: HostIndices) -> tuple[list[int], list[int]]:
    """(sequences with a slot, their slots)."""
    rows = [i for i, slot in enumerate(host.slots) if slot >= 0]
    return rows, [host.slots[i] for i in rows]


def initial_states(call, host: HostIndices) -> Optional[torch.Tensor]:
    """[N, H, 128, 128] start state of each sequence in the state dtype: its pool slot's
    (or its row of initial_state), zero for padding and where has_initial_state is False;
    None without initial_state (every sequence starts from zero)."""
    if call.initial_state is None:
        return None
    if host.slots is None:
        states = call.initial_state.clone()
    else:
        states = call.initial_state.new_zeros((call.num_seqs, *call.initial_state.shape[1:]))
        rows, slots = _pooled(host)
        if rows:
            states[rows] = call.initial_state[slots]
    if host.has_initial is not None:
        fresh = [i for i, has in enumerate(host.has_initial) if not has]
        if fresh:
            states[fresh] = 0
    return states


def store_final_states(call, host: HostIndices, states: torch.Tensor) -> None:
    """Write the [N, ...] final states into final_state (its pool slots with a pool;
    padding sequences write nothing), converted to its dtype."""
    if call.final_state is None:
        return
    if host.slots is None:
        call.final_state.copy_(states)
        return
    rows, slots = _pooled(host)
    if rows:
        call.final_state[slots] = states[rows].to(call.final_state.dtype)
