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
from ._numerics import LOG2E, LOG2E_F, Ops, add_ftz, bf, bmul, fma_ftz, hadd, hf, max_num, min_num, mul_ftz

C = 16  # tokens per chunk
D = 128  # head dim

# Argument names of fwd (flash_kda.fwd, reference.fwd; _args.ARGS) and of gold, in call order,
# for callers that keep a problem as a dict (the CLI self-check, tests, benchmarks); the
# keyword-only arguments of fwd are passed by name when a problem dict has them.
FWD_ARGS = _args.POSITIONAL
FWD_KEYWORDS = _args.KEYWORD_ONLY
GATES = _validate.GATES
CLAMP_LOG2 = 15.0  # C of design §2.5: the score operands' clamped gamma~ = max(gamma, -C)
INVERSE_TOLERANCE = 2.0**-8  # design §2.6: a sound Neumann inverse has every |residual| <= this
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


def unbounded_gamma(ops: Ops, g, valid, A_log, dt_bias, gate: str) -> torch.Tensor:
    """design §3.2 step U1 (§2.5), the log2 decay of the unbounded gates, in [-inf, 0]:
    softplus: a = EX2(A_log * LOG2E_F), y = (g + dt) * LOG2E_F, gamma = min(-a * (max(y, 0) +
    LG2(1 + EX2(-|y|))), 0); log_decay: gamma = min(g * LOG2E_F, 0); min and max return the
    other operand for a NaN. 0 beyond the valid rows."""
    x = g.float()
    if gate == "softplus":
        neg_a = -ops.ex2(mul_ftz(A_log.float(), torch.full_like(A_log.float(), LOG2E_F)))
        y = mul_ftz(add_ftz(x, dt_bias.reshape(1, -1, 1, D).float().expand_as(x)), torch.full_like(x, LOG2E_F))
        sp = add_ftz(max_num(y, 0.0), ops.lg2(add_ftz(torch.ones_like(y), ops.ex2(-y.abs()))))
        gamma = min_num(mul_ftz(neg_a.reshape(1, -1, 1, 1).expand_as(sp), sp), 0.0)
    else:
        gamma = min_num(mul_ftz(x, torch.full_like(x, LOG2E_F)), 0.0)
    return torch.where(valid[:, None, :, None], gamma, torch.zeros_like(gamma))


def _chain(gamma: torch.Tensor, rows, start=None) -> list:
    """The sequential fp32 sums (add_ftz) of gamma over ``rows`` in that order, from 0 (or
    ``start``): element i is the sum after row rows[i]."""
    acc = torch.zeros_like(gamma[:, :, 0]) if start is None else start
    out = []
    for t in rows:
        acc = add_ftz(acc, gamma[:, :, t])
        out.append(acc)
    return out


