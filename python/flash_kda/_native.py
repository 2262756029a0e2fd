# SPDX-License-Identifier: MIT
"""Find, load and describe ``libflash_kda.so`` (the C ABI of ``flash_kda.h``).

Standard library only: importing this module loads nothing. :func:`load` opens the
library beside the package once, declares every export's argument types, checks the ABI
version and lists the compiled arch tables. A library that cannot be used becomes a
stored reason (:func:`load_error`), never an exception, so callers can fall back.
"""

import ctypes
import os
import struct
import threading
from typing import NamedTuple, Optional

ABI_VERSION = 8
TESTING_VERSION = 6  # flash_kda_testing.h
LIBRARY_NAME = "libflash_kda.so"
LIBRARY_ENV = "FLASH_KDA_LIBRARY"  # optional override of the library path, read at load
SWITCH_ENV = "FLA_FLASH_KDA"  # "0" turns the native path off (as it turns off fla's FlashKDA backend)

FEATURE_FWD = 1
FEATURE_PROBES = 2
FEATURE_GATE_FORMS = 4  # the table runs every gate and beta form (flash_kda.h)
FEATURE_STABLE_INVERSE = 8  # the table's AUTO mode takes the stable inverse

DTYPE_NONE, DTYPE_BF16, DTYPE_FP32, DTYPE_INT32, DTYPE_INT64 = 0, 1, 2, 3, 4
MODE_EXACT, MODE_AUTO = 0, 1
PROBE_EX2, PROBE_SIGMOID, PROBE_RSQRT, PROBE_LG2 = 0, 1, 2, 3
GATE_CODES = {"lower_bound": 0, "softplus": 1, "log_decay": 2}  # flash_kda_gate
BETA_LOGIT, BETA_PROBABILITY = 0, 1  # flash_kda_beta
PROBE_MMA_BF16_F32, PROBE_MMA_F16_F16 = 0, 1

STATUS_INVALID_ARGUMENT = 1
_STATUS_NAMES = {0: "OK", 1: "INVALID_ARGUMENT", 2: "UNSUPPORTED_DEVICE", 3: "CUDA_ERROR", 4: "INTERNAL"}

_i32, _i64, _u32, _f64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32, ctypes.c_double
_ptr = ctypes.c_void_p


