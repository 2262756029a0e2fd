# SPDX-License-Identifier: MIT
"""ci/resource_summary.py --check: any spill fails but the one known spill within its bytes."""

import importlib.util
import os

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "resource_summary", os.path.join(HERE, "..", "ci", "resource_summary.py")
)
summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summary)

KNOWN = "_ZN9flash_kda5sm90a17recurrence_kernelILi2ELi8ELNS_8PassCodeE2ELi1EEEvNS_9FwdParamsE14CUtensorMap_st"
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


def test_the_kernel_names_match_the_known_spill():
    assert summary.kernel_name(KNOWN) == "recurrence_kernel<2, 8, kStates, 1>"
    assert ("sm_90a", summary.kernel_name(KNOWN)) in summary.KNOWN_SPILLS


def test_check_passes_without_spills_and_with_the_known_spill(tmp_path):
    stores, loads = summary.KNOWN_SPILLS[("sm_90a", summary.kernel_name(KNOWN))][0]
    assert summary.main([log(tmp_path / "a.log", [(KNOWN, "sm_90a", 0, 0)]), "--check"]) == 0
    assert summary.main([log(tmp_path / "b.log", [(KNOWN, "sm_90a", stores, loads)]), "--check"]) == 0


def test_check_fails_on_any_other_spill(tmp_path):
    stores, loads = summary.KNOWN_SPILLS[("sm_90a", summary.kernel_name(KNOWN))][0]
    grown = [(KNOWN, "sm_90a", stores + 4, loads), (KNOWN, "sm_90a", stores, loads + 4)]
    for i, entry in enumerate(grown):
        assert summary.main([log(tmp_path / f"g{i}.log", [entry]), "--check"]) == 1
    elsewhere = [(KNOWN.replace("5sm90a", "6sm100a"), "sm_100a", 4, 4), (OTHER, "sm_90a", 4, 4)]
    for i, entry in enumerate(elsewhere):
        assert summary.main([log(tmp_path / f"e{i}.log", [entry]), "--check"]) == 1
    # Without --check the summary reports and succeeds.
    assert summary.main([log(tmp_path / "n.log", elsewhere)]) == 0
