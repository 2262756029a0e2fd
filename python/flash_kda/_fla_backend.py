# SPDX-License-Identifier: MIT
"""fla's ``chunk_kda`` on this package: a backend of fla's backend registry (``fla.backends``).

``import flash_kda`` registers it without importing fla (:func:`install`): at once when
``fla.ops.kda`` is already imported, else from a small import hook that registers it as soon
as ``fla.ops.kda`` has been imported, and then leaves ``sys.meta_path``. It runs ahead of
fla's own FlashKDA backend (priority 2 against its 3), is switched off by ``FLA_FLASH_KDA=0``
like that one, and takes every flag combination ``flash_kda.fwd`` can run (README, "fla"):

* the gate from fla's flags: ``use_gate_in_kernel`` with ``lower_bound`` is FlashKDA's
  bounded gate (``safe_gate`` True or False; ``A_log`` None: fla's ``lower_bound * sigmoid(g +
  dt_bias)``, i.e. ``A_log`` 0), without ``lower_bound`` the softplus gate, and
  ``use_gate_in_kernel=False`` a precomputed log decay; ``use_beta_sigmoid_in_kernel=False`` a
  probability beta;
* V-first states (``state_v_first``), fused q/k L2 norm, no negative eigenvalues, no
  intermediate states, no grad, q, k and v heads alike (no GVA), head dimension 128;
* with a ``cp_context``: ``flash_kda.distributed.fla_chunk_kda`` where its conventions fit.

The verifier also refuses a call that ``flash_kda.fwd`` would not run on its native kernels
(no kernel for the GPU, ``FLA_FLASH_KDA``, forms not yet enabled there), with the dispatcher's
reason: fla's own path then runs it without a detour through this package.
"""

import sys
from typing import Optional

BACKEND_TYPE = "flash_kda_bin"
PRIORITY = 2  # fla's own FlashKDA backend: 3 (lower runs first)
ENV_VAR = "FLA_FLASH_KDA"  # "0" turns it off, as it turns off fla's FlashKDA backend
_TARGET = "fla.ops.kda"
_HEAD_DIM = 128
# chunk_kda's arguments, in its order (fla 0.6.0), and the keyword-only ones it passes on
_ORDER = ("q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel",
          "use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "safe_gate", "lower_bound",
          "disable_recompute", "return_intermediate_states", "state_v_first", "cu_seqlens", "cu_seqlens_cpu",
          "cp_context", "use_graph", "max_num_seqs")  # fmt: skip
_KEYWORDS = ("A_log", "dt_bias")
_DEFAULTS = dict(scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                 use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
                 lower_bound=None, disable_recompute=False, return_intermediate_states=False, state_v_first=False,
                 cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None, use_graph=False, max_num_seqs=None,
                 A_log=None, dt_bias=None)  # fmt: skip

_state = {"registered": False}


# ------------------------------------------------------------------ the arguments


def arguments(args: tuple, kwargs: dict) -> dict:
    """chunk_kda's arguments by name, its defaults filled in; ``TypeError`` for an argument it
    does not have (a later fla's: the verifier refuses the call)."""
    if len(args) > len(_ORDER):
        raise TypeError(f"chunk_kda takes {len(_ORDER)} positional arguments, got {len(args)}")
    named = dict(zip(_ORDER, args))
    for name, value in kwargs.items():
        if name in named:
            raise TypeError(f"chunk_kda got {name!r} twice")
        if name not in _DEFAULTS and name not in _ORDER:
            raise TypeError(f"flash_kda's backend does not know chunk_kda's argument {name!r}")
        named[name] = value
    missing = [name for name in _ORDER[:5] if name not in named]
    if missing:
        raise TypeError(f"chunk_kda needs {', '.join(missing)}")
    return {**_DEFAULTS, **named}


def forms(a: dict) -> tuple:
    """``(gate, beta_is_logit)`` of flash_kda.fwd for fla's flags, or ``(None, reason)``. fla's
    in-kernel gate is bounded where lower_bound is set (safe_gate picks its kernel only) and the
    softplus gate otherwise; without use_gate_in_kernel, g is the natural-log decay itself."""
    if not a["use_gate_in_kernel"]:
        gate = "log_decay"  # fla's fused_kda_gate output, or the caller's own
    elif a["lower_bound"] is not None:
        gate = "lower_bound"
    elif a["safe_gate"]:
        return None, "safe_gate=True with use_gate_in_kernel=True needs lower_bound (fla refuses it too)"
    elif a["A_log"] is None:
        return None, "the softplus gate (use_gate_in_kernel=True, no lower_bound) needs A_log"
    else:
        gate = "softplus"
    return gate, bool(a["use_beta_sigmoid_in_kernel"])


