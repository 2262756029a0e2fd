# SPDX-License-Identifier: MIT
"""Host time of eager forwards, and eager against CUDA-graph time for the table's rows:

    python benchmarks/bench_host.py --json benchmarks/results/host.json   (H200 machine, ~1 minute)
    python benchmarks/bench_host.py --mock-library     (CPU machine: the Python of a native call)
    python benchmarks/bench_host.py --layers           (also each layer of the path apart)

Host time: synchronise the device, then time ``--burst`` consecutive calls one by one with
``time.perf_counter``; repeat for ``--bursts`` bursts and report the median of the per-call
times (and the 90th percentile). A burst queues at most ``--burst`` calls' kernels, so the
launch queue never fills and the numbers are host time, not GPU time.

- ``repeat_signature_us``: ``flash_kda.fwd`` of the tiny batched call (T=256, H=4, bf16 states
  in and out; its plan launches K1 and K2), every call the same signature with new data
  pointers (the inputs rotate through several copies), in grad mode as a plain script calls it;
  ``repeat_signature_inference_us`` the same inside one ``torch.inference_mode()`` block, as
  serving engines call it; ``varlen_repeat_us`` the same tokens as two sequences (a third kernel, the
  prefix);
- ``new_signature_us``: the tiny call with every call a new token count (more than the
  signature records and the library's plans hold), the case of a varlen serving step: after
  the repeated call taught the eager launch in C its signature, members of its family;
- ``serving_step_us``: the mean host time a call of varlen serving steps, each of new lengths
  (two sequences, T=256 + the step, H=4) and ``LAYERS`` calls, one per layer with that layer's
  gate parameters and outputs: a step's first call is a family member, its second records the
  graph that the others replay;
- ``flashkda_us``: upstream FlashKDA's ``flash_kda_C.fwd`` on the same call with its workspace
  allocated per call as its Python wrapper does (null where ``flash_kda_C`` is not importable);
- ``fla_routed_us``: fla's ``chunk_kda`` with FlashKDA's flags, which fla's backend routes to
  ``flash_kda.fwd`` (null without fla).

Then for each row of benchmarks/results/h200.md (bench_fwd.TABLE, automatic path, bf16 states)
the eager call (on the default stream and on a stream of its own) and its CUDA graph, each
back to back: ``--reps`` rounds that run every variant in turn for 20 ms (CUDA events around
each run, the median ms a call). The eager call keeps up with the GPU where its host time hides
behind the kernels of the calls before it. Without a CUDA
device (``--mock-library``) the Python part is timed with the library replaced by a stand-in
that answers at once (``flash_kda.testing.simulated_native``).
"""

import argparse
import contextlib
import datetime
import json
import os
import statistics
import subprocess
import time

import torch
from bench_fwd import TABLE, make_inputs

TINY = ([256], 4)  # the tiny call: T=256, H=4
TINY_VARLEN = ([100, 156], 4)
COPIES = 4  # input copies the repeated call rotates through (new pointers, one signature)
DISTINCT = 320  # token counts of the new-signature run: more than the records (64) and plans (256) hold
LAYERS, STEPS = 69, 20  # serving steps: Kimi-K3's KDA layers a step


def host_us(fn, bursts, burst, cuda):
    """(median, 90th percentile) host time of one ``fn()`` in microseconds, from ``bursts``
    bursts of ``burst`` calls, the device synchronised before each burst when ``cuda``."""
    for _ in range(min(50, bursts * burst)):  # warm-up
        fn()
    times = []
    for _ in range(bursts):
        if cuda:
            torch.cuda.synchronize()
        for _ in range(burst):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    if cuda:
        torch.cuda.synchronize()
    times.sort()
    return statistics.median(times) * 1e6, times[int(0.9 * (len(times) - 1))] * 1e6


