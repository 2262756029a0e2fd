# SPDX-License-Identifier: MIT
"""The fp64 gold of long sequences: the exact chunk recurrence of design section 2.4 in
fp64 with chunks of 64 tokens, so that 1M-token sequences take seconds, not the minutes
of reference.gold's token-by-token loop. Same math, same arguments and results as
reference.gold (tests/test_reference.py checks that the two agree to fp64 rounding).

Per chunk, with the natural-log decays G = cumsum(log alpha) <= 0 (|G| <= 5 * 64, so
exp(+-G) stays far inside fp64's range):
    Kd = k exp(G), Ki = k exp(-G), Qd = scale q exp(G), Kr = k exp(G_last - G)
    A  = strictly lower part of diag(beta) Kd Ki^T
    U  = (I + A)^-1 diag(beta) (V - Kd S)
    O  = Qd S + (lower part with diagonal of Qd Ki^T) U
    S' = diag(exp(G_last)) S + Kr^T U                 (S is K-first: [k][v])
The unbounded gates (design section 2.5; decays down to -inf) take the pairwise decays
exp(G_i - G_j), i >= j, of G summed from decays clamped at -1000 (exp(-1000) is 0 in fp64
too), instead of the split into exp(G) and exp(-G).
"""

import torch
from flash_kda import reference

CHUNK = 64
D = 128


def _unit(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _take(x: torch.Tensor, tok: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Rows tok [s, C] of x [BT, H, ...] as float64 [s, H, C, ...], invalid rows zero."""
    y = x[tok.reshape(-1)].reshape(*tok.shape, *x.shape[1:]).double()
    mask = valid.reshape(*valid.shape, *([1] * (y.dim() - 2)))
    return torch.where(mask, y, torch.zeros((), dtype=y.dtype, device=y.device)).transpose(1, 2)


def gold_chunked(q, k, v, g, beta, scale, A_log, dt_bias, lower_bound, initial_state=None, cu_seqlens=None, *,
                 gate="lower_bound", beta_is_logit=True):  # fmt: skip
    """(out [B, T, H, 128], final_state [N, H, 128 (V), 128 (K)]), both float64; ``gate`` and
    ``beta_is_logit`` as reference.gold."""
    unbounded = gate != "lower_bound"
    B, T, H, _ = q.shape
    f64, dev = torch.float64, q.device
    bounds = [i * T for i in range(B + 1)] if cu_seqlens is None else [int(x) for x in cu_seqlens.tolist()]
    N = len(bounds) - 1
    if not unbounded:
        a = torch.exp(A_log.double()).reshape(1, H, 1)
        dt = dt_bias.double().reshape(1, H, D)
    else:  # the natural-log decay of every token, [B * T, H, D]
        decays = reference.gate_gold(g, A_log, dt_bias, lower_bound, gate).clamp(min=-1000.0)
    S = torch.zeros(N, H, D, D, dtype=f64, device=dev)
    if initial_state is not None:
        S = initial_state.double().transpose(-1, -2).clone()  # K-first
    out = torch.zeros(B * T, H, D, dtype=f64, device=dev)
    qf, kf, vf, gf = (x.reshape(B * T, H, D) for x in (q, k, v, g))
    bf = beta.reshape(B * T, H)
    lengths = [bounds[i + 1] - bounds[i] for i in range(N)]
    tri = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=dev)
    strict, inclusive = torch.tril(tri, -1), torch.tril(tri)
    eye = torch.eye(CHUNK, dtype=f64, device=dev)
    with torch.no_grad():
        for start in range(0, max(lengths, default=0), CHUNK):
            seqs = [i for i in range(N) if lengths[i] > start]
            rows = torch.arange(CHUNK, device=dev)
            n = torch.tensor([min(CHUNK, lengths[i] - start) for i in seqs], device=dev)
            valid = rows[None, :] < n[:, None]  # [s, C]
            tok = torch.tensor([bounds[i] + start for i in seqs], device=dev)[:, None] + rows[None, :]
            tok = torch.where(valid, tok, torch.zeros_like(tok))

            qn, kn, vv = (_take(x, tok, valid) for x in (qf, kf, vf))
            qn, kn = _unit(qn), _unit(kn)
            kn = kn * valid[:, None, :, None]
            if unbounded:
                logd = _take(decays, tok, valid)
            else:
                logd = lower_bound * torch.sigmoid(a[..., None] * (_take(gf, tok, valid) + dt[:, :, None, :]))
            logd = logd * valid[:, None, :, None]
            b = _take(bf, tok, valid)
            b = torch.sigmoid(b) if beta_is_logit else torch.nan_to_num(b, nan=0.0).clamp(0.0, 1.0)
            b = b * valid[:, None, :]  # [s, H, C]
            G = torch.cumsum(logd, dim=2)
            Gl = G[:, :, -1:, :]
            Kd, Qd, Kr = kn * torch.exp(G), scale * qn * torch.exp(G), kn * torch.exp(Gl - G)
            zero = torch.zeros((), dtype=f64, device=dev)
            if unbounded:  # exp(G_i - G_j) for i >= j, never exp(-G)
                pair = torch.exp(torch.where(inclusive[..., None], G[:, :, :, None] - G[:, :, None], zero))
                kk = torch.einsum("shik,shjk,shijk->shij", kn, kn, pair)
                qk = torch.einsum("shik,shjk,shijk->shij", scale * qn, kn, pair)
            else:
                Ki = kn * torch.exp(-G)
                kk, qk = Kd @ Ki.transpose(-1, -2), Qd @ Ki.transpose(-1, -2)
            A = torch.where(strict, b[..., None] * kk, zero)
            sel = torch.tensor(seqs, device=dev)
            St = S[sel]
            rhs = b[..., None] * (vv - Kd @ St)
            U = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
            Mqk = torch.where(inclusive, qk, zero)
            O = Qd @ St + Mqk @ U  # [s, H, C, V]
            S[sel] = torch.exp(Gl).transpose(-1, -2) * St + Kr.transpose(-1, -2) @ U
            keep = valid.reshape(-1)
            out[tok.reshape(-1)[keep]] = O.transpose(1, 2).reshape(-1, H, D)[keep]
    return out.reshape(B, T, H, D), S.transpose(-1, -2).contiguous()
