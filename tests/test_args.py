# SPDX-License-Identifier: MIT
"""The one argument table (flash_kda._args): the public signature, its docstring's
Parameters, the op schema, the ctypes mirrors of the C structs (parsed from the headers), the
fields a call fills and the signature records all agree with it."""

import ctypes
import inspect
import pathlib
import re

import flash_kda
import pytest
import torch
from conftest import FWD_ARGS, FWD_KEYWORDS, check, fused_projection_views, make_problem, pooled_problem
from flash_kda import _args, _launch, _native, _validate

HEADERS = pathlib.Path(__file__).resolve().parents[1] / "src" / "include" / "flash_kda"


def test_the_public_signature_is_the_table():
    parameters = list(inspect.signature(flash_kda.fwd).parameters.values())
    assert [p.name for p in parameters] == list(_args.NAMES)
    for p, a in zip(parameters, _args.ARGS):
        kind = inspect.Parameter.KEYWORD_ONLY if a.keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert p.kind == kind, a.name
        assert p.default == (inspect.Parameter.empty if a.default is _args.REQUIRED else a.default), a.name
    assert _args.POSITIONAL[:10] == ("q", "k", "v", "g", "beta", "scale", "out", "A_log", "dt_bias", "lower_bound")
    assert (FWD_ARGS, FWD_KEYWORDS) == (_args.POSITIONAL, _args.KEYWORD_ONLY)  # the reference's and the tests'


def test_the_docstring_documents_each_argument_of_the_table_in_order():
    doc = flash_kda.fwd.__doc__
    section = doc[doc.index("    Parameters\n    ----------\n") : doc.index("    Raises\n")]
    entries = re.findall(r"^    (\w+) : (.+)$", section, re.M)
    assert entries == [(a.name, a.annotation) for a in _args.ARGS]
    for a in _args.ARGS:  # each entry's text is the table's, re-wrapped
        body = section.split(f"    {a.name} : {a.annotation}\n", 1)[1].split("\n    ", 1)[0]
        assert " ".join(body.split()).startswith(" ".join(a.doc.split())[:60]), a.name


def test_the_op_schema_is_the_table():
    schema = torch.ops.flash_kda.fwd.default._schema
    arguments = schema.arguments
    assert [x.name for x in arguments] == [*_args.NAMES, _args.STATE_IN_PLACE]
    for x, a in zip(arguments, _args.ARGS):
        written = x.alias_info is not None and x.alias_info.is_write
        assert written == (a.name in _args.OUTPUTS), a.name
        assert x.has_default_value() == (a.default is not _args.REQUIRED), a.name
        if x.has_default_value():
            assert x.default_value == a.default, a.name
        base = re.sub(r"\([a-z]!\)", "", a.schema)
        assert str(x.type) == (f"Optional[{base[:-1]}]" if base.endswith("?") else base), a.name
    assert [a.name for a in _args.ARGS if "!" in a.schema] == list(_args.OUTPUTS) == ["out", "final_state",
                                                                                     "checkpoints"]  # fmt: skip


# ------------------------------------------------------------------ the C structs

_C_TYPES = {
    "uint32_t": ctypes.c_uint32,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "double": ctypes.c_double,
}


