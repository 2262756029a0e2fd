# SPDX-License-Identifier: MIT
"""PyTorch reference of the KDA forward, step by step after the precision ledger (design
§3), and the fp64 token-by-token gold.

:func:`fwd` has the signature of :func:`flash_kda.fwd`. On a GPU whose arch table the
native library has, every approximate instruction and tensor-core product runs through
the library's single-instruction probes (never the real kernels), which makes it the
bitwise oracle of the native forward. Elsewhere (CPU, or a GPU without a table) the
approximations become exact math and the result is accurate but not bit-exact; this is
also the pure-PyTorch fallback path. :func:`gold` is the exact-arithmetic recurrence of
design §2.1 in fp64, the accuracy yardstick for every path.

Tail rows (t >= n of a sequence's last chunk) are zero in q, k, g, v and beta; the
kernels produce the same values there (design §3.5: free).
"""

import math
from typing import NamedTuple, Optional

import torch

from . import _args, _sequences, _validate
from ._numerics import LOG2E, LOG2E_F, Ops, add_ftz, bf, bmul, fma_ftz, hadd, hf, mul_ftz

C = 16  # tokens per chunk
D = 128  # head dim

# Argument names of fwd (flash_kda.fwd, reference.fwd; _args.ARGS) and of gold, in call order,
# for callers that keep a problem as a dict (the CLI self-check, tests, benchmarks); the
# keyword-only arguments of fwd are passed by name when a problem dict has them.
FWD_ARGS = _args.POSITIONAL
FWD_KEYWORDS = _args.KEYWORD_ONLY
GOLD_ARGS = ("q", "k", "v", "g", "beta", "scale", "A_log", "dt_bias", "lower_bound", "initial_state", "cu_seqlens")


