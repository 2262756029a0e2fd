# SPDX-License-Identifier: MIT
"""Time flash_kda's forward (automatic and exact paths) against the hardware floor, upstream
FlashKDA and fla's Triton chunk_kda on the same inputs.

    python benchmarks/bench_fwd.py --out benchmarks/results/h200.json --readme README.md \
        --pools --sustained 3 --plot --fla T8192-N1-H96 T8192-N1-H6
    python benchmarks/bench_fwd.py --out sweep.json --sweep T8192-N1-H6 ...   (cost-model data)

The JSON records the command, the library's commit, the date and the GPU; report.py renders
it as the markdown table beside it (h200.md) and, with --readme, the README's table.

Medians of ``triton.testing.do_bench`` (CUDA events, warm-up, L2 flushed between runs) of
eager calls, and of CUDA-graph replays of the same call (what a serving engine runs: no
Python in the timed region). bf16 state in and out. The floor column is the hardware
bound: the larger of 1,290 bytes per token per head at the measured copy bandwidth and
118 kFLOP per token per head at the measured bf16 matrix rate (design section 7). FlashKDA
is timed through its extension module ``flash_kda_C`` wherever that imports. fla
autotunes each new shape on its first call (minutes), so it is timed only for the shapes
named by ``--fla``. ``--sustained S`` adds, per row, the automatic path's graph replayed
back to back for S seconds (a busy server: no gaps, no L2 flush) with the SM clock and
board power sampled by nvidia-smi meanwhile: where a call draws the board's power limit,
the clock drops and sustained calls run slower than the do_bench median. Benchmarks never
assert correctness; the tests do.
"""

import argparse
import datetime
import importlib
import json
import os
import subprocess
import sys
import time

import torch
from report import write

BYTES_PER_TOKEN_HEAD = 1290
FLOPS_PER_TOKEN_HEAD = 118_000

# (id, lens of the sequences, heads): the table, then the plot's H sweeps.
TABLE = [
    ("T8192-N1-H96", [8192], 96),
    ("T8192-N1-H48", [8192], 48),
    ("T8192-N1-H24", [8192], 24),
    ("T8192-N1-H12", [8192], 12),
    ("T8192-N1-H6", [8192], 6),
    ("T32768-N1-H96", [32768], 96),
    ("T32768-N1-H6", [32768], 6),
    ("T131072-N1-H4", [131072], 4),
    ("T1048576-N1-H1", [1048576], 1),
    ("varlen6-H96", [1300, 547, 2048, 963, 271, 3063], 96),
    ("8x1024-H8", [1024] * 8, 8),
    ("64x512-H8", [512] * 64, 8),
]
PLOT_HEADS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96)
PLOT = [(f"T{T}-N1-H{h}", [T], h) for T in (8192, 32768) for h in PLOT_HEADS]
SHAPES = {s: (lens, h) for s, lens, h in TABLE + PLOT}
SWEEP_SEGMENTS = (0, 8, 16, 32, 64, 128, 256, 512, 1024)


def _copy_ms(do_bench, nbytes):
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    return do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")


def _matmul_ms(do_bench, n):
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    return do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")


def measure_ceilings(do_bench):
    """(copy bandwidth B/s counting reads + writes, bf16 matmul FLOP/s), measured here."""
    nbytes, n = 2 * 1024**3, 8192
    return 2 * nbytes / (_copy_ms(do_bench, nbytes) * 1e-3), 2 * n**3 / (_matmul_ms(do_bench, n) * 1e-3)


