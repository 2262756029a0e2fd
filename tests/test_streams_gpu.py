# SPDX-License-Identifier: MIT
"""The same bits whatever runs beside the forward on other streams (design §4.5).

A serving engine keeps other streams busy (communication, sampling, other layers), and the
GPU places their CTAs on the SMs the forward's passes run on. Each case makes one call on a
quiet GPU, then calls with a side stream keeping memory-bound elementwise kernels queued
before and after them, and asks for the quiet call's bits every time. Before each stage
release of the recurrence carried a proxy fence (numerics.cuh release_stage), such
neighbours made fragment loads issued just before a release read part of the next chunk's
bytes on the H200: 19 of 20 calls with 32-token chunks and K1 first gave other output
rows, and 1 in 60 segmented calls."""

import pytest
import torch
from conftest import FWD_ARGS, assert_bitwise, clone_outputs, make_problem
from flash_kda import testing

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("native_gpu")]
DEV = "cuda"
NOISY_CALLS = 8
NEIGHBOURS = 12  # elementwise kernels queued on the side stream before and after each call

CASES = [
    # (id, T, H, exact, run_native keywords): each schedule of the recurrence, mostly with K1
    # first, so that the pass's SMs keep room for the neighbours' CTAs.
    ("chunk32-bv32", 2048, 24, False, dict(chunk_tokens=32, overlap=-1, block_v=32)),
    ("chunk32-k1-beside", 2048, 24, False, dict(chunk_tokens=32, overlap=1, block_v=32)),
    ("chunk32-bv64", 2048, 24, False, dict(chunk_tokens=32, overlap=-1, block_v=64)),
    ("segments", 8192, 12, False, dict()),  # the plan's segments: streamed rerun, 16 tokens
    ("exact-latency-bound", 8192, 6, True, dict(overlap=-1)),  # <1, 4>: fragments a link ahead
    ("exact-streamed", 2048, 24, True, dict(overlap=-1, block_v=128)),
]


@pytest.fixture(scope="module")
def neighbours():
    """A side stream and a 256 MB buffer that its elementwise kernels read and write."""
    return torch.cuda.Stream(), torch.empty(64 << 20, device=DEV).normal_()


def forward(p, exact, native, stream, busy=None):
    """The native forward on a copy of p on `stream`; with `busy` = (side stream, buffer), that
    stream's kernels run before and after it. Returns the outputs after a device sync."""
    got = clone_outputs(p)
    call = testing.validated(*[got[name] for name in FWD_ARGS], exact=exact)
    torch.cuda.synchronize()

    def queue_neighbours():
        if busy is not None:
            with torch.cuda.stream(busy[0]):
                for _ in range(NEIGHBOURS):
                    busy[1].mul_(1.0000001)

    queue_neighbours()
    with torch.cuda.stream(stream):
        testing.run_native(call, **native)
    queue_neighbours()
    torch.cuda.synchronize()
    return got


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bits_do_not_depend_on_other_streams_kernels(case, neighbours):
    _, seqlen, heads, exact, native = case
    p = make_problem(1, seqlen, heads, initial=torch.bfloat16, final=torch.bfloat16, device=DEV, seed=31)
    stream = torch.cuda.Stream()
    quiet = forward(p, exact, native, stream)
    for _ in range(NOISY_CALLS):
        got = forward(p, exact, native, stream, busy=neighbours)
        assert_bitwise(got["out"], quiet["out"], "out")
        assert_bitwise(got["final_state"], quiet["final_state"], "final_state")
