# SPDX-License-Identifier: MIT
"""The ledger reference (flash_kda.reference) and its primitives (flash_kda._numerics),
against exact arithmetic and the fp64 gold, on the CPU."""

from fractions import Fraction

import pytest
import torch
from conftest import STATE_VARIANTS, call, gold_of, make_problem, rel_err, state_id
from flash_kda import _numerics as nm
from flash_kda import reference

# ------------------------------------------------------------------ primitives


def correctly_rounded_fp32(exact: Fraction) -> float:
    """Round-to-nearest-even of an exact rational to fp32, decided with exact arithmetic."""
    x = torch.tensor(float(exact), dtype=torch.float32)
    candidates = [torch.nextafter(x, torch.tensor(-float("inf"))), x, torch.nextafter(x, torch.tensor(float("inf")))]

    def key(c):
        return abs(Fraction(c.item()) - exact), int(c.view(torch.int32).item()) & 1

    return min(candidates, key=key).item()


def test_fma_rounds_once_where_fp64_double_rounding_fails():
    # 3 * (1 + 2^-23) is exactly an fp32 midpoint; a tiny c decides the direction. fp64
    # rounding of the sum loses c and the fp32 tie then goes to even: the wrong side.
    a, b = torch.tensor([3.0]), torch.tensor([1 + 2.0**-23])
    for c in (2.0**-100, -(2.0**-100)):
        exact = Fraction(3) * Fraction(1 + 2.0**-23) + Fraction(c)
        got = nm._fma_exact(a, b, torch.tensor([c])).item()
        assert got == correctly_rounded_fp32(exact), c


def test_fma_matches_exact_rounding_on_random_triples():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2000, generator=gen) * torch.exp2(torch.randint(-20, 20, (2000,), generator=gen).float())
    b = torch.randn(2000, generator=gen)
    c = torch.randn(2000, generator=gen) * torch.exp2(torch.randint(-30, 10, (2000,), generator=gen).float())
    got = nm._fma_exact(a, b, c)
    for i in range(0, 2000, 7):
        exact = Fraction(a[i].item()) * Fraction(b[i].item()) + Fraction(c[i].item())
        assert got[i].item() == correctly_rounded_fp32(exact), i


def test_ftz_flushes_subnormal_inputs_and_results():
    sub = torch.tensor([2.0**-130, -(2.0**-127)])
    assert torch.equal(nm.ftz(sub), torch.zeros(2))
    assert nm.add_ftz(sub, torch.zeros(2)).abs().max().item() == 0.0
    # 2^-70 * 2^-60 = 2^-130 is subnormal: flushed; a normal product is not
    assert nm.mul_ftz(torch.tensor([2.0**-70]), torch.tensor([2.0**-60])).item() == 0.0
    assert nm.mul_ftz(torch.tensor([2.0**-60]), torch.tensor([2.0**-60])).item() == 2.0**-120


