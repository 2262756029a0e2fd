# SPDX-License-Identifier: MIT
"""Time flash_kda.distributed: one sequence of T tokens spread over the ranks of a group,
against flash_kda.fwd over the whole sequence on one GPU.

    torchrun --standalone --nproc-per-node R benchmarks/bench_cp.py --out benchmarks/results/cp-h200.json
    torchrun --standalone --nproc-per-node 2 benchmarks/bench_cp.py --T 262144 --H 4 --out smoke.json

(On a machine that does not resolve its own host name: ``--master_addr 127.0.0.1
--master_port P`` instead of ``--standalone``, and ``GLOO_SOCKET_IFNAME=lo`` for gloo.)

Each rank takes GPU ``LOCAL_RANK % device_count``. With one rank per GPU the group is NCCL;
with more ranks than GPUs (a smoke run of several processes on one GPU) it is gloo and the
JSON says ``shared_gpu``: such times measure nothing about multi-GPU speed.

Per (T, H): the slowest rank's time of a call (CUDA events on each rank, barrier before each
call; median over ``--iters``), each rank's phase times (``flash_kda.distributed.Timings``:
``exchange`` is the time the rank waited for the exchange, the communication left exposed),
the all-gather alone on the same buffer, and rank 0's time of the one-GPU call with the ratio.
Random inputs (bf16 state out, no initial state), automatic mode. ``--cpu`` runs the same
on CPU tensors through gloo (a check of the script, not a measurement). Benchmarks never
assert correctness; tests/test_distributed*.py do.
"""

import argparse
import datetime
import faulthandler
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist


def inputs(tokens, heads, seed, device):
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16)

    return dict(
        q=randn(1, tokens, heads, 128), k=randn(1, tokens, heads, 128), v=randn(1, tokens, heads, 128),
        g=randn(1, tokens, heads, 128), beta=randn(1, tokens, heads), out=torch.empty(1, tokens, heads, 128,
        dtype=torch.bfloat16, device=device), A_log=torch.zeros(heads, device=device),
        dt_bias=torch.zeros(heads, 128, device=device),
    )  # fmt: skip


def args_of(p):
    return (p["q"], p["k"], p["v"], p["g"], p["beta"], 128**-0.5, p["out"], p["A_log"], p["dt_bias"], -5.0)


def event_ms(fn, iters, barrier=None):
    """Per-iteration ms of fn (CUDA events; host time on the CPU), each after a barrier if given."""
    cuda, times = torch.cuda.is_available() and torch.cuda.is_initialized(), []
    for _ in range(iters):
        if cuda:
            torch.cuda.synchronize()
        if barrier is not None:
            barrier()
        if not cuda:
            start = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - start))
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def slowest(times, group):
    """Element-wise max over the group's ranks of a list of floats."""
    t = torch.tensor(times, dtype=torch.float64)
    if dist.get_backend(group) == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().tolist()


def host_gather(x, size):
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x)
    return parts


def bench_row(T, H, iters, device, rank, size):
    import flash_kda
    import flash_kda.distributed as cp

    tokens = T // size
    p = inputs(tokens, H, seed=rank, device=device)
    final = torch.empty(1, H, 128, 128, dtype=torch.bfloat16, device=device)
    timings = cp.Timings()
    split = [r * tokens for r in range(size + 1)]

    def call():
        cp.fwd(*args_of(p), None, final, [0, T], split=split, timings=timings)

    call()  # warm-up (plans, workspaces)
    phases, times = [], []
    for t in event_ms(call, iters, dist.barrier):
        phases.append(timings.milliseconds())
        times.append(t)
    row = dict(T=T, H=H, ranks=size, ms=statistics.median(slowest(times, None)))
    row["phases"] = {k: statistics.median(ph[k] for ph in phases) for k in phases[0]}
    send = torch.empty(2, 1, H, 128, 128, dtype=torch.float32, device=device)
    recv = send.new_empty(size, *send.shape)
    if dist.get_backend() == "nccl":
        gather = lambda: dist.all_gather_into_tensor(recv, send)  # noqa: E731
    else:  # as flash_kda.distributed runs gloo with CUDA tensors: through host copies
        gather = lambda: recv.copy_(torch.stack(host_gather(send.cpu(), size)))  # noqa: E731
    gather()
    row["allgather_ms"] = statistics.median(slowest(event_ms(gather, iters, dist.barrier), None))
    per_rank = [None] * size
    dist.all_gather_object(per_rank, row["phases"])
    row["phases_by_rank"] = per_rank
    if rank == 0:
        whole = inputs(T, H, seed=1000, device=device)
        one = lambda: flash_kda.fwd(*args_of(whole), None, final)  # noqa: E731
        one()
        row["one_gpu_ms"] = statistics.median(event_ms(one, iters))
        row["ratio"] = row["ms"] / row["one_gpu_ms"]
        del whole
    if device.type == "cuda":
        torch.cuda.empty_cache()
    dist.barrier()
    return row


def environment(backend, shared):
    import flash_kda

    gpu = torch.cuda.get_device_properties(0).name if torch.cuda.is_initialized() else "cpu"
    sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    ).stdout.strip()  # fmt: skip
    return dict(
        gpu=gpu, gpus=torch.cuda.device_count(), torch=torch.__version__, cuda=torch.version.cuda,
        flash_kda=flash_kda.__version__, git=os.environ.get("GIT_SHA") or sha, backend=backend, shared_gpu=shared,
        date=datetime.date.today().isoformat(),
    )  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, nargs="+", default=[1048576, 262144])
    parser.add_argument("--H", type=int, nargs="+", default=[4, 12])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cpu", action="store_true", help="CPU tensors and gloo: checks the script only")
    parser.add_argument("--seconds", type=float, default=1800.0, help="watchdog: stacks and exit after")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.seconds, exit=True)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    shared = args.cpu or int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > torch.cuda.device_count()
    backend = "gloo" if shared else "nccl"
    device = torch.device("cpu")
    if not args.cpu:
        torch.cuda.set_device(local % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.seconds))
    rank, size = dist.get_rank(), dist.get_world_size()
    rows = []
    with torch.inference_mode():
        for T in args.T:
            for H in args.H:
                rows.append(bench_row(T, H, args.iters, device, rank, size))
                if rank == 0:
                    r = rows[-1]
                    print(f"T={T} H={H} ranks={size}: {r['ms']:.3f} ms, one GPU {r['one_gpu_ms']:.3f} ms "
                          f"(x{r['ratio']:.2f}), exchange wait {r['phases']['exchange']:.3f} ms, "
                          f"all-gather alone {r['allgather_ms']:.3f} ms", flush=True)  # fmt: skip
    if rank == 0:
        command = " ".join(["torchrun", f"--nproc-per-node {size}", *sys.argv])
        result = dict(command=command, **environment(backend, shared))
        with open(args.out, "w") as f:
            json.dump(dict(result, rows=rows), f, indent=1)
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
