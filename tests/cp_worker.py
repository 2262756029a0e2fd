# SPDX-License-Identifier: MIT
"""One rank of the context-parallel cases (tests/cp_cases.py), launched by torchrun:

    python -m torch.distributed.run --nproc_per_node 4 tests/cp_worker.py OUT [--device cuda]

Every rank joins a gloo group (several processes may share one GPU), runs each case it
takes part in twice with fresh outputs, and once every rank is done saves what it wrote to
OUT/<case>-<rank>.pt. A watchdog ends a rank that runs past ``--seconds`` (its threads'
stacks on stderr), and gloo's own timeout is as long, so no rank can outlive a launch.
"""

import argparse
import datetime
import faulthandler

import cp_cases
import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--gpu-cases", action="store_true", help="also run cp_cases.GPU_CASES")
    parser.add_argument("--seconds", type=float, default=150.0, help="the watchdog's limit")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.seconds, exit=True)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.seconds))
    me = dist.get_rank()
    cases = cp_cases.CASES + (cp_cases.GPU_CASES if args.gpu_cases else [])
    groups = {}
    for case in cases:  # every process creates every group, in the same order
        if case.ranks not in groups:
            groups[case.ranks] = (
                None if case.ranks == tuple(range(dist.get_world_size())) else dist.new_group(list(case.ranks))
            )
    written = {}
    with torch.inference_mode():
        for case in cases:
            if me not in case.ranks:
                continue
            rank = case.ranks.index(me)
            p = cp_cases.problem(case, args.device)
            written[f"{case.name}-{rank}"] = [cp_cases.run_rank(case, p, rank, groups[case.ranks]) for _ in range(2)]
    dist.barrier()
    for name, runs in written.items():
        torch.save(runs, f"{args.out}/{name}.pt")
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
