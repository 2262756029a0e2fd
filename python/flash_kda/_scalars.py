# SPDX-License-Identifier: MIT
"""Python scalar arguments: real numbers and integer counts. Pure Python, so the public
wrapper's checks trace under ``torch.compile``; ``TypeError`` for a wrong type,
``ValueError`` for a value no float64 holds."""

import numbers
import operator


def as_real(where: str, name: str, x) -> float:
    """``x`` as a float: a real number, not bool (``TypeError``), that fits a float64
    (``ValueError``, never ``OverflowError``)."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{where}: {name} must be a real number, got {type(x).__name__}")
    try:
        return float(x)
    except OverflowError:
        raise ValueError(f"{where}: {name} must be finite, got a value beyond the float64 range") from None


def as_count(where: str, name: str, x) -> int:
    """``x`` as a Python int (``operator.index``: int, numpy integers), not bool (``TypeError``)."""
    if isinstance(x, bool):
        raise TypeError(f"{where}: {name} must be an int, got bool")
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"{where}: {name} must be an int, got {type(x).__name__}") from None
