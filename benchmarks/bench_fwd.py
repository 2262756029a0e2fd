# SPDX-License-Identifier: MIT
"""Time flash_kda's native forward against fla's Triton chunk_kda on the same inputs.

    python benchmarks/bench_fwd.py --out benchmarks/results/h200.json [--fla T8192-N1-H96 ...]

Medians of ``triton.testing.do_bench`` (CUDA events, warm-up, L2 flushed between runs),
bf16 state in and out for flash_kda; fla's ``chunk_kda`` gets the same tensors with the
FlashKDA flags (``use_gate_in_kernel``, ``use_qk_l2norm_in_kernel``,
``use_beta_sigmoid_in_kernel``, ``safe_gate``, ``lower_bound=-5``, ``state_v_first``),
``FLA_FLASH_KDA=0`` so that it runs its own kernels, and an fp32 initial state (fla's
requirement). fla autotunes each new shape on its first call (minutes), so it is timed
only for the shapes named by ``--fla``. The floor column is the hardware bound: the larger
of 1,290 bytes per token per head at the measured copy bandwidth and 118 kFLOP per token
per head at the measured bf16 matrix rate (spec section 7).
Benchmarks never assert correctness; the tests do.
"""

import argparse
import json
import os
import subprocess
import sys

import torch

BYTES_PER_TOKEN_HEAD = 1290
FLOPS_PER_TOKEN_HEAD = 118_000

# (id, lens of the sequences, heads)
SHAPES = [
    ("T8192-N1-H96", [8192], 96),
    ("T8192-N1-H48", [8192], 48),
    ("T8192-N1-H24", [8192], 24),
    ("T8192-N1-H12", [8192], 12),
    ("T8192-N1-H6", [8192], 6),
    ("T32768-N1-H96", [32768], 96),
    ("T32768-N1-H6", [32768], 6),
    ("varlen6-H96", [1300, 547, 2048, 963, 271, 3063], 96),
    ("8x1024-H8", [1024] * 8, 8),
    ("64x512-H8", [512] * 64, 8),
]


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


def make_inputs(lens, heads, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lens)
    batched = len(set(lens)) == 1
    B, Tb = (len(lens), lens[0]) if batched else (1, T)
    N = len(lens)
    bf16 = torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=bf16)

    p = dict(
        q=randn(B, Tb, heads, 128),
        k=randn(B, Tb, heads, 128),
        v=randn(B, Tb, heads, 128),
        g=randn(B, Tb, heads, 128),
        beta=randn(B, Tb, heads),
        A_log=torch.rand(heads, generator=gen, device="cuda"),
        dt_bias=torch.rand(heads, 128, generator=gen, device="cuda"),
        initial_state=0.1 * randn(N, heads, 128, 128),
    )
    p["cu_seqlens"] = None
    if not batched:
        bounds = [0]
        for n in lens:
            bounds.append(bounds[-1] + n)
        p["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int64, device="cuda")
    return p


def native_runner(p, block_v=0):
    """A closure running flash_kda.fwd on problem p (bf16 state in and out); a non-zero
    block_v forces that column split (dispatch.run_native)."""
    import flash_kda
    from flash_kda import _validate, dispatch

    out, final = torch.empty_like(p["v"]), torch.empty_like(p["initial_state"])
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], 128**-0.5, out, p["A_log"], p["dt_bias"], -5.0)
    args += (p["initial_state"], final)

    def run():
        if block_v:
            dispatch.run_native(_validate.check_fwd(*args, p["cu_seqlens"]), *args, block_v=block_v)
        else:
            flash_kda.fwd(*args, p["cu_seqlens"])

    return run


def time_native(p, do_bench, block_v=0):
    return do_bench(native_runner(p, block_v), warmup=25, rep=200, return_mode="median")


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
        return do_bench(run, warmup=25, rep=200, return_mode="median")
    finally:
        os.environ.pop("FLA_FLASH_KDA", None)


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
        git=sha or os.environ.get("GIT_SHA"),
    )


def markdown(results, env, command):
    lines = [
        f"# flash_kda forward vs fla Triton chunk_kda on {env['gpu']}",
        "",
        f"`{command}`",
        "",
        f"GPU {env['gpu']} ({env['sms']} SMs), torch {env['torch']}, CUDA {env['cuda']}, "
        f"fla {env['fla']}, triton {env['triton']}, git {env['git']}. Measured copy bandwidth "
        f"{env['copy_tb_s']:.2f} TB/s, bf16 matmul {env['matmul_tflop_s']:.0f} TFLOP/s.",
        "",
        "| shape | heads | block_v | native ms | fla ms | native / fla | floor ms | native / floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        fla = f"{r['fla_ms']:.3f}" if r.get("fla_ms") else "-"
        ratio = f"{r['native_ms'] / r['fla_ms']:.2f}" if r.get("fla_ms") else "-"
        lines.append(
            f"| {r['shape']} | {r['heads']} | {r['block_v']} | {r['native_ms']:.3f} | {fla} | "
            f"{ratio} | {r['floor_ms']:.3f} | {r['native_ms'] / r['floor_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="results JSON; the markdown table goes beside it")
    parser.add_argument("--fla", nargs="*", default=[], help="shape ids to time with fla too")
    parser.add_argument("--shapes", nargs="*", default=None, help="only these shape ids")
    parser.add_argument(
        "--block-v", type=int, nargs="*", default=[], help="also time these forced block_v values (diagnostics)"
    )
    args = parser.parse_args()
    import flash_kda
    from flash_kda import _native
    from triton.testing import do_bench

    bw, rate = measure_ceilings(do_bench)
    env = environment()
    env.update(copy_tb_s=bw / 1e12, matmul_tflop_s=rate / 1e12)
    lib = _native.load()
    results = []
    for shape, lens, heads in SHAPES:
        if args.shapes and shape not in args.shapes:
            continue
        p = make_inputs(lens, heads)
        tokens = sum(lens)
        floor = max(BYTES_PER_TOKEN_HEAD * tokens * heads / bw, FLOPS_PER_TOKEN_HEAD * tokens * heads / rate)
        r = dict(
            shape=shape,
            lens=lens,
            heads=heads,
            native_ms=time_native(p, do_bench),
            block_v=lib.pick_block_v(len(lens), heads, env["sms"]),
            floor_ms=floor * 1e3,
            path=flash_kda.backend_for("cuda"),
        )
        if shape in args.fla:
            r["fla_ms"] = time_fla(p, do_bench)
        for bv in args.block_v:
            r[f"native_bv{bv}_ms"] = time_native(p, do_bench, bv)
        results.append(r)
        print(json.dumps(r), flush=True)
        del p
        torch.cuda.empty_cache()
    command = "python " + " ".join(sys.argv)
    with open(args.out, "w") as f:
        json.dump(dict(environment=env, command=command, results=results), f, indent=1)
    table = markdown(results, env, command)
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    main()
