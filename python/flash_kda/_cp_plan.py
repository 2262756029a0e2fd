# SPDX-License-Identifier: MIT
"""What one rank of a context-parallel forward computes (docs/distributed.md), from host
facts alone: its pieces of the packed sequences, which of them depends on earlier ranks
and whose exports compose its start state, and which one it exports to later ranks.

Two front ends build the same :class:`RankPlan`: :func:`from_split` (the global
``cu_seqlens`` and every rank's token range, flash_kda.distributed's convention) and
:func:`from_fla` (the local bounds and neighbour counts of fla's ``FLACPContext``).
"""

import bisect
from typing import NamedTuple, Optional


class Piece(NamedTuple):
    """The part of one sequence that lies on this rank."""

    row: int  # the sequence's row of the state arguments (a pool entry with ssm_state_indices)
    start: int  # its local tokens [start, end)
    end: int


class Local(NamedTuple):
    """The sequences that start and end on this rank (empty ones included), consecutive rows."""

    row0: int  # rows [row0, row1)
    row1: int
    bounds: tuple  # their local bounds [row1 - row0 + 1], in local tokens

    @property
    def tokens(self) -> int:
        return self.bounds[-1] - self.bounds[0]


class RankPlan(NamedTuple):
    """One rank's work. ``first`` starts on an earlier rank: its start state is composed from
    the exports of ``chain`` (group ranks in token order; ``chain[0]`` holds the sequence's
    start) and it runs after the exchange. ``last`` continues on a later rank: it is exported
    (its transition too when it is ``first`` itself, i.e. the whole slice lies inside one
    sequence). ``local`` depends on no other rank and runs while the exchange is in flight."""

    tokens: int  # tokens of the local slice
    first: Optional[Piece]
    chain: tuple
    local: Optional[Local]
    last: Optional[Piece]
    first_final: bool  # write first's end state to final_state
    last_final: bool  # write last's end state to final_state (fla's per-rank convention)
    exchange: bool  # whether the ranks exchange at all (the same on every rank)


def _owns(bounds: list, i: int, lo: int, hi: int, anchor_rank: bool) -> bool:
    """Whether the slice [lo, hi) owns sequence i: it holds one of its tokens, or for an
    empty sequence its anchor (its position, or the last token when it sits at the end;
    rank 0 when there are no tokens at all)."""
    bos, eos, total = bounds[i], bounds[i + 1], bounds[-1]
    if bos < eos:
        return max(bos, lo) < min(eos, hi)
    if total == 0:
        return anchor_rank
    anchor = bos if bos < total else total - 1
    return lo <= anchor < hi


def _owned_rows(bounds: list, lo: int, hi: int, anchor_rank: bool) -> tuple:
    """[a, b): the rows the slice owns, a contiguous range (bisection, then the few rows at
    either end that only the ownership rule can decide)."""
    n_seqs = len(bounds) - 1
    a = bisect.bisect_left(bounds, lo, 1) - 1  # first row whose end is >= lo
    b = bisect.bisect_right(bounds, hi, 0, n_seqs)  # first row whose start is > hi
    if bounds[-1] == 0:
        a, b = 0, n_seqs
    while a < b and not _owns(bounds, a, lo, hi, anchor_rank):
        a += 1
    while b > a and not _owns(bounds, b - 1, lo, hi, anchor_rank):
        b -= 1
    return a, b


def _local(bounds: list, row0: int, row1: int, lo: int, tokens: int) -> Optional[Local]:
    if row1 <= row0:
        return None
    clamp = lambda t: min(max(t - lo, 0), tokens)  # noqa: E731
    return Local(row0, row1, tuple(clamp(bounds[i]) for i in range(row0, row1 + 1)))


def from_split(bounds: list, split: list, rank: int) -> RankPlan:
    """The plan of ``rank`` when group rank r holds the packed tokens [split[r], split[r+1])
    and ``bounds`` is the global cu_seqlens (both validated: non-decreasing from 0, bounds[-1]
    <= split[-1]). A sequence's initial state is read and its final state written by the rank
    holding its first and its last token."""
    lo, hi = split[rank], split[rank + 1]
    tokens = hi - lo
    a, b = _owned_rows(bounds, lo, hi, rank == 0)
    first = last = None
    if a < b and bounds[a] < lo:
        first = Piece(a, 0, min(bounds[a + 1], hi) - lo)
    if a < b and bounds[b] > hi:
        last = first if first is not None and first.row == b - 1 else Piece(b - 1, bounds[b - 1] - lo, tokens)
    chain = ()
    if first is not None:
        holder = bisect.bisect_right(split, bounds[a]) - 1  # the rank holding the sequence's first token
        chain = tuple(r for r in range(holder, rank) if split[r] < split[r + 1])
    row0, row1 = a + (first is not None), b - (last is not None)
    crossing = any(0 < s < bounds[-1] and bounds[bisect.bisect_left(bounds, s)] != s for s in split[1:-1])
    return RankPlan(
        tokens, first, chain, _local(bounds, row0, row1, lo, tokens), last,
        first_final=first is not None and bounds[a + 1] <= hi, last_final=False, exchange=crossing,
    )  # fmt: skip


def from_fla(bounds: list, pre_num_ranks: int, post_num_ranks: int, rank: int) -> RankPlan:
    """The plan of ``rank`` from fla's contiguous FLACPContext: ``bounds`` its local
    cu_seqlens (sequences tile the slice), the first local sequence started ``pre_num_ranks``
    ranks earlier and the last continues on ``post_num_ranks`` later ones. Rows are local
    sequences; every row's end state on this rank is written (fla's CP has no global rows)."""
    tokens, n_seqs = bounds[-1], len(bounds) - 1
    first = Piece(0, 0, bounds[1]) if pre_num_ranks > 0 else None
    last = None
    if post_num_ranks > 0:
        last = first if first is not None and n_seqs == 1 else Piece(n_seqs - 1, bounds[-2], tokens)
    row0, row1 = int(first is not None), n_seqs - (last is not None)
    return RankPlan(
        tokens, first, tuple(range(rank - pre_num_ranks, rank)), _local(bounds, row0, row1, 0, tokens), last,
        first_final=first is not None, last_final=last is not None, exchange=True,
    )  # fmt: skip