def make_inputs(lens, heads, seed=0, device="cuda"):
    """Random inputs on the GPU (reference.random_problem draws on the CPU, which takes
    minutes for the 1M-token rows); varlen when the lengths differ. ``device`` 'cpu' is for
    host-side timings (bench_host.py)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    T = sum(lens)
    batched = len(set(lens)) == 1
    B, Tb = (len(lens), lens[0]) if batched else (1, T)
    N = len(lens)
    bf16 = torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=bf16)

    p = dict(
        q=randn(B, Tb, heads, 128),
        k=randn(B, Tb, heads, 128),
        v=randn(B, Tb, heads, 128),
        g=randn(B, Tb, heads, 128),
        beta=randn(B, Tb, heads),
        A_log=torch.rand(heads, generator=gen, device=device),
        dt_bias=torch.rand(heads, 128, generator=gen, device=device),
        initial_state=0.1 * randn(N, heads, 128, 128),
        cu_seqlens=None,
    )
    if not batched:
        p["cu_seqlens"] = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=device)
    return p


GATES = ("lower_bound", "softplus", "log_decay", "log_decay_bf16")  # the forms with_gate makes


def with_gate(p, gate, seed=0):
    """Problem p with its gate in form `gate` (design sections 2.2, 2.5): 'lower_bound' keeps
    make_inputs' gate; 'softplus' takes Kimi-Linear-like inputs, A_log = log U(1, 16), dt_bias ~
    N(0, 1); 'log_decay' their softplus gate computed in fp32 and passed as g, 'log_decay_bf16'
    the same g rounded to bf16 (the bounded gate's bytes)."""
    if gate == "lower_bound":
        return p
    heads, device = p["q"].shape[2], p["q"].device
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    A_log = torch.log(1 + 15 * torch.rand(heads, generator=gen, device=device))
    dt_bias = torch.randn(heads, 128, generator=gen, device=device)
    q = dict(p, gate=gate, A_log=A_log, dt_bias=dt_bias)
    if gate in ("log_decay", "log_decay_bf16"):
        x = p["g"].float() + dt_bias
        g = -torch.exp(A_log)[:, None] * torch.nn.functional.softplus(x)
        g = g.to(torch.bfloat16) if gate == "log_decay_bf16" else g
        q.update(gate="log_decay", g=g, A_log=None, dt_bias=None)
    return q


def fwd_args(p):
    """flash_kda.fwd's positional arguments for problem p with a fresh out and final_state
    (bf16 state in and out, scale 128^-0.5, lower bound -5): (args, out, final)."""
    out, final = torch.empty_like(p["v"]), torch.empty_like(p["initial_state"])
    lower_bound = -5.0 if p.get("gate", "lower_bound") == "lower_bound" else None
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], 128**-0.5, out, p["A_log"], p["dt_bias"], lower_bound)
    return args + (p["initial_state"], final, p["cu_seqlens"]), out, final


def runner(p, exact, max_seqlen=None, **hook):
    """A closure running one forward on problem p (bf16 state in and out), with flash_kda.fwd's
    max_seqlen hint if given. Without hook arguments it is the public flash_kda.fwd; with them
    (flash_kda.testing's overrides: block_v, segment_chunks, overlap, chunk_tokens) the library's
    plan is forced through its test entry point, which also runs the gate forms other than the
    bounded one (problem key 'gate', with_gate) on any arch, where its table enables them or not."""
    import flash_kda
    from flash_kda import testing

    args, _, _ = fwd_args(p)
    gate = p.get("gate", "lower_bound")
    if not hook and gate == "lower_bound":
        return lambda: flash_kda.fwd(*args, exact=exact, max_seqlen=max_seqlen)
    forms = {} if gate == "lower_bound" else dict(gate=gate)
    if forms:  # with the process-wide overrides (ab_graph's LIB:stable)
        hook = dict(testing.get_overrides(), **hook, unvalidated_forms=1)
    call = testing.validated(*args, exact=exact, max_seqlen=max_seqlen, **forms)
    return lambda: testing.run_native(call, **hook)


