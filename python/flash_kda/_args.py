# SPDX-License-Identifier: MIT
"""The arguments of ``flash_kda.fwd``, written once (standard library only).

:data:`ARGS` lists every argument in call order: its name, whether it is keyword-only, its
Python type and default, its type in the op schema, the fields of ``flash_kda_fwd_args``
(flash_kda.h) it fills and its docstring entry. The op schema (:func:`schema`), the
docstring's Parameters section (:func:`parameters_doc`) and the argument lists of the
reference and the tests come from it; ``tests/test_args.py`` checks the public signature,
the ctypes mirror of the C struct and the packing of a call against it. Adding an argument
is one entry here, its check in ``_validate.py`` and its field in ``flash_kda_fwd_args``.
"""

from typing import NamedTuple


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()  # the default of an argument that has none


class Arg(NamedTuple):
    name: str
    keyword_only: bool
    annotation: str  # the Python type, as the docstring writes it
    default: object  # REQUIRED, or the default value
    schema: str  # the op schema's type: "(a!)" marks what the call writes
    abi: tuple  # the flash_kda_fwd_args fields it fills
    doc: str


_ACTIVATION = (
    "bfloat16 ``[B, T, H, 128]``. Strided views are read without copies on the native path: last "
    "stride 1, every other stride of a dimension longer than one a positive multiple of 8 elements, "
    "base 16-byte aligned (e.g. slices of one fused projection)."
)
_STATE = (
    "Contiguous bfloat16 or float32 (the same dtype when both are given) ``[N, H, 128 (V), 128 (K)]``, "
    "V-first; ``[P, H, 128, 128]`` pools with ``ssm_state_indices``. The state is kept in bf16 between "
    "chunks: an fp32 initial state is rounded to bf16, an fp32 final state is the exact widening."
)