class NativeError(RuntimeError):
    """A call the library refused or failed (its message); ``status`` is its
    ``flash_kda_status`` (``STATUS_INVALID_ARGUMENT`` for an argument)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class ArchInfo(NamedTuple):
    """One compiled arch table: ``name`` like ``"sm_90a"``, ``compute_capability`` like 90."""

    name: str
    compute_capability: int
    features: int

    @property
    def short_name(self) -> str:
        """``"90a"`` for ``"sm_90a"``."""
        return self.name[3:] if self.name.startswith("sm_") else self.name


class _ArchDesc(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("compute_capability", _i32), ("features", _u32)]


class Strides(ctypes.Structure):
    """``flash_kda_strides``: element strides of [B, T, H, ...]; all zero = contiguous."""

    _fields_ = [("batch", _i64), ("token", _i64), ("head", _i64)]


class FwdArgs(ctypes.Structure):
    """``flash_kda_fwd_args`` (flash_kda.h); device pointers are plain integers."""

    _fields_ = [
        ("struct_size", _u32),
        ("reserved0", _i32),
        ("batch", _i64),
        ("seqlen", _i64),
        ("heads", _i64),
        ("head_dim", _i64),
        ("num_seqs", _i64),
        ("q", _ptr),
        ("k", _ptr),
        ("v", _ptr),
        ("g", _ptr),
        ("beta", _ptr),
        ("out", _ptr),
        ("A_log", _ptr),
        ("dt_bias", _ptr),
        ("scale", _f64),
        ("lower_bound", _f64),
        ("initial_state", _ptr),
        ("final_state", _ptr),
        ("initial_state_dtype", _i32),
        ("final_state_dtype", _i32),
        ("cu_seqlens", _ptr),
        ("workspace", _ptr),
        ("workspace_bytes", _i64),
        ("num_sms", _i32),
        ("reserved", _i32),
        ("q_strides", Strides),
        ("k_strides", Strides),
        ("v_strides", Strides),
        ("g_strides", Strides),
        ("out_strides", Strides),
        ("beta_strides", Strides),
        ("cu_seqlens_dtype", _i32),
        ("state_indices_dtype", _i32),
        ("state_indices", _ptr),
        ("state_pool_size", _i64),
        ("has_initial_state", _ptr),
        ("checkpoints", _ptr),
        ("checkpoints_dtype", _i32),
        ("checkpoint_every", _i32),
        ("checkpoint_slots", _i64),
        ("mode", _i32),
        ("reserved1", _i32),
        ("reserved2", _i32),
        ("reserved3", _i32),
        ("max_seqlen", _i32),
        ("reserved4", _i32),
        ("gate", _i32),
        ("g_dtype", _i32),
        ("beta_form", _i32),
        ("beta_dtype", _i32),
    ]


_PACK_CODES = {_i32: "i", _i64: "q", _u32: "I", _f64: "d", _ptr: "Q"}


def flat_layout(cls) -> tuple[struct.Struct, tuple[str, ...]]:
    """``(packer, names)`` for ctypes Structure ``cls``: one ``struct.Struct`` that writes every
    scalar field in place (nested structures flattened, their fields named ``outer.inner``;
    the padding kept), and the field names in its value order. ``packer.pack_into(s, 0,
    *values)`` fills a whole ``cls`` in ~0.5 us, where its keyword constructor takes ~5 us
    for FwdArgs' 43 fields; pointers are given as integers (0 for NULL)."""
    codes, names, at = ["="], [], 0

    def walk(c, base, prefix):
        nonlocal at
        for name, kind in c._fields_:
            offset = base + getattr(c, name).offset
            if issubclass(kind, ctypes.Structure):
                walk(kind, offset, f"{prefix}{name}.")
                continue
            codes.append("x" * (offset - at) + _PACK_CODES[kind])
            names.append(prefix + name)
            at = offset + ctypes.sizeof(kind)

    walk(cls, 0, "")
    codes.append("x" * (ctypes.sizeof(cls) - at))
    packer = struct.Struct("".join(codes))
    assert packer.size == ctypes.sizeof(cls), cls
    return packer, tuple(names)


def field_packer(cls, first: str, last: str) -> tuple[int, struct.Struct, tuple[str, ...]]:
    """``(offset, packer, names)`` for the fields ``first`` to ``last`` of ctypes Structure
    ``cls``, consecutive in its layout and not nested: ``packer.pack_into(s, offset,
    *values)`` writes them in ~0.3 us (their padding as zeros), where setting them one by one
    takes ~60 ns each; pointers are given as integers (0 for NULL)."""
    names = [name for name, _ in cls._fields_]
    fields = cls._fields_[names.index(first) : names.index(last) + 1]
    start = at = getattr(cls, first).offset
    codes = ["="]
    for name, kind in fields:
        offset = getattr(cls, name).offset
        codes.append("x" * (offset - at) + _PACK_CODES[kind])
        at = offset + ctypes.sizeof(kind)
    return start, struct.Struct("".join(codes)), tuple(name for name, _ in fields)


class FwdPlan(ctypes.Structure):
    """``flash_kda_fwd_plan_info``: what ``flash_kda_fwd`` runs for some arguments."""

    _fields_ = [
        ("struct_size", _u32),
        ("block_v", _i32),
        ("segment_chunks", _i32),
        ("segment_block_v", _i32),
        ("max_segments", _i64),
        ("workspace_bytes", _i64),
        ("overlap_min_ctas", _i32),
        ("overlap_max_ctas", _i32),
        ("chunk_tokens", _i32),
        ("overlap_lead", _i32),
    ]


MAX_LAUNCHES = 8  # FLASH_KDA_TESTING_MAX_LAUNCHES
LAUNCH_KINDS = {1: "prefix", 2: "K1 first", 3: "K1 beside", 4: "recurrence", 5: "warpgroup", 6: "combine"}
# flash_kda_testing_device_id: the reference devices the plan can be evaluated for without a GPU.
DEVICE_IDS = {"current": 0, "h200": 1, "sm100": 2, "sm120": 3}