def unbounded_decays(ops: Ops, q_hat, k_hat, gamma, scale: float):
    """design §3.2 steps U2, U3 (§2.5): every factor EX2 of a sum that never subtracts. With the
    halves H0 = rows 0-7 and H1 = rows 8-15: G_t (H0 forward; in H1 G_7 + F_t, F forward from
    row 8), D_t = sum_{s>t} gamma_s (H1 backward, T = D_7 its total; in H0 B_t + T, B backward
    to row 7), e = EX2(G_7 + T); Kd = k (*) E(G), Qd = (q (*) E(G)) (*) sb, Kr = k (*) E(D) with
    E = bf(EX2(.)); the score operands A = k (*) E(a), A_q = (q (*) E(a)) (*) sb, B = k (*) E(-a)
    from the clamped gamma~ = max(gamma, -C): a_t = -B~_t in H0, F~_t in H1."""
    half = C // 2
    clamped = max_num(gamma, -CLAMP_LOG2)
    G0 = _chain(gamma, range(half))  # G_0 .. G_7
    D1 = _chain(gamma, range(C - 1, half - 1, -1))  # after rows 15, 14, .., 8: D_14 .. D_8, then T
    T = D1[-1]
    D = [None] * C
    D[C - 1] = torch.zeros_like(T)
    for i, t in enumerate(range(C - 2, half - 1, -1)):
        D[t] = D1[i]
    B0 = _chain(gamma, range(half - 1, 0, -1))  # after rows 7 .. 1: B_6 .. B_0
    Bc = _chain(clamped, range(half - 1, 0, -1))
    zero = torch.zeros_like(T)
    B, Bt = [None] * half, [None] * half
    B[half - 1], Bt[half - 1] = zero, zero
    for i, t in enumerate(range(half - 2, -1, -1)):
        B[t], Bt[t] = B0[i], Bc[i]
    F = _chain(gamma, range(half, C))
    Fc = _chain(clamped, range(half, C))
    G7 = G0[-1]
    G = G0 + [add_ftz(G7, f) for f in F]
    for t in range(half):
        D[t] = add_ftz(B[t], T)
    a = [-b for b in Bt] + Fc
    stack = lambda xs: torch.stack(xs, dim=2)  # noqa: E731
    G, D, a = stack(G), stack(D), stack(a)
    e = ops.ex2(add_ftz(G7, T))
    sb = bf(torch.tensor(scale, dtype=torch.float32, device=G.device))
    e_plus = bf(ops.ex2(G))
    up, down = bf(ops.ex2(a)), bf(ops.ex2(-a))
    Qd = bmul(bmul(q_hat, e_plus), sb.expand_as(e_plus))
    Kd = bmul(k_hat, e_plus)
    Kr = bmul(k_hat, bf(ops.ex2(D)))
    A_q = bmul(bmul(q_hat, up), sb.expand_as(up))
    A_k = bmul(k_hat, up)
    B_op = bmul(k_hat, down)
    return e, Qd, Kd, Kr, A_q, A_k, B_op


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


def residual(ops: Ops, L, N) -> torch.Tensor:
    """design §2.6: R = N + MMA16(L, N) - I, each entry the fp32 sum (RN) of the two fp16
    values, 1 subtracted on the diagonal."""
    R = N.float() + ops.mma16(L, N).float()
    return R - torch.eye(R.shape[-1], dtype=R.dtype, device=R.device)


def within_tolerance(R) -> torch.Tensor:
    """Every |R_ij| <= INVERSE_TOLERANCE (NaN is not), per matrix."""
    return (R.abs() <= INVERSE_TOLERANCE).all(-1).all(-1)


def forward_substitution(L) -> torch.Tensor:
    """design §2.6: (I + L)^-1 of strictly lower fp16 L [..., n, n] in fp32, column by
    column as the kernel's lanes: X_jj = 1, X_ij = 0 above, and for i > j X_ij = -acc with
    acc = fma(L_is, X_sj, acc) over s = 0 .. i - 1 in order from +0 (FTZ)."""
    Lf = L.float()
    n = L.shape[-1]
    X = torch.zeros(Lf.shape, dtype=torch.float32, device=L.device)
    j = torch.arange(n, device=L.device)
    for i in range(n):
        acc = torch.zeros_like(X[..., 0, :])
        for s in range(i):
            acc = fma_ftz(Lf[..., i, s, None].expand_as(acc), X[..., s, :], acc)
        X[..., i, :] = torch.where(j == i, torch.ones_like(acc), torch.where(j < i, -acc, torch.zeros_like(acc)))
    return X


def neumann_inverse(ops: Ops, L, stable: bool = False) -> torch.Tensor:
    """design §3.2 step 9: INV = bf(f(N3)); with ``stable`` (AUTO mode, design §2.6), bf of the fp32
    forward substitution where N3's residual is out of tolerance."""
    N = neumann_product(ops, L)
    INV = bf(N.float())
    if not stable:
        return INV
    unsound = ~within_tolerance(residual(ops, L, N))
    if unsound.any():
        INV[unsound] = bf(forward_substitution(L[unsound]))
    return INV


def write_strength(ops: Ops, beta, beta_is_logit: bool = True) -> torch.Tensor:
    """design §3.2 step 8's b in fp32: sig(f(beta)) of a logit, else min(max(f(beta), 0), 1) (NaN: 0)."""
    x = beta.float()
    if beta_is_logit:
        return ops.sigmoid(x)
    return min_num(max_num(x, 0.0), 1.0)


