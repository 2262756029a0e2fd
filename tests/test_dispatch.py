# SPDX-License-Identifier: MIT
"""The dispatcher: choose_path on simulated devices and builds, the real environment's
answers, a library that cannot load, and the once-per-(path, reason) INFO log."""

import contextlib
import ctypes
import logging
import os
import types

import flash_kda
import pytest
import torch
from conftest import call, clone_outputs, make_problem
from flash_kda import _native, dispatch, fallback, reference
from flash_kda._native import FEATURE_FWD, FEATURE_PROBES, ArchInfo

BOTH = FEATURE_FWD | FEATURE_PROBES
BUILD = [ArchInfo("sm_90a", 90, BOTH), ArchInfo("sm_100a", 100, BOTH)]
LOAD_ERROR = "cannot load /opt/x/libflash_kda.so: file not found"


def must_not_ask():
    raise AssertionError("fla_present was asked although the native path was taken")


class Asker:
    """A fla_present callable that records how often it is asked."""

    def __init__(self, answer):
        self.answer, self.calls = answer, 0

    def __call__(self):
        self.calls += 1
        return self.answer


def choose(cc, archs=BUILD, error=None, fla=True, switch=None, device="cuda"):
    return dispatch.choose_path(device, cc, archs, error, fla, switch)


@pytest.mark.parametrize("cc", [90, 100])
@pytest.mark.parametrize("switch", [None, "1", ""])
def test_native_when_the_build_has_the_arch(cc, switch):
    assert choose(cc, fla=must_not_ask, switch=switch) == ("native", f"native kernels for sm_{cc}")


@pytest.mark.parametrize("cc", [80, 89, 120])
@pytest.mark.parametrize(
    "fla, path, tail",
    [(True, "fla", "; using fla Triton"), (False, "torch", "; fla is not importable, using PyTorch")],
    ids=["fla", "no-fla"],
)
def test_arch_missing_from_the_build(cc, fla, path, tail):
    asker = Asker(fla)
    assert choose(cc, fla=asker) == (path, f"no kernel for sm_{cc} in this build (has sm_90a, sm_100a){tail}")
    assert asker.calls == 1


@pytest.mark.parametrize("archs", [[], [ArchInfo("sm_90a", 90, FEATURE_PROBES)]], ids=["empty", "probes-only"])
def test_tables_without_the_forward_do_not_count(archs):
    reason = "no kernel for sm_90 in this build (has none); using fla Triton"
    assert choose(90, archs=archs) == ("fla", reason)


@pytest.mark.parametrize("fla, path", [(True, "fla"), (False, "torch")])
def test_switch_zero_turns_native_off(fla, path):
    path_, reason = choose(90, fla=fla, switch="0", error=LOAD_ERROR)
    assert path_ == path
    assert reason.startswith("FLA_FLASH_KDA=0 turns the native kernels off; ")
    assert "native library unavailable" not in reason  # the switch is the reason given


@pytest.mark.parametrize(
    "fla, path, tail",
    [(True, "fla", "; using fla Triton"), (False, "torch", "; fla is not importable, using PyTorch")],
    ids=["fla", "no-fla"],
)
def test_library_that_cannot_load(fla, path, tail):
    assert choose(90, archs=[], error=LOAD_ERROR, fla=fla) == (path, f"native library unavailable: {LOAD_ERROR}{tail}")


@pytest.mark.parametrize("cc", [None, 90])
def test_cpu_always_takes_torch(cc):
    assert choose(cc, fla=must_not_ask, device="cpu") == ("torch", "cpu tensors run on the PyTorch path")


def test_backend_for_cpu(monkeypatch):
    assert flash_kda.backend_for("cpu") == "torch"
    monkeypatch.setenv(dispatch.ENV_SWITCH, "0")
    assert flash_kda.backend_for(torch.device("cpu")) == "torch"
    assert dispatch.explain("cpu") == ("torch", "cpu tensors run on the PyTorch path")


def archs_read_directly(path):
    """(name, cc) of every arch table, read from the library without flash_kda's loader."""

    class Desc(ctypes.Structure):
        _fields_ = [("name", ctypes.c_char_p), ("cc", ctypes.c_int32), ("features", ctypes.c_uint32)]

    lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    lib.flash_kda_arch_info.argtypes = [ctypes.c_int32, ctypes.POINTER(Desc)]
    result = []
    for i in range(lib.flash_kda_num_archs()):
        desc = Desc()
        assert lib.flash_kda_arch_info(i, ctypes.byref(desc)) == 0
        result.append((desc.name.decode(), desc.cc))
    return result


def test_compiled_archs_match_the_library():
    if _native.load() is None:
        pytest.skip(f"the native library is not loadable here: {_native.load_error()}")
    archs = flash_kda.compiled_archs()
    assert archs and all(isinstance(a, str) for a in archs)
    direct = archs_read_directly(_native.load().path)
    assert ["sm_" + a for a in archs] == [name for name, _ in direct]
    assert all(name.startswith(f"sm_{cc}") for name, cc in direct)


