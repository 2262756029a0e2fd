# SPDX-License-Identifier: MIT
"""Context parallel: the KDA forward of one packed varlen batch spread over the ranks of a
``torch.distributed`` process group (NCCL on GPUs, gloo on the CPU), each rank holding a
contiguous slice of the packed tokens (docs/distributed.md).

The recurrence is affine in the state, so a piece of a sequence maps its start state S to
``S @ X + S^`` (design §6.1). Each rank runs three phases on :func:`flash_kda.fwd`:

* **A**: the piece it hands on (its last one, when that sequence continues on a later rank)
  runs from its true start if the sequence starts here (then ``S^`` is the true end state
  and no ``X`` is needed), else from zero for ``S^`` and, with ``v = 0``, from the identity
  for ``X``.
* **exchange**: one all-gather of a fixed ``[2, H, 128, 128]`` fp32 buffer a rank (128 KiB
  a head), started asynchronously; meanwhile the rank runs every local sequence that
  depends on no other rank.
* **B and C**: the rank composes the start state of its first piece (when that sequence
  began on an earlier rank) from the exports of the ranks before it, in fp64 and token
  order, and reruns that piece from it.

``import flash_kda.distributed`` (``import flash_kda`` does not load this module).
"""

import time
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from . import _cp_plan, _cp_states
from . import fwd as _kda_fwd

_WHERE = "flash_kda.distributed.fwd"
D = 128

__all__ = ["fwd", "Timings", "fla_chunk_kda", "fla_refusal"]


class Timings:
    """Phase times of :func:`fwd` calls: pass one as ``timings=``; after the call's work has
    finished (``torch.cuda.synchronize()`` on the GPU) :meth:`milliseconds` gives, for the
    last call, ``phase_a`` (the exported piece), ``local`` (the sequences that depend on no
    other rank, while the exchange is in flight), ``exchange`` (how long the rank then
    waited for the exchange: the communication time left exposed) and ``rerun`` (the
    combine and the rerun of the first piece)."""

    PHASES = ("phase_a", "local", "exchange", "rerun")

    def __init__(self):
        self._marks = []

    def _mark(self, device: torch.device) -> None:
        if device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def _restart(self, device: torch.device) -> None:
        self._marks = []
        self._mark(device)

    def milliseconds(self) -> dict:
        """``{phase: ms}`` of the last call, with ``total``."""
        if len(self._marks) != len(self.PHASES) + 1:
            raise RuntimeError("flash_kda.distributed.Timings: no call recorded")
        marks = self._marks
        if isinstance(marks[0], float):
            spans = [1e3 * (b - a) for a, b in zip(marks, marks[1:])]
        else:
            spans = [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
        return dict(zip(self.PHASES, spans), total=sum(spans))


class _Call(NamedTuple):
    """What every phase passes to flash_kda.fwd: slices of the local token tensors, and the
    arguments it passes unchanged."""

    tokens: tuple  # q, k, v, g, beta, out: [1, T_local, ...]
    params: tuple  # scale, A_log, dt_bias, lower_bound
    exact: Optional[bool]
    forms: dict = {}  # gate, beta_is_logit

    def fwd(self, piece, *, v=None, **kw) -> None:
        """flash_kda.fwd over the local tokens [piece.start, piece.end) as one sequence (B = 1),
        or over a Local's sequences (varlen, bounds on the host); ``v`` replaces the values."""
        if isinstance(piece, _cp_plan.Local):
            start, end = piece.bounds[0], piece.bounds[-1]
            kw["cu_seqlens"] = torch.tensor([b - start for b in piece.bounds], dtype=torch.int64)
        else:
            start, end = piece.start, piece.end
        q, k, v_piece, g, beta, out = (x[:, start:end] for x in self.tokens)
        scale, A_log, dt_bias, lower_bound = self.params
        v = v_piece if v is None else v
        _kda_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, exact=self.exact, **self.forms, **kw)


# ------------------------------------------------------------------ the exchange


class _Exchange:
    """One all-gather of every rank's ``[2, 1, H, 128, 128]`` fp32 export (S^, X), started
    asynchronously. NCCL reads and writes device memory on its own stream (``wait`` orders
    the current stream after it); gloo with CUDA tensors goes through host copies."""

    def __init__(self, send: torch.Tensor, group):
        self.device = send.device
        backend = dist.get_backend(group)
        src = send.cpu() if send.is_cuda and backend == "gloo" else send
        self.recv = src.new_empty((dist.get_world_size(group), *src.shape))
        if backend == "nccl":
            self.work = dist.all_gather_into_tensor(self.recv, src, group=group, async_op=True)
        else:
            self.work = dist.all_gather(list(self.recv.unbind(0)), src, group=group, async_op=True)

    def wait(self) -> torch.Tensor:
        self.work.wait()
        return self.recv.to(self.device)


