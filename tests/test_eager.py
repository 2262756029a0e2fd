# SPDX-License-Identifier: MIT
"""The eager launch in C (``_eager``, libflash_kda_torch.so) on any machine: its argument
slots come from the argument table in the order the library reads them, it attaches on
torch >= 2.10 once its reading of a probe tensor agrees with torch's, and it leaves every call
it cannot launch to the Python path (CPU tensors, other objects, a wrong count) without
writing. The launches themselves, and the refusals that need a learned signature, are
tests/test_host_gpu.py's."""

import ctypes
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


def test_the_slots_follow_the_argument_table():
    assert _eager.SLOTS[: len(_args.TENSORS)] == tuple(_args.TENSORS)
    scalars = _eager.SLOTS[len(_args.TENSORS) : -1]
    assert set(scalars) <= set(_args.NAMES) and _eager.SLOTS[-1] == "forms"
    assert list(scalars) == [n for n in _args.NAMES if n in scalars]  # the table's order


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
    assert _eager._probe_agrees(so)
    q = torch.randn(1, 32, 2, 128, dtype=torch.bfloat16)
    beta, out = torch.randn(1, 32, 2, dtype=torch.bfloat16), torch.full_like(q, float("nan"))
    A_log, dt_bias = torch.zeros(2), torch.zeros(2, 128)
    launched, forms = _eager.launches(), _eager.forms("lower_bound", True, False, -5.0, None, None)
    args = [q, q, q, q, beta, out, A_log, dt_bias, None, None, None, None, None, None, 0.1, -5.0, 0, 0, forms, False]
    assert _eager.OP(*args) == _eager.MISS
    # an object that is not a tensor in a tensor's slot, a wrong scalar type, a wrong count
    for i, bad in ((0, object()), (6, [1.0]), (14, "0.1"), (16, 1.5)):
        assert _eager.OP(*args[:i], bad, *args[i + 1 :]) == _eager.MISS
    assert _eager.OP(*args[:-1]) == _eager.MISS and _eager.OP() == _eager.MISS
    assert torch.isnan(out).all() and _eager.launches() == launched


@needs_library
def test_the_probe_reads_what_torch_gives():
    so = _eager.attach(_native.load())
    assert so is not None, _eager.attach_error()
    words = (ctypes.c_int64 * 11)()
    for t in (torch.zeros(2, 3), torch.zeros(4, 5, 6)[1:, ::2].transpose(0, 2), torch.nn.Parameter(torch.ones(7))):
        assert so.flash_kda_torch_probe(t, words) == 0
        assert list(words[: 2 + t.dim()]) == [t.data_ptr(), t.dim(), *t.shape]
        assert list(words[6 : 6 + t.dim()]) == list(t.stride())

    class Sub(torch.Tensor):
        pass

    assert so.flash_kda_torch_probe(torch.zeros(2).as_subclass(Sub), words) == 1  # subclasses: the Python path
    assert so.flash_kda_torch_probe(torch.zeros(1, 1, 1, 1, 1), words) == 1  # more than four dimensions


def test_a_stand_in_library_never_attaches():
    from flash_kda import testing

    assert _eager.attach(testing.stand_in_library()) is None