def random_problem(
    batch, seqlen, heads, *, lens=None, initial=None, final=None, device="cpu", seed=0, lower_bound=-5.0
):
    """Random inputs for fwd, a dict keyed by FWD_ARGS (the self-check's and the tests'):
    q, k, v, g, beta ~ N(0, 1) bf16; A_log, dt_bias ~ U(0, 1); initial state ~ 0.1 N(0, 1).
    ``lens`` makes a varlen problem (batch 1, seqlen = sum(lens)). ``out`` and
    ``final_state`` are pre-filled with NaN so that unwritten elements show."""
    gen = torch.Generator().manual_seed(seed)
    if lens is not None:
        batch, seqlen = 1, sum(lens)
    bf16 = torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=bf16)

    n_seqs = batch if lens is None else len(lens)
    p = dict(
        q=randn(batch, seqlen, heads, 128),
        k=randn(batch, seqlen, heads, 128),
        v=randn(batch, seqlen, heads, 128),
        g=randn(batch, seqlen, heads, 128),
        beta=randn(batch, seqlen, heads),
        scale=128**-0.5,
        A_log=torch.rand(heads, generator=gen).to(device),
        dt_bias=torch.rand(heads, 128, generator=gen).to(device),
        lower_bound=lower_bound,
    )
    p["out"] = torch.full_like(p["q"], float("nan"))
    p["initial_state"] = None
    if initial is not None:
        p["initial_state"] = (0.1 * torch.randn(n_seqs, heads, 128, 128, generator=gen)).to(device, initial)
    p["final_state"] = None
    if final is not None:
        p["final_state"] = torch.full((n_seqs, heads, 128, 128), float("nan"), dtype=final, device=device)
    p["cu_seqlens"] = None
    if lens is not None:
        bounds = [0]
        for n in lens:
            bounds.append(bounds[-1] + n)
        p["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int64, device=device)
    return p


def rel_err(x: torch.Tensor, gold: torch.Tensor) -> float:
    """Relative Frobenius error of x against an fp64 gold tensor."""
    return float((x.double() - gold).norm() / gold.norm().clamp_min(1e-30))


class Chunks(NamedTuple):
    """The chunking of a call (design §1.3 and §4.2)."""

    tok0: torch.Tensor  # [num_chunks] first token of each chunk
    valid: torch.Tensor  # [num_chunks, 16] bool: row t < n
    seq_chunks: list[list[int]]  # chunk ids of each sequence, in order


def chunk_table(batch: int, seqlen: int, bounds: Optional[list[int]], device, size: int = C) -> Chunks:
    """Chunk c of sequence i covers tokens [bos_i + 16 c, min(bos_i + 16 c + 16, eos_i));
    ``size`` other than 16 is for the chunk-length model (tests/chunk_model.py)."""
    spans = (
        [(i * seqlen, seqlen) for i in range(batch)]
        if bounds is None
        else [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(len(bounds) - 1)]
    )
    tok0, rows, seq_chunks = [], [], []
    for bos, length in spans:
        ids = []
        for c in range(math.ceil(length / size)):
            ids.append(len(tok0))
            tok0.append(bos + size * c)
            rows.append(min(size, length - size * c))
        seq_chunks.append(ids)
    tok0_t = torch.tensor(tok0, dtype=torch.int64, device=device)
    valid = torch.arange(size, device=device)[None, :] < torch.tensor(rows, device=device)[:, None]
    return Chunks(tok0_t, valid, seq_chunks)


def gather_chunks(x: torch.Tensor, chunks: Chunks) -> torch.Tensor:
    """[B, T, H, ...] -> [chunks, H, 16, ...], rows beyond a sequence set to zero."""
    size = chunks.valid.shape[1]
    flat = x.reshape(-1, *x.shape[2:])
    idx = (chunks.tok0[:, None] + torch.arange(size, device=x.device)[None, :]).clamp(max=flat.shape[0] - 1)
    rows = flat[idx.reshape(-1)].reshape(idx.shape[0], size, *x.shape[2:])
    mask = chunks.valid.reshape(chunks.valid.shape + (1,) * (rows.dim() - 2))
    rows = torch.where(mask, rows, torch.zeros((), dtype=rows.dtype, device=rows.device))
    return rows.transpose(1, 2)  # [chunks, H, 16, ...]


def l2_normalize(ops: Ops, x: torch.Tensor) -> torch.Tensor:
    """design §3.2 step 2: per row, 16 segments of 8 elements, fma partials in element
    order, butterfly over segments (xor 8, 4, 2, 1), r = RSQ(T + 1e-6), x_hat = bf(x * r)."""
    xf = x.float()
    seg = xf.unflatten(-1, (16, 8))
    partial = torch.zeros_like(seg[..., 0])
    for e in range(8):
        partial = fma_ftz(seg[..., e], seg[..., e], partial)
    lanes = torch.arange(16, device=x.device)
    for off in (8, 4, 2, 1):
        partial = add_ftz(partial, partial[..., lanes ^ off])
    r = ops.rsqrt(add_ftz(partial[..., 0], torch.full_like(partial[..., 0], 1e-6)))
    return bf(mul_ftz(xf, r[..., None]))


def gate_values(ops: Ops, g, valid, A_log, dt_bias, lower_bound) -> torch.Tensor:
    """design §3.2 steps 1, 3: a = EX2(A_log * LOG2E_F); gamma = c * sig((g + dt) * a) for valid rows,
    0 beyond."""
    a = ops.ex2(mul_ftz(A_log.float(), torch.full_like(A_log.float(), LOG2E_F)))
    c = torch.tensor(lower_bound * LOG2E, dtype=torch.float32, device=g.device)
    x = add_ftz(g.float(), dt_bias.reshape(1, -1, 1, D).float().expand_as(g))
    gamma = mul_ftz(c.expand_as(x), ops.sigmoid(mul_ftz(x, a.reshape(1, -1, 1, 1).expand_as(x))))
    return torch.where(valid[:, None, :, None], gamma, torch.zeros_like(gamma))


def cumulative_gates(gamma: torch.Tensor, restart: int = C) -> torch.Tensor:
    """design §3.2 step 4: the sequential fp32 sum of gamma over a chunk's rows (dim 2), 0 (+) gamma_0
    first, restarted every ``restart`` rows (the chunk model's 16-row blocks)."""
    G = torch.empty_like(gamma)
    acc = torch.zeros_like(gamma[:, :, 0])
    for t in range(gamma.shape[2]):
        if t % restart == 0:
            acc = torch.zeros_like(acc)
        acc = add_ftz(acc, gamma[:, :, t])
        G[:, :, t] = acc
    return G


def gate_cumsum(ops: Ops, g, valid, A_log, dt_bias, lower_bound) -> torch.Tensor:
    """design §3.2 steps 1, 3, 4: G = sequential fp32 cumulative sum of gamma over the chunk's 16 rows."""
    return cumulative_gates(gate_values(ops, g, valid, A_log, dt_bias, lower_bound))


def apply_decays(ops: Ops, q_hat, k_hat, G, scale: float):
    """design §3.2 steps 5, 6: e = EX2(G[15]); Qd = (q (*) E+) (*) sb, Kd = k (*) E+, Ki = k (*) E-,
    Kr = Ki (*) bf(e), with E+ = bf(EX2(G)), E- = bf(EX2(-G)), sb = bf(fp32(scale))."""
    e = ops.ex2(G[:, :, C - 1])
    e_plus, e_minus = bf(ops.ex2(G)), bf(ops.ex2(-G))
    sb = bf(torch.tensor(scale, dtype=torch.float32, device=G.device))
    Qd = bmul(bmul(q_hat, e_plus), sb.expand_as(e_plus))
    Kd = bmul(k_hat, e_plus)
    Ki = bmul(k_hat, e_minus)
    Kr = bmul(Ki, bf(e)[:, :, None, :].expand_as(Ki))
    return e, Qd, Kd, Ki, Kr


def chunk_scores(ops: Ops, Qd, Kd, Ki, b):
    """design §3.2 steps 7, 8: L = hf(hf(Kd Ki^T) * hf(b_i)) strictly below the diagonal, Mqk =
    bf(Qd Ki^T) on and below it (MMA32)."""
    i = torch.arange(C, device=Kd.device)
    lower, lower_diag = i[:, None] > i[None, :], i[:, None] >= i[None, :]
    l_raw = hf(ops.mma32(Kd, Ki)).float()
    L = hf(mul_ftz(l_raw, hf(b).float()[..., :, None].expand_as(l_raw)))
    L = torch.where(lower, L, torch.zeros_like(L))
    Mqk = bf(ops.mma32(Qd, Ki))
    return L, torch.where(lower_diag, Mqk, torch.zeros_like(Mqk))


def neumann_product(ops: Ops, L) -> torch.Tensor:
    """design §3.2 step 9 before its rounding: N3 = (I - L)(I + L^2)(I + L^4)(I + L^8) in fp16, by
    N_{m+1} = N_m (+h) MMA16(N_m, P), P = L^2, L^4, L^8 (fp16 products, fp16 accumulation)."""
    eye = torch.eye(C, dtype=torch.bool, device=L.device)
    n = torch.where(eye, torch.ones_like(L), -L)
    p = ops.mma16(L, L)
    for step in range(3):
        n = hadd(n, ops.mma16(n, p))
        if step < 2:
            p = ops.mma16(p, p)
    return n


def neumann_inverse(ops: Ops, L) -> torch.Tensor:
    """design §3.2 step 9: INV = bf(f(N3))."""
    return bf(neumann_product(ops, L).float())


def prepare(ops: Ops, q, k, g, beta, A_log, dt_bias, scale, lower_bound, chunks: Chunks) -> dict:
    """K1 (design §3.2) for every chunk and head: tensors [chunks, H, ...]."""
    q_hat = l2_normalize(ops, gather_chunks(q, chunks))
    k_hat = l2_normalize(ops, gather_chunks(k, chunks))
    G = gate_cumsum(ops, gather_chunks(g, chunks), chunks.valid, A_log, dt_bias, lower_bound)
    e, Qd, Kd, Ki, Kr = apply_decays(ops, q_hat, k_hat, G, scale)
    b = ops.sigmoid(gather_chunks(beta, chunks).float())
    L, Mqk = chunk_scores(ops, Qd, Kd, Ki, b)
    return dict(Kd=Kd, Qd=Qd, Kr=Kr, e=e, INV=neumann_inverse(ops, L), Mqk=Mqk, beta=bf(b))


def recurrence_step(ops: Ops, S, V, rec: dict):
    """design §3.3 for one chunk of a batch of (sequence, head) pairs. S: bf16 state
    [.., 128 (v), 128 (k)]; V: [.., 16, 128]. Returns (O, S'). Chunks of 16 m rows (the
    chunk model, tests/chunk_model.py) go by 16-row blocks: block i's U and output rows take
    blocks 0..i as one k-sum, in order; with 16 rows that is the ledger's one block."""
    Pk, Pq = bf(ops.mma32(rec["Kd"], S)), bf(ops.mma32(rec["Qd"], S))
    u = bmul(bf(V.float() - Pk.float()), rec["beta"][..., None].expand_as(V))
    U, O = torch.empty_like(u), torch.empty_like(u)
    for i in range(V.shape[-2] // C):
        rows, upto = slice(C * i, C * (i + 1)), slice(0, C * (i + 1))
        U[..., rows, :] = bf(ops.mma32(rec["INV"][..., rows, upto], u[..., upto, :].transpose(-1, -2)))
        scores = bf(ops.mma32(rec["Mqk"][..., rows, upto], U[..., upto, :].transpose(-1, -2)))
        O[..., rows, :] = bf(Pq[..., rows, :].float() + scores.float())
    delta = ops.mma32(rec["Kr"].transpose(-1, -2), U.transpose(-1, -2))  # [.., k, v]
    decay = rec["e"][..., None, :].expand_as(S)
    S_next = bf(fma_ftz(S.float(), decay, delta.transpose(-1, -2)))
    return O, S_next


def run_chain(ops: Ops, rec: dict, V, S, chunks: Chunks, out, after=None):
    """The recurrence over chunk positions: at position j, one recurrence_step for every
    sequence with a chunk j; its output rows inside the sequences go to ``out``
    [B, T, H, 128] and S [N, H, 128, 128] is updated in place; ``after(seqs, j, S_next)``
    runs after each position. Returns S."""
    T, size = out.shape[1], chunks.valid.shape[1]
    depth = max((len(ids) for ids in chunks.seq_chunks), default=0)
    for step in range(depth):
        seqs = [i for i, ids in enumerate(chunks.seq_chunks) if len(ids) > step]
        ids = torch.tensor([chunks.seq_chunks[i][step] for i in seqs], device=S.device)
        sel = torch.tensor(seqs, device=S.device)
        O, S_next = recurrence_step(ops, S[sel], V[ids], {key: val[ids] for key, val in rec.items()})
        S[sel] = S_next
        tok = chunks.tok0[ids][:, None] + torch.arange(size, device=S.device)[None, :]
        keep = chunks.valid[ids]
        rows = tok[keep]
        out[rows // T, rows % T] = O.transpose(1, 2)[keep]
        if after is not None:
            after(seqs, step, S_next)
    return S


def _write_checkpoints(call, firsts: list[int], lengths: list[int], seqs: list[int], step: int, S) -> None:
    """Spec-free bookkeeping of flash_kda.h: after chunk ``step`` every sequence in ``seqs``
    has consumed 16 (step + 1) tokens; at a multiple of checkpoint_every its state S[j]
    goes to slot first_i + tokens / every - 1 (slots past the buffer are not written)."""
    done = C * (step + 1)
    if not call.checkpoint_every or done % call.checkpoint_every:
        return
    rows, slots = [], []
    for j, i in enumerate(seqs):
        slot = firsts[i] + done // call.checkpoint_every - 1
        if lengths[i] >= done and slot < call.checkpoints.shape[0]:
            rows.append(j)
            slots.append(slot)
    if rows:
        call.checkpoints[slots] = S[rows].to(call.checkpoints.dtype)


def run(call: _validate.FwdCall, ops: Ops) -> None:
    """The ledger for a validated call: writes ``out`` (rows inside sequences),
    ``final_state`` (its pool slots) and ``checkpoints`` in place. Index tensors on the
    device are read (a synchronisation) and checked before anything is written."""
    host = _sequences.read_host(call)
    device, T, H = call.device, call.seqlen, call.heads
    if not call.has_tokens or (host.bounds is not None and host.bounds[-1] == 0):  # every sequence empty
        start = _sequences.initial_states(call, host)
        with torch.no_grad():
            if start is None:
                start = torch.zeros(call.num_seqs, H, D, D, dtype=torch.bfloat16, device=device)
            _sequences.store_final_states(call, host, start.to(torch.bfloat16))
        return
    spans = _sequences.spans(call.batch, T, host.bounds)
    lengths = [n for _, n in spans]
    firsts = _sequences.checkpoint_firsts(lengths, call.checkpoint_every or 1)
    with torch.no_grad():
        chunks = chunk_table(call.batch, T, host.bounds, device)
        rec = prepare(
            ops, call.q, call.k, call.g, call.beta, call.A_log, call.dt_bias, call.scale, call.lower_bound, chunks
        )
        V = gather_chunks(call.v, chunks)
        start = _sequences.initial_states(call, host)  # design §1.4: the state is bf16
        S = torch.zeros(call.num_seqs, H, D, D, dtype=torch.bfloat16, device=device)
        if start is not None:
            S = start.to(torch.bfloat16)
        run_chain(
            ops,
            rec,
            V,
            S,
            chunks,
            call.out,
            lambda seqs, step, S_next: _write_checkpoints(call, firsts, lengths, seqs, step, S_next),
        )
        _sequences.store_final_states(call, host, S)


def fwd(*args, **kwargs) -> None:
    """The forward after the precision ledger, with the arguments, checks and in-place
    contract of :func:`flash_kda.fwd` (pools, checkpoints and strided views included).

    On a GPU whose arch table the library has, the approximate instructions run through
    the library's probes: the bitwise oracle of the native forward in exact mode (``exact``
    and ``max_seqlen`` are accepted and ignored: the ledger is always exact and has no plan).
    Elsewhere it uses exact math.
    """
    call = _validate.check_fwd(*args, **kwargs)
    run(call, Ops(call.device))


def gold(
    q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state=None, cu_seqlens=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact recurrence of design §2.1 in fp64, one token at a time.

    Returns ``(out, final_state)``: ``out`` [B, T, H, 128] and ``final_state``
    [N, H, 128 (V), 128 (K)], both float64. The initial state is used unrounded.
    """
    B, T, H, _ = q.shape
    f64 = torch.float64
    with torch.no_grad():

        def unit(x):
            x = x.to(f64)
            return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

        qn, kn = unit(q).reshape(B * T, H, D), unit(k).reshape(B * T, H, D)
        vv = v.to(f64).reshape(B * T, H, D)
        a = torch.exp(A_log.to(f64)).reshape(1, H, 1)
        gate = lower_bound * torch.sigmoid(a * (g.to(f64).reshape(B * T, H, D) + dt_bias.to(f64).reshape(1, H, D)))
        alpha, b = torch.exp(gate), torch.sigmoid(beta.to(f64).reshape(B * T, H))
        if cu_seqlens is None:
            bounds = [i * T for i in range(B + 1)]
        else:
            bounds = [int(x) for x in cu_seqlens.tolist()]
        N = len(bounds) - 1
        S = torch.zeros(N, H, D, D, dtype=f64, device=q.device)  # K-first: S[n, h, k, v]
        if initial_state is not None:
            S = initial_state.to(f64).transpose(-1, -2).clone()
        out = torch.zeros(B * T, H, D, dtype=f64, device=q.device)
        lengths = [bounds[i + 1] - bounds[i] for i in range(N)]
        for pos in range(max(lengths, default=0)):
            seqs = [i for i in range(N) if lengths[i] > pos]
            sel = torch.tensor(seqs, device=q.device)
            tok = torch.tensor([bounds[i] + pos for i in seqs], device=q.device)
            St = S[sel] * alpha[tok][..., None]
            kt = kn[tok]
            err = vv[tok] - torch.einsum("shk,shkv->shv", kt, St)
            St = St + b[tok][..., None, None] * kt[..., None] * err[..., None, :]
            out[tok] = scale * torch.einsum("shk,shkv->shv", qn[tok], St)
            S[sel] = St
        return out.reshape(B, T, H, D), S.transpose(-1, -2).contiguous()