ARGS = (
    Arg("q", False, "torch.Tensor", REQUIRED, "Tensor", ("q", "q_strides", "batch", "seqlen", "heads", "head_dim"),
        f"The queries, raw (L2-normalised inside): {_ACTIVATION} B or T may be 0: a call without tokens "
        "writes each final state as its start state."),
    Arg("k", False, "torch.Tensor", REQUIRED, "Tensor", ("k", "k_strides"),
        "The keys, raw (L2-normalised inside), like q."),
    Arg("v", False, "torch.Tensor", REQUIRED, "Tensor", ("v", "v_strides"), "The values, like q."),
    Arg("g", False, "torch.Tensor", REQUIRED, "Tensor", ("g", "g_strides", "g_dtype"),
        "The raw gate pre-activation, like q; with ``gate=\"log_decay\"`` the per-channel natural-log decay "
        "itself, bfloat16 or float32 (float32 strides: multiples of 4 elements)."),
    Arg("beta", False, "torch.Tensor", REQUIRED, "Tensor", ("beta", "beta_strides", "beta_dtype"),
        "``[B, T, H]``, any positive strides: bfloat16 raw logits (sigmoid applied inside), or with "
        "``beta_is_logit=False`` the write strength itself, bfloat16 or float32."),
    Arg("scale", False, "float", REQUIRED, "float", ("scale",),
        "Output scale, usually ``128 ** -0.5``; finite in bfloat16 (``|scale| < 3.3961e38``)."),
    Arg("out", False, "torch.Tensor", REQUIRED, "Tensor(a!)", ("out", "out_strides"),
        "bfloat16 ``[B, T, H, 128]``, same stride rules as q, not overlapping itself or any other "
        "argument. Rows of tokens outside every sequence are not written."),
    Arg("A_log", False, "torch.Tensor", REQUIRED, "Tensor?", ("A_log",),
        "``[H]``, bfloat16, float16 or float32 (widened to float32 exactly); None with ``gate=\"log_decay\"``."),
    Arg("dt_bias", False, "torch.Tensor", REQUIRED, "Tensor?", ("dt_bias",),
        "``[H, 128]`` or ``[H * 128]``, bfloat16, float16 or float32 (widened exactly); None with "
        "``gate=\"log_decay\"``."),
    Arg("lower_bound", False, "float", REQUIRED, "float?", ("lower_bound",),
        "Gate lower bound in ``[-5, 0]`` with ``gate=\"lower_bound\"``; unused by ``\"softplus\"`` (None or any "
        "finite number); None with ``\"log_decay\"``."),
    Arg("initial_state", False, "torch.Tensor, optional", None, "Tensor?", ("initial_state", "initial_state_dtype"),
        f"{_STATE} None: every sequence starts from zero."),
    Arg("final_state", False, "torch.Tensor, optional", None, "Tensor(b!)?", ("final_state", "final_state_dtype"),
        "Written with each sequence's state after its last token, like initial_state. It may be "
        "initial_state itself (updated in place) but must not overlap it otherwise."),
    Arg("cu_seqlens", False, "torch.Tensor, optional", None, "Tensor?", ("cu_seqlens", "cu_seqlens_dtype", "num_seqs"),
        "int64 or int32 ``[N + 1]`` for variable-length sequences packed into ``B = 1``; N = B without it. "
        "On the CPU its contents are checked (start 0, non-decreasing, last <= T). On the GPU they are not "
        "read on the native path (that would synchronise): invalid contents give unspecified rows and states "
        "but never an out-of-bounds access; the fallback paths read and check them."),
    Arg("ssm_state_indices", True, "torch.Tensor, optional", None, "Tensor?",
        ("state_indices", "state_indices_dtype", "state_pool_size"),
        "int32 or int64 ``[N]`` on q's device: sequence i reads ``initial_state[idx[i]]`` and writes "
        "``final_state[idx[i]]`` (fla's and vLLM's state-pool convention). A negative index is padding: it "
        "starts from zero and writes no state (its rows of ``out`` are still computed). Non-negative indices "
        "must be distinct and < P; this is checked where the indices are read on the host (CPU tensors, "
        "fallback paths); the native GPU path treats indices >= P as padding."),
    Arg("has_initial_state", True, "torch.Tensor, optional", None, "Tensor?", ("has_initial_state",),
        "bool ``[N]`` on q's device: False starts that sequence from zero whatever its initial state (slot) "
        "holds."),
    Arg("checkpoint_every", True, "int, optional", None, "int?", ("checkpoint_every",),
        "With ``checkpoints``: write the state after every ``checkpoint_every`` tokens of each sequence "
        "(a positive multiple of 16)."),
    Arg("checkpoints", True, "torch.Tensor, optional", None, "Tensor(c!)?",
        ("checkpoints", "checkpoints_dtype", "checkpoint_slots"),
        "Contiguous ``[S, H, 128, 128]`` in the states' dtype (bfloat16 or float32), V-first. Sequence i "
        "owns slots ``[first_i, first_i + len_i // checkpoint_every)`` with ``first_i = sum(len_j // "
        "checkpoint_every for j < i)``; slot ``first_i + m`` holds the state after ``(m + 1) * "
        "checkpoint_every`` of its tokens; slots >= S are not written. :func:`checkpoint_layout` computes S "
        "and the first slots."),
    Arg("exact", True, "bool, optional", None, "bool?", ("mode",),
        "True: bit-exact FlashKDA numerics (out, final_state and checkpoints bitwise equal to "
        ":func:`flash_kda.reference.fwd` on the same GPU; a checkpoint at token t equals the final_state of "
        "the first t tokens). False: where the library's plan predicts a gain, long sequences with few heads "
        "are split into segments whose start states are combined in fp32, and chains may run 32-token chunks "
        "(docs/design.md §4.8): deterministic, within the accuracy contract, not bit-exact. None (default): "
        'True when the environment variable ``FLASH_KDA_EXACT`` is ``"1"``, else False.'),
    Arg("max_seqlen", True, "int, optional", None, "int?", ("max_seqlen",),
        "Varlen calls: the longest sequence's tokens (``max(cu_seqlens[1:] - cu_seqlens[:-1])``, which a "
        "serving engine knows on the host), in ``[0, T]``. A hint for the plan, which cannot read a GPU "
        "``cu_seqlens`` without synchronising and otherwise plans for the mean length: a batch whose longest "
        "sequence holds most of its tokens then runs that sequence as one chain (H200: ``[7000] + [100] * "
        "10`` tokens at H = 6 0.27 ms without it, 0.11 with it). Any value gives correct results; only the "
        "automatic path's plan follows it (its speed and bits; the exact path ignores it). None or 0: "
        "unknown. With ``cu_seqlens`` on the CPU the lengths are read there and the hint is not needed. "
        "Ignored in batched mode."),
    Arg("gate", True, "str, optional", "lower_bound", "str", ("gate",),
        "The decay gate's form (docs/design.md §2.5): ``\"lower_bound\"`` (FlashKDA's, above), ``\"softplus\"`` "
        "(Kimi-Linear's unbounded gate, :math:`\\log\\alpha_t = -e^{A_{log}}\\,\\mathrm{softplus}(g_t + dt_{bias})`) "
        "or ``\"log_decay\"`` (g is :math:`\\log\\alpha_t` itself: any value <= 0 including -inf; larger values "
        "and NaN count as 0). The last two run natively on the arches "
        "where their kernels are validated, elsewhere on fla's Triton path, else PyTorch (docs/dispatch.md)."),
    Arg("beta_is_logit", True, "bool, optional", True, "bool", ("beta_form",),
        "True: beta holds logits. False: beta is the write strength :math:`\\beta_t` itself, as engines that "
        "apply the sigmoid pass it; values outside [0, 1] are clamped and NaN counts as 0. False (and a "
        "float32 beta) runs natively where validated, elsewhere on fla's Triton path, else PyTorch."),
)  # fmt: skip