def _compose(recv: torch.Tensor, chain: tuple) -> torch.Tensor:
    """fp32 [1, H, 128, 128]: the start state after the pieces of ``chain`` (ranks in token
    order, the first one exported from the sequence's true start), ``s <- s @ X + S^`` in
    fp64 (deterministic, and independent of TF32 settings), rounded once."""
    state = recv[chain[0], 0, 0].double()  # [H, V, K]
    for r in chain[1:]:
        state = torch.baddbmm(recv[r, 0, 0].double(), state, recv[r, 1, 0].double())
    return state.float().unsqueeze(0)


# ------------------------------------------------------------------ the phases


def _run(plan: _cp_plan.RankPlan, call: _Call, states: _cp_states.States, group, timings) -> None:
    q, v = call.tokens[0], call.tokens[2]
    device, heads = q.device, q.shape[2]
    if timings is not None:
        timings._restart(device)
    send = torch.empty(2, 1, heads, D, D, dtype=torch.float32, device=device) if plan.exchange else None
    last = plan.last
    if last is not None and last is plan.first:  # inside one sequence: S^ from zero, X from the identity
        identity = torch.eye(D, dtype=torch.float32, device=device).expand(1, heads, D, D).contiguous()
        zeros = torch.zeros_like(v[:, last.start : last.end])
        call.fwd(last, v=zeros, initial_state=identity, final_state=send[1])
        call.fwd(last, final_state=send[0])  # its out rows are rewritten by the rerun
    elif last is not None:  # starts here: S^ is its true end state
        call.fwd(last, initial_state=states.start(last.row), final_state=send[0])
        if plan.last_final:
            states.store(last.row, send[0])
    _mark(timings, device)
    exchange = _Exchange(send, group) if plan.exchange else None
    local = plan.local
    if local is not None and local.tokens:
        call.fwd(local, **states.call_args(local.row0, local.row1))
    _mark(timings, device)
    recv = exchange.wait() if exchange is not None else None
    _mark(timings, device)
    first = plan.first
    if first is not None:
        final = None
        if plan.first_final and states.final is not None:
            final = torch.empty(1, heads, D, D, dtype=torch.float32, device=device)
        call.fwd(first, initial_state=_compose(recv, plan.chain), final_state=final)
        if final is not None:
            states.store(first.row, final)
    if local is not None and not local.tokens:  # only empty sequences: no fwd call needed
        for row in range(local.row0, local.row1):
            states.store_empty(row)
    _mark(timings, device)


def _mark(timings, device) -> None:
    if timings is not None:
        timings._mark(device)


# ------------------------------------------------------------------ the public entry


