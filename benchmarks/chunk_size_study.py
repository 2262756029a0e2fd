# SPDX-License-Identifier: MIT
"""How accurate would an automatic path with longer chunks be?

The link of K2 does the state update once per chunk: per state element an unpack, an FFMA,
a pack and a movmatrix, about half of the link's instructions,
so chunks of 32 or 64 tokens would halve or quarter that work per token and the number of
links in the chain. The exact path must keep 16 (FlashKDA's bits); the automatic path must
only stay within 1.1x the exact path's error. This study emulates, in fp32 on the CPU, the
forward with C-token chunks and the precisions a kernel would keep (bf16 operands and state,
fp32 accumulation), and prints the relative Frobenius errors of out and final_state against
reference.gold (fp64), with the exact ledger's (reference.fwd) beside them:

    PYTHONPATH=python python benchmarks/chunk_size_study.py [--seqlen 2048] [--heads 2]

Chunks longer than 16 cannot take the ledger's Ki = k 2^-G (over 32 tokens G reaches about
-230, past fp32's range), so the decayed scores q_i k_j 2^(G_i - G_j) of rows in different
16-row blocks are formed against the end of the earlier block, every factor at most 1 (the
sub-chunk form of fla's chunk_kda); within 16 rows, L, Mqk and the inverse are the ledger's
(fp16 L and Neumann product), and the inverse's other blocks come by forward substitution.
An emulation of that design in plain fp32 arithmetic, for any multiple of 16 rows;
tests/chunk_model.py is its ledger-level model at 16 and 32 rows (the oracle for
a kernel), whose accuracy tests/test_chunk_model.py checks.
"""

import argparse

import torch
from flash_kda import _numerics, reference
from flash_kda._numerics import LOG2E
from flash_kda._numerics import bf as _bf

SUB = 16  # rows of a score block


def bf(x):
    """x rounded to bf16 (RNE), kept in fp32."""
    return _bf(x).float()


def hf(x):
    """x rounded to fp16 (RNE), kept in fp32."""
    return x.to(torch.float16).float()


def decayed_scores(x, y, G, scale=None):
    """[.., C, C]: sum_k x[i, k] y[j, k] 2^(G[i, k] - G[j, k]) for i >= j, 0 above, from bf16
    operands: block (I, J) is formed against the first row of J where I = J (the ledger's
    Kd Ki^T within 16 rows) and against the last row of J where I > J (every factor <= 1);
    ``scale`` multiplies x's rounded rows and is rounded again (the ledger's Qd)."""
    C = x.shape[-2]
    out = torch.zeros(*x.shape[:-1], C, dtype=torch.float32)
    for J in range(0, C, SUB):
        for I in range(J, C, SUB):
            ref = G[..., J : J + 1, :] if I == J else G[..., J + SUB - 1 : J + SUB, :]
            xi = bf(x[..., I : I + SUB, :] * bf(torch.exp2(G[..., I : I + SUB, :] - ref)))
            if scale is not None:
                xi = bf(xi * scale)
            yj = bf(y[..., J : J + SUB, :] * bf(torch.exp2(ref - G[..., J : J + SUB, :])))
            out[..., I : I + SUB, J : J + SUB] = xi @ yj.transpose(-1, -2)
    return out


def block_inverse(L):
    """bf((I + L)^-1) of a strictly lower [.., C, C] L (fp16 values) by 16-row blocks: the
    diagonal blocks by the ledger's fp16 Neumann product (reference.neumann_inverse), the
    others by forward substitution, INV_IJ = bf(-INV_II bf(sum_K L_IK INV_KJ)) with fp32
    sums: what a K1 for C-token records would compute."""
    m = L.shape[-1] // SUB
    ops = _numerics.Ops(torch.device("cpu"))
    inv = torch.zeros_like(L)

    def blk(x, i, j):
        return x[..., i * SUB : (i + 1) * SUB, j * SUB : (j + 1) * SUB]

    for i in range(m):
        blk(inv, i, i)[...] = reference.neumann_inverse(ops, blk(L, i, i).to(torch.float16)).float()
        for j in range(i - 1, -1, -1):
            acc = sum(blk(L, i, k) @ blk(inv, k, j) for k in range(j, i))
            blk(inv, i, j)[...] = bf(-(blk(inv, i, i) @ bf(acc)))
    return inv


