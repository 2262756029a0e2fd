# SPDX-License-Identifier: MIT
"""Shared fixtures and helpers: GPU skipping, random problems, the bitwise comparison."""

import collections

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

# The seven state variants of design §1.4: (initial dtype, final dtype).
STATE_VARIANTS = [
    (None, None),
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float32),
    (None, torch.bfloat16),
    (None, torch.float32),
    (torch.bfloat16, None),
    (torch.float32, None),
]


# The accuracy contract of paths that are not bit-exact (design section 3.6): relative
# Frobenius error of out and final state against the fp64 gold, and at most RATIO times the
# exact path's error on the same inputs (issue 7, acceptance 2).
OUT_TOLERANCE, STATE_TOLERANCE = 0.0065, 0.006
RATIO = 1.1


def state_id(variant) -> str:
    names = {None: "none", torch.bfloat16: "bf16", torch.float32: "fp32"}
    return f"{names[variant[0]]}in-{names[variant[1]]}out"


def pytest_configure(config):
    """FLASH_KDA_TEST_MODE (flash_kda.testing.TEST_MODES: generic, sm120, sm100) runs every
    native call of the suite with the other arches' code paths on this GPU, and
    FLASH_KDA_TEST_WAIT_LIMIT_S shortens the bounded waits; the report's header names both."""
    if TEST_MODE not in testing.TEST_MODES:
        raise pytest.UsageError(
            f"FLASH_KDA_TEST_MODE must be one of {', '.join(testing.TEST_MODES)}, got {TEST_MODE!r}"
        )
    switches = testing.mode_overrides(TEST_MODE) if testing.native_library() is not None else {}
    if WAIT_LIMIT_S and testing.native_library() is not None:
        switches["wait_limit_ns"] = int(float(WAIT_LIMIT_S) * 1e9)
    if switches:
        testing.set_overrides(**switches)


def pytest_report_header(config):
    return f"flash_kda test mode: {TEST_MODE} {testing.get_overrides() or ''}"


def k1_fit(facts: dict, block_v: int, blocks: int = 1, unbounded: bool = False) -> int:
    """K1 CTAs of `blocks` 16-token blocks that fit beside one CTA of the whole pass at block_v
    on the device of `facts` (testing.device_facts or reference_device): FlashKDA's K1, or the
    unbounded gates'."""
    return facts["k1_beside_unbounded" if unbounded else "k1_beside"][blocks - 1][(32, 64, 128).index(block_v)]


def k1_fits_beside(block_v: int, blocks: int = 1) -> bool:
    """Whether a K1 CTA fits beside one CTA of the whole pass at block_v on this GPU (in the
    test mode): where none does, forced overlap has K1 leave the pass's SMs, or run first."""
    return k1_fit(testing.device_facts(**testing.get_overrides()), block_v, blocks) > 0


def warpgroup_passes_run() -> bool:
    """Whether calls on this GPU may run sm_90a's warpgroup passes: an sm_90a GPU outside
    the generic test modes."""
    return (
        HAS_CUDA and torch.cuda.get_device_capability() == (9, 0) and not testing.get_overrides().get("generic_passes")
    )


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


import os  # noqa: E402

from flash_kda import testing  # noqa: E402

TEST_MODE = os.environ.get("FLASH_KDA_TEST_MODE", "default")
# FLASH_KDA_TEST_WAIT_LIMIT_S: the native producers' bounded waits trap after this many seconds
# (testing's wait_limit_ns; the library's default is 60 s), so that a hang ends a GPU run soon.
WAIT_LIMIT_S = os.environ.get("FLASH_KDA_TEST_WAIT_LIMIT_S")
from flash_kda.reference import FWD_ARGS, FWD_KEYWORDS, GOLD_ARGS, rel_err  # noqa: E402, F401 (re-exported)
from flash_kda.reference import random_problem as make_problem  # noqa: E402 (re-exported)


