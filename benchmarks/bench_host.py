# SPDX-License-Identifier: MIT
"""Host (CPU) time of one eager forward, split by layer: where an eager call that does little
GPU work spends its time. Diagnostics, not a table:

    python benchmarks/bench_host.py [--shape 8x1024-H8] [--bursts 100] [--burst 20] [--exact]
    python benchmarks/bench_host.py --mock-library    (CPU machine: the Python path of a native call)
    python benchmarks/bench_host.py --distinct 100    (every call of a new shape)

Each row times one layer, outermost first: the public ``flash_kda.fwd``; the custom op
``torch.ops.flash_kda.fwd`` called directly (as a ``torch.compile``'d graph calls it, without
the public function's Python wrapper); validation alone
(``check_fwd``); the native call of a validated call (``dispatch.run_native``: argument
struct, workspace, stream, the C library); the C entry alone (``lib.fwd``: checks, plan and
kernel launches). Method: synchronise the device, then time ``--burst`` consecutive calls
one by one with ``time.perf_counter``; repeat for ``--bursts`` bursts and report the median
(and the 90th percentile) of the per-call times. A burst queues at most ``--burst`` calls'
kernels, so the launch queue never fills and the numbers are host time, not GPU time (a
long loop without synchronisation ends up waiting for the GPU once it falls behind).

``--distinct n`` cycles the calls through n token counts (views of the inputs, 0 to n - 1
tokens shorter), so that a call's signature is new to validation's cache whenever n exceeds
the cache (64): the cost of a call of a shape not seen recently.

Without a CUDA device only validation is timed (on CPU tensors). ``--mock-library`` (CPU
only) also times the public call and ``dispatch.run_native`` with the C library, the device
queries, the device switch and the stream replaced by stand-ins that do nothing: the Python
part of a native call, everything except the C entry, measurable on a machine without a GPU.
"""

import argparse
import contextlib
import statistics
import time
import types

import torch
from bench_fwd import SHAPES, make_inputs


def host_us(fn, bursts, burst, cuda):
    """(median, 90th percentile) host time of one ``fn()`` in microseconds, from ``bursts``
    bursts of ``burst`` calls, the device synchronised before each burst when ``cuda``."""
    for _ in range(min(50, bursts * burst)):  # warm-up (a signature's first two calls validate fully)
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


def mock_native_library():
    """Route CUDA-path calls of CPU tensors through dispatch.run_native with stand-ins for
    everything that needs a GPU (the C library answers instantly and launches nothing)."""
    from flash_kda import _native, dispatch

    class Library:
        archs = [_native.ArchInfo("sm_90a", 90, _native.FEATURE_FWD)]

        def cuda_versions(self):
            return 13000, 13000

        def plan(self, args):
            return types.SimpleNamespace(workspace_bytes=256)

        def fwd(self, cc, args, stream):
            pass

    library, cuda0 = Library(), torch.device("cuda", 0)
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.current_stream = lambda device=None: types.SimpleNamespace(cuda_stream=0)
    torch.cuda.device = lambda device: contextlib.nullcontext()
    dispatch.device_facts = lambda index: (90, 132)
    dispatch._raw_stream = lambda index: 0
    dispatch._exchange_device = dispatch._maybe_exchange_device = lambda index: 0
    _native.load, _native.load_error = (lambda: library), (lambda: None)
    explain = dispatch.explain
    dispatch.explain = lambda device: explain(cuda0)  # the facts of a CUDA device, asked every call


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="8x1024-H8", help="a shape id of bench_fwd.py")
    parser.add_argument("--bursts", type=int, default=100)
    parser.add_argument("--burst", type=int, default=20, help="calls timed between two synchronisations")
    parser.add_argument("--exact", action="store_true", help="the exact path (default: automatic)")
    parser.add_argument("--mock-library", action="store_true", help="CPU only: see the module docstring")
    parser.add_argument(
        "--distinct", type=int, default=1, help="cycle through this many token counts (new signatures; batched shapes)"
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if args.mock_library:
        if cuda:
            parser.error("--mock-library is for machines without a CUDA device")
        mock_native_library()
    import flash_kda
    from flash_kda import _native, dispatch

    lens, heads = SHAPES[args.shape]
    if args.distinct < 1:
        parser.error(f"--distinct must be at least 1, got {args.distinct}")
    if args.distinct > 1 and (len(set(lens)) != 1 or args.distinct >= lens[0]):
        parser.error("--distinct needs a batched shape (equal lengths) longer than its value")
    p = make_inputs(lens, heads, device="cuda" if cuda else "cpu")
    out, final = torch.empty_like(p["v"]), torch.empty_like(p["initial_state"])
    # --distinct n: n views of the inputs, 0 .. n - 1 tokens shorter: n signatures, used in turn
    calls = []
    for cut in range(args.distinct):
        short = {n: p[n][:, : p[n].shape[1] - cut] for n in ("q", "k", "v", "g", "beta")}
        fwd_args = (short["q"], short["k"], short["v"], short["g"], short["beta"], 128**-0.5)
        fwd_args += (out[:, : out.shape[1] - cut], p["A_log"], p["dt_bias"], -5.0, p["initial_state"], final)
        calls.append(fwd_args + (p["cu_seqlens"],))
    turn = iter(range(1 << 62))

    def each(fn):  # fn(the next call's arguments)
        return lambda: fn(calls[next(turn) % len(calls)])

    rows = [("check_fwd (validation)", each(lambda a: dispatch.validated(*a, exact=args.exact)))]
    if cuda or args.mock_library:
        call = dispatch.validated(*calls[0], exact=args.exact)
        op = torch.ops.flash_kda.fwd  # what a torch.compile'd graph calls: no Python wrapper
        tail = (None, None, None, None, args.exact, None, False)  # indices .. max_seqlen, state_in_place
        rows = [
            ("flash_kda.fwd", each(lambda a: flash_kda.fwd(*a, exact=args.exact))),
            ("torch.ops.flash_kda.fwd (the op)", each(lambda a: op(*a, *tail))),
        ] + rows
        rows += [("dispatch.run_native (validated call)", lambda: dispatch.run_native(call))]
    if cuda:
        lib = _native.load()
        device = torch.device("cuda", torch.cuda.current_device())
        cc, num_sms = dispatch.device_facts(device.index)
        c_args, keep = dispatch.native_args(call, num_sms, 0, 0)
        workspace = torch.empty(lib.plan(c_args).workspace_bytes, dtype=torch.uint8, device=device)
        c_args.workspace, c_args.workspace_bytes = workspace.data_ptr(), workspace.numel()
        stream = torch.cuda.current_stream().cuda_stream
        rows += [("lib.fwd (C: checks, plan, launches)", lambda: lib.fwd(cc, c_args, stream))]
    mode = "exact" if args.exact else "automatic"
    where = "C library mocked" if args.mock_library else ("CUDA" if cuda else "CPU tensors")
    shapes = f", {args.distinct} token counts in turn" if args.distinct > 1 else ""
    print(
        f"{args.shape}{shapes}, {mode} path, {where}: host time per call in us "
        f"(median and p90 of {args.bursts} bursts x {args.burst} calls, synchronised between bursts):"
    )
    for name, fn in rows:
        median, p90 = host_us(fn, args.bursts, args.burst, cuda)
        print(f"  {name:40s} {median:8.1f} {p90:8.1f}", flush=True)


if __name__ == "__main__":
    main()