def graphed(fn):
    """fn captured in a CUDA graph (after a warm-up run); returns the replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_ms(do_bench, fn):
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def gpu_sampler():
    """nvidia-smi printing the SM clock (MHz) and board power (W) every 100 ms, or None. It
    samples GPU index torch.cuda.current_device(): nvidia-smi's numbering, which is CUDA's
    unless CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER change CUDA's."""
    query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "100"]
    try:
        return subprocess.Popen(
            query + ["-i", str(torch.cuda.current_device())],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    except OSError:
        return None


def sustained(fn, seconds):
    """fn replayed back to back for `seconds`: mean ms a call (CUDA events around all of
    them), and the medians of the SM clock and board power sampled meanwhile (None without
    nvidia-smi). The host waits every 50 calls, so the queue never holds more."""
    fn()
    torch.cuda.synchronize()
    smi = gpu_sampler()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls, t0 = 0, time.perf_counter()
    begin.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(50):
            fn()
        calls += 50
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    r = dict(sustained_ms=begin.elapsed_time(end) / calls, sm_mhz=None, power_w=None)
    if smi is not None:
        smi.terminate()
        samples = [line.split(",") for line in smi.communicate()[0].split("\n") if line.count(",") == 1]
        samples = samples[2:]  # the first samples straddle the start
        if samples:
            r["sm_mhz"] = sorted(float(a) for a, _ in samples)[len(samples) // 2]
            r["power_w"] = sorted(float(b) for _, b in samples)[len(samples) // 2]
    return r


def time_fla(p, do_bench):
    from fla.ops.kda import chunk_kda
    from flash_kda.fallback import FLASH_KDA_FLAGS

    os.environ["FLA_FLASH_KDA"] = "0"
    h0 = p["initial_state"].float()
    q, k, v, g, beta, cu = p["q"], p["k"], p["v"], p["g"], p["beta"], p["cu_seqlens"]

    def run():
        with torch.inference_mode():
            chunk_kda(
                q,
                k,
                v,
                g,
                beta,
                scale=128**-0.5,
                initial_state=h0,
                output_final_state=True,
                lower_bound=-5.0,
                cu_seqlens=cu,
                **FLASH_KDA_FLAGS,
                A_log=p["A_log"],
                dt_bias=p["dt_bias"].reshape(-1),
            )

    try:
        eager = time_ms(do_bench, run)
        # fla reads a varlen call's lengths on the host, which a graph capture cannot hold.
        return eager, time_ms(do_bench, graphed(run)) if cu is None else None
    finally:
        os.environ.pop("FLA_FLASH_KDA", None)


def time_flashkda(p, do_bench):
    """Upstream FlashKDA's forward (its extension module, bf16 state in and out) on problem
    p: (eager ms, graph ms), or None where flash_kda_C does not import."""
    try:
        ext = importlib.import_module("flash_kda_C")
    except ImportError:
        return None
    q = p["q"]
    B, T, H = q.shape[:3]
    N = p["cu_seqlens"].numel() - 1 if p["cu_seqlens"] is not None else B
    workspace = torch.empty(ext.get_workspace_size(B * T, H, N), dtype=torch.uint8, device=q.device)
    out, final = torch.empty_like(p["v"]), torch.empty_like(p["initial_state"])
    args = (q, p["k"], p["v"], p["g"], p["beta"], 128**-0.5, out, workspace, p["A_log"], p["dt_bias"], -5.0)

    def run():
        ext.fwd(*args, initial_state=p["initial_state"], final_state=final, cu_seqlens=p["cu_seqlens"])

    return time_ms(do_bench, run), time_ms(do_bench, graphed(run))


def plan_of(p, exact, max_seqlen=None):
    """The library's plan (chunk_tokens, block_v, segment_chunks, segment_block_v,
    overlap_min_ctas, overlap_max_ctas, overlap_lead) for problem p."""
    from flash_kda import testing

    gate = p.get("gate", "lower_bound")
    forms = {} if gate == "lower_bound" else dict(gate=gate)
    return plan_fields(testing.plan_of(testing.validated(*fwd_args(p)[0], exact=exact, max_seqlen=max_seqlen, **forms)))


PLAN_FIELDS = (
    "chunk_tokens",
    "block_v",
    "segment_chunks",
    "segment_block_v",
    "overlap_min_ctas",
    "overlap_max_ctas",
    "overlap_lead",
)


def plan_fields(plan):
    """The fields of a library plan (flash_kda_fwd_plan_info) that h200.json records."""
    return {name: getattr(plan, name) for name in PLAN_FIELDS}


def environment():
    import flash_kda

    props = torch.cuda.get_device_properties(0)

    def version(dist):
        try:
            import importlib.metadata as md

            return md.version(dist)
        except Exception:
            return None

    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,  # the GPU machine's copy of the tree has no .git: GIT_SHA then
        cwd=os.path.dirname(os.path.abspath(__file__)),
    ).stdout.strip()
    return dict(
        gpu=props.name,
        sms=props.multi_processor_count,
        cc=f"{props.major}.{props.minor}",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        flash_kda=flash_kda.__version__,
        fla=version("fla-core"),
        triton=version("triton"),
        git=os.environ.get("GIT_SHA") or sha,  # the device's copy of the tree may carry an older .git
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    )


def floor_ms(lens, heads, env):
    tokens = sum(lens)
    bw, rate = env["copy_tb_s"] * 1e12, env["matmul_tflop_s"] * 1e12
    return 1e3 * max(BYTES_PER_TOKEN_HEAD * tokens * heads / bw, FLOPS_PER_TOKEN_HEAD * tokens * heads / rate)


def bench_shape(shape, do_bench, env, with_fla, sustain_s=0.0, gate="lower_bound"):
    lens, heads = SHAPES[shape]
    p = with_gate(make_inputs(lens, heads), gate)
    r = dict(shape=shape, lens=lens if len(lens) <= 8 else f"{len(lens)}x{lens[0]}", heads=heads, gate=gate)
    r["plan"] = plan_of(p, exact=False)
    for path, exact in (("auto", False), ("exact", True)):
        fn = runner(p, exact)
        r[f"{path}_ms"] = time_ms(do_bench, fn)
        r[f"{path}_graph_ms"] = time_ms(do_bench, graphed(fn))
    if sustain_s > 0:
        r["auto_sustained"] = sustained(graphed(runner(p, False)), sustain_s)
    r["floor_ms"] = floor_ms(lens, heads, env)
    upstream = time_flashkda(p, do_bench)
    if upstream is not None:
        r["flashkda_ms"], r["flashkda_graph_ms"] = upstream
    if with_fla:
        r["fla_ms"], r["fla_graph_ms"] = time_fla(p, do_bench)
    del p
    torch.cuda.empty_cache()
    return r


POOLS = [
    ("16x1024-H8-pool256", [1024] * 16, 8, 256),
    ("varlen8-H8-pool64", [1500, 700, 2048, 333, 1024, 900, 60, 1600], 8, 64),
]


def bench_pool(shape, lens, heads, slots, do_bench):
    """A pooled call (initial_state and final_state one fp32 pool [slots, H, 128, 128],
    written in place through ssm_state_indices) against the same sequences with contiguous
    states, and against gathering the states, calling, and scattering them back."""
    import flash_kda

    p = make_inputs(lens, heads)
    N = len(lens)
    gen = torch.Generator(device="cuda").manual_seed(1)
    pool = 0.1 * torch.randn(slots, heads, 128, 128, generator=gen, device="cuda")
    idx = torch.randperm(slots, generator=gen, device="cuda")[:N]
    init = pool[idx].contiguous()
    final, out = torch.empty_like(init), torch.empty_like(p["v"])
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], 128**-0.5, out, p["A_log"], p["dt_bias"], -5.0)
    cu = p["cu_seqlens"]

    def contiguous():
        flash_kda.fwd(*args, init, final, cu)

    def pooled():
        flash_kda.fwd(*args, pool, pool, cu, ssm_state_indices=idx)

    def gather_call_scatter():
        states = pool[idx]
        flash_kda.fwd(*args, states, final, cu)
        pool[idx] = final

    r = dict(shape=shape, lens=lens, heads=heads, slots=slots)
    for name, fn in (("contiguous", contiguous), ("pooled", pooled), ("gather_scatter", gather_call_scatter)):
        r[f"{name}_ms"] = time_ms(do_bench, fn)
        r[f"{name}_graph_ms"] = time_ms(do_bench, graphed(fn))
    torch.cuda.empty_cache()
    return r


