# SPDX-License-Identifier: MIT
"""Every input check of ``flash_kda.fwd`` (design §1.5), shared by all paths; the validated
call (:class:`FwdCall`) that every path takes; and the signature records with which a call
of a signature met before skips the checks its signature has passed.

Each check raises before anything is launched or written: ``TypeError`` for a wrong type
or dtype, ``ValueError`` for a wrong shape, device, layout, value or index content,
``RuntimeError`` for inputs that require grad. Messages name the argument, what was
expected and what was given. Helpers: ``_layout`` (strides, alignment, overlap),
``_sequences`` (index tensor contents), ``_scalars`` (Python numbers). Over the 400-line
module limit: every check of ``fwd`` lives here, so that a check is found (and changed) once.
"""

import math
import os
from typing import NamedTuple, Optional

import torch

from . import _args, _layout, _scalars, _sequences

HEAD_DIM = 128
MAX_TOKENS = 2**31  # the C ABI's bound on B * T (int32 token coordinates)
MAX_HEADS = 65535  # the C ABI's bound on H
MAX_SEQS = 2**30  # the C ABI's bound on N and on the pool size
EXACT_ENV = "FLASH_KDA_EXACT"  # "1": bit-exact mode when fwd's exact is None
_WHERE = "flash_kda.fwd"
_STATE_DTYPES = (torch.bfloat16, torch.float32)
_GATE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_BETA_DTYPES = (torch.bfloat16, torch.float32)  # beta, and g of the log-decay gate
# The decay gate's forms (design §2.2, §2.5): FlashKDA's bounded gate, Kimi-Linear's softplus
# gate, and a per-channel natural-log decay computed by the caller.
GATES = ("lower_bound", "softplus", "log_decay")
_INDEX_DTYPES = (torch.int32, torch.int64)

# os.environ's own mapping of encoded names to values on POSIX (else None): what
# os.environ.get reads, in ~40 ns instead of ~600 (the environment is read on every call).
ENVIRON = os.environ._data if isinstance(getattr(os.environ, "_data", None), dict) and os.name == "posix" else None


_EXACT_KEY, _ONE = EXACT_ENV.encode(), b"1"


def resolve_exact(exact) -> bool:
    """``exact`` if given, else ``FLASH_KDA_EXACT == "1"``."""
    if exact is None:
        return ENVIRON.get(_EXACT_KEY) == _ONE if ENVIRON is not None else os.environ.get(EXACT_ENV) == "1"
    if not isinstance(exact, bool):
        raise TypeError(f"{_WHERE}: exact must be a bool or None, got {type(exact).__name__}")
    return exact


