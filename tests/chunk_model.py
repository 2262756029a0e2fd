# SPDX-License-Identifier: MIT
"""A model of the automatic path with 32-token chunks.
It is the bitwise oracle of the native 32-token path (design §4.8; tests/test_chunk32_gpu.py
on a GPU), and its accuracy is tested on the CPU (tests/test_chunk_model.py).

Like reference.py it runs the approximate instructions exactly on the CPU, or through the
library's probes on a GPU that has them. Every rounding follows the ledger (design §3.2,
§3.3) within each 16-row block; design §4.8 says where a 32-token chunk departs from it:

- the chunk's cumulative gate G over 32 rows, and each block's own, restarted at row 16;
- Kd, Qd and e from the chunk's G; Kr = k̂ ⊛ bf(EX2(G_31 − G)), formed directly;
- L, Mqk and the Neumann inverse of each diagonal block from the block's own G (design
  §3.2 steps 6-9 on 16 rows);
- the cross block from block 1's own Kd / Qd and B = k̂_0 ⊛ bf(EX2(G_15 − G)), the decay to
  the end of block 0, so that no factor exceeds 1; INV10 = bf(−MMA16(N11, MMA16(L10, N00)))
  with N the blocks' fp16 Neumann products before their rounding to bf16;
- one link per chunk (reference.recurrence_step by 16-row blocks): U and the output rows of
  block 1 accumulate block 0's term first;
- the unbounded gates (design §2.5, "32-token chunks"): each 8-row quarter sums its gamma
  forward and backward from zero, and the chunk's sums add the quarters' totals in order;
  the diagonal blocks score the 16-token operands, the cross block block 1's own Kd / Qd
  (its sums from row 16) against B = k̂_0 ⊛ bf(EX2(sum to row 15)), so no factor exceeds 1;
- ``stable`` (AUTO mode, design §2.6): a chunk whose diagonal blocks' residuals or the cross
  block's, (f(x) - f(y)) - f(MMA16(L11, y)) with x = MMA16(L10, N00) and y = MMA16(N11, x), are
  out of tolerance takes all three INV blocks from the fp32 forward substitution of its 32 rows.

``chunk=16`` with ``ledger_kr=True`` is the exact ledger itself (reference.run's
arithmetic), which tests/test_chunk_model.py checks bit for bit: the plumbing is shared.
"""

import torch
from flash_kda import reference
from flash_kda._numerics import Ops, add_ftz, bf, bmul, hf, max_num, mul_ftz

BLOCK = reference.C  # rows of the ledger's chunk: the model's blocks
QUARTER = BLOCK // 2  # rows a thread of the 32-token unbounded K1 sums


