# SPDX-License-Identifier: MIT
"""ci/resource_summary.py --check: any spill on any arch fails."""

import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "resource_summary", os.path.join(HERE, "..", "ci", "resource_summary.py")
)
summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summary)

STATES = "_ZN9flash_kda5sm90a17recurrence_kernelILi2ELi8ELNS_8PassCodeE2ELi1EEEvNS_9FwdParamsE14CUtensorMap_st"
OTHER = "_ZN9flash_kda5sm90a17recurrence_kernelILi1ELi8ELNS_8PassCodeE2ELi1EEEvNS_9FwdParamsE14CUtensorMap_st"


def log(path, entries):
    """A build log of ptxas -v lines: (mangled name, arch, spill stores, spill loads) each."""
    lines = []
    for name, arch, stores, loads in entries:
        lines += [
            f"ptxas info    : Compiling entry function '{name}' for '{arch}'",
            f"    0 bytes stack frame, {stores} bytes spill stores, {loads} bytes spill loads",
            "ptxas info    : Used 96 registers, used 1 barriers",
        ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


LEAVING = "_ZN9flash_kda5sm90a22prepare_overlap_kernelILi1ELNS_11RecordOrderE1ELNS0_9K1VariantE2ELNS0_7K1PlaceE1EEEvNS_9FwdParamsE"


def test_kernel_names():
    assert summary.kernel_name(STATES) == "recurrence_kernel<2, 8, kStates, 1>"
    assert summary.kernel_name(OTHER) == "recurrence_kernel<1, 8, kStates, 1>"
    leaving = "prepare_overlap_kernel<1, RecordOrder::kTiles, K1Variant::kUnbounded, K1Place::kLeaving>"
    assert summary.kernel_name(LEAVING) == leaving
    beside = "prepare_overlap_kernel<1, RecordOrder::kTiles, K1Variant::kUnbounded>"
    assert summary.kernel_name(LEAVING.replace("K1PlaceE1E", "K1PlaceE0E")) == beside
    first = LEAVING.replace("22prepare_overlap_kernel", "14prepare_kernel").replace("7K1PlaceE1E", "8GateLoadE{}E")
    assert summary.kernel_name(first.format(0)) == "prepare_kernel<1, RecordOrder::kTiles, K1Variant::kUnbounded>"
    fp32_g = "prepare_kernel<1, RecordOrder::kTiles, K1Variant::kUnbounded, GateLoad::kBeforeWait>"
    assert summary.kernel_name(first.format(1)) == fp32_g


def test_check_passes_without_spills(tmp_path):
    clean = [(STATES, "sm_90a", 0, 0), (OTHER, "sm_90a", 0, 0), (STATES.replace("5sm90a", "6sm100a"), "sm_100a", 0, 0)]
    assert summary.main([log(tmp_path / "a.log", clean), "--check"]) == 0


def test_check_fails_on_any_spill(tmp_path):
    spills = [
        (STATES, "sm_90a", 16, 12),
        (STATES, "sm_90a", 0, 4),
        (STATES.replace("5sm90a", "6sm100a"), "sm_100a", 4, 4),
        (OTHER, "sm_90a", 4, 0),
    ]
    for i, entry in enumerate(spills):
        assert summary.main([log(tmp_path / f"s{i}.log", [entry]), "--check"]) == 1
    # Without --check the summary reports and succeeds.
    assert summary.main([log(tmp_path / "n.log", spills)]) == 0
