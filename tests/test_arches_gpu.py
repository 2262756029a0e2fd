# SPDX-License-Identifier: MIT
"""Every arch's code path on the GPU at hand (flash_kda.testing's modes): the other arches'
passes (generic: recurrence_kernel everywhere, records in fragment order), sm_120's and
sm_100's limits simulated, the device facts the plan takes, the launch record, and a planted
stall that must end in an error rather than a hang.

Exact mode gives FlashKDA's bits whichever passes run, so each mode's out and final state must
equal the default path's bit for bit (and the reference's); AUTO calls are compared with their
plan forced, so that both modes run the same segments and chunk length.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import assert_bitwise, call, check, clone_outputs, make_problem
from flash_kda import reference, testing

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("native_gpu")]
DEV = "cuda"
MODES = ("generic", "sm120", "sm100")

# (id, batch, seqlen, heads, lens, fwd keywords, forced plan)
CASES = [
    ("exact-bv32", 2, 300, 3, None, dict(exact=True), dict(block_v=32)),
    ("exact-bv64", 1, 700, 4, None, dict(exact=True), dict(block_v=64)),
    ("exact-bv128", 1, 500, 2, None, dict(exact=True), dict(block_v=128)),
    ("exact-plan", 1, 1024, 6, None, dict(exact=True), {}),
    ("exact-varlen", 1, 0, 3, [200, 0, 77, 1, 140], dict(exact=True), {}),
    ("exact-k1-beside", 1, 900, 2, None, dict(exact=True), dict(block_v=32, overlap=1)),
    ("exact-k1-leaving", 1, 900, 2, None, dict(exact=True), dict(block_v=64, overlap=2)),
    ("exact-k1-lead-grid", 4, 2048, 24, None, dict(exact=True), dict(block_v=128, overlap=2)),
    ("auto-seg-bv64", 1, 1000, 2, None, dict(exact=False), dict(block_v=64, segment_chunks=8)),
    ("auto-seg-bv128", 1, 1000, 2, None, dict(exact=False), dict(block_v=128, segment_chunks=6)),
    ("auto-seg-varlen", 1, 0, 2, [300, 0, 95, 500], dict(exact=False), dict(block_v=64, segment_chunks=4)),
    ("auto-32-bv32", 1, 640, 3, None, dict(exact=False), dict(block_v=32, chunk_tokens=32)),
    ("auto-32-bv64", 1, 640, 3, None, dict(exact=False), dict(block_v=64, chunk_tokens=32)),
]


def _problem(batch, seqlen, heads, lens, seed=7):
    return make_problem(batch, seqlen, heads, lens=lens, initial=torch.float32, final=torch.float32, device=DEV,
                        seed=seed)  # fmt: skip


def _run(p, keywords, forced, mode):
    """p's out and final state from the native path in test mode `mode` with the plan forced."""
    q = clone_outputs(p)
    testing.run_native(check(q, **keywords), **forced, **testing.mode_overrides(mode))
    torch.cuda.synchronize()
    return q["out"], q["final_state"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_mode_gives_the_default_paths_bits(case, mode):
    name, batch, seqlen, heads, lens, keywords, forced = case
    p = _problem(batch, seqlen, heads, lens)
    out, final = _run(p, keywords, forced, "default")
    mode_out, mode_final = _run(p, keywords, forced, mode)
    assert_bitwise(mode_out, out, f"{mode} out")
    assert_bitwise(mode_final, final, f"{mode} final_state")


@pytest.mark.parametrize("mode", ("generic", "sm120"))
def test_generic_passes_give_the_references_bits(mode):
    p = _problem(1, 700, 3, None, seed=11)
    out, final = _run(p, dict(exact=True), dict(block_v=64), mode)
    ref = clone_outputs(p)
    call(reference.fwd, ref)
    assert_bitwise(out, ref["out"], f"{mode} out vs reference")
    assert_bitwise(final, ref["final_state"], f"{mode} final_state vs reference")


@pytest.mark.parametrize("mode", ("default", *MODES))
def test_the_device_facts_are_the_modes_reference_device(mode):
    """What the launch code finds on this GPU in each mode is the reference device the plan
    is evaluated with on the CPU (src/costs.h), the SM count aside."""
    if (
        torch.cuda.get_device_capability(DEV) != (9, 0)
        or torch.cuda.get_device_properties(DEV).multi_processor_count != 132
    ):
        pytest.skip("the reference devices are what an H200 reports")
    facts = testing.device_facts(**testing.mode_overrides(mode))
    reference_row = testing.reference_device(testing.MODE_DEVICES[mode])
    for name in ("sms", "compute_capability"):  # the row's own (the device's are the H200's)
        facts.pop(name), reference_row.pop(name)
    assert facts == reference_row


def _launched(p, keywords, forced, mode):
    return testing.launched(check(clone_outputs(p), **keywords), **forced, **testing.mode_overrides(mode))


def test_sm120s_limits_give_its_ring_depths_combine_and_k1():
    """Under sm_120's limits (99 KB a block, 100 KB and 1,536 threads an SM) the passes get
    sm_120's rings, the combine two stages, and no K1 CTA fits beside a pass."""
    p = _problem(1, 1000, 2, None)
    seg = _launched(p, dict(exact=False), dict(block_v=128, segment_chunks=8), "sm120")
    stages = {k["name"]: k["stages"] for k in seg}
    assert stages["recurrence_kernel<2, 8, kStates, 1>"] == 2, seg
    assert stages["recurrence_kernel<2, 8, kGeneral, 1>"] == 5, seg
    assert 2 in (stages.get("combine_kernel<16>"), stages.get("combine_kernel<8>")), seg
    seg64 = _launched(p, dict(exact=False), dict(block_v=64, segment_chunks=8), "sm120")
    stages64 = {k["name"]: k["stages"] for k in seg64}
    assert stages64["recurrence_kernel<1, 8, kStates, 1>"] == 3, seg64
    assert stages64["recurrence_kernel<1, 8, kGeneral, 1>"] == 3, seg64  # unpaired releases
    whole = _launched(p, dict(exact=True), dict(block_v=64, overlap=1), "sm120")
    names = [k["name"] for k in whole]
    assert "recurrence_kernel<1, 8, kPlain, 1>" in names and not any("warpgroup" in n for n in names), whole
    facts = testing.device_facts(**testing.mode_overrides("sm120"))
    assert facts["k1_beside"] == [[0, 0, 0], [0, 0, 0]] and facts["k1_alone"] == [6, 1], facts


STALL = textwrap.dedent(
    """
    import sys, time
    import torch
    sys.path.insert(0, {tests!r})
    from conftest import check, make_problem
    from flash_kda import testing
    p = make_problem(1, 2048, 2, device="cuda", seed=3)
    start = time.monotonic()
    try:
        testing.run_native(check(p, exact=True), block_v=32, stall=1, wait_limit_ns=500_000_000,
                           **testing.mode_overrides({mode!r}))
        torch.cuda.synchronize()
    except Exception as e:
        print(f"ERROR after {{time.monotonic() - start:.1f}} s: {{type(e).__name__}}: {{e}}", flush=True)
        sys.exit(3)
    print("NO ERROR", flush=True)
    """
)


@pytest.mark.skipif(
    not testing.debug_waits(), reason="the planted stall needs a library built with FLASH_KDA_DEBUG_WAITS=ON"
)
@pytest.mark.parametrize("mode", ("default", "generic"))
def test_a_planted_stall_ends_in_an_error_not_a_hang(mode):
    """A producer that never arms its first stage (testing's `stall`) leaves its consumers
    and itself waiting for ever; the bounded waits (wait_limit_ns 0.5 s here) end the kernel
    with a trap, which the call's synchronisation reports. A trap poisons the CUDA context, so
    the call runs in a process of its own."""
    tests = os.path.dirname(os.path.abspath(__file__))
    script = STALL.format(tests=tests, mode=mode)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3 and "ERROR after" in done.stdout, done.stdout + done.stderr
    seconds = float(done.stdout.split("ERROR after ")[1].split(" s")[0])
    assert seconds < 30, done.stdout


@pytest.mark.skipif(testing.debug_waits(), reason="a debug build (FLASH_KDA_DEBUG_WAITS=ON) runs the planted stall")
def test_a_release_build_refuses_the_planted_stall():
    """A release build's kernels carry no planted stall and no bounded waits: asking for the
    stall is an error before anything launches, which names the build option."""
    p = make_problem(1, 256, 2, device=DEV, seed=3)
    with pytest.raises(RuntimeError, match="FLASH_KDA_DEBUG_WAITS=ON"):
        testing.run_native(check(p, exact=True), block_v=32, stall=1)