def unbounded_decays32(ops: Ops, q_hat, k_hat, gamma, scale: float):
    """The 32-token unbounded K1's decays (prepare.cuh unbounded_decays32): e, Qd, Kd, Kr,
    each block's score operands (A_q, A, B) and the cross block's (Qd^1, Kd^1, B0)."""
    clamped = max_num(gamma, -reference.CLAMP_LOG2)
    zero = torch.zeros_like(gamma[:, :, 0])
    F, Fc, R, Rc, Sf, Sb = [], [], [], [], [], []
    for q in range(4):
        rows = range(QUARTER * q, QUARTER * (q + 1))
        F.append(reference._chain(gamma, rows))
        Fc.append(reference._chain(clamped, rows))
        back, back_c = reference._chain(gamma, rows[::-1]), reference._chain(clamped, rows[::-1])
        R.append([zero] + back[:-1])  # R[q][i]: the sum after row 8 q + 7 - i, i.e. R_{7-i}
        Rc.append([zero] + back_c[:-1])
        Sf.append(F[q][-1])
        Sb.append(back[-1])
    P = [zero, Sf[0], add_ftz(Sf[0], Sf[1]), add_ftz(add_ftz(Sf[0], Sf[1]), Sf[2])]
    Q = [add_ftz(add_ftz(Sb[3], Sb[2]), Sb[1]), add_ftz(Sb[3], Sb[2]), Sb[3], zero]
    G, D, a, own = [], [], [], []
    for q in range(4):
        for j in range(QUARTER):
            r = R[q][QUARTER - 1 - j]
            G.append(add_ftz(P[q], F[q][j]))
            D.append(add_ftz(r, Q[q]))
            a.append(Fc[q][j] if q % 2 else -Rc[q][QUARTER - 1 - j])
            own.append({0: add_ftz(r, Sb[1]), 1: r, 2: F[q][j], 3: add_ftz(Sf[2], F[q][j])}[q])
    stack = lambda xs: torch.stack(xs, dim=2)  # noqa: E731
    G, D, a, own = stack(G), stack(D), stack(a), stack(own)
    e = ops.ex2(add_ftz(P[3], Sf[3]))
    sb = bf(torch.tensor(scale, dtype=torch.float32, device=G.device)).expand_as(G)
    e_plus, up, down, o = bf(ops.ex2(G)), bf(ops.ex2(a)), bf(ops.ex2(-a)), bf(ops.ex2(own))
    Qd, Kd = bmul(bmul(q_hat, e_plus), sb), bmul(k_hat, e_plus)
    Kr = bmul(k_hat, bf(ops.ex2(D)))

    def rebased(rows, b_rows, f, f_b):  # (A_q, A, B): q̂, k̂ of rows by f, k̂ of b_rows by f_b
        return (
            bmul(bmul(q_hat[:, :, rows], f[:, :, rows]), sb[:, :, rows]),
            bmul(k_hat[:, :, rows], f[:, :, rows]),
            bmul(k_hat[:, :, b_rows], f_b[:, :, b_rows]),
        )

    r0, r1 = slice(0, BLOCK), slice(BLOCK, 2 * BLOCK)
    scores = [rebased(r, r, up, down) for r in (r0, r1)]
    return e, Qd, Kd, Kr, scores, rebased(r1, r0, o, o)