def refusal(a: dict) -> Optional[str]:
    """Why flash_kda.fwd cannot take these chunk_kda arguments (None: it can), before the
    dispatcher is asked: fla's flags, shapes, dtypes, grad."""
    import torch

    q, k, v, g, beta = (a[name] for name in ("q", "k", "v", "g", "beta"))
    if not all(isinstance(x, torch.Tensor) for x in (q, k, v, g, beta)):
        return "q, k, v, g and beta must be tensors"
    if torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v, g, beta, a["A_log"], a["dt_bias"])
    ):
        return "flash_kda.fwd is forward-only (inference): an input requires grad"
    if q.dim() != 4 or q.shape[-1] != _HEAD_DIM or v.shape != q.shape or k.shape != q.shape:
        return f"flash_kda.fwd needs q, k, v of one shape [B, T, H, 128] (no GVA), got {list(q.shape)}, {list(v.shape)}"
    if q.dtype != torch.bfloat16 or k.dtype != torch.bfloat16 or v.dtype != torch.bfloat16:
        return f"flash_kda.fwd needs bfloat16 q, k, v, got {q.dtype}"
    if not a["use_qk_l2norm_in_kernel"]:
        return "flash_kda.fwd normalises q and k itself: use_qk_l2norm_in_kernel must be True"
    if a["allow_neg_eigval"]:
        return "flash_kda.fwd has no negative eigenvalues (allow_neg_eigval must be False)"
    if a["return_intermediate_states"]:
        return "flash_kda.fwd does not return intermediate states"
    if not a["state_v_first"] and (a["initial_state"] is not None or a["output_final_state"]):
        return "flash_kda.fwd keeps V-first states: K-first states need state_v_first=True"
    gate, why = forms(a)
    if gate is None:
        return why
    if gate == "log_decay":
        if g.dtype not in (torch.bfloat16, torch.float32):
            return f"a precomputed gate (use_gate_in_kernel=False) must be bfloat16 or float32, got {g.dtype}"
    elif g.dtype != torch.bfloat16:
        return f"an in-kernel gate's g must be bfloat16, got {g.dtype}"
    if gate == "lower_bound" and not -5.0 <= float(a["lower_bound"]) <= 0.0:
        return f"flash_kda.fwd's bounded gate needs lower_bound in [-5, 0], got {a['lower_bound']}"
    if beta.dtype not in (torch.bfloat16, torch.float32):
        return f"beta must be bfloat16 or float32, got {beta.dtype}"
    heads = q.shape[2]
    if g.shape != q.shape or beta.shape != q.shape[:3]:
        return f"g must have q's shape and beta [B, T, H], got {list(g.shape)} and {list(beta.shape)}"
    if gate != "log_decay":
        A_log, dt_bias = a["A_log"], a["dt_bias"]
        if A_log is not None and (not isinstance(A_log, torch.Tensor) or A_log.numel() != heads):
            return f"A_log must have H = {heads} entries"
        if dt_bias is not None and (not isinstance(dt_bias, torch.Tensor) or dt_bias.numel() != heads * _HEAD_DIM):
            return f"dt_bias must have H * 128 = {heads * _HEAD_DIM} entries"
    initial = a["initial_state"]
    if initial is not None and (not isinstance(initial, torch.Tensor) or not initial.is_floating_point()):
        return "initial_state must be a floating-point tensor"
    if a["cu_seqlens"] is not None and q.shape[0] != 1:
        return f"cu_seqlens needs B = 1, got B = {q.shape[0]}"
    if a["cp_context"] is not None:
        from . import distributed

        return distributed.fla_refusal(a["cp_context"])
    return None


def native_refusal(a: dict) -> Optional[str]:
    """Why flash_kda.fwd would not run the call on its native kernels (None: it would)."""
    from . import dispatch

    gate, beta_is_logit = forms(a)
    return dispatch.native_refusal(
        a["q"].device, gate=gate, beta_is_logit=beta_is_logit, g_dtype=a["g"].dtype, beta_dtype=a["beta"].dtype
    )


# ------------------------------------------------------------------ the call


def _gate_parameters(a: dict, gate: str, heads: int):
    """(A_log, dt_bias, lower_bound) as flash_kda.fwd takes them for the gate."""
    import torch

    if gate == "log_decay":
        return None, None, None
    q = a["q"]
    A_log = a["A_log"]
    if A_log is None:  # fla's bounded gate without A_log: lower_bound * sigmoid(g + dt_bias)
        A_log = torch.zeros(heads, dtype=torch.float32, device=q.device)
    dt_bias = a["dt_bias"]
    dt_bias = torch.zeros(heads, _HEAD_DIM, dtype=torch.float32, device=q.device) if dt_bias is None else dt_bias
    return A_log, dt_bias.reshape(heads, _HEAD_DIM), a["lower_bound"] if gate == "lower_bound" else None


