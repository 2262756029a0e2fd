# SPDX-License-Identifier: MIT
"""Context-parallel cases: global problems, their split over a group's ranks, and what each
rank must write. tests/cp_worker.py runs them under torchrun; test_distributed.py (CPU,
gloo) and test_distributed_gpu.py (processes sharing one GPU through gloo) check them."""

import types
from typing import NamedTuple, Optional

import torch
from chunked_gold import gold_chunked
from flash_kda import reference

NAN = float("nan")
WORLD = 4
BF16, FP32 = torch.bfloat16, torch.float32


class Case(NamedTuple):
    name: str
    lens: tuple  # sequence lengths of the packed batch
    split: tuple  # rank r of the group holds tokens [split[r], split[r + 1]); past sum(lens): padding
    ranks: tuple = tuple(range(WORLD))  # world ranks forming the group, in group order
    heads: int = 2
    states: tuple = (BF16, BF16)  # (initial dtype, final dtype), None for absent
    pool: Optional[tuple] = None  # (P, slots, has_initial, in_place): states are pools
    exact: Optional[bool] = None
    fla: bool = False  # through fla_chunk_kda with an fla context (equal slices)
    seed: int = 0
    long_memory: bool = False  # gate pre-activations shifted by -6: start states carry across ranks


CASES = [
    # one sequence crossing 3 boundaries, unaligned and 16-aligned splits
    Case("one-seq-3-crossings", (400,), (0, 97, 200, 333, 400)),
    Case("one-seq-aligned-fp32", (400,), (0, 96, 208, 320, 400), states=(FP32, FP32), seed=1),
    # a 1-token slice inside a sequence, an empty sequence, crossings of 1 and 2 boundaries
    Case("mixed", (300, 17, 0, 213, 1, 64), (0, 150, 151, 400, 595), seed=2),
    # empty slices (ranks 0 and 2), one of them between the two pieces of a sequence
    Case("empty-slices", (200, 150), (0, 0, 120, 120, 350), states=(None, FP32), seed=3),
    # no sequence crosses a boundary: no exchange
    Case("no-crossing", (100, 60, 90, 50), (0, 100, 160, 250, 300), states=(FP32, None), seed=4),
    # pools with a padding slot and a fresh start, updated in place; 16 padding rows at the end
    Case(
        "pools-in-place",
        (250, 90, 0, 60),
        (0, 100, 180, 300, 416),
        pool=(7, (5, -1, 2, 0), (True, True, False, True), True),
        states=(FP32, FP32),
        seed=5,
    ),  # fmt: skip
    Case("pools", (130, 200, 33), (0, 64, 200, 300, 363), pool=(5, (1, 4, 3), None, False), seed=6),
    # only empty sequences and padding rows: rank 0 writes their final states
    Case("all-empty", (0, 0), (0, 16, 32, 48, 64), seed=7),
    # groups of two and three ranks beside idle ranks; no states
    Case("group-01", (130, 70), (0, 101, 200), ranks=(0, 1), states=(None, None), seed=8),
    Case("group-23", (33, 170), (0, 64, 203), ranks=(2, 3), heads=1, seed=9),
    Case("group-012", (333,), (0, 111, 222, 333), ranks=(0, 1, 2), seed=10),
    # long memory: the composed start states matter (design section 3.6's long-memory bounds)
    Case("long-memory", (400,), (0, 97, 200, 333, 400), states=(FP32, FP32), long_memory=True, seed=13),
    Case("long-memory-mixed", (170, 230), (0, 64, 100, 290, 400), long_memory=True, seed=14),
    # fla's chunk_kda with a cp_context: equal slices of 100 tokens
    Case("fla-context", (150, 170, 80), (0, 100, 200, 300, 400), states=(FP32, FP32), fla=True, seed=11),
]
# On the GPU also: exact mode with one crossing 160 tokens (10 chunks) into the sequence, so
# that the rank after the boundary reruns from the exact state and every bit equals the
# one-process call (the CPU path has no exact mode to compare with); and slices long enough
# for the automatic path's segments inside each flash_kda.fwd call.
EXACT = Case("exact-one-crossing", (320, 100), (0, 160, 420), ranks=(0, 1), exact=True, seed=12)
GPU_CASES = [
    EXACT,
    Case(
        "long-slices",
        (16384, 3000),
        (0, 4000, 8200, 12300, 19384),
        heads=4,
        states=(FP32, FP32),
        long_memory=True,
        seed=15,
    ),  # fmt: skip
]