def sweep_shape(shape, do_bench, widths=(0, 32, 64, 128)):
    """Graph-replay time for each forced segment length and width: the cost model's data."""
    lens, heads = SHAPES[shape]
    p = make_inputs(lens, heads)
    rows = []
    for L in SWEEP_SEGMENTS:
        for bv in widths:
            hook = dict(block_v=bv, segment_chunks=L)
            try:
                ms = time_ms(do_bench, graphed(runner(p, exact=L == 0, **hook)))
            except RuntimeError as err:  # e.g. a workspace too large for the GPU
                ms = None
                print(f"{shape} L={L} bv={bv}: {err}", flush=True)
            rows.append(dict(shape=shape, segment_chunks=L, block_v=bv, graph_ms=ms))
            print(json.dumps(rows[-1]), flush=True)
    del p
    torch.cuda.empty_cache()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="results JSON; the markdown table goes beside it")
    parser.add_argument("--readme", help="also rewrite this file's perf-table block (README.md)")
    parser.add_argument("--fla", nargs="*", default=[], help="shape ids to time with fla too")
    parser.add_argument("--shapes", nargs="*", default=None, help="only these shape ids (default: the table)")
    parser.add_argument("--plot", action="store_true", help="also the H sweeps at T=8192 and T=32768")
    parser.add_argument("--sweep", nargs="*", default=[], help="shape ids for the segment-length sweep")
    parser.add_argument("--sweep-widths", default="0,32,64,128", help="block_v values of the sweep (0: the plan's)")
    parser.add_argument("--pools", action="store_true", help="also the state-pool rows")
    parser.add_argument(
        "--sustained", type=float, default=0.0, metavar="S", help="also S seconds of back-to-back replays"
    )
    parser.add_argument("--mode", default="default", help="a test mode (flash_kda.testing.TEST_MODES): generic "
                        "times the other arches' passes on this GPU, the mma.sync estimate")  # fmt: skip
    parser.add_argument("--gate", choices=GATES, default="lower_bound", help="the gate form of every row")
    args = parser.parse_args()
    from flash_kda import testing
    from triton.testing import do_bench

    testing.set_overrides(**testing.mode_overrides(args.mode))

    bw, rate = measure_ceilings(do_bench)
    env = environment()
    env["test_mode"] = args.mode
    env.update(copy_tb_s=bw / 1e12, matmul_tflop_s=rate / 1e12)
    command = "python " + " ".join(sys.argv)
    data = dict(environment=env, command=command, results=[], sweep=[], pools=[])
    if args.sweep:
        for shape in args.sweep:
            widths = tuple(int(w) for w in args.sweep_widths.split(","))
            data["sweep"] += sweep_shape(shape, do_bench, widths)
    else:
        shapes = args.shapes or [s for s, _, _ in TABLE]
        if args.plot:
            shapes += [s for s, _, _ in PLOT if s not in shapes]
        for shape in shapes:
            data["results"].append(bench_shape(shape, do_bench, env, shape in args.fla, args.sustained, args.gate))
            print(json.dumps(data["results"][-1]), flush=True)
            with open(args.out, "w") as f:  # keep what was measured if the run is cut short
                json.dump(data, f, indent=1)
        if args.pools:
            for shape, lens, heads, slots in POOLS:
                data["pools"].append(bench_pool(shape, lens, heads, slots, do_bench))
                print(json.dumps(data["pools"][-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    if data["results"]:
        print(write(data, args.out, readme=args.readme))


if __name__ == "__main__":
    main()
