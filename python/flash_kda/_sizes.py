# SPDX-License-Identifier: MIT
"""Workspace sizes (design §1.6), from the library or, without it, the same formula."""

from . import _native, _scalars

# Bytes of one (head, chunk) record, mirrored from src/kda/workspace.h for when the library
# is absent (tests/test_native.py checks it against flash_kda_record_bytes()).
RECORD_BYTES = 13952
# Bytes of the overlapped forward's work counter after the ready flags (workspace.h
# OverlapSync).
OVERLAP_SYNC_BYTES = 128
MAX_WORKSPACE = 2**50  # the library's bound on a workspace (src/plan.h kMaxWorkspace)
_WHERE = "flash_kda.get_workspace_size"
# (name, lowest, highest) of each argument: the C ABI's limits (src/plan.h).
_BOUNDS = {"T_total": (0, 2**31 - 1), "H": (1, 65535), "N": (1, 2**30)}


def _prefix_bytes(num_seqs: int) -> int:
    """One int32 prefix array over N + 1 entries, 128-byte aligned (src/plan.cpp)."""
    return -(-4 * (num_seqs + 1) // 128) * 128


def _exact_bytes(total: int, heads: int, num_seqs: int) -> int:
    """src/plan.cpp lay_out with max_segments 0: the records, three prefix arrays, one
    4-byte ready flag per record (128-byte aligned) and the overlap counters."""
    tiles = -(-total // 16) + num_seqs
    flags = -(-4 * heads * tiles // 128) * 128 + OVERLAP_SYNC_BYTES
    return heads * tiles * RECORD_BYTES + 3 * _prefix_bytes(num_seqs) + flags


def _argument(name: str, x) -> int:
    value = _scalars.as_count(_WHERE, name, x)
    low, high = _BOUNDS[name]
    if not low <= value <= high:
        raise ValueError(f"{_WHERE}: {name} must be in [{low}, {high}], got {value}")
    return value


def get_workspace_size(T_total: int, H: int, N: int = 1) -> int:
    """Bytes of scratch memory the exact-mode native forward uses.

    ``fwd`` allocates its workspace itself from PyTorch's allocator; this is FlashKDA's
    sizing function, for callers that budget memory.

    Parameters
    ----------
    T_total : int
        Tokens in all sequences, ``B * T``, in ``[0, 2**31)``.
    H : int
        Heads, in ``[1, 65535]``.
    N : int, default 1
        Sequences, in ``[1, 2**30]``.

    Returns
    -------
    int
        The size in bytes (from the library when it loads, else the same formula).

    Raises
    ------
    TypeError
        An argument that is not a Python int (``bool`` and ``float`` included).
    ValueError
        An argument out of range, or a size beyond 2**50 bytes.
    """
    T_total, H, N = (_argument(name, x) for name, x in (("T_total", T_total), ("H", H), ("N", N)))
    lib = _native.load()
    size = lib.workspace_size(T_total, H, N) if lib is not None else _exact_bytes(T_total, H, N)
    if size < 0 or size > MAX_WORKSPACE:
        raise ValueError(f"{_WHERE}: the workspace for T_total={T_total}, H={H}, N={N} would exceed 2**50 bytes")
    return size