def bounds_of(case: Case) -> list:
    bounds = [0]
    for n in case.lens:
        bounds.append(bounds[-1] + n)
    return bounds


def problem(case: Case, device) -> dict:
    """The global problem of a case (reference.random_problem), with padding rows past the
    last sequence, host cu_seqlens and, for pool cases, pools and indices."""
    total, rows = sum(case.lens), case.split[-1]
    lens = list(case.lens) + ([rows - total] if rows > total else [])
    initial, final = case.states
    p = reference.random_problem(
        1, 0, case.heads, lens=lens, initial=initial, final=final, device=device, seed=case.seed
    )
    n_seqs = len(case.lens)
    if case.long_memory:
        p["g"] = (p["g"].float() - 6.0).to(torch.bfloat16)
    p["cu_seqlens"] = torch.tensor(bounds_of(case), dtype=torch.int64)
    for name in ("initial_state", "final_state"):
        if p[name] is not None:
            p[name] = p[name][:n_seqs].contiguous()
    if case.pool is not None:
        size, slots, has, in_place = case.pool
        gen = torch.Generator().manual_seed(case.seed + 100)
        dtype = initial or final
        p["initial_state"] = (0.1 * torch.randn(size, case.heads, 128, 128, generator=gen)).to(device, dtype)
        p["final_state"] = p["initial_state"] if in_place else torch.full_like(p["initial_state"], NAN)
        p["ssm_state_indices"] = torch.tensor(slots, dtype=torch.int64, device=device)
        if has is not None:
            p["has_initial_state"] = torch.tensor(has, dtype=torch.bool, device=device)
    return p


def start_states(case: Case, p: dict) -> Optional[torch.Tensor]:
    """[N, H, 128, 128]: each sequence's start state (zero for padding or a fresh start)."""
    if p["initial_state"] is None:
        return None
    if case.pool is None:
        return p["initial_state"]
    _, slots, has, _ = case.pool
    start = torch.zeros(len(slots), *p["initial_state"].shape[1:], dtype=p["initial_state"].dtype)
    for i, slot in enumerate(slots):
        if slot >= 0 and (has is None or has[i]):
            start[i] = p["initial_state"][slot].cpu()
    return start.to(p["initial_state"].device)


def owner(case: Case, row: int) -> int:
    """The group rank that writes sequence ``row``'s final state: the rank of its last
    token; of its position (the last token when it sits at the end) if it is empty; rank 0
    when there are no tokens."""
    bounds, split = bounds_of(case), case.split
    total = bounds[-1]
    if total == 0:
        return 0
    token = bounds[row + 1] - 1 if bounds[row + 1] > bounds[row] else min(bounds[row], total - 1)
    return max(r for r in range(len(split) - 1) if split[r] <= token < split[r + 1])


def fla_context(case: Case, rank: int, group, device):
    """A rank's fla context: an object with FLACPContext's fields for the contiguous layout,
    computed by fla's rule (fla.ops.cp.context; test_distributed_gpu.py compares the two
    where fla imports)."""
    part = case.split[1]
    lo, hi = rank * part, (rank + 1) * part
    bounds = bounds_of(case)
    first = max(i for i in range(len(case.lens)) if bounds[i] <= lo)
    last = min(i for i in range(len(case.lens)) if bounds[i + 1] >= hi)
    local = sorted({min(max(b - lo, 0), part) for b in bounds[first : last + 2]})
    local = torch.tensor(local, dtype=torch.int32)
    return types.SimpleNamespace(
        group=group, cu_seqlens=local.to(device), cu_seqlens_cpu=local, layout="contiguous",
        pre_num_ranks=rank - bounds[first] // part, post_num_ranks=(bounds[last + 1] - 1) // part - rank,
    )  # fmt: skip