def prepare(
    ops: Ops, q, k, g, beta, A_log, dt_bias, scale, lower_bound, chunks, ledger_kr=False, stable=False,
    gate="lower_bound", beta_is_logit=True,
) -> dict:  # fmt: skip
    """The record of every chunk and head (C = 16 or 32 rows): tensors [chunks, H, ...]."""
    C = chunks.valid.shape[1]
    if C not in (16, 32) or (ledger_kr and C != 16):
        raise ValueError(f"chunk: expected 16 or 32 rows (16 with ledger_kr), got {C}")
    blocks = C // BLOCK
    q_hat = reference.l2_normalize(ops, reference.gather_chunks(q, chunks))
    k_hat = reference.l2_normalize(ops, reference.gather_chunks(k, chunks))
    b = reference.write_strength(ops, reference.gather_chunks(beta, chunks), beta_is_logit)
    unbounded = gate != "lower_bound"
    if unbounded and C != 2 * BLOCK:
        raise ValueError(f"chunk: the unbounded gates' model is of 32-row chunks, got {C}")
    if unbounded:
        gamma = reference.unbounded_gamma(ops, reference.gather_chunks(g, chunks), chunks.valid, A_log, dt_bias, gate)
        e, Qd, Kd, Kr, scores, cross_ops = unbounded_decays32(ops, q_hat, k_hat, gamma, scale)
    else:
        gamma = reference.gate_values(
            ops, reference.gather_chunks(g, chunks), chunks.valid, A_log, dt_bias, lower_bound
        )
        G, G_own = reference.cumulative_gates(gamma, C), reference.cumulative_gates(gamma, BLOCK)
        sb = bf(torch.tensor(scale, dtype=torch.float32, device=G.device))
        e_plus = bf(ops.ex2(G))
        Qd = bmul(bmul(q_hat, e_plus), sb.expand_as(e_plus))
        Kd = bmul(k_hat, e_plus)
        e = ops.ex2(G[:, :, C - 1])
        Kr = bmul(k_hat, bf(ops.ex2(add_ftz(G[:, :, C - 1 :].expand_as(G), -G))))
    INV = torch.zeros(*Kd.shape[:2], C, C, dtype=torch.bfloat16, device=Kd.device)
    Mqk = torch.zeros_like(INV)
    own, N, Ls, sound = [], [], [], None
    for i in range(blocks):  # diagonal blocks: the ledger on the block's own G
        rows = slice(BLOCK * i, BLOCK * (i + 1))
        if unbounded:
            Qd_i, Kd_i, Ki_i = scores[i]
        else:
            _, Qd_i, Kd_i, Ki_i, Kr_i = reference.apply_decays(
                ops, q_hat[:, :, rows], k_hat[:, :, rows], G_own[:, :, rows], scale
            )
            if ledger_kr:  # the ledger's Kr = Ki (*) bf(e) (one block: C = 16)
                Kr = Kr_i
        L_i, Mqk_i = reference.chunk_scores(ops, Qd_i, Kd_i, Ki_i, b[:, :, rows])
        N.append(reference.neumann_product(ops, L_i))
        Ls.append(L_i)
        INV[:, :, rows, rows], Mqk[:, :, rows, rows] = bf(N[-1].float()), Mqk_i
        if stable:
            ok = reference.within_tolerance(reference.residual(ops, L_i, N[-1]))
            sound = ok if sound is None else sound & ok
        own.append((Qd_i, Kd_i))
    if blocks == 2:  # the cross block, against the end of block 0
        r0, r1 = slice(0, BLOCK), slice(BLOCK, C)
        if unbounded:
            Qd_1, Kd_1, B = cross_ops
        else:
            B = bmul(
                k_hat[:, :, r0], bf(ops.ex2(add_ftz(G[:, :, BLOCK - 1 : BLOCK].expand_as(G[:, :, r0]), -G[:, :, r0])))
            )
            Qd_1, Kd_1 = own[1]
        l_raw = hf(ops.mma32(Kd_1, B)).float()
        L10 = hf(mul_ftz(l_raw, hf(b[:, :, r1]).float()[..., :, None].expand_as(l_raw)))
        Mqk[:, :, r1, r0] = bf(ops.mma32(Qd_1, B))
        x = ops.mma16(L10, N[0])
        y = ops.mma16(N[1], x)
        INV[:, :, r1, r0] = bf(-y.float())
        if stable:
            cross = (x.float() - y.float()) - ops.mma16(Ls[1], y).float()
            sound = sound & reference.within_tolerance(cross)
            Ls = [torch.cat([Ls[0], torch.zeros_like(Ls[0])], -1), torch.cat([L10, Ls[1]], -1)]
    if stable and not sound.all():
        L = torch.cat(Ls, -2) if blocks == 2 else Ls[0]
        INV[~sound] = bf(reference.forward_substitution(L[~sound]))
    return dict(Kd=Kd, Qd=Qd, Kr=Kr, e=e, INV=INV, Mqk=Mqk, beta=bf(b))


def fwd(
    q,
    k,
    v,
    g,
    beta,
    scale,
    A_log,
    dt_bias,
    lower_bound,
    initial_state=None,
    cu_seqlens=None,
    *,
    chunk=32,
    ledger_kr=False,
    ops=None,
    stable=None,
    gate="lower_bound",
    beta_is_logit=True,
):
    """(out [B, T, H, 128] bf16, final state [N, H, 128 (v), 128 (k)] bf16) with ``chunk``-row
    chunks; the initial state, if any, is rounded to bf16 (design §1.4). ``stable`` (default:
    for 32-row chunks, which only AUTO mode runs) takes the stable inverse of design §2.6."""
    if stable is None:
        stable = chunk == 32
    B, T, H, D = q.shape
    ops = ops or Ops(q.device)
    bounds = None if cu_seqlens is None else [int(x) for x in cu_seqlens.tolist()]
    with torch.no_grad():
        chunks = reference.chunk_table(B, T, bounds, q.device, size=chunk)
        rec = prepare(
            ops, q, k, g, beta, A_log, dt_bias, scale, lower_bound, chunks, ledger_kr, stable, gate, beta_is_logit
        )
        V = reference.gather_chunks(v, chunks)
        N = len(chunks.seq_chunks)
        S = torch.zeros(N, H, D, D, dtype=torch.bfloat16, device=q.device)
        if initial_state is not None:
            S = initial_state.to(torch.bfloat16).clone()
        out = torch.zeros(B, T, H, D, dtype=torch.bfloat16, device=q.device)
        return out, reference.run_chain(ops, rec, V, S, chunks, out)