def calls_of(lens, heads, device, copies=COPIES):
    """``copies`` (arguments of flash_kda.fwd, max_seqlen) for one problem, each with its own
    tensors: one signature, new pointers in turn."""
    out = []
    for seed in range(copies):
        p = make_inputs(lens, heads, seed=seed, device=device)
        outs, final = torch.empty_like(p["v"]), torch.empty_like(p["initial_state"])
        args = (p["q"], p["k"], p["v"], p["g"], p["beta"], 128**-0.5, outs, p["A_log"], p["dt_bias"], -5.0)
        out.append(
            (args + (p["initial_state"], final, p["cu_seqlens"]), None if p["cu_seqlens"] is None else max(lens))
        )
    return out


def new_signatures(lens, heads, device, count=DISTINCT):
    """``count`` argument tuples of flash_kda.fwd, each of another token count: views of one
    batched problem of ``lens[0] + count`` tokens, 0 .. count - 1 tokens shorter."""
    ((args, _),) = calls_of([lens[0] + count], heads, device, copies=1)
    sliced = []
    for cut in range(count):
        short = [x[:, : x.shape[1] - cut] for x in args[:5]]
        sliced.append((*short, args[5], args[6][:, : args[6].shape[1] - cut], *args[7:]))
    return sliced


def serving_step_us(heads, device, steps=STEPS, layers=LAYERS):
    """The mean host µs a call of ``steps`` serving steps (``serving_step_us`` above), the
    device synchronised before each step."""
    import flash_kda

    ((args, _),) = calls_of([128, 128 + steps], heads, device, copies=1)
    weights = [(torch.rand_like(args[7]), torch.rand_like(args[8])) for _ in range(layers)]
    outs = [(torch.empty_like(args[6]), torch.empty_like(args[11])) for _ in range(layers)]
    times = []
    for step in range(steps):
        T = 256 + step
        cu = torch.tensor([0, 128, T], dtype=torch.int32, device=device)
        step_args = [x[:, :T] for x in args[:5]]
        for (A_log, dt_bias), (out, final) in zip(weights, outs):
            call = (*step_args, args[5], out[:, :T], A_log, dt_bias, args[9], args[10], final, cu)
            start = time.perf_counter()
            flash_kda.fwd(*call, max_seqlen=T - 128)
            times.append(time.perf_counter() - start)
        if device == "cuda":
            torch.cuda.synchronize()
    return statistics.mean(times) * 1e6, sorted(times)[int(0.9 * (len(times) - 1))] * 1e6


def rotating(fn, calls):
    turn = iter(range(1 << 62))
    return lambda: fn(*calls[next(turn) % len(calls)])


def flashkda_call(lens, heads, device):
    """Upstream FlashKDA's call of the tiny problem, its workspace allocated per call (its
    Python wrapper's way), or None without flash_kda_C."""
    try:
        import flash_kda_C
    except ImportError:
        return None
    ((args, _),) = calls_of(lens, heads, device, copies=1)
    q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial, final, cu = args
    B, T, H = q.shape[:3]

    def run():
        workspace = torch.empty(flash_kda_C.get_workspace_size(B * T, H, B), dtype=torch.uint8, device=device)
        flash_kda_C.fwd(q, k, v, g, beta, scale, out, workspace, A_log, dt_bias, lower_bound,
                        initial_state=initial, final_state=final, cu_seqlens=cu)  # fmt: skip

    return run


def fla_call(lens, heads, device):
    """fla's chunk_kda on the tiny problem with FlashKDA's flags (routed to flash_kda.fwd by
    fla's backend), or None without fla."""
    try:
        from fla.ops.kda import chunk_kda
    except Exception:
        return None
    from flash_kda.fallback import FLASH_KDA_FLAGS

    ((args, _),) = calls_of(lens, heads, device, copies=1)
    q, k, v, g, beta, scale, _, A_log, dt_bias, lower_bound, initial, _, cu = args

    def run():
        with torch.no_grad():
            chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial, output_final_state=True,
                      lower_bound=lower_bound, cu_seqlens=cu, A_log=A_log, dt_bias=dt_bias,
                      **FLASH_KDA_FLAGS)  # fmt: skip

    return run