NAMES = tuple(a.name for a in ARGS)
POSITIONAL = tuple(a.name for a in ARGS if not a.keyword_only)
KEYWORD_ONLY = tuple(a.name for a in ARGS if a.keyword_only)
TENSORS = tuple(a.name for a in ARGS if a.schema.startswith("Tensor"))
OUTPUTS = tuple(a.name for a in ARGS if "!" in a.schema)

# The fields of flash_kda_fwd_args that the dispatcher fills rather than an argument: the
# struct's size, the workspace, the device's SMs and the reserved slots (0).
DISPATCH_FIELDS = ("struct_size", "workspace", "workspace_bytes", "num_sms", "reserved0", "reserved",
                   "reserved1", "reserved2", "reserved3", "reserved4")  # fmt: skip

# The op's own last argument: a call whose final_state *is* its initial_state passes
# initial_state=None and state_in_place=True, so that the schema's only mutated arguments are
# the outputs (no undeclared mutation of an input).
STATE_IN_PLACE = "state_in_place"


def _default_text(value) -> str:
    if isinstance(value, str):
        return repr(value)
    return str(value)  # None, True, False, numbers


def schema() -> str:
    """The schema of ``torch.ops.flash_kda.fwd``: the arguments of :data:`ARGS` with their
    defaults, then ``state_in_place``. Every argument may be passed by name; the keyword-only
    ones of ``flash_kda.fwd`` may also be passed by position here, since inductor's generated
    call of a custom op that writes its arguments passes them all by position (torch 2.13:
    a schema with ``*`` fails there)."""
    parts = [f"{a.schema} {a.name}" + ("" if a.default is REQUIRED else f"={_default_text(a.default)}") for a in ARGS]
    parts.append(f"bool {STATE_IN_PLACE}=False")
    return f"fwd({', '.join(parts)}) -> ()"


def parameters_doc(indent: str = "    ", width: int = 92) -> str:
    """The numpy-style Parameters section of ``flash_kda.fwd``'s docstring."""
    import textwrap

    lines = ["Parameters", "----------"]
    for a in ARGS:
        lines.append(f"{a.name} : {a.annotation}")
        lines.extend(textwrap.wrap(a.doc, width=width, initial_indent=indent, subsequent_indent=indent))
    return "\n".join(indent + line if line else line for line in lines)