class TestingLaunch(ctypes.Structure):
    """``flash_kda_testing_launch``: one kernel a call launched."""

    _fields_ = [("name", ctypes.c_char * 96), ("kind", _i32), ("code", _i32), ("blocks", _i32), ("width", _i32),
                ("stages", _i32), ("resident", _i32), ("smem", _i32), ("order", _i32), ("ctas", _i64)]  # fmt: skip


class TestingLaunches(ctypes.Structure):
    """``flash_kda_testing_launches``: what a call launched."""

    _fields_ = [("count", _i32), ("reserved", _i32), ("kernels", TestingLaunch * MAX_LAUNCHES)]


class TestingDevice(ctypes.Structure):
    """``flash_kda_testing_device``: the facts the plan takes of a device."""

    _fields_ = [("struct_size", _u32), ("compute_capability", _i32), ("generic_passes", _i32), ("sms", _i32),
                ("smem_optin", _i32), ("smem_sm", _i32), ("threads_sm", _i32), ("regs_sm", _i32),
                ("k1_alone", _i32 * 2), ("k1_overlap", _i32 * 2), ("k1_beside", (_i32 * 3) * 2),
                ("k1_beside_unbounded", (_i32 * 3) * 2), ("combine_wide", _i32)]  # fmt: skip


# The overrides of flash_kda_testing.h, in order (append-only): name, ctype. The plan's four;
# (version 2) kernels an arch table does not enable yet: unvalidated_forms 1 runs the gate and
# beta forms, stable_inverse 1 / -1 turns AUTO mode's stable inverse on / off; (version 3) the
# generic passes, the simulated device limits, the planted stall, the reference device, the
# producers' wait limit and the launch record.
OVERRIDE_FIELDS = (
    ("block_v", _i32), ("segment_chunks", _i32), ("overlap", _i32), ("chunk_tokens", _i32),
    ("unvalidated_forms", _i32), ("stable_inverse", _i32),
    ("generic_passes", _i32), ("sim_sms", _i32), ("sim_smem_optin", _i32), ("sim_smem_sm", _i32),
    ("sim_threads_sm", _i32), ("sim_regs_sm", _i32), ("sim_k1_ctas_sm", _i32), ("stall", _i32),
    ("device", _i32), ("wait_limit_ns", _i64), ("launches", _ptr),
)  # fmt: skip


class TestingOverrides(ctypes.Structure):
    """``flash_kda_testing_overrides`` (flash_kda_testing.h): forced parts of the plan, kernels
    not yet enabled by default, and the test switches."""

    _fields_ = [("struct_size", _u32), *OVERRIDE_FIELDS]


# (name, restype, argtypes) of every export.
_EXPORTS = [
    ("flash_kda_abi_version", _i32, []),
    ("flash_kda_last_error", ctypes.c_char_p, []),
    ("flash_kda_num_archs", _i32, []),
    ("flash_kda_arch_info", _i32, [_i32, ctypes.POINTER(_ArchDesc)]),
    ("flash_kda_cuda_versions", _i32, [ctypes.POINTER(_i32), ctypes.POINTER(_i32)]),
    ("flash_kda_record_bytes", _i64, []),
    ("flash_kda_workspace_size", _i64, [_i64, _i64, _i64]),
    ("flash_kda_fwd_plan", _i32, [_i32, ctypes.POINTER(FwdArgs), ctypes.POINTER(FwdPlan)]),
    ("flash_kda_pick_block_v", _i32, [_i64, _i64, _i32]),
    ("flash_kda_fwd", _i32, [_i32, ctypes.POINTER(FwdArgs), _ptr]),
    ("flash_kda_testing_version", _i32, []),
    (
        "flash_kda_testing_plan",
        _i32,
        [_i32, ctypes.POINTER(FwdArgs), ctypes.POINTER(TestingOverrides), ctypes.POINTER(FwdPlan)],
    ),
    ("flash_kda_testing_device_facts", _i32, [_i32, ctypes.POINTER(TestingOverrides), ctypes.POINTER(TestingDevice)]),
    ("flash_kda_testing_fwd", _i32, [_i32, ctypes.POINTER(FwdArgs), ctypes.POINTER(TestingOverrides), _ptr]),
    ("flash_kda_testing_replays", _i64, []),
    ("flash_kda_testing_set_replays", _i32, [_i32]),
    ("flash_kda_probe_unary_op", _i32, [_i32, _i32, _ptr, _ptr, _i64, _ptr]),
    ("flash_kda_probe_mma_op", _i32, [_i32, _i32, _ptr, _ptr, _ptr, _i64, _i64, _i64, _i64, _ptr]),
]