def _member(where: str, group) -> tuple:
    """(this process's rank in group, the group's size)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{where}: torch.distributed is not initialized (call init_process_group first)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{where}: this process is not a member of group")
    return rank, dist.get_world_size(group)


def _local_slice(where: str, q, k, v, g, beta, out) -> tuple:
    """(T_local, H) of the local token tensors; fwd checks the rest (dtypes, strides, ...)."""
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("out", out)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if q.dim() != 4 or q.shape[0] != 1 or q.shape[2] < 1 or q.shape[3] != D:
        raise ValueError(f"{where}: q must be the local slice [1, T_local, H, 128], got {list(q.shape)}")
    for name, x in (("k", k), ("v", v), ("g", g), ("out", out)):
        if x.shape != q.shape:
            raise ValueError(
                f"{where}: {name} must have shape [1, T_local, H, 128] = {list(q.shape)}, got {list(x.shape)}"
            )
    if beta.shape != q.shape[:3]:
        raise ValueError(f"{where}: beta must have shape [1, T_local, H] = {list(q.shape[:3])}, got {list(beta.shape)}")
    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta), ("out", out)):
        if x.device != q.device:
            raise ValueError(f"{where}: {name} must be on {q.device} like q, got {x.device}")
    return q.shape[1], q.shape[2]


def _host_ints(name: str, x) -> list:
    """A CPU integer tensor or a sequence of ints as a list of Python ints."""
    if isinstance(x, torch.Tensor):
        if x.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{_WHERE}: {name} must be int64 or int32, got {x.dtype}")
        if x.device.type != "cpu" or x.dim() != 1:
            raise ValueError(
                f"{_WHERE}: {name} must be a 1-D tensor on the CPU (the host knows it), got {x.device} {list(x.shape)}"
            )
        return [int(b) for b in x.tolist()]
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{_WHERE}: {name} must be a CPU int tensor or a sequence of ints, got {type(x).__name__}")
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in x):
        raise TypeError(f"{_WHERE}: {name} must hold ints")
    return [int(b) for b in x]


def _monotone(name: str, xs: list, last_at_least: Optional[int] = None) -> list:
    if len(xs) < 2 or xs[0] != 0 or any(b < a for a, b in zip(xs, xs[1:])):
        raise ValueError(f"{_WHERE}: {name} must have >= 2 entries, start at 0 and be non-decreasing, got {xs[:8]}...")
    if last_at_least is not None and xs[-1] > last_at_least:
        raise ValueError(f"{_WHERE}: {name} must end at most at the split's {last_at_least} tokens, got {xs[-1]}")
    return xs


def _split(split, tokens: int, rank: int, size: int) -> list:
    if split is None:
        return [r * tokens for r in range(size + 1)]
    split = _monotone("split", _host_ints("split", split))
    if len(split) != size + 1:
        raise ValueError(f"{_WHERE}: split must have one entry per rank plus one ({size + 1}), got {len(split)}")
    if split[rank + 1] - split[rank] != tokens:
        held = split[rank + 1] - split[rank]
        raise ValueError(
            f"{_WHERE}: split gives rank {rank} split[{rank + 1}] - split[{rank}] = {held} tokens, "
            f"but its q has T_local = {tokens}"
        )
    return split


def fwd(
    q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None, cu_seqlens=None,
    *, group=None, split=None, ssm_state_indices=None, has_initial_state=None, exact=None, timings=None,
    gate="lower_bound", beta_is_logit=True,
) -> None:  # fmt: skip
    """The KDA forward of one packed batch whose tokens are spread over the ranks of
    ``group``: this rank's part. Every rank of the group calls it, with the same global
    arguments; it writes this rank's ``out`` rows and the final states of the sequences
    that end on this rank, in place, like :func:`flash_kda.fwd` over the whole batch.

    Parameters
    ----------
    q, k, v, g, out : torch.Tensor
        bfloat16 ``[1, T_local, H, 128]``: this rank's slice of the packed tokens (as for
        :func:`flash_kda.fwd`; strided views allowed). ``T_local`` may be 0.
    beta : torch.Tensor
        bfloat16 ``[1, T_local, H]``.
    scale, A_log, dt_bias, lower_bound
        As for :func:`flash_kda.fwd`, the same on every rank.
    initial_state, final_state : torch.Tensor, optional
        As for :func:`flash_kda.fwd`, indexed by the *global* sequence: ``[N, H, 128, 128]``,
        or pools ``[P, H, 128, 128]`` with ``ssm_state_indices``, on this rank's device. A
        sequence's initial state is read only by the rank holding its first token, its final
        state written only by the rank holding its last token (an empty sequence: the rank
        holding the token at its position, or the last token when it sits at the end; rank 0
        when there are no tokens). Other rows and slots are not touched.
    cu_seqlens : torch.Tensor or sequence of int, optional
        The *global* bounds ``[N + 1]`` of the packed batch, on the CPU (every rank knows
        them on the host), the same on every rank; None: one sequence of all tokens.
    group : torch.distributed.ProcessGroup, optional
        The ranks that share the batch (default: the default group). Rank order is token
        order.
    split : torch.Tensor or sequence of int, optional
        ``[R + 1]`` token offsets, the same on every rank: rank r of ``group`` holds tokens
        ``[split[r], split[r + 1])``; ``split[-1]`` >= ``cu_seqlens[-1]`` (tokens past the
        last sequence are padding and not written). None: equal slices of ``T_local``.
    ssm_state_indices, has_initial_state : torch.Tensor, optional
        As for :func:`flash_kda.fwd`, ``[N]`` over the global sequences, on this rank's
        device.
    exact, gate, beta_is_logit : optional
        Passed to every :func:`flash_kda.fwd` call. Composed start states make the result
        deterministic and within the automatic path's accuracy contract, not bitwise the
        one-GPU result (docs/distributed.md says when it is).
    timings : Timings, optional
        Receives the phase times of the call.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`flash_kda.fwd`, before anything is written; ``RuntimeError`` also when
        torch.distributed is not initialized. Ranks that disagree on the global arguments
        get wrong results: they are not compared.
    """
    rank, size = _member(_WHERE, group)
    tokens, heads = _local_slice(_WHERE, q, k, v, g, beta, out)
    split = _split(split, tokens, rank, size)
    bounds = [0, split[-1]]
    if cu_seqlens is not None:
        bounds = _monotone("cu_seqlens", _host_ints("cu_seqlens", cu_seqlens), split[-1])
    if timings is not None and not isinstance(timings, Timings):
        raise TypeError(f"{_WHERE}: timings must be a Timings or None, got {type(timings).__name__}")
    states = _cp_states.States(
        _WHERE, initial_state, final_state, ssm_state_indices, has_initial_state, len(bounds) - 1, heads, out
    )
    plan = _cp_plan.from_split(bounds, split, rank)
    forms = dict(gate=gate, beta_is_logit=beta_is_logit)
    call = _Call((q, k, v, g, beta, out), (scale, A_log, dt_bias, lower_bound), exact, forms)
    _run(plan, call, states, group, timings)


# ------------------------------------------------------------------ fla's chunk_kda with a cp_context

_FLA = "flash_kda.distributed.fla_chunk_kda"


def fla_refusal(cp_context) -> Optional[str]:
    """Why :func:`fla_chunk_kda` cannot run fla's ``cp_context`` (None: it can): it runs
    fla's contiguous layout with its rank metadata, not the zigzag one."""
    layout = getattr(cp_context, "layout", "contiguous")
    if layout != "contiguous":
        return f"flash_kda.distributed runs fla's contiguous context-parallel layout, not {layout!r}"
    if getattr(cp_context, "cu_seqlens_cpu", None) is None and getattr(cp_context, "cu_seqlens", None) is None:
        return "the cp_context has no cu_seqlens"
    if getattr(cp_context, "pre_num_ranks", None) is None or getattr(cp_context, "post_num_ranks", None) is None:
        return "the cp_context has no pre_num_ranks / post_num_ranks"
    return None