class FwdCall(NamedTuple):
    """A validated ``fwd`` call: the caller's tensors (activations possibly strided), the
    gate parameters widened to fp32, the sizes and the resolved mode."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    out: torch.Tensor
    A_log: Optional[torch.Tensor]  # float32 [H], contiguous; None with gate "log_decay"
    dt_bias: Optional[torch.Tensor]  # float32 [H, 128], contiguous; likewise
    scale: float
    lower_bound: float  # 0.0 where the gate takes none
    initial_state: Optional[torch.Tensor]  # [S, H, 128, 128], S = N or the pool size P
    final_state: Optional[torch.Tensor]  # may be initial_state itself
    cu_seqlens: Optional[torch.Tensor]  # int32/int64 [N + 1] on q's device, or None (batched)
    state_indices: Optional[torch.Tensor]  # int32/int64 [N] on q's device: pool slots
    has_initial_state: Optional[torch.Tensor]  # bool [N] on q's device
    checkpoint_every: int  # tokens between checkpoints, 0 = none
    checkpoints: Optional[torch.Tensor]  # [slots, H, 128, 128]
    exact: bool  # bit-exact mode (C ABI MODE_EXACT) rather than AUTO
    batch: int  # B
    seqlen: int  # T
    heads: int  # H
    num_seqs: int  # N
    state_dtype: Optional[torch.dtype]  # dtype of the state tensors given, None if none
    seq_bounds: Optional[list[int]]  # cu_seqlens read on the host, when it was on the CPU
    strides: tuple  # (batch, token, head) element strides of q, k, v, g, out, beta for the C ABI
    max_seqlen: int = 0  # varlen: the longest sequence's tokens for the plan, 0 = unknown
    record: Optional["SignatureRecord"] = None  # of the call's signature, when it has one
    gate: str = "lower_bound"  # one of GATES
    beta_is_logit: bool = True  # False: beta is the write strength itself (clamped to [0, 1])

    @property
    def default_forms(self) -> bool:
        """FlashKDA's input contract: the bounded gate, bf16 g and bf16 beta logits."""
        return (
            self.gate == "lower_bound" and self.beta_is_logit and self.beta.dtype == torch.bfloat16
        )  # g is bf16 with every gate but log_decay

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def pool_size(self) -> int:
        """First dimension of the state tensors: N, or P with ``state_indices``."""
        state = self.initial_state if self.initial_state is not None else self.final_state
        return self.num_seqs if state is None else state.shape[0]

    @property
    def has_tokens(self) -> bool:
        """Whether any sequence can hold a token: a call without is the state copy alone."""
        return self.batch * self.seqlen > 0 and self.num_seqs > 0


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def tensor(name: str, x, dtypes, expected: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{_WHERE}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{_WHERE}: {name} must be {expected}, got {x.dtype}")
    return x


def _expect_shape(name: str, x: torch.Tensor, shape: list[int], form: str) -> None:
    if _shape(x) != shape:
        raise ValueError(f"{_WHERE}: {name} must have shape {form} = {shape}, got {_shape(x)}")


def _finite(name: str, x) -> float:
    value = _scalars.as_real(_WHERE, name, x)
    if not math.isfinite(value):
        raise ValueError(f"{_WHERE}: {name} must be finite, got {value}")
    return value


# Below this magnitude fp32 then bf16 rounding stays finite (bf16 overflows from
# (2 - 2^-8) 2^127 = 3.3961e38); at or above it the exact check rounds through torch.
_BF16_SAFE = 3.39e38


def _scale(x) -> float:
    """Finite, and finite once rounded to fp32 and then bf16 (design §3.2 step 6)."""
    value = _finite("scale", x)
    if abs(value) >= _BF16_SAFE and not torch.isfinite(torch.tensor(value, dtype=torch.float32).to(torch.bfloat16)):
        raise ValueError(f"{_WHERE}: scale must be finite in bfloat16 (|scale| < 3.3961e38), got {value}")
    return value


def _lower_bound(x) -> float:
    value = _finite("lower_bound", x)
    if not -5.0 <= value <= 0.0:
        raise ValueError(f"{_WHERE}: lower_bound must be in [-5, 0], got {value}")
    return value


def check_forms(gate, beta_is_logit) -> None:
    """``gate`` one of GATES, ``beta_is_logit`` a bool."""
    if not isinstance(gate, str):
        raise TypeError(f"{_WHERE}: gate must be a str, got {type(gate).__name__}")
    if gate not in GATES:
        raise ValueError(f"{_WHERE}: gate must be one of {', '.join(map(repr, GATES))}, got {gate!r}")
    if not isinstance(beta_is_logit, bool):
        raise TypeError(f"{_WHERE}: beta_is_logit must be a bool, got {type(beta_is_logit).__name__}")


def _gate_parameters(gate: str, A_log, dt_bias, lower_bound, H: int) -> float:
    """The gate's parameters for its form; returns lower_bound as a float (0.0 where unused).
    "lower_bound": A_log, dt_bias and a lower_bound in [-5, 0]; "softplus": A_log and dt_bias,
    lower_bound None or a finite number (unused); "log_decay": all three None."""
    if gate == "log_decay":
        for name, x in (("A_log", A_log), ("dt_bias", dt_bias), ("lower_bound", lower_bound)):
            if x is not None:
                raise ValueError(f"{_WHERE}: {name} must be None with gate='log_decay' (g is the log decay itself)")
        return 0.0
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        if x is None:
            raise TypeError(f"{_WHERE}: {name} must be a torch.Tensor with gate={gate!r}, got None")
    _gate_shapes(A_log, dt_bias, H)
    if gate == "lower_bound":
        if lower_bound is None:
            raise TypeError(f"{_WHERE}: lower_bound must be a real number, got NoneType (gate='lower_bound' needs one)")
        return _lower_bound(lower_bound)
    if lower_bound is not None:
        _finite("lower_bound", lower_bound)
    return 0.0


def refuse_grad(tensors: dict) -> None:
    """Inputs that require grad while grad mode is on: ``RuntimeError`` (forward only)."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise RuntimeError(
                f"{_WHERE}: {name} requires grad, but flash_kda.fwd is forward-only (no backward); use fla's "
                "chunk_kda for training, or call under torch.no_grad() / torch.inference_mode()"
            )


def refuse_inference_outputs(outputs: dict) -> None:
    """Inference tensors cannot be written outside inference mode: ``ValueError``."""
    if torch.is_inference_mode_enabled():
        return
    for name, t in outputs.items():
        if isinstance(t, torch.Tensor) and t.is_inference():
            raise ValueError(
                f"{_WHERE}: {name} is an inference tensor (made under torch.inference_mode()) and cannot be "
                "written outside inference mode; call fwd under torch.inference_mode() or pass a normal tensor"
            )


def _same_device(tensors: dict, device: torch.device) -> None:
    for name, x in tensors.items():
        if x is not None and x.device != device:
            raise ValueError(f"{_WHERE}: {name} must be on {device} like q, got {x.device}")


def _gate_shapes(A_log, dt_bias, H: int) -> None:
    """A_log [H] and dt_bias [H, 128] or [H * 128], bf16, fp16 or fp32."""
    _expect_shape("A_log", tensor("A_log", A_log, _GATE_DTYPES, "bfloat16, float16 or float32"), [H], "[H]")
    tensor("dt_bias", dt_bias, _GATE_DTYPES, "bfloat16, float16 or float32")
    if _shape(dt_bias) not in ([H, HEAD_DIM], [H * HEAD_DIM]):
        raise ValueError(
            f"{_WHERE}: dt_bias must have shape [H, D] = {[H, HEAD_DIM]} (or [H * D]), got {_shape(dt_bias)}"
        )


def _widen(x: torch.Tensor) -> torch.Tensor:
    """fp32, contiguous, 16-byte aligned: exact, and no copy when x already is."""
    if x.dtype == torch.float32 and x.is_contiguous() and x.data_ptr() % 16 == 0:
        return x  # the common case, without the conversions' dispatch
    x = x.to(torch.float32).contiguous()
    return x.clone() if x.data_ptr() % 16 else x


def _index_tensor(name: str, x, dtypes, expected: str, n: int) -> torch.Tensor:
    tensor(name, x, dtypes, expected)
    if x.dim() != 1 or x.numel() != n:
        raise ValueError(f"{_WHERE}: {name} must have shape [N] = [{n}], got {_shape(x)}")
    return x


def _cu_seqlens(cu, B: int, T: int, device: torch.device):
    """(cu_seqlens on q's device, host bounds or None, N)."""
    if cu is None:
        return None, None, B
    tensor("cu_seqlens", cu, _INDEX_DTYPES, "int64 (or int32)")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{_WHERE}: cu_seqlens must be 1-D with N + 1 >= 1 entries, got shape {_shape(cu)}")
    if cu.numel() - 1 > MAX_SEQS:
        raise ValueError(f"{_WHERE}: cu_seqlens must have at most 2**30 + 1 entries, got {cu.numel()}")
    if B != 1:
        raise ValueError(f"{_WHERE}: q must have B = 1 when cu_seqlens is given, got B = {B}")
    if cu.device.type == "cpu":
        bounds = _sequences.check_bounds(_sequences.host_list(cu), T)
        return cu.to(device), bounds, cu.numel() - 1
    if cu.device != device:
        raise ValueError(f"{_WHERE}: cu_seqlens must be on {device} like q (or on the CPU), got {cu.device}")
    # On the device its contents cannot be read without a sync: the kernels clamp instead.
    return cu, None, cu.numel() - 1


def _pool_size(initial_state, final_state, indices, N: int) -> int:
    """The first dimension the state tensors must have: N, or the pool size P."""
    if indices is None:
        return N
    _index_tensor("ssm_state_indices", indices, _INDEX_DTYPES, "int32 or int64", N)
    pools = [s for s in (initial_state, final_state) if s is not None]
    if not pools:
        raise ValueError(f"{_WHERE}: ssm_state_indices needs initial_state or final_state (the state pools)")
    P = pools[0].shape[0] if pools[0].dim() == 4 else 0
    if not 1 <= P <= MAX_SEQS:
        raise ValueError(
            f"{_WHERE}: the state pools must have shape [P, H, V, K] with P in [1, 2**30], got {_shape(pools[0])}"
        )
    if indices.device.type == "cpu":
        _sequences.check_slots(_sequences.host_list(indices), P)
    return P


def _states(initial_state, final_state, shape: list[int], form: str) -> Optional[torch.dtype]:
    dtypes = []
    for name, state in (("initial_state", initial_state), ("final_state", final_state)):
        if state is None:
            continue
        _expect_shape(name, state, shape, form)
        _layout.contiguous(name, state)
        dtypes.append(state.dtype)
    if len(dtypes) == 2 and dtypes[0] != dtypes[1]:
        raise TypeError(
            f"{_WHERE}: initial_state and final_state must have the same dtype, got {dtypes[0]} and {dtypes[1]}"
        )
    return dtypes[0] if dtypes else None


def _checkpoints(every, checkpoints, H: int, state_dtype) -> int:
    if (every is None) != (checkpoints is None):
        raise ValueError(f"{_WHERE}: checkpoint_every and checkpoints must be given together")
    if every is None:
        return 0
    every = _scalars.as_count(_WHERE, "checkpoint_every", every)
    if every < 16 or every % 16 or every >= MAX_TOKENS:
        raise ValueError(f"{_WHERE}: checkpoint_every must be a positive multiple of 16 below 2**31, got {every}")
    if checkpoints.dim() != 4 or _shape(checkpoints)[1:] != [H, HEAD_DIM, HEAD_DIM]:
        raise ValueError(
            f"{_WHERE}: checkpoints must have shape [S, H, V, K] = [S, {H}, 128, 128], got {_shape(checkpoints)}"
        )
    if checkpoints.shape[0] >= MAX_TOKENS:
        raise ValueError(f"{_WHERE}: checkpoints must have fewer than 2**31 slots, got {checkpoints.shape[0]}")
    if state_dtype is not None and checkpoints.dtype != state_dtype:
        raise TypeError(f"{_WHERE}: checkpoints must have the states' dtype {state_dtype}, got {checkpoints.dtype}")
    _layout.contiguous("checkpoints", checkpoints)
    return every


def _activations(q, k, v, g, beta, out, gate: str) -> tuple[int, int, int]:
    tensor("q", q, (torch.bfloat16,), "bfloat16")
    if q.dim() != 4 or q.shape[-1] != HEAD_DIM:
        raise ValueError(f"{_WHERE}: q must have shape [B, T, H, {HEAD_DIM}], got {_shape(q)}")
    B, T, H, _ = q.shape
    if H < 1:
        raise ValueError(f"{_WHERE}: q must have H >= 1 heads, got shape {_shape(q)}")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{_WHERE}: q must be on a CUDA device or the CPU, got {q.device}")
    for name, x in (("k", k), ("v", v), ("out", out)):
        if tensor(name, x, (torch.bfloat16,), "bfloat16").shape != q.shape:
            _expect_shape(name, x, _shape(q), "[B, T, H, D]")
    if gate == "log_decay":
        tensor("g", g, _BETA_DTYPES, "bfloat16 or float32 with gate='log_decay'")
    else:
        tensor("g", g, (torch.bfloat16,), "bfloat16")
    if g.shape != q.shape:
        _expect_shape("g", g, _shape(q), "[B, T, H, D]")
    _expect_shape("beta", tensor("beta", beta, _BETA_DTYPES, "bfloat16 or float32"), [B, T, H], "[B, T, H]")
    if B * T >= MAX_TOKENS or H > MAX_HEADS:
        raise ValueError(f"{_WHERE}: need B * T < 2**31 and H <= {MAX_HEADS}, got B * T = {B * T}, H = {H}")
    return B, T, H


# ------------------------------------------------------------------ what a trace checks
#
# Under torch.compile the op's real implementation (with every check above) runs only when
# the compiled graph runs; these checks run in the traced Python, so that a call a graph
# could never run fails when it is traced, with the same message.

# The tensors every call passes, and those of the gates with parameters (None with log_decay).
_REQUIRED = tuple(a.name for a in _args.ARGS if a.schema.startswith("Tensor") and not a.schema.endswith("?"))
_GATE_PARAMETERS = ("A_log", "dt_bias")


def check_traceable(tensors: dict, outputs: dict, gate: str = "lower_bound") -> None:
    """The checks ``torch.compile`` can trace: Python types, devices, grad, inference (``gate``
    checked by :func:`check_forms`).

    One pass decides whether anything is wrong; only then do the checks run one by one
    (:func:`_report_untraceable`), so that the first fault is reported as before."""
    required = _REQUIRED if gate == "log_decay" else _REQUIRED + _GATE_PARAMETERS
    q = tensors["q"]
    ok = isinstance(q, torch.Tensor)
    if ok:
        device = q.device
        grad = torch.is_grad_enabled()
        ok = device.type in ("cpu", "cuda")
        for name, x in tensors.items():
            if not ok:
                break
            if x is None:
                ok = name not in required
            elif not isinstance(x, torch.Tensor) or (grad and x.requires_grad):
                ok = False
            elif x.device != device:
                ok = name == "cu_seqlens" and x.device.type == "cpu"
        if ok and not torch.compiler.is_compiling() and not torch.is_inference_mode_enabled():
            for x in outputs.values():
                if x is not None and x.is_inference():
                    ok = False
    if not ok:
        _report_untraceable(tensors, outputs, required)


def _report_untraceable(tensors: dict, outputs: dict, required: tuple) -> None:
    """:func:`check_traceable` check by check: raises for the first fault."""
    for name, x in tensors.items():
        if (x is not None or name in required) and not isinstance(x, torch.Tensor):
            raise TypeError(f"{_WHERE}: {name} must be a torch.Tensor, got {type(x).__name__}")
    device = tensors["q"].device
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{_WHERE}: q must be on a CUDA device or the CPU, got {device}")
    for name, x in tensors.items():
        if x is not None and x.device != device and not (name == "cu_seqlens" and x.device.type == "cpu"):
            raise ValueError(f"{_WHERE}: {name} must be on {device} like q, got {x.device}")
    refuse_grad(tensors)
    if not torch.compiler.is_compiling():  # inference tensors do not reach a trace
        refuse_inference_outputs(outputs)


def traceable_scalars(scale, lower_bound, checkpoint_every, exact, max_seqlen) -> tuple:
    """The scalars as the op's schema takes them (float, float or None, int or None, bool or
    None, int or None), with the type checks of the full validation."""
    scale = _scalars.as_real(_WHERE, "scale", scale)
    if lower_bound is not None:  # None: the gates without one (checked with the gate)
        lower_bound = _scalars.as_real(_WHERE, "lower_bound", lower_bound)
    if checkpoint_every is not None:  # a multiple of 16 too, checked with checkpoints
        checkpoint_every = _scalars.as_count(_WHERE, "checkpoint_every", checkpoint_every)
        if not 0 < checkpoint_every < MAX_TOKENS:
            raise ValueError(
                f"{_WHERE}: checkpoint_every must be a positive multiple of 16 below 2**31, got {checkpoint_every}"
            )
    if exact is not None and not isinstance(exact, bool):
        raise TypeError(f"{_WHERE}: exact must be a bool or None, got {type(exact).__name__}")
    if max_seqlen is not None:  # checked against T with the tensors
        max_seqlen = _scalars.as_count(_WHERE, "max_seqlen", max_seqlen)
        if not 0 <= max_seqlen < MAX_TOKENS:
            raise ValueError(f"{_WHERE}: max_seqlen must be in [0, T], got {max_seqlen}")
    return scale, lower_bound, checkpoint_every, exact, max_seqlen


# ------------------------------------------------------------------ signature records
#
# Every check above except three reads only the call's *signature*: for each tensor its
# type, dtype, device, shape and strides; whether grad mode is on and any tensor requires
# grad; whether inference mode is off and an output is an inference tensor; the scalars;
# the resolved mode. The three are pointer- or content-dependent: 16-byte alignment
# (data_ptr), overlap between outputs and the other arguments (data_ptr plus a byte extent
# that the signature fixes), and the contents of index tensors on the host. check_fwd runs
# every check on the first two calls of a signature and at the second remembers what they
# derived (its SignatureRecord; the first leaves a mark, or makes the record where the eager
# launch in C learns from the native launches: _api.fwd); a later call of the same signature
# runs only the three, in the order the full validation runs them, so it raises the same
# error for the same fault. The native
# path may also keep a launch of its own in the record (dispatch: the library then checks
# alignment and overlap itself, and check_all says what is wrong when it refuses a call).

# The tensor arguments in the order of the signature and the pointer list.
_TENSORS = _args.TENSORS
_SLOT = {name: i for i, name in enumerate(_TENSORS)}
_Q, _K, _V, _G, _BETA, _OUT, _A_LOG, _DT_BIAS, _INITIAL, _FINAL, _CU, _INDICES, _HAS_INITIAL, _CHECKPOINTS = (
    _SLOT[name] for name in ("q", "k", "v", "g", "beta", "out", "A_log", "dt_bias", "initial_state", "final_state",
                             "cu_seqlens", "ssm_state_indices", "has_initial_state", "checkpoints")
)  # fmt: skip
_OUTPUTS = tuple(_SLOT[name] for name in _args.OUTPUTS)
SIGNATURE_CACHE_SIZE = 64  # signatures remembered; the records are dropped when it is full


class SignatureRecord:
    """What the full validation derived from a signature (everything but pointers and index
    contents), which pointer- and content-dependent checks a call still needs, and the
    native path's launch for the signature (``launch``: None until the dispatcher makes one,
    or where it cannot)."""

    __slots__ = ("batch", "seqlen", "heads", "num_seqs", "pool_size", "state_dtype", "strides", "checkpoint_every",
                 "exact", "device", "early_aligned", "cu_on_host", "indices_on_host", "late_aligned", "overlaps",
                 "A_log_ready", "dt_bias_ready", "gates_as_given", "gate", "beta_is_logit", "launch")  # fmt: skip

    def __init__(self, call: FwdCall, tensors: tuple, overlaps: tuple):
        q, A_log, dt_bias, cu, indices = (tensors[i] for i in (_Q, _A_LOG, _DT_BIAS, _CU, _INDICES))
        self.batch, self.seqlen, self.heads, self.num_seqs = call.batch, call.seqlen, call.heads, call.num_seqs
        self.pool_size, self.state_dtype, self.strides = call.pool_size, call.state_dtype, call.strides
        self.checkpoint_every, self.exact, self.device = call.checkpoint_every, call.exact, q.device
        present = lambda slots: tuple((i, _TENSORS[i]) for i in slots if tensors[i] is not None and tensors[i].numel())  # noqa: E731
        self.early_aligned = present((_Q, _K, _V, _G, _OUT))  # 16-byte aligned when non-empty
        self.late_aligned = present((_INITIAL, _FINAL, _CHECKPOINTS))
        self.cu_on_host = cu is not None and cu.device.type == "cpu"  # contents checked, copied to q's device
        self.indices_on_host = indices is not None and indices.device.type == "cpu"  # contents checked
        self.overlaps = overlaps  # _layout.overlap_pairs, indexed by slot
        # fp32 and contiguous: used as they are when 16-byte aligned, else widened (None: the
        # log-decay gate, which takes neither)
        self.A_log_ready = A_log is None or (A_log.dtype == torch.float32 and A_log.is_contiguous())
        self.dt_bias_ready = dt_bias is None or (
            dt_bias.dtype == torch.float32 and dt_bias.is_contiguous() and dt_bias.dim() == 2
        )
        # both used as given (no copy) wherever they are 16-byte aligned
        self.gates_as_given = self.A_log_ready and (
            dt_bias is None or (dt_bias.dtype == torch.float32 and dt_bias.is_contiguous())
        )
        self.gate, self.beta_is_logit = call.gate, call.beta_is_logit
        self.launch = None


class _Seen:
    """The mark of a signature met once: its second call makes its record, so a signature met
    once (a new token count, the case of every varlen serving step) costs a mark, not a
    record and a prepacked launch, where nothing learns from its launch (without the eager
    launch in C; with it, the first call makes the record whose launch teaches C the family)."""

    launch = None


_SEEN = _Seen()
_records: dict = {}  # signature -> SignatureRecord, or _SEEN after its first call


def cached_mode(scale, lower_bound, checkpoint_every, exact, max_seqlen, gate, beta_is_logit) -> Optional[bool]:
    """The resolved mode of a call whose scalars a signature can hold (float scale, float or
    None lower_bound, int or None checkpoint_every and max_seqlen, bool or None exact, a gate
    of GATES, bool beta_is_logit); None for any other (the full validation reports it)."""
    if type(scale) is not float or (type(lower_bound) is not float and lower_bound is not None):
        return None
    if (gate != "lower_bound" and gate not in GATES) or (beta_is_logit is not True and beta_is_logit is not False):
        return None
    if (checkpoint_every is not None and type(checkpoint_every) is not int) or (
        max_seqlen is not None and type(max_seqlen) is not int
    ):
        return None
    if exact is None:
        return resolve_exact(None)
    return exact if exact is True or exact is False else None


def signature(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
              cu_seqlens=None, ssm_state_indices=None, has_initial_state=None, checkpoint_every=None,
              checkpoints=None, exact=None, max_seqlen=None, gate="lower_bound", beta_is_logit=True):  # fmt: skip
    """Everything the signature-dependent checks read, as a hashable key (the resolved mode
    last); None when the call is not cached (scalars of other types than float, int and
    bool/None, a gate that is not one of GATES, or an argument that does not look like a
    tensor: the full validation then runs and reports it)."""
    mode = cached_mode(scale, lower_bound, checkpoint_every, exact, max_seqlen, gate, beta_is_logit)
    if mode is None:
        return None
    tensors = (q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens, ssm_state_indices,
               has_initial_state, checkpoints)  # fmt: skip
    try:  # with grad mode on, whether each tensor requires grad joins its entry
        if torch.is_grad_enabled():
            metas = tuple([None if x is None else (type(x), x.dtype, x.device, x.shape, x.stride(), x.requires_grad)
                           for x in tensors])  # fmt: skip
        else:
            metas = tuple([None if x is None else (type(x), x.dtype, x.device, x.shape, x.stride()) for x in tensors])
        written = not torch.is_inference_mode_enabled() and any(
            [tensors[i] is not None and tensors[i].is_inference() for i in _OUTPUTS]
        )
    except Exception:  # not a tensor: the full validation says what is wrong
        return None
    return metas, scale, lower_bound, checkpoint_every, max_seqlen, gate, beta_is_logit, written, mode


def record_of(key) -> Optional[SignatureRecord]:
    """The record of a signature (:func:`signature`), or None (also for one met only once)."""
    record = _records.get(key)
    return None if record is _SEEN else record


def clear_records() -> None:
    _records.clear()


def _check_pointers(record: SignatureRecord, tensors: tuple, scale: float, lower_bound) -> FwdCall:
    """A call whose signature passed the full validation before: only the pointer- and
    content-dependent checks, in the full validation's order (so the same error for the
    same fault), then the validated call."""
    pointers = _layout.pointers(tensors)
    for slot, name in record.early_aligned:  # activation_strides' alignment, q k v g out
        if pointers[slot] % 16:
            _layout.aligned(name, tensors[slot], 16)
    cu, bounds = tensors[_CU], None
    if record.cu_on_host:
        bounds = _sequences.check_bounds(_sequences.host_list(cu), record.seqlen)
        cu = cu.to(record.device)
    if record.indices_on_host:
        _sequences.check_slots(_sequences.host_list(tensors[_INDICES]), record.pool_size)
    for slot, name in record.late_aligned:  # states and checkpoints (contiguous, aligned)
        if pointers[slot] % 16:
            _layout.aligned(name, tensors[slot], 16)
    _layout.check_overlaps(record.overlaps, pointers)
    A_log, dt_bias = tensors[_A_LOG], tensors[_DT_BIAS]
    if A_log is not None and not (record.A_log_ready and pointers[_A_LOG] % 16 == 0):
        A_log = _widen(A_log)
    if dt_bias is not None and not (record.dt_bias_ready and pointers[_DT_BIAS] % 16 == 0):
        dt_bias = _widen(dt_bias.reshape(record.heads, HEAD_DIM))
    gate = record.gate
    return FwdCall(
        tensors[_Q], tensors[_K], tensors[_V], tensors[_G], tensors[_BETA], tensors[_OUT], A_log, dt_bias, scale,
        lower_bound if gate == "lower_bound" else 0.0, tensors[_INITIAL], tensors[_FINAL], cu, tensors[_INDICES],
        tensors[_HAS_INITIAL], record.checkpoint_every, tensors[_CHECKPOINTS], record.exact, record.batch,
        record.seqlen, record.heads, record.num_seqs, record.state_dtype, bounds, record.strides, 0, record, gate,
        record.beta_is_logit,
    )  # fmt: skip


_NO_KEY = object()  # check_fwd's default: compute the signature


def check_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
              cu_seqlens=None, ssm_state_indices=None, has_initial_state=None, checkpoint_every=None, checkpoints=None,
              exact=None, max_seqlen=None, gate="lower_bound", beta_is_logit=True, *,
              key=_NO_KEY, mark_first=True) -> FwdCall:  # fmt: skip
    """Validate one ``fwd`` call (arguments as :func:`flash_kda.fwd`); return it as a
    :class:`FwdCall`. Reads no device memory (index tensors on the CPU are read). Raises
    ``TypeError``, ``ValueError`` or ``RuntimeError`` (grad) before anything is written.

    The first two calls of a signature (``key``: its :func:`signature`, computed when not
    given) run every check, the second making its record (the first, unless ``mark_first``);
    later ones run the pointer- and content-dependent checks only (alignment, aliasing, index
    tensors on the host), which is all that can differ between them."""
    tensors = (q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens, ssm_state_indices,
               has_initial_state, checkpoints)  # fmt: skip
    if key is _NO_KEY:
        key = signature(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
                        cu_seqlens, ssm_state_indices, has_initial_state, checkpoint_every, checkpoints, exact,
                        max_seqlen, gate, beta_is_logit)  # fmt: skip
    record = None if key is None else _records.get(key)
    if record is not None and record is not _SEEN:
        return _longest(_check_pointers(record, tensors, scale, lower_bound), max_seqlen)
    if key is not None:
        exact = key[-1]  # the resolved mode: FLASH_KDA_EXACT is read once per call
    call, overlaps = _check_all(tensors, scale, lower_bound, checkpoint_every, exact, gate, beta_is_logit)
    if key is not None:
        if len(_records) >= SIGNATURE_CACHE_SIZE:
            _records.clear()
        if record is None and mark_first:  # met once: a mark
            _records[key] = _SEEN
        else:
            record = _records[key] = SignatureRecord(call, tensors, overlaps)
            call = call._replace(record=record)
    return _longest(call, max_seqlen)


def check_all(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state=None, final_state=None,
              cu_seqlens=None, ssm_state_indices=None, has_initial_state=None, checkpoint_every=None, checkpoints=None,
              exact=None, max_seqlen=None, gate="lower_bound", beta_is_logit=True) -> FwdCall:  # fmt: skip
    """Every check of a ``fwd`` call, uncached (what :func:`check_fwd` runs on the first
    call of a signature)."""
    tensors = (q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens, ssm_state_indices,
               has_initial_state, checkpoints)  # fmt: skip
    call = _check_all(tensors, scale, lower_bound, checkpoint_every, exact, gate, beta_is_logit)[0]
    return _longest(call, max_seqlen)


def _longest(call: FwdCall, max_seqlen) -> FwdCall:
    """The call with the longest sequence its plan assumes (C ABI ``max_seqlen``): read on the
    host where cu_seqlens was on the CPU, else the caller's hint, an int in [0, T] or None
    (0, None: unknown; the plan then takes the mean length). Batched calls keep 0."""
    if max_seqlen is not None:
        max_seqlen = _scalars.as_count(_WHERE, "max_seqlen", max_seqlen)
        if not 0 <= max_seqlen <= call.seqlen:
            raise ValueError(f"{_WHERE}: max_seqlen must be in [0, T = {call.seqlen}], got {max_seqlen}")
    if call.cu_seqlens is None:
        return call
    bounds = call.seq_bounds
    longest = max([bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)], default=0) if bounds else max_seqlen
    return call._replace(max_seqlen=longest) if longest else call