@pytest.fixture(autouse=True)
def one_gpu_memory_test_at_a_time(request):
    """Tests marked gpu_memory (fp64 golds of tens of GiB) take an exclusive lock on a file of
    this pytest-xdist run, so that they run one at a time while the workers' other tests run
    beside them (eight such tests at once exhaust an H200's 140 GiB), and hand their cached
    blocks back to the driver before the next one starts."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None or request.node.get_closest_marker("gpu_memory") is None:
        yield
        return
    import fcntl
    import gc
    import tempfile

    with open(os.path.join(tempfile.gettempdir(), f"flash-kda-gpu-memory-{run}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            gc.collect()
            if HAS_CUDA:
                torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def native_gpu():
    """For GPU modules (``pytest.mark.usefixtures("native_gpu")``): skips them where the
    native path does not run (no table for the GPU's arch, FLA_FLASH_KDA=0, no library);
    where it runs, the reference and the chunk model must use the library's probes."""
    from flash_kda import dispatch

    if dispatch.backend_for("cuda") != "native":
        pytest.skip(f"no native path here: {dispatch.explain('cuda')[1]}")
    assert testing.Ops(torch.device("cuda")).exact_instructions, "the reference must run the probes"


def call(fn, p, **overrides):
    """fn(*the positional fwd arguments of problem p, **its keyword ones), with overrides."""
    q = dict(p, **overrides)
    return fn(*[q[name] for name in FWD_ARGS], **{name: q[name] for name in FWD_KEYWORDS if name in q})


def check(p, **overrides) -> testing.FwdCall:
    """The validated call of problem p (with overrides)."""
    return call(testing.validated, p, **overrides)


def gold_of(p):
    """reference.gold on problem p: (out, final_state) in fp64."""
    from flash_kda import reference

    return reference.gold(*[p[name] for name in GOLD_ARGS])


def clone_outputs(p):
    """A copy of p whose out / final_state are fresh NaN-filled tensors."""
    q = dict(p)
    q["out"] = torch.full_like(p["out"], float("nan"))
    if p["final_state"] is not None:
        q["final_state"] = torch.full_like(p["final_state"], float("nan"))
    return q


def assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """The same bits (so NaN matches NaN) or torch.equal values, else fail naming the first
    differing index, the number of mismatches and the largest gap in units in the last place."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (
        f"{what}: {actual.dtype}{list(actual.shape)} vs {expected.dtype}{list(expected.shape)}"
    )
    int_type = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[actual.dtype]
    a = actual.contiguous().view(int_type).long()
    e = expected.contiguous().view(int_type).long()
    if torch.equal(a, e) or torch.equal(actual, expected):
        return  # the same bits (NaN included), or equal values (signed zeros compare equal)
    sign = 1 << (15 if int_type == torch.int16 else 31)

    def order(x):  # sign-magnitude bits -> integers ordered like the floats
        x = x & (2 * sign - 1)
        return torch.where(x & sign != 0, -(x & (sign - 1)), x & (sign - 1))

    diff = a != e
    gap = (order(a) - order(e)).abs()[diff].max().item()
    first = tuple(diff.nonzero()[0].tolist())
    raise AssertionError(
        f"{what}: {int(diff.sum())} of {actual.numel()} elements differ; first at {first}: "
        f"{actual[first].item()!r} vs {expected[first].item()!r}; max gap {gap} ulp"
    )


# ------------------------------------------------------------------ serving problems

NAN = float("nan")


def kernels_of(fn):
    """The CUDA kernels fn launches (torch profiler): name -> number of launches."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return collections.Counter(e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def nan_like(x):
    return torch.full_like(x, NAN)


def pooled_problem(batch, seqlen, heads, slots, pool_size, *, lens=None, has_initial=None, dtype=torch.float32,
                   index_dtype=torch.int64, in_place=False, device="cpu", seed=0):  # fmt: skip
    """A problem whose states are pools [P, H, 128, 128] addressed by ``ssm_state_indices``
    = ``slots`` (negative: padding); final_state is the initial pool itself when
    ``in_place``, else a NaN-filled pool."""
    p = make_problem(batch, seqlen, heads, lens=lens, device=device, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    p["initial_state"] = (0.1 * torch.randn(pool_size, heads, 128, 128, generator=gen)).to(device, dtype)
    p["final_state"] = p["initial_state"] if in_place else nan_like(p["initial_state"])
    p["ssm_state_indices"] = torch.tensor(slots, dtype=index_dtype, device=device)
    if has_initial is not None:
        p["has_initial_state"] = torch.tensor(has_initial, dtype=torch.bool, device=device)
    return p


def gather_compute_scatter(run, p):
    """What a pooled problem p must produce: each sequence's start state gathered from its
    slot (zero for padding or has_initial_state False), one contiguous call ``run(plain)``
    of the plain problem, its final states scattered to the slots. Call it before the
    pooled call (which may update the pool in place). Returns (out, final pool)."""
    slots = p["ssm_state_indices"].tolist()
    has = p["has_initial_state"].tolist() if p.get("has_initial_state") is not None else [True] * len(slots)
    pool = p["initial_state"]
    start = torch.zeros((len(slots), *pool.shape[1:]), dtype=pool.dtype, device=pool.device)
    for i, slot in enumerate(slots):
        if slot >= 0 and has[i]:
            start[i] = pool[slot]
    plain = {name: p[name] for name in FWD_ARGS}
    plain.update(initial_state=start, final_state=nan_like(start), out=nan_like(p["out"]))
    run(plain)
    expected = p["final_state"].clone()
    for i, slot in enumerate(slots):
        if slot >= 0:
            expected[slot] = plain["final_state"][i]
    return plain["out"], expected


def sequence_spans(p):
    """(first token, length) of each sequence of problem p in the flattened tokens."""
    B, T = p["q"].shape[:2]
    if p["cu_seqlens"] is None:
        return [(b * T, T) for b in range(B)]
    bounds = p["cu_seqlens"].tolist()
    return [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(len(bounds) - 1)]


def prefix_final_states(run, p, every, dtype):
    """[S, H, 128, 128] in ``dtype``: the final state of each sequence's first
    (m + 1) * every tokens, run alone as a batched call ``run(sub)``, in checkpoint slot order."""
    H = p["q"].shape[2]
    states = []
    for i, (bos, length) in enumerate(sequence_spans(p)):
        for m in range(length // every):
            t = (m + 1) * every
            sub = {name: p[name] for name in FWD_ARGS}
            for name in ("q", "k", "v", "g", "beta"):
                sub[name] = p[name].reshape(-1, *p[name].shape[2:])[bos : bos + t].unsqueeze(0).clone()
            sub["out"] = nan_like(sub["q"])
            sub["cu_seqlens"] = None
            if p["initial_state"] is not None:
                sub["initial_state"] = p["initial_state"][i : i + 1].clone()
            sub["final_state"] = torch.full((1, H, 128, 128), NAN, dtype=dtype, device=p["q"].device)
            run(sub)
            states.append(sub["final_state"][0])
    return torch.stack(states) if states else torch.empty(0, H, 128, 128, dtype=dtype, device=p["q"].device)


def fused_projection_views(p, out_row=192):
    """p with q, k, v as [B, T, H, 128] slices of one fused projection [B, T, 3 * H * 128],
    g with heads 136 elements apart, beta a transposed view and out rows of a wider,
    NaN-padded buffer (returned as ``out_buffer`` to check the padding stays untouched)."""
    B, T, H, D = p["q"].shape
    fused = torch.cat([p[n].reshape(B, T, H * D) for n in ("q", "k", "v")], dim=-1)
    views = {n: fused[..., i * H * D : (i + 1) * H * D].unflatten(-1, (H, D)) for i, n in enumerate("qkv")}
    g_buffer = torch.zeros(B, T, H, 136, dtype=p["g"].dtype, device=p["g"].device)
    g_buffer[..., :D] = p["g"]
    views["g"] = g_buffer[..., :D]
    views["beta"] = p["beta"].transpose(1, 2).contiguous().transpose(1, 2)
    out_buffer = torch.full((B, T, H, out_row), NAN, dtype=p["out"].dtype, device=p["out"].device)
    views["out"] = out_buffer[..., :D]
    return dict(p, **views), out_buffer


# ------------------------------------------------------------------ gate and beta forms

GATE_KEYWORDS = ("gate", "beta_is_logit")  # the forms of a problem (design sections 2.2, 2.5)


def forms(p) -> dict:
    """The gate and beta keywords of problem p (its defaults when it has none)."""
    return {name: p[name] for name in GATE_KEYWORDS if name in p}


def kimi_gates(heads, seqlen, batch=1, seed=0):
    """Kimi-Linear-like gate inputs: A_log = log U(1, 16) [H], dt_bias ~ N(0, 1) [H, 128],
    g ~ N(0, 1) bf16 [B, T, H, 128]."""
    gen = torch.Generator().manual_seed(seed + 7)
    A_log = torch.log(1 + 15 * torch.rand(heads, generator=gen))
    dt_bias = torch.randn(heads, 128, generator=gen)
    g = torch.randn(batch, seqlen, heads, 128, generator=gen).bfloat16()
    return g, A_log, dt_bias


def softplus_log_decay(g, A_log, dt_bias) -> torch.Tensor:
    """The softplus gate's natural-log decay -exp(A_log) softplus(g + dt_bias) in fp32, as an
    engine computes it before a pre-activated call (fp64 math, rounded once)."""
    x = g.double() + dt_bias.double().reshape(1, 1, *dt_bias.shape)
    return (-torch.exp(A_log.double()).reshape(1, 1, -1, 1) * torch.nn.functional.softplus(x)).float()


def with_forms(p, gate, *, beta_is_logit=True, beta_dtype=torch.bfloat16, seed=0):
    """Problem p (from make_problem) with Kimi-Linear-like gates in form `gate`: 'lower_bound'
    (lower_bound -5 on those inputs), 'softplus', or 'log_decay' (their softplus gate in fp32,
    passed as g; A_log, dt_bias and lower_bound None); with beta_is_logit False, beta is
    sigmoid(beta) in beta_dtype, else beta in beta_dtype."""
    B, T, H, _ = p["q"].shape
    device = p["q"].device
    g, A_log, dt_bias = kimi_gates(H, T, B, seed)
    q = dict(p, gate=gate, beta_is_logit=beta_is_logit)
    q.update(g=g.to(device), A_log=A_log.to(device), dt_bias=dt_bias.to(device), lower_bound=-5.0)
    if gate == "softplus":
        q["lower_bound"] = None
    if gate == "log_decay":
        q.update(g=softplus_log_decay(g, A_log, dt_bias).to(device), A_log=None, dt_bias=None, lower_bound=None)
    beta = p["beta"].float()
    q["beta"] = (beta if beta_is_logit else torch.sigmoid(beta.double()).float()).to(beta_dtype)
    return q


def degenerate_problem(kind, gate, beta, *, batch=1, seqlen=256, heads=2, device="cpu", seed=0):
    """Keys that break the fp16 Neumann inverse (issue 37): `kind` 'repeated' (one key per
    head), 'alternating' (one key, alternating sign) or 'few' (three directions), gates that
    do not decay (each form's gamma 0 or as near as its formula allows) and beta logits
    `beta` for every token (20: saturated). States in and out, fp32."""
    p = make_problem(batch, seqlen, heads, initial=torch.float32, final=torch.float32, device=device, seed=seed)
    gen = torch.Generator().manual_seed(seed + 11)
    k0 = torch.randn(1, 1, heads, 128, generator=gen)
    if kind == "repeated":
        k = k0.expand(batch, seqlen, heads, 128)
    elif kind == "alternating":
        k = k0 * ((-1.0) ** torch.arange(seqlen).float()).reshape(1, -1, 1, 1).expand(batch, seqlen, 1, 1)
    else:
        d = torch.randn(3, heads, 128, generator=gen)
        k = d[torch.randint(0, 3, (batch, seqlen), generator=gen)]
    p = dict(p, k=k.to(torch.bfloat16).contiguous().to(device), gate=gate, beta_is_logit=True)
    p["beta"] = torch.full_like(p["beta"], beta)
    if gate == "lower_bound":  # sigmoid(exp(A_log) (g + dt)) ~ e^-20: gamma ~ -5e-9
        p["g"] = torch.full_like(p["g"], -20.0)
    elif gate == "softplus":  # softplus(-30 + dt) ~ e^-29
        p.update(g=torch.full_like(p["g"], -30.0), lower_bound=None)
    else:
        p.update(g=torch.zeros_like(p["g"]), A_log=None, dt_bias=None, lower_bound=None)
    return p


def chunk_l(call, ops) -> torch.Tensor:
    """The fp16 L (design §3.2 step 8) of every chunk of a validated call (16-token chunks), as
    the reference forms it for the call's gate and beta forms (with `ops`: exact math or the
    GPU's probes)."""
    from flash_kda import reference

    chunks = reference.chunk_table(call.batch, call.seqlen, call.seq_bounds, call.q.device)
    q_hat = reference.l2_normalize(ops, reference.gather_chunks(call.q, chunks))
    k_hat = reference.l2_normalize(ops, reference.gather_chunks(call.k, chunks))
    g = reference.gather_chunks(call.g, chunks)
    if call.gate == "lower_bound":
        G = reference.gate_cumsum(ops, g, chunks.valid, call.A_log, call.dt_bias, call.lower_bound)
        operands = reference.apply_decays(ops, q_hat, k_hat, G, call.scale)[1:4]
    else:
        gamma = reference.unbounded_gamma(ops, g, chunks.valid, call.A_log, call.dt_bias, call.gate)
        operands = reference.unbounded_decays(ops, q_hat, k_hat, gamma, call.scale)[4:]
    b = reference.write_strength(ops, reference.gather_chunks(call.beta, chunks), call.beta_is_logit)
    return reference.chunk_scores(ops, *operands, b)[0]


def unsound_chunks(call, ops) -> int:
    """How many (chunk, head) inverses of a call the stable inverse recomputes (design section
    2.6)."""
    from flash_kda import reference

    L = chunk_l(call, ops)
    return int((~reference.within_tolerance(reference.residual(ops, L, reference.neumann_product(ops, L)))).sum())
