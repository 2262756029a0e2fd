# SPDX-License-Identifier: MIT
"""The stable inverse's residuals on this GPU (design section 2.6): per input class, the
distribution over (chunk, head) of max |N3 + MMA16(L, N3) - I|, computed through the library's
probes as K1 computes it, and how many chunks exceed the tolerance (2^-8) and 2^-10. Healthy
inputs (random, long-memory, Kimi-Linear-like gates in every form) must stay far below the
tolerance, degenerate keys far above it. Run on a GPU from the repository root:

    python3 ci/gate_residuals.py
"""

import sys

import torch

sys.path.insert(0, "tests")
from conftest import FWD_ARGS, chunk_l, degenerate_problem, forms, make_problem, with_forms
from flash_kda import reference, testing
from flash_kda._numerics import Ops


def stats(ops, name, p):
    call = testing.validated(*[p[n] for n in FWD_ARGS], exact=False, **forms(p))
    L = chunk_l(call, ops)
    r = reference.residual(ops, L, reference.neumann_product(ops, L)).abs().amax((-1, -2)).flatten().double()
    r = torch.nan_to_num(r, nan=float("inf")).clamp(max=1e30)
    q = torch.quantile(r, torch.tensor([0.5, 0.99, 0.999, 1.0], dtype=torch.float64, device=r.device)).tolist()
    print(
        f"{name:32s} chunks {r.numel():6d} median {q[0]:.2e} p99 {q[1]:.2e} p999 {q[2]:.2e} max {q[3]:.2e} "
        f"above 2^-8: {int((r > reference.INVERSE_TOLERANCE).sum())}, above 2^-10: {int((r > 2**-10).sum())}",
        flush=True,
    )


def main():
    ops = Ops(torch.device("cuda"))
    if not ops.exact_instructions:
        sys.exit("the library has no probes for this GPU")
    for gate in reference.GATES:
        stats(ops, f"Kimi-like {gate}", with_forms(make_problem(1, 8192, 4, device="cuda", seed=1), gate))
    stats(ops, "random (lower bound -5)", make_problem(1, 8192, 4, device="cuda", seed=2))
    for shift, name in ((0.0, "long memory"), (3.0, "long memory, beta + 3")):
        p = make_problem(1, 8192, 4, device="cuda", seed=3)
        p.update(g=(p["g"].float() - 6).bfloat16(), beta=(p["beta"].float() + shift).bfloat16())
        stats(ops, name, p)
    for kind in ("repeated", "alternating", "few"):
        for beta in (20.0, 5.0, 3.0, 0.0):
            stats(ops, f"{kind}, beta {beta}", degenerate_problem(kind, "log_decay", beta, seqlen=512, device="cuda"))


if __name__ == "__main__":
    main()