def local_rows(case: Case, rank: int) -> list:
    """fla's per-rank rows: (global sequence, its first and last local token + 1) of rank's slice."""
    lo, hi = case.split[rank], case.split[rank + 1]
    bounds = bounds_of(case)
    return [(i, max(bounds[i], lo), min(bounds[i + 1], hi)) for i in range(len(case.lens))
            if bounds[i] < hi and bounds[i + 1] > lo]  # fmt: skip


def run_rank(case: Case, p: dict, rank: int, group) -> dict:
    """Run the case on one rank of its group (fresh outputs): what the rank wrote."""
    import flash_kda.distributed as cp

    lo, hi = case.split[rank], case.split[rank + 1]
    local = {n: p[n][:, lo:hi] for n in ("q", "k", "v", "g", "beta")}
    scalars = dict(scale=p["scale"], A_log=p["A_log"], dt_bias=p["dt_bias"], lower_bound=p["lower_bound"])
    if case.fla:
        context = fla_context(case, rank, group, p["q"].device)
        rows = [i for i, _, _ in local_rows(case, rank)]
        start = None if p["initial_state"] is None else p["initial_state"][rows].float()
        out, final = cp.fla_chunk_kda(
            *local.values(), scale=scalars["scale"], initial_state=start, output_final_state=True,
            cp_context=context, A_log=scalars["A_log"], dt_bias=scalars["dt_bias"].reshape(-1),
            lower_bound=scalars["lower_bound"], exact=case.exact,
        )  # fmt: skip
        return dict(out=out.cpu(), final=final.cpu())
    out = torch.full_like(local["q"], NAN)
    initial, final = p["initial_state"], p["final_state"]
    if case.pool is not None and case.pool[3]:  # in place: a fresh copy of the pool
        initial = final = initial.clone()
    elif final is not None:
        final = torch.full_like(final, NAN)
    cp.fwd(
        local["q"], local["k"], local["v"], local["g"], local["beta"], scalars["scale"], out, scalars["A_log"],
        scalars["dt_bias"], scalars["lower_bound"], initial, final, p["cu_seqlens"], group=group, split=case.split,
        ssm_state_indices=p.get("ssm_state_indices"), has_initial_state=p.get("has_initial_state"), exact=case.exact,
    )  # fmt: skip
    return dict(out=out.cpu(), final=None if final is None else final.cpu())


def gold(case: Case, p: dict, upto: Optional[list] = None):
    """The fp64 gold of the case (out, final state per sequence): reference.gold, or its
    64-token chunked form for long problems; ``upto`` truncates each sequence to its first
    upto[i] tokens for the final states (fla's per-rank rows)."""
    fp64 = reference.gold if sum(case.lens) <= 4096 else gold_chunked
    bounds = bounds_of(case)
    args = {n: p[n] for n in reference.GOLD_ARGS}
    args.update(cu_seqlens=p["cu_seqlens"], initial_state=start_states(case, p))
    for n in ("q", "k", "v", "g", "beta"):
        args[n] = p[n][:, : bounds[-1]]
    if upto is None:
        return fp64(*args.values())
    cut = [0]
    pieces = {n: [] for n in ("q", "k", "v", "g", "beta")}
    for i, n in enumerate(upto):
        for name in pieces:
            pieces[name].append(args[name][:, bounds[i] : bounds[i] + n])
        cut.append(cut[-1] + n)
    args.update({n: torch.cat(x, dim=1) for n, x in pieces.items()}, cu_seqlens=torch.tensor(cut))
    return fp64(*args.values())