def emulate(p, C):
    """(out [B, T, H, 128], final state [B, H, 128 (v), 128 (k)]) with C-token chunks;
    batched problems whose length is a multiple of C."""
    q, k, v, g, beta = (p[n].float() for n in ("q", "k", "v", "g", "beta"))
    B, T, H, D = q.shape
    n = T // C

    def unit(x):
        return bf(x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6))

    def chunks(x):  # [B, T, H, ...] -> [B, H, n, C, ...]
        return x.reshape(B, n, C, H, *x.shape[3:]).permute(0, 3, 1, 2, *range(4, x.dim() + 1))

    a = torch.exp2(p["A_log"].float() * LOG2E).reshape(1, 1, H, 1)
    gamma = p["lower_bound"] * LOG2E * torch.sigmoid((g + p["dt_bias"].float().reshape(1, 1, H, D)) * a)
    G = torch.cumsum(chunks(gamma), dim=-2)  # log2 decay from the chunk's start, fp32
    qh, kh, V, b = chunks(unit(q)), chunks(unit(k)), chunks(v), chunks(torch.sigmoid(beta))
    sb = bf(torch.tensor(p["scale"], dtype=torch.float32))
    Kd, Qd = bf(kh * bf(torch.exp2(G))), bf(bf(qh * bf(torch.exp2(G))) * sb)
    Kr = bf(kh * bf(torch.exp2(G[..., -1:, :] - G)))
    e = torch.exp2(G[..., -1, :])
    L = torch.tril(hf(hf(decayed_scores(kh, kh, G)) * hf(b)[..., :, None]), diagonal=-1)  # the ledger's L
    INV = block_inverse(L)
    Mqk = bf(torch.tril(decayed_scores(qh, kh, G, scale=sb)))
    S = torch.zeros(B, H, D, D) if p["initial_state"] is None else bf(p["initial_state"].float())
    out = torch.empty(B, H, n, C, D)
    for c in range(n):
        Pk, Pq = bf(Kd[:, :, c] @ S.transpose(-1, -2)), bf(Qd[:, :, c] @ S.transpose(-1, -2))
        u = bf(bf(V[:, :, c] - Pk) * b[:, :, c, :, None])
        U = bf(INV[:, :, c] @ u)
        out[:, :, c] = bf(Pq + bf(Mqk[:, :, c] @ U))
        S = bf(S * e[:, :, c, None, :] + (Kr[:, :, c].transpose(-1, -2) @ U).transpose(-1, -2))
    return out.permute(0, 2, 3, 1, 4).reshape(B, T, H, D), S


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--chunks", default="16,32,64")
    args = parser.parse_args()
    for memory in ("short", "long"):
        for initial in (None, torch.float32):
            p = reference.random_problem(1, args.seqlen, args.heads, initial=initial, final=torch.float32, seed=3)
            if memory == "long":  # the accuracy tests' long memory: ~100 chunks remembered
                p["g"] = (p["g"].float() - 6.0).to(torch.bfloat16)
            gold_out, gold_state = reference.gold(*[p[name] for name in reference.GOLD_ARGS])
            exact = dict(p, out=torch.empty_like(p["v"]), final_state=torch.empty_like(p["final_state"]))
            reference.fwd(*[exact[name] for name in reference.FWD_ARGS])
            cells = [
                f"ledger C=16 {reference.rel_err(exact['out'], gold_out):.5f} / "
                f"{reference.rel_err(exact['final_state'], gold_state):.5f}"
            ]
            for C in (int(c) for c in args.chunks.split(",")):
                out, S = emulate(p, C)
                cells.append(f"C={C} {reference.rel_err(out, gold_out):.5f} / {reference.rel_err(S, gold_state):.5f}")
            state = "initial fp32" if initial is not None else "no initial"
            print(f"T={args.seqlen} H={args.heads} {memory} memory, {state}: out / state errors: " + ", ".join(cells))


if __name__ == "__main__":
    main()