class NativeLibrary:
    """A loaded ``libflash_kda.so``. Every failing call raises ``RuntimeError`` with the
    library's own message (``flash_kda_last_error``)."""

    def __init__(self, path: str):
        self.path = path
        self._lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        for name, restype, argtypes in _EXPORTS:
            fn = getattr(self._lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        version = self._lib.flash_kda_abi_version()
        if version != ABI_VERSION:
            raise RuntimeError(f"{path} has C ABI version {version}, this package needs {ABI_VERSION}")
        self.archs = self._list_archs()
        self._cuda_versions: Optional[tuple[int, int]] = None
        # flash_kda_fwd by address, for the dispatcher's prepacked calls: (cc, &args, stream)
        self.fwd_by_address = self._lib["flash_kda_fwd"]
        self.fwd_by_address.restype = _i32
        self.fwd_by_address.argtypes = [_i32, _ptr, _ptr]
        # the addresses of flash_kda_fwd and flash_kda_fwd_plan, which the eager launch in C calls (_eager)
        self.fwd_address = ctypes.cast(self.fwd_by_address, ctypes.c_void_p)
        self.plan_address = ctypes.cast(self._lib.flash_kda_fwd_plan, ctypes.c_void_p)

    def _list_archs(self) -> list[ArchInfo]:
        archs = []
        for i in range(self._lib.flash_kda_num_archs()):
            desc = _ArchDesc()
            self._check(self._lib.flash_kda_arch_info(i, ctypes.byref(desc)))
            archs.append(ArchInfo(desc.name.decode(), desc.compute_capability, desc.features))
        return archs

    def _check(self, status: int) -> None:
        if status != 0:
            raise NativeError(self.error(status), status)

    def table_for(self, compute_capability: int, feature: int = FEATURE_FWD) -> Optional[ArchInfo]:
        """The arch table for ``compute_capability`` (e.g. 90) having ``feature``, if any."""
        for arch in self.archs:
            if arch.compute_capability == compute_capability and arch.features & feature:
                return arch
        return None

    def workspace_size(self, total_tokens: int, heads: int, num_seqs: int) -> int:
        """Exact-mode workspace bytes, -1 for sizes out of the library's range."""
        return self._lib.flash_kda_workspace_size(total_tokens, heads, num_seqs)

    def record_bytes(self) -> int:
        """Bytes of one (head, chunk) record of the workspace."""
        return self._lib.flash_kda_record_bytes()

    def cuda_versions(self) -> tuple[int, int]:
        """``(runtime, driver)`` CUDA versions as 1000 * major + 10 * minor (driver 0: none),
        asked once."""
        if self._cuda_versions is None:
            runtime, driver = _i32(0), _i32(0)
            self._check(self._lib.flash_kda_cuda_versions(ctypes.byref(runtime), ctypes.byref(driver)))
            self._cuda_versions = (runtime.value, driver.value)
        return self._cuda_versions

    def pick_block_v(self, num_seqs: int, heads: int, num_sms: int) -> int:
        return self._lib.flash_kda_pick_block_v(num_seqs, heads, num_sms)

    def plan(self, compute_capability: int, args: FwdArgs, overrides: Optional[TestingOverrides] = None) -> FwdPlan:
        """The plan of ``fwd`` for these arguments (sizes only are read) on the current CUDA
        device, through the table for ``compute_capability``, with the test entry point's
        overrides if given (``overrides.device``: a reference device, no GPU asked)."""
        args.struct_size = ctypes.sizeof(FwdArgs)
        plan = FwdPlan(struct_size=ctypes.sizeof(FwdPlan))
        if overrides is None:
            self._check(self._lib.flash_kda_fwd_plan(compute_capability, ctypes.byref(args), ctypes.byref(plan)))
        else:
            self._check_testing()
            pointers = ctypes.byref(args), ctypes.byref(overrides), ctypes.byref(plan)
            self._check(self._lib.flash_kda_testing_plan(compute_capability, *pointers))
        return plan

    def device_facts(self, compute_capability: int, overrides: Optional[TestingOverrides] = None) -> TestingDevice:
        """What the plan knows of the current device (through the table for
        ``compute_capability``) under the overrides' switches, or of ``overrides.device``."""
        self._check_testing()
        facts = TestingDevice(struct_size=ctypes.sizeof(TestingDevice))
        given = ctypes.byref(overrides) if overrides is not None else None
        self._check(self._lib.flash_kda_testing_device_facts(compute_capability, given, ctypes.byref(facts)))
        return facts

    def fwd(self, compute_capability: int, args: FwdArgs, stream: int, overrides: Optional[TestingOverrides] = None):
        """The forward on ``stream``, through the test entry point when ``overrides`` are given."""
        args.struct_size = ctypes.sizeof(FwdArgs)
        if overrides is None:
            self._check(self._lib.flash_kda_fwd(compute_capability, ctypes.byref(args), stream))
        else:
            self._check_testing()
            self._check(self._lib.flash_kda_testing_fwd(compute_capability, ctypes.byref(args), ctypes.byref(overrides),
                                                        stream))  # fmt: skip

    def replays(self) -> int:
        """The calls of flash_kda_fwd launched as a replay of their signature's graph."""
        self._check_testing()
        return self._lib.flash_kda_testing_replays()

    def set_replays(self, on: bool) -> bool:
        """Turn the graph replays of repeated calls on or off; the previous setting."""
        self._check_testing()
        return bool(self._lib.flash_kda_testing_set_replays(int(on)))

    def error(self, status: int) -> str:
        """The message of a failed call with ``status``, as :meth:`fwd` raises it."""
        message = self._lib.flash_kda_last_error().decode(errors="replace")
        return f"{message} [{_STATUS_NAMES.get(status, status)}]"

    def _check_testing(self) -> None:
        version = self._lib.flash_kda_testing_version()
        if version != TESTING_VERSION:
            raise RuntimeError(f"{self.path} has testing version {version}, this package needs {TESTING_VERSION}")

    def probe_unary(self, compute_capability, op, x, y, count, stream) -> None:
        self._check(self._lib.flash_kda_probe_unary_op(compute_capability, op, x, y, count, stream))

    def probe_mma(self, compute_capability, op, a, b, c, batch, m, n, k, stream) -> None:
        self._check(self._lib.flash_kda_probe_mma_op(compute_capability, op, a, b, c, batch, m, n, k, stream))


_lock = threading.Lock()
_state = {"loaded": False, "library": None, "error": None}

# Process-wide plan overrides (flash_kda.testing.set_overrides): None, or a TestingOverrides
# with which every native call of the process goes through the test entry point.
overrides: Optional[TestingOverrides] = None


def library_path() -> str:
    """Where the library is looked for: ``$FLASH_KDA_LIBRARY`` or beside this package."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        return override
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)


def load() -> Optional[NativeLibrary]:
    """The library, loaded once; ``None`` when it cannot be used (see :func:`load_error`)."""
    with _lock:
        if not _state["loaded"]:
            path = library_path()
            try:
                _state["library"] = NativeLibrary(path)
            except (OSError, AttributeError, RuntimeError) as err:
                _state["error"] = f"cannot load {path}: {err}"
            _state["loaded"] = True
        return _state["library"]


def load_error() -> Optional[str]:
    """Why :func:`load` returned ``None``; ``None`` when the library loaded."""
    load()
    return _state["error"]


def compiled_archs() -> list[ArchInfo]:
    """The arch tables of the loaded library (empty when it could not be loaded)."""
    lib = load()
    return list(lib.archs) if lib is not None else []


def _reset_for_tests() -> None:
    """Forget the loaded library so the next :func:`load` looks again."""
    with _lock:
        _state.update(loaded=False, library=None, error=None)