def back_to_back_ms(variants, reps, target_ms=20.0):
    """For each ``(fn, stream)`` of ``variants``, the median ms a call of ``fn`` run back to back
    on ``stream`` (None: the current one; CUDA events there around ``n`` calls, ``n`` chosen for
    ``target_ms`` a run), over ``reps`` rounds that run each variant once in turn, so that the
    board's clock and power drift reach every variant alike; each round starts one variant
    later, so that every variant runs first, second, ... equally often."""

    def run(fn, stream, n):
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / n

    counts = [max(5, min(2000, int(target_ms / max(run(fn, stream, 1), 1e-3)))) for fn, stream in variants]
    times = [[] for _ in variants]
    for r in range(reps):
        for i in range(len(variants)):
            k = (i + r) % len(variants)
            times[k].append(run(*variants[k], counts[k]))
    return [statistics.median(t) for t in times]


def eager_against_graph(reps):
    """[{shape, eager_ms, eager_side_stream_ms, graph_ms, ratio}] for the table's rows
    (automatic path): eager calls on the current (default) stream and on a stream of their
    own, and replays of a graph of the call, timed in turn (back_to_back_ms)."""
    import flash_kda

    rows, side = [], torch.cuda.Stream()
    for shape, lens, heads in TABLE:
        ((args, longest),) = calls_of(lens, heads, "cuda", copies=1)

        def eager(args=args, longest=longest):
            flash_kda.fwd(*args, max_seqlen=longest)

        eager()  # the signature learned before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            eager()
        # the side stream: an engine's own stream rather than the legacy default one
        eager_ms, side_ms, graph_ms = back_to_back_ms([(eager, None), (eager, side), (graph.replay, None)], reps)
        rows.append(dict(shape=shape, eager_ms=round(eager_ms, 5), eager_side_stream_ms=round(side_ms, 5),
                         graph_ms=round(graph_ms, 5), ratio=round(eager_ms / graph_ms, 4)))  # fmt: skip
        ratio = eager_ms / graph_ms
        print(f"  {shape:16s} eager {eager_ms:8.4f} ms  on a side stream {side_ms:8.4f} ms  graph {graph_ms:8.4f} ms"
              f"  eager/graph {ratio:6.3f}", flush=True)  # fmt: skip
        del graph, args
        torch.cuda.empty_cache()
    return rows


def layers(lens, heads, device):
    """(name, fn) of each layer of the native path of the tiny call, outermost first."""
    import flash_kda
    from flash_kda import testing

    calls = [args for args, _ in calls_of(lens, heads, device)]
    fwd_op = torch.ops.flash_kda.fwd
    rows = [
        ("flash_kda.fwd (repeated signature)", rotating(lambda *a: flash_kda.fwd(*a), calls)),
        ("torch.ops.flash_kda.fwd (the op)", rotating(lambda *a: fwd_op(*a), calls)),
        ("validation (signature hit)", rotating(lambda *a: testing.validated(*a), calls)),
    ]
    call = testing.validated(*calls[0])
    rows.append(("validated call -> library", lambda: testing.run_native(call)))
    rows.append(("flash_kda_fwd alone (a packed call)", testing.library_call(call)))
    launch = testing.eager_op()
    if launch is not None:  # the eager launch in C: a learned call, one it lacks (its read and key), CPU tensors
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial, final, cu = calls[0]
        cpu = [x.cpu() for x in (q, k, v, g, beta, out)]
        forms, rest = testing.eager_forms(exact=False), (None, None, None)
        rows.append(("eager launch, learned signature (C + library)",
                     lambda: launch(q, k, v, g, beta, out, A_log, dt_bias, initial, final, cu, *rest, scale,
                                    lower_bound, 0, 0, forms, False)))  # fmt: skip
        rows.append(("eager launch, unknown signature (read + key)",
                     lambda: launch(q, k, v, g, beta, out, A_log, dt_bias, initial, final, cu, *rest, 0.5,
                                    lower_bound, 0, 0, forms, False)))  # fmt: skip
        rows.append(("eager launch, CPU tensors (read alone)",
                     lambda: launch(*cpu, None, None, None, None, None, *rest, 0.5, lower_bound, 0, 0, forms,
                                    False)))  # fmt: skip
    return rows


