# SPDX-License-Identifier: MIT
"""The eager launch in C (``_eager``, libflash_kda_torch.so) on any machine: its schemas come
from the argument table in the order the library reads them, it attaches on torch >= 2.10,
and it leaves every call it cannot launch to the Python path (CPU tensors, unknown
signatures). The launches themselves are tests/test_host_gpu.py's."""

import os

import pytest
import torch
from flash_kda import _args, _eager, _native

TORCH_2_10 = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 10)
LIBRARY = os.path.join(os.path.dirname(_eager.__file__), _eager.LIBRARY_NAME)
needs_library = pytest.mark.skipif(
    not (TORCH_2_10 and os.path.exists(LIBRARY) and _native.load() is not None),
    reason="needs torch >= 2.10 and both built libraries",
)


def test_the_schemas_follow_the_argument_table():
    launch, short, learn = (torch._C.parse_schema(f"flash_kda::{schema}") for schema in _eager.SCHEMAS)
    public = torch._C.parse_schema(f"flash_kda::{_args.schema()}")
    assert [a.name for a in launch.arguments] == list(_eager.SLOTS)
    assert [a.name for a in launch.arguments][: len(_args.TENSORS)] == list(_args.TENSORS)
    assert set(_eager.SLOTS[len(_args.TENSORS) : -1]) <= set(_args.NAMES)
    def kind(a):
        return str(a.type), None if a.alias_info is None else a.alias_info.is_write

    public_types = {a.name: kind(a) for a in public.arguments}
    for a in launch.arguments[: len(_args.TENSORS)]:  # the tensors' types and aliasing as the public op's
        assert kind(a) == public_types[a.name], a.name
    assert [a.name for a in learn.arguments] == [*_eager.SLOTS, "learned"]
    # the short op: the tensors up to cu_seqlens, then the scalars without checkpoint_every
    assert [a.name for a in short.arguments] == [n for n in _eager.SLOTS[: _eager.SLOTS.index("ssm_state_indices")]] + [
        n for n in _eager.SLOTS[len(_args.TENSORS) :] if n != "checkpoint_every"
    ]


@pytest.mark.parametrize(
    "keywords",
    [dict(), dict(lower_bound=None), dict(checkpoint_every=0), dict(max_seqlen=0), dict(exact=True),
     dict(beta_is_logit=False), dict(gate="softplus"), dict(gate="log_decay")],
)  # fmt: skip
def test_forms_tell_every_flag_and_none_apart(keywords):
    base = dict(gate="lower_bound", beta_is_logit=True, exact=False, lower_bound=-5.0, checkpoint_every=None,
                max_seqlen=None)  # fmt: skip
    changed = dict(base, **keywords)
    assert (_eager.forms(**changed) == _eager.forms(**base)) == (changed == base)


@needs_library
def test_the_library_attaches_and_leaves_cpu_calls_to_python():
    so = _eager.attach(_native.load())
    assert so is not None, _eager.attach_error()
    assert so.flash_kda_torch_slots().decode() == ",".join(_eager.SLOTS)
    q = torch.randn(1, 32, 2, 128, dtype=torch.bfloat16)
    beta, out = torch.randn(1, 32, 2, dtype=torch.bfloat16), torch.full_like(q, float("nan"))
    A_log, dt_bias = torch.zeros(2), torch.zeros(2, 128)
    launched, forms = _eager.launches(), _eager.forms("lower_bound", True, False, -5.0, None, None)
    status = _eager.OP(q, q, q, q, beta, out, A_log, dt_bias, None, None, None, None, None, None, 0.1, -5.0, 0, 0,
                       forms)  # fmt: skip
    short = _eager.OP_SHORT(q, q, q, q, beta, out, A_log, dt_bias, None, None, None, 0.1, -5.0, 0, forms)
    assert status == short == _eager.MISS
    assert torch.isnan(out).all() and _eager.launches() == launched


def test_a_stand_in_library_never_attaches():
    from flash_kda import testing

    assert _eager.attach(testing.stand_in_library()) is None