def c_fields(header: str, struct: str) -> list:
    """(name, ctypes type) of each field of ``typedef struct <struct> {...}`` in a header."""
    text = (HEADERS / header).read_text()
    body = re.search(r"typedef struct " + struct + r" \{(.*?)\} " + struct + ";", text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = []
    for declaration in body.split(";"):
        declaration = " ".join(declaration.split())
        if not declaration:
            continue
        match = re.fullmatch(r"(?:const )?([\w]+) (\*?)(\w+)", declaration)
        assert match, declaration
        kind, pointer, name = match.groups()
        if pointer:
            fields.append((name, ctypes.c_void_p))
        elif kind == "flash_kda_strides":
            fields.append((name, _native.Strides))
        else:
            fields.append((name, _C_TYPES[kind]))
    return fields


@pytest.mark.parametrize(
    "header,struct,mirror",
    [("flash_kda.h", "flash_kda_fwd_args", _native.FwdArgs),
     ("flash_kda.h", "flash_kda_fwd_plan_info", _native.FwdPlan), ("flash_kda.h", "flash_kda_strides", _native.Strides),
     ("flash_kda_testing.h", "flash_kda_testing_overrides", _native.TestingOverrides)],
)  # fmt: skip
def test_the_ctypes_mirrors_are_the_headers_structs(header, struct, mirror):
    if not (HEADERS / header).exists():
        pytest.skip(f"the sources are not here ({HEADERS})")
    assert [(name, kind) for name, kind in mirror._fields_] == c_fields(header, struct)


def test_the_abi_versions_match_the_headers():
    if not (HEADERS / "flash_kda.h").exists():
        pytest.skip(f"the sources are not here ({HEADERS})")
    abi = re.search(r"#define FLASH_KDA_ABI_VERSION (\d+)", (HEADERS / "flash_kda.h").read_text()).group(1)
    testing = re.search(r"#define FLASH_KDA_TESTING_VERSION (\d+)", (HEADERS / "flash_kda_testing.h").read_text())
    assert (int(abi), int(testing.group(1))) == (_native.ABI_VERSION, _native.TESTING_VERSION)


def test_each_struct_field_is_filled_by_an_argument_or_the_dispatcher():
    """The table's abi column and the dispatcher's fields partition flash_kda_fwd_args."""
    filled = [field for a in _args.ARGS for field in a.abi]
    assert len(filled) == len(set(filled)), "a field filled by two arguments"
    assert sorted(filled + list(_args.DISPATCH_FIELDS)) == sorted(name for name, _ in _native.FwdArgs._fields_)


def samples():
    batched = make_problem(2, 20, 2, initial=torch.bfloat16, final=torch.bfloat16, seed=1)
    varlen = make_problem(1, 0, 2, lens=[17, 0, 23], initial=torch.float32, final=torch.float32, seed=2)
    varlen["cu_seqlens"] = varlen["cu_seqlens"].int()
    pool = pooled_problem(1, 0, 2, [2, -1, 0], 3, lens=[20, 5, 30], has_initial=[True, True, False], in_place=True)
    ckpt = make_problem(1, 0, 1, lens=[40, 33], initial=torch.float32, final=torch.float32, seed=4)
    ckpt.update(checkpoint_every=16, checkpoints=torch.full((4, 1, 128, 128), float("nan")))
    strided, _ = fused_projection_views(make_problem(2, 24, 2, final=torch.float32, seed=5))
    return dict(batched=batched, varlen=varlen, pool=pool, ckpt=ckpt, strided=strided)


@pytest.mark.parametrize("name", list(samples()))
def test_native_fields_fill_the_table_s_fields(name):
    """native_fields (the pack of a validated call) gives every field of the struct: the
    table's arguments' and the dispatcher's, of which only struct_size and num_sms are set
    before the launch."""
    p = samples()[name]
    fields, _ = _launch.native_fields(check(p), 132)
    assert {name.split(".")[0] for name in fields} == {name for name, _ in _native.FwdArgs._fields_}
    assert {f for f in _args.DISPATCH_FIELDS if fields[f] and f != "num_sms"} == {"struct_size"}


def arguments(p) -> dict:
    """Every argument of the table for problem p: its value, else the table's default."""
    return {a.name: p.get(a.name, None if a.default is _args.REQUIRED else a.default) for a in _args.ARGS}


@pytest.mark.parametrize("argument", [a.name for a in _args.ARGS if a.name in _args.TENSORS])
def test_the_signature_covers_every_tensor_argument(argument):
    """Changing one tensor argument's view (its shape, dtype or strides) changes the
    signature: no argument of the table is missing from the records' key."""
    p = samples()["ckpt"] if argument == "checkpoints" else samples()["pool"]
    p = dict(p, ssm_state_indices=p.get("ssm_state_indices"), has_initial_state=p.get("has_initial_state"))
    base = arguments(p)
    key = _validate.signature(*base.values())
    x = base[argument]
    other = x.float() if x.dtype != torch.float32 else x.double()
    assert _validate.signature(*{**base, argument: other}.values()) != key, argument
    assert key is not None


def test_every_function_taking_fwd_s_arguments_takes_the_table_s():
    """The functions that take fwd's arguments one by one (written out for speed) take the
    table's, in its order: an argument added to the table must be added to each."""
    from flash_kda import _op, reference

    def names(fn):
        return [p.name for p in inspect.signature(fn).parameters.values() if p.kind != p.VAR_KEYWORD]

    for fn in (flash_kda.fwd, _validate.signature, _op.call):
        assert names(fn) == list(_args.NAMES), fn.__qualname__
    for fn in (_validate.check_fwd, _validate.check_all):
        assert names(fn)[: len(_args.NAMES)] == list(_args.NAMES), fn.__qualname__
    assert names(_op.fwd_op) == [*_args.NAMES, _args.STATE_IN_PLACE]
    assert reference.FWD_ARGS + reference.FWD_KEYWORDS == _args.NAMES


# A value other than the default (or the sample's) for each argument that is not a tensor: the
# signature key must see it. An argument added to the table needs its entry here.
OTHER_SCALARS = {"scale": 0.5, "lower_bound": -1.0, "checkpoint_every": 32, "exact": True, "max_seqlen": 3,
                 "gate": "softplus", "beta_is_logit": False}  # fmt: skip


def test_the_signature_covers_every_scalar_argument():
    scalars = [a.name for a in _args.ARGS if a.name not in _args.TENSORS]
    assert sorted(OTHER_SCALARS) == sorted(scalars), "give each scalar argument another value here"
    p = samples()["ckpt"]
    base = arguments(p)
    key = _validate.signature(*base.values())
    assert key is not None
    for name, value in OTHER_SCALARS.items():
        assert _validate.signature(*{**base, name: value}.values()) != key, name