def git_commit():
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                         cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()  # fmt: skip
    return os.environ.get("GIT_SHA") or sha or None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results here (benchmarks/results/host.json)")
    parser.add_argument("--bursts", type=int, default=100)
    parser.add_argument("--burst", type=int, default=20, help="calls timed between two synchronisations")
    parser.add_argument("--reps", type=int, default=25, help="back-to-back rounds per table row")
    parser.add_argument("--mock-library", action="store_true", help="CPU only: see the module docstring")
    parser.add_argument("--layers", action="store_true", help="also time each layer of the native path")
    parser.add_argument("--no-table", action="store_true", help="skip the eager-against-graph table")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if args.mock_library and cuda:
        parser.error("--mock-library is for machines without a CUDA device")
    if not cuda and not args.mock_library:
        parser.error("no CUDA device: use --mock-library for the Python part")
    import flash_kda

    device = "cuda" if cuda else "cpu"
    command = "python benchmarks/bench_host.py" + (" --mock-library" if args.mock_library else "")
    command += (" --layers" if args.layers else "") + (" --no-table" if args.no_table else "")
    command += f" --json {args.json}" if args.json else ""
    result = dict(gpu=torch.cuda.get_device_name() if cuda else None, commit=git_commit(),
                  date=datetime.date.today().isoformat(), torch=torch.__version__, command=command)  # fmt: skip
    simulated = contextlib.nullcontext()
    if args.mock_library:
        from flash_kda import testing

        simulated = testing.simulated_native(testing.stand_in_library())
    fwd = flash_kda.fwd
    with simulated:
        batched = [a for a, _ in calls_of(*TINY, device)]
        varlen = calls_of(*TINY_VARLEN, device)
        runs = [
            ("repeat_signature_us", rotating(lambda *a: fwd(*a), batched)),
            ("repeat_signature_inference_us", rotating(lambda *a: fwd(*a), batched)),  # timed in inference_mode
            ("varlen_repeat_us", rotating(lambda a, longest: fwd(*a, max_seqlen=longest), varlen)),
            ("new_signature_us", rotating(lambda *a: fwd(*a), new_signatures(*TINY, device))),
            ("serving_step_us", "steps"),
            ("flashkda_us", flashkda_call(*TINY, device) if cuda else None),
            ("fla_routed_us", fla_call(*TINY, device) if cuda else None),
        ]
        where = result["gpu"] or "CPU, library mocked"
        print(f"host time per call in us (median and p90 of {args.bursts} bursts of {args.burst}), {where}:")
        for name, fn in runs:
            # the inference row enters inference_mode once around its bursts, as an engine does
            mode = torch.inference_mode() if "inference" in name else contextlib.nullcontext()
            with mode:
                if fn == "steps":
                    timed = serving_step_us(TINY[1], device)
                else:
                    timed = None if fn is None else host_us(fn, args.bursts, args.burst, cuda)
            print(f"  {name:30s} " + ("n/a" if timed is None else f"{timed[0]:8.1f} {timed[1]:8.1f}"), flush=True)
            result[name] = None if timed is None else round(timed[0], 2)
            result[name.replace("_us", "_p90_us")] = None if timed is None else round(timed[1], 2)
        if args.layers:
            for name, fn in layers(*TINY, device):
                median, p90 = host_us(fn, args.bursts, args.burst, cuda)
                print(f"  {name:40s} {median:8.1f} {p90:8.1f}", flush=True)
    if cuda and not args.no_table:
        print("eager against CUDA graph, back to back (automatic path, bf16 states; ms a call):")
        result["eager_against_graph"] = eager_against_graph(args.reps)
        slow = [r for r in result["eager_against_graph"] if r["graph_ms"] >= 0.030 and r["ratio"] > 1.05]
        print(f"rows of >= 30 us GPU time with eager more than 5% above the graph: {len(slow)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