def fla_chunk_kda(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, *, cp_context, A_log, dt_bias,
    lower_bound, exact=None, gate="lower_bound", beta_is_logit=True,
) -> tuple:  # fmt: skip
    """fla's ``chunk_kda(..., cp_context=...)`` with FlashKDA's flags (design §1.7) on this
    package: ``(o, final_state)`` for this rank's slice, as fla's FlashKDA backend returns.

    The rows follow fla's per-rank sequences (``cp_context.cu_seqlens``): ``initial_state``
    fp32 ``[N_local, H, 128, 128]`` (V-first; row 0 is not read when that sequence began on
    an earlier rank), and with ``output_final_state`` the fp32 ``[N_local, H, 128, 128]``
    state after each local sequence's last token on this rank (its final state where it
    ends here, the state handed to the next rank otherwise). fla's own CP path takes
    neither. ``gate`` and ``beta_is_logit`` as :func:`flash_kda.fwd` (fla's other gate and
    beta flags, mapped by ``flash_kda._fla_backend``). Raises ``ValueError`` for a context
    :func:`fla_refusal` names.
    """
    why = fla_refusal(cp_context)
    if why is not None:
        raise ValueError(f"{_FLA}: {why}")
    group = getattr(cp_context, "group", None)  # None: the default group, as fla's collectives read it
    rank, _ = _member(_FLA, group)
    tokens, heads = _local_slice(_FLA, q, k, v, g, beta, v)
    cu = getattr(cp_context, "cu_seqlens_cpu", None)
    cu = cp_context.cu_seqlens.cpu() if cu is None else cu  # a device tensor: one synchronisation
    bounds = [int(b) for b in cu.tolist()]
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != tokens or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"{_FLA}: cp_context.cu_seqlens must tile the local T = {tokens} tokens, got {bounds[:8]}")
    out = torch.empty_like(v)
    final = None
    if output_final_state:
        final = torch.empty(len(bounds) - 1, heads, D, D, dtype=torch.float32, device=q.device)
    states = _cp_states.States(_FLA, initial_state, final, None, None, len(bounds) - 1, heads, out)
    plan = _cp_plan.from_fla(bounds, cp_context.pre_num_ranks, cp_context.post_num_ranks, rank)
    scale = D**-0.5 if scale is None else scale
    forms = dict(gate=gate, beta_is_logit=beta_is_logit)
    _run(plan, _Call((q, k, v, g, beta, out), (scale, A_log, dt_bias, lower_bound), exact, forms), states, group, None)
    return out, final