@contextlib.contextmanager
def library_at(path):
    """flash_kda with FLASH_KDA_LIBRARY=path, reloaded; the real library is restored after."""
    old = os.environ.get(_native.LIBRARY_ENV)
    os.environ[_native.LIBRARY_ENV] = str(path)
    _native._reset_for_tests()
    try:
        yield
    finally:
        if old is None:
            del os.environ[_native.LIBRARY_ENV]
        else:
            os.environ[_native.LIBRARY_ENV] = old
        _native._reset_for_tests()


@pytest.fixture(params=["missing", "not-elf"])
def broken_library(request, tmp_path):
    path = tmp_path / "libflash_kda.so"
    if request.param == "not-elf":
        path.write_bytes(b"this is not a shared object\n")
    with library_at(path):
        yield str(path)


def test_unloadable_library_is_a_reason_not_an_error(broken_library):
    assert flash_kda.compiled_archs() == []
    assert _native.load() is None
    error = _native.load_error()
    assert error.startswith(f"cannot load {broken_library}: ")
    assert flash_kda.backend_for("cpu") == "torch"
    # workspace size still answers (from the mirrored formula)
    assert flash_kda.get_workspace_size(64, 2, 1) > 0


def test_cpu_fwd_works_without_the_library(broken_library):
    p = make_problem(1, 8, 2, final=torch.float32)
    expected = clone_outputs(p)
    call(reference.fwd, expected)
    call(flash_kda.fwd, p)
    assert _native.load() is None
    assert torch.equal(p["out"], expected["out"]) and torch.equal(p["final_state"], expected["final_state"])
    assert not torch.isnan(p["out"]).any()


def test_library_is_restored_after_a_broken_one(tmp_path):
    before = (flash_kda.compiled_archs(), _native.load_error())
    with library_at(tmp_path / "missing.so"):
        assert flash_kda.compiled_archs() == [] and "missing.so" in _native.load_error()
    assert (flash_kda.compiled_archs(), _native.load_error()) == before


def test_info_log_once_per_path_and_reason(caplog, monkeypatch):
    monkeypatch.setattr(dispatch, "_logged", set())
    caplog.set_level(logging.INFO, logger="flash_kda")
    p = make_problem(1, 4, 2)
    call(flash_kda.fwd, p)
    call(flash_kda.fwd, clone_outputs(p))
    records = [r for r in caplog.records if r.name == "flash_kda"]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    assert records[0].getMessage() == "flash_kda.fwd on cpu -> torch (cpu tensors run on the PyTorch path)"
    # another (path, reason) is logged once more; a repeat is not
    dispatch._log_once("cuda:0", "fla", "no kernel for sm_89")
    dispatch._log_once("cuda:0", "fla", "no kernel for sm_89")
    assert len([r for r in caplog.records if r.name == "flash_kda"]) == 2


def test_unloadable_library_on_a_gpu_is_logged_as_a_warning(caplog, monkeypatch):
    monkeypatch.setattr(dispatch, "_logged", set())
    reason = dispatch.choose_path("cuda", 90, [], "cannot load /x/libflash_kda.so: missing", False, None)[1]
    with caplog.at_level(logging.INFO, logger="flash_kda"):
        dispatch._log_once("cuda:0", "torch", reason)
        dispatch._log_once("cuda:0", "torch", reason)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "cannot load /x/libflash_kda.so" in caplog.records[0].getMessage()


# ------------------------------------------------------------------ hardening


@pytest.mark.parametrize("value", ["1", "", " 0", "0 ", "00", "false", "off", "0\n"])
def test_fla_flash_kda_parsed_like_fla(monkeypatch, value):
    """Native is off iff FLA_FLASH_KDA is exactly "0", fla's own rule for its backend."""
    monkeypatch.setenv(dispatch.ENV_SWITCH, value)
    fla_enabled = os.environ.get("FLA_FLASH_KDA", "1") != "0"  # fla/backends.py BaseBackend.is_enabled
    assert fla_enabled
    assert choose(90, fla=must_not_ask, switch=os.environ.get(dispatch.ENV_SWITCH))[0] == "native"
    monkeypatch.setenv(dispatch.ENV_SWITCH, "0")
    assert choose(90, switch=os.environ.get(dispatch.ENV_SWITCH))[0] == "fla"


def test_backend_for_cuda_on_cpu_only_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:1", torch.device("cuda", 0)):
        path, reason = dispatch.explain(device)
        assert (path, flash_kda.backend_for(device)) == ("torch", "torch")
        assert reason.startswith("CUDA is not available to this torch (torch.cuda.is_available() is False)")