def prepare(
    ops: Ops, q, k, g, beta, A_log, dt_bias, scale, lower_bound, chunks: Chunks, gate="lower_bound",
    beta_is_logit=True, stable=False,
) -> dict:  # fmt: skip
    """K1 (design §3.2; the unbounded gates' steps U1-U3 of design §2.5) for every chunk and
    head: tensors [chunks, H, ...]. ``stable``: the stable inverse of AUTO mode."""
    q_hat = l2_normalize(ops, gather_chunks(q, chunks))
    k_hat = l2_normalize(ops, gather_chunks(k, chunks))
    if gate == "lower_bound":
        G = gate_cumsum(ops, gather_chunks(g, chunks), chunks.valid, A_log, dt_bias, lower_bound)
        e, Qd, Kd, Ki, Kr = apply_decays(ops, q_hat, k_hat, G, scale)
        operands = Qd, Kd, Ki
    else:
        gamma = unbounded_gamma(ops, gather_chunks(g, chunks), chunks.valid, A_log, dt_bias, gate)
        e, Qd, Kd, Kr, *operands = unbounded_decays(ops, q_hat, k_hat, gamma, scale)
    b = write_strength(ops, gather_chunks(beta, chunks), beta_is_logit)
    L, Mqk = chunk_scores(ops, *operands, b)
    return dict(Kd=Kd, Qd=Qd, Kr=Kr, e=e, INV=neumann_inverse(ops, L, stable), Mqk=Mqk, beta=bf(b))


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
            ops, call.q, call.k, call.g, call.beta, call.A_log, call.dt_bias, call.scale, call.lower_bound, chunks,
            call.gate, call.beta_is_logit, stable=not call.exact,
        )  # fmt: skip
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
    the library's probes: the bitwise oracle of the native forward in exact mode, and with
    ``exact=False`` of the automatic path's 16-token whole-sequence passes (the stable inverse
    of design §2.6; the reference has no plan: no segments, no 32-token chunks, and
    ``max_seqlen`` is ignored). ``gate`` and ``beta_is_logit`` as :func:`flash_kda.fwd`.
    Elsewhere it uses exact math.
    """
    call = _validate.check_fwd(*args, **kwargs)
    run(call, Ops(call.device))


def gate_gold(g, A_log, dt_bias, lower_bound, gate="lower_bound") -> torch.Tensor:
    """The natural-log decay of every gate form in fp64, [B * T, H, 128] (design §2.2,
    §2.5): lower_bound * sigmoid(e^A_log (g + dt)), -e^A_log softplus(g + dt), or g itself
    clamped to <= 0 (NaN: 0)."""
    B, T, H, _ = g.shape
    x = g.to(torch.float64).reshape(B * T, H, D)
    if gate == "log_decay":
        return torch.fmin(x, torch.zeros((), dtype=x.dtype, device=x.device))
    a = torch.exp(A_log.to(torch.float64)).reshape(1, H, 1)
    x = x + dt_bias.to(torch.float64).reshape(1, H, D)
    if gate == "softplus":
        # -a softplus(x); NaN (an a of 0 against an infinite softplus, or a NaN g) takes no decay
        decay = -a * torch.logaddexp(x, torch.zeros_like(x))
        return torch.where(torch.isnan(decay), torch.zeros_like(decay), decay)
    return lower_bound * torch.sigmoid(a * x)


def gold(
    q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state=None, cu_seqlens=None, *,
    gate="lower_bound", beta_is_logit=True,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The exact recurrence of design §2.1 in fp64, one token at a time, for every gate form
    (:func:`gate_gold`) and beta form (a logit, or the write strength clamped to [0, 1]).

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
        alpha = torch.exp(gate_gold(g, A_log, dt_bias, lower_bound, gate))
        b = beta.to(f64).reshape(B * T, H)
        b = torch.sigmoid(b) if beta_is_logit else torch.nan_to_num(b, nan=0.0).clamp(0.0, 1.0)
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