def test_exact_ops_on_cpu():
    ops = nm.Ops(torch.device("cpu"))
    assert not ops.exact_instructions
    x = torch.linspace(-8, 8, 101)
    assert torch.allclose(ops.ex2(x), torch.exp2(x), rtol=1e-6)
    assert torch.allclose(ops.sigmoid(x), torch.sigmoid(x), rtol=1e-6)
    assert torch.allclose(ops.rsqrt(x.abs() + 1), torch.rsqrt(x.abs() + 1), rtol=1e-6)
    a = torch.randn(3, 16, 32).bfloat16()
    b = torch.randn(3, 8, 32).bfloat16()
    assert torch.allclose(ops.mma32(a, b), a.float() @ b.float().transpose(-1, -2), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ ledger steps


def test_l2_normalize_follows_the_segment_tree():
    """x_hat = bf(x * RSQ(T + 1e-6)) with T summed as design §3.2 step 2's 16 x 8 tree (checked here in
    plain fp32 Python arithmetic, element by element)."""
    x = (torch.randn(3, 128) * 3).bfloat16()
    got = reference.l2_normalize(nm.Ops(torch.device("cpu")), x)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    for row in range(3):
        xs = x[row].float()
        p = [f32(0.0)] * 16
        for j in range(16):
            for e in range(8):
                p[j] = nm._fma_exact(xs[8 * j + e : 8 * j + e + 1], xs[8 * j + e : 8 * j + e + 1], p[j].reshape(1))[0]
        for off in (8, 4, 2, 1):
            p = [p[j] + p[j ^ off] for j in range(16)]
        r = torch.rsqrt((p[0] + f32(1e-6)).double()).float()
        assert torch.equal(got[row], (xs * r).bfloat16()), row


def test_chunk_table_splits_sequences_independently():
    chunks = reference.chunk_table(1, 60, [0, 17, 17, 18, 60], "cpu")
    assert chunks.tok0.tolist() == [0, 16, 17, 18, 34, 50]
    assert chunks.valid.sum(1).tolist() == [16, 1, 1, 16, 16, 10]
    assert chunks.seq_chunks == [[0, 1], [], [2], [3, 4, 5]]


def test_neumann_inverse_inverts_unit_lower_triangular():
    gen = torch.Generator().manual_seed(1)
    L = (0.3 * torch.randn(5, 16, 16, generator=gen)).tril(-1).half()
    inv = reference.neumann_inverse(nm.Ops(torch.device("cpu")), L).double()
    eye = torch.eye(16, dtype=torch.float64)
    assert (inv @ (eye + L.double()) - eye).abs().max().item() < 2e-2


# ------------------------------------------------------------------ whole forward vs gold

BATCHED = [(b, t, h) for b, t, h in [(1, 1, 1), (2, 15, 2), (1, 16, 1), (2, 17, 3), (1, 50, 2)]]


@pytest.mark.parametrize("batch,seqlen,heads", BATCHED, ids=[f"B{b}-T{t}-H{h}" for b, t, h in BATCHED])
@pytest.mark.parametrize("variant", STATE_VARIANTS, ids=[state_id(v) for v in STATE_VARIANTS])
def test_reference_matches_gold_batched(batch, seqlen, heads, variant):
    p = make_problem(batch, seqlen, heads, initial=variant[0], final=variant[1], seed=batch * seqlen + heads)
    call(reference.fwd, p)
    gold_out, gold_state = gold_of(p)
    assert rel_err(p["out"], gold_out) < 1e-2
    if variant[1] is not None:
        assert p["final_state"].dtype == variant[1]
        assert rel_err(p["final_state"], gold_state) < 1e-2


@pytest.mark.parametrize("lens", [[1], [0, 5], [33, 0, 1, 16], [1, 1, 1]], ids=lambda l: "lens" + "-".join(map(str, l)))
@pytest.mark.parametrize("variant", STATE_VARIANTS, ids=[state_id(v) for v in STATE_VARIANTS])
def test_reference_matches_gold_varlen(lens, variant):
    p = make_problem(1, 0, 2, lens=lens, initial=variant[0], final=variant[1], seed=len(lens))
    call(reference.fwd, p)
    gold_out, gold_state = gold_of(p)
    if p["out"].numel():
        assert rel_err(p["out"], gold_out) < 1e-2
    if variant[1] is not None:
        # an empty sequence's final state is its initial state, rounded to bf16
        for i, n in enumerate(lens):
            if n == 0 and variant[0] is not None:
                assert torch.equal(p["final_state"][i], p["initial_state"][i].bfloat16().to(variant[1]))
        assert rel_err(p["final_state"], gold_state) < 1e-2


def test_reference_leaves_inputs_and_uncovered_rows_alone():
    p = make_problem(1, 0, 1, lens=[20, 9], initial=torch.bfloat16, final=torch.bfloat16)
    p["q"] = torch.cat([p["q"], torch.randn(1, 5, 1, 128).bfloat16()], 1)
    for name in ("k", "v", "g"):
        p[name] = torch.cat([p[name], torch.randn(1, 5, 1, 128).bfloat16()], 1)
    p["beta"] = torch.cat([p["beta"], torch.randn(1, 5, 1).bfloat16()], 1)
    p["out"] = torch.full_like(p["q"], float("nan"))
    before = {n: p[n].clone() for n in ("q", "k", "v", "g", "beta", "initial_state")}
    call(reference.fwd, p)
    for n, t in before.items():
        assert torch.equal(p[n], t), f"{n} was modified"
    assert torch.isnan(p["out"][0, 29:]).all() and not torch.isnan(p["out"][0, :29]).any()