def _check_all(tensors: tuple, scale, lower_bound, checkpoint_every, exact, gate, beta_is_logit) -> tuple:
    """:func:`check_all` on the tensor arguments in slot order (``_TENSORS``), returning
    ``(call, the overlap pairs it tested)``."""
    (q, k, v, g, beta, out, A_log, dt_bias, initial_state, final_state, cu_seqlens, ssm_state_indices,
     has_initial_state, checkpoints) = tensors  # fmt: skip
    check_forms(gate, beta_is_logit)
    B, T, H = _activations(q, k, v, g, beta, out, gate)
    lower_bound = _gate_parameters(gate, A_log, dt_bias, lower_bound, H)
    optional = dict(initial_state=initial_state, final_state=final_state, checkpoints=checkpoints)
    for name, x in optional.items():
        if x is not None:
            tensor(name, x, _STATE_DTYPES, "bfloat16 or float32")
    if ssm_state_indices is not None:
        tensor("ssm_state_indices", ssm_state_indices, _INDEX_DTYPES, "int32 or int64")
    if has_initial_state is not None:
        tensor("has_initial_state", has_initial_state, (torch.bool,), "bool")
    inputs = dict(q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, initial_state=initial_state)
    inputs.update(ssm_state_indices=ssm_state_indices, has_initial_state=has_initial_state)
    outputs = dict(out=out, final_state=final_state, checkpoints=checkpoints)
    arguments = dict(inputs, **outputs)
    refuse_grad(arguments)
    _same_device(arguments, q.device)
    scale = _scale(scale)
    mode = resolve_exact(exact)
    strides = tuple(
        _layout.activation_strides(name, x) for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("out", out))
    ) + (_layout.beta_strides(beta),)
    _layout.no_self_overlap("out", out)
    device_cu, bounds, N = _cu_seqlens(cu_seqlens, B, T, q.device)
    S = _pool_size(initial_state, final_state, ssm_state_indices, N)
    form = "[N, H, V, K]" if ssm_state_indices is None else "[P, H, V, K]"
    state_dtype = _states(initial_state, final_state, [S, H, HEAD_DIM, HEAD_DIM], form)
    if has_initial_state is not None:
        _index_tensor("has_initial_state", has_initial_state, (torch.bool,), "bool", N)
    every = _checkpoints(checkpoint_every, checkpoints, H, state_dtype)
    refuse_inference_outputs(outputs)
    # _layout.no_aliasing, with the pairs kept for the signature cache
    overlaps = _layout.overlap_pairs(outputs, dict(inputs, cu_seqlens=cu_seqlens), _SLOT)
    _layout.check_overlaps(overlaps, _layout.pointers(tensors))
    call = FwdCall(
        q, k, v, g, beta, out, None if A_log is None else _widen(A_log),
        None if dt_bias is None else _widen(dt_bias.reshape(H, HEAD_DIM)), scale, lower_bound, initial_state,
        final_state, device_cu, ssm_state_indices, has_initial_state, every, checkpoints, mode, B, T, H, N,
        state_dtype, bounds, strides, gate=gate, beta_is_logit=beta_is_logit,
    )  # fmt: skip
    return call, overlaps