@pytest.mark.parametrize("device", ["xyz", "cuda:-1:0", "", 1.5, None])
def test_backend_for_unparsable_device_is_a_value_error(device):
    with pytest.raises(ValueError, match=r"flash_kda\.backend_for: device must be a torch\.device or a device string"):
        flash_kda.backend_for(device)


class FakeLibrary:
    """The facts explain() asks a loaded library for."""

    def __init__(self, runtime, driver, archs=BUILD):
        self.archs, self.versions = archs, (runtime, driver)

    def cuda_versions(self):
        return self.versions


@pytest.fixture
def simulated_gpu(monkeypatch):
    """An sm_90 GPU with fla present; returns a function installing a library with given
    CUDA runtime and driver versions."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(dispatch, "device_facts", lambda index: (90, 132))
    monkeypatch.setattr(fallback, "fla_available", lambda: True)
    monkeypatch.setattr(_native, "load_error", lambda: None)
    monkeypatch.delenv(dispatch.ENV_SWITCH, raising=False)
    monkeypatch.setattr(dispatch, "_logged", set())

    def install(runtime, driver):
        monkeypatch.setattr(_native, "load", lambda: FakeLibrary(runtime, driver))

    return install


OLD_DRIVER = "CUDA driver 12.8 is older than the CUDA 13.0 runtime this library was built with; using fla Triton"


def test_old_driver_takes_the_fallback_with_one_warning(simulated_gpu, caplog):
    simulated_gpu(13000, 12080)
    assert dispatch.explain("cuda:0") == ("fla", OLD_DRIVER)
    assert choose(90, archs=BUILD, switch=None, fla=True) == ("native", "native kernels for sm_90")
    assert dispatch.choose_path("cuda", 90, BUILD, None, True, None, (13000, 12080)) == ("fla", OLD_DRIVER)
    with caplog.at_level(logging.INFO, logger="flash_kda"):
        for _ in range(3):
            dispatch._log_once("cuda:0", *dispatch.explain("cuda:0"))
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert OLD_DRIVER in caplog.records[0].getMessage()


@pytest.mark.parametrize("runtime,driver", [(12090, 12080), (12090, 13000), (13000, 13010)])
def test_driver_of_the_runtime_major_version_runs_native(simulated_gpu, runtime, driver):
    simulated_gpu(runtime, driver)
    assert dispatch.explain("cuda") == ("native", "native kernels for sm_90")


@pytest.mark.parametrize(
    "runtime,driver,switch,checkpoints,tokens",
    [(13000, 13000, None, 0, True), (13000, 12080, None, 0, True), (13000, 13000, "0", 0, True),
     (13000, 13000, "0", 16, True), (13000, 13000, "0", 0, False), (13000, 13000, None, 0, False)],
    ids=["native", "old-driver", "switch-off", "switch-off-checkpoints", "switch-off-no-tokens", "native-no-tokens"],
)  # fmt: skip
def test_run_takes_the_path_explain_gives_for_a_cuda_call(simulated_gpu, monkeypatch, runtime, driver, switch,
                                                          checkpoints, tokens):  # fmt: skip
    """run() leaves out explain's availability checks for a call whose tensors are on a CUDA
    device; the path and reason it runs and logs are still explain's (fla turned to torch for
    checkpoints and for calls without tokens, the state copy alone): native, fla for an old
    driver or the switch, torch for the switch with checkpoints or without tokens."""
    simulated_gpu(runtime, driver)
    if switch is not None:
        monkeypatch.setenv(dispatch.ENV_SWITCH, switch)
    taken, logged = [], []
    monkeypatch.setattr(dispatch, "run_native", lambda c: taken.append(dispatch.NATIVE))
    monkeypatch.setattr(fallback, "fla_fwd", lambda c: taken.append(dispatch.FLA))
    monkeypatch.setattr(fallback, "torch_fwd", lambda c: taken.append(dispatch.TORCH))
    monkeypatch.setattr(dispatch, "_log_once", lambda device, path, reason: logged.append((path, reason)))
    cuda_call = types.SimpleNamespace(
        device=torch.device("cuda", 0), checkpoint_every=checkpoints, has_tokens=tokens, default_forms=True
    )
    dispatch.run(cuda_call)
    path, reason = dispatch.explain("cuda:0")
    if path == dispatch.FLA and checkpoints:
        path, reason = dispatch.TORCH, f"{reason}; {dispatch._CHECKPOINTS}"
    elif path == dispatch.FLA and not tokens:
        path, reason = dispatch.TORCH, f"{reason}; {dispatch._NO_TOKENS}"
    assert taken == [path] and logged == [(path, reason)]


def test_cpu_path_never_loads_the_library():
    _native._reset_for_tests()
    try:
        p = make_problem(1, 20, 1, final=torch.float32)
        call(flash_kda.fwd, p)
        assert flash_kda.backend_for("cpu") == "torch"
        assert not _native._state["loaded"], "the PyTorch path loaded the native library"
    finally:
        _native._reset_for_tests()
