# SPDX-License-Identifier: MIT
"""flash_kda.distributed with the native kernels: the cases of cp_cases.py (and its GPU
cases) run by four processes that share the one GPU through a gloo group, launched with
torchrun, against the one-process call and the fp64 gold; in exact mode a sequence that
crosses one boundary at a chunk boundary gives the one-process call's bits."""

import cp_cases
import pytest
import torch
from conftest import assert_bitwise
from cp_cases import CASES, EXACT, GPU_CASES, bounds_of, owner
from test_distributed import check_case, check_fla_states, one_process, run_workers, slot_of

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("native_gpu")]
ALL = CASES + GPU_CASES


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_workers(tmp_path_factory.mktemp("cp"), "cuda", "--gpu-cases")


@pytest.mark.parametrize("case", ALL, ids=[c.name for c in ALL])
def test_ranks_match_the_one_process_call(results, case):
    check_case(case, results[case.name], "cuda")
    if case.fla:
        check_fla_states(case, results[case.name], "cuda")


def test_exact_mode_one_crossing_at_a_chunk_boundary_is_bitwise(results):
    """Rank 1 starts 10 chunks into sequence 0 from the state rank 0's exact run ended
    with, so its chunks, and every bit, are the one-process call's."""
    runs = results[EXACT.name]
    single_out, single_final = one_process(EXACT, cp_cases.problem(EXACT, "cuda"))
    out = torch.cat([run[0]["out"] for run in runs], dim=1)
    total = bounds_of(EXACT)[-1]
    assert_bitwise(out[:, :total], single_out[:, :total].cpu(), "out")
    for row in range(len(EXACT.lens)):
        got = runs[owner(EXACT, row)][0]["final"][slot_of(EXACT, row)]
        assert_bitwise(got, single_final[row].cpu(), f"final state {row}")


def test_the_fla_contexts_are_fla_s():
    """The workers' fla contexts have the fields fla's own builder gives (fla imports here)."""
    context = pytest.importorskip("fla.ops.cp.context")
    case = next(c for c in CASES if c.fla)
    cu = torch.tensor(bounds_of(case))
    for rank in range(len(case.ranks)):
        ours = cp_cases.fla_context(case, rank, None, "cpu")
        theirs = context.get_cp_cu_seqlens(cu, cu_seqlens_cpu=cu, world_size=len(case.ranks), rank=rank)
        assert theirs.cu_seqlens_cpu.tolist() == ours.cu_seqlens_cpu.tolist(), rank
        assert (theirs.pre_num_ranks, theirs.post_num_ranks) == (ours.pre_num_ranks, ours.post_num_ranks), rank
        assert theirs.layout == ours.layout
