# SPDX-License-Identifier: MIT
"""Host (CPU) time of one eager forward, split by layer: where an eager call that does little
GPU work spends its time. Diagnostics, not a table:

    python benchmarks/bench_host.py [--shape 8x1024-H8] [--calls 2000]

Each row is a CPU-bound loop (no synchronisation inside; the GPU work of the calls is queued
behind) over one layer, outermost first: the public ``flash_kda.fwd``; validation alone
(``check_fwd``); the native call of a validated call (``dispatch.run_native``: argument
struct, workspace, stream, the C library); the C entry alone (``lib.fwd``: checks, plan and
kernel launches). Without a CUDA device only validation is timed (on CPU tensors).
"""

import argparse
import time

import torch
from bench_fwd import SHAPES, make_inputs


def per_call_us(fn, calls):
    for _ in range(min(100, calls)):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="8x1024-H8", help="a shape id of bench_fwd.py")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--exact", action="store_true", help="the exact path (default: automatic)")
    args = parser.parse_args()
    import flash_kda
    from flash_kda import _native, dispatch

    lens, heads = SHAPES[args.shape]
    p = make_inputs(lens, heads, device="cuda" if torch.cuda.is_available() else "cpu")
    out, final = torch.empty_like(p["v"]), torch.empty_like(p["initial_state"])
    fwd_args = (p["q"], p["k"], p["v"], p["g"], p["beta"], 128**-0.5, out, p["A_log"], p["dt_bias"], -5.0)
    fwd_args += (p["initial_state"], final, p["cu_seqlens"])
    rows = [("check_fwd (validation)", lambda: dispatch.validated(*fwd_args, exact=args.exact))]
    if torch.cuda.is_available():
        call = dispatch.validated(*fwd_args, exact=args.exact)
        lib = _native.load()
        device = torch.device("cuda", torch.cuda.current_device())
        cc, num_sms = dispatch.device_facts(device.index)
        c_args, keep = dispatch.native_args(call, num_sms, 0, 0)
        workspace = torch.empty(lib.plan(c_args).workspace_bytes, dtype=torch.uint8, device=device)
        c_args.workspace, c_args.workspace_bytes = workspace.data_ptr(), workspace.numel()
        stream = torch.cuda.current_stream().cuda_stream
        rows = [("flash_kda.fwd", lambda: flash_kda.fwd(*fwd_args, exact=args.exact))] + rows
        rows += [
            ("dispatch.run_native (validated call)", lambda: dispatch.run_native(call)),
            ("lib.fwd (C: checks, plan, launches)", lambda: lib.fwd(cc, c_args, stream)),
        ]
    mode = "exact" if args.exact else "automatic"
    print(f"{args.shape}, {mode} path, host time per call (us, {args.calls} calls):")
    for name, fn in rows:
        print(f"  {name:40s} {per_call_us(fn, args.calls):8.1f}", flush=True)


if __name__ == "__main__":
    main()