def _readable(x):
    """x, or a copy where flash_kda.fwd could not read the view in place (its strides or
    alignment, docs/api.md)."""
    import torch

    from . import _layout

    try:
        _layout.activation_strides("x", x)
    except ValueError:
        return x.clone(memory_format=torch.contiguous_format)
    return x


def run(a: dict) -> tuple:
    """chunk_kda's ``(o, final_state)`` for arguments this backend accepted: flash_kda.fwd (or
    flash_kda.distributed.fla_chunk_kda with a cp_context); final_state fp32 V-first
    ``[N, H, 128, 128]`` with ``output_final_state``, else None."""
    import torch

    from . import _api

    q, k, v, g, beta = (a[name] for name in ("q", "k", "v", "g", "beta"))
    gate, beta_is_logit = forms(a)
    heads = q.shape[2]
    A_log, dt_bias, lower_bound = _gate_parameters(a, gate, heads)
    scale = q.shape[-1] ** -0.5 if a["scale"] is None else float(a["scale"])
    initial = a["initial_state"]
    if a["cp_context"] is not None:
        from . import distributed

        return distributed.fla_chunk_kda(
            q, k, v, g, beta, scale, initial, a["output_final_state"], cp_context=a["cp_context"], A_log=A_log,
            dt_bias=dt_bias, lower_bound=lower_bound, gate=gate, beta_is_logit=beta_is_logit,
        )  # fmt: skip
    cu = a["cu_seqlens"]
    seqs = q.shape[0] if cu is None else cu.numel() - 1
    if initial is not None:  # fp32 like the final state (exact: the kernels round it to bf16)
        initial = initial.to(torch.float32).contiguous()
    q, k, v, g = (_readable(x) for x in (q, k, v, g))
    final = None
    if a["output_final_state"]:
        final = torch.empty(seqs, heads, _HEAD_DIM, _HEAD_DIM, dtype=torch.float32, device=q.device)
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    host = a["cu_seqlens_cpu"]
    max_seqlen = None
    if cu is not None and host is not None and host.numel() > 1:  # the plan's hint, read on the host
        max_seqlen = int((host[1:] - host[:-1]).max())
    _api.fwd(
        q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial, final, cu, max_seqlen=max_seqlen,
        gate=gate, beta_is_logit=beta_is_logit,
    )  # fmt: skip
    return out, final


# ------------------------------------------------------------------ the registration


def _backend_class(base):
    """The backend: fla's ``BaseBackend`` with this package's verifier and implementation."""

    class FlashKdaBinBackend(base):
        """flash-kda-bin's native KDA forward (inference), ahead of fla's FlashKDA backend."""

        backend_type = BACKEND_TYPE
        package_name = None  # this module exists only where flash_kda is imported
        env_var = ENV_VAR
        default_enable = True
        priority = PRIORITY

        def chunk_kda_verifier(self, *args, **kwargs):
            try:
                a = arguments(args, kwargs)
            except TypeError as err:
                return False, str(err)
            why = refusal(a)
            if why is None:
                why = native_refusal(a)
            return why is None, why

        def chunk_kda(self, *args, **kwargs):
            return run(arguments(args, kwargs))

    return FlashKdaBinBackend


def register() -> bool:
    """Register the backend for ``fla.ops.kda.chunk.chunk_kda`` (once); False when fla's
    registry is not there (an fla without ``fla.backends``)."""
    if _state["registered"]:
        return True
    try:
        from fla.backends import BaseBackend
        from fla.backends import register as fla_register
        from fla.ops.kda.chunk import chunk_kda
    except Exception:  # an fla without the backend registry, or broken dependencies
        return False
    fla_register(chunk_kda)(_backend_class(BaseBackend))
    _state["registered"] = True
    return True


class _Loader:
    """fla.ops.kda's own loader, which registers the backend once the module has run."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _uninstall_hook()
        register()


class _Hook:
    """A meta-path finder that finds nothing itself: for ``fla.ops.kda`` it asks the finders
    after it and wraps the loader they give (:class:`_Loader`)."""

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        finders = sys.meta_path[sys.meta_path.index(self) + 1 :] if self in sys.meta_path else []
        for finder in finders:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_HOOK = _Hook()


def _uninstall_hook() -> None:
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def install() -> None:
    """Register at once if ``fla.ops.kda`` is imported, else when it is (import flash_kda)."""
    if _TARGET in sys.modules:
        register()
    elif _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
