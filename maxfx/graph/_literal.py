"""Python literals as tensor data: MAX's ``Number`` and ``NestedArray`` type aliases.

``max.graph.ops.constant`` (and ``max.experimental.tensor``, which re-exports
them) name the values `ops.constant` and ``Tensor(...)`` take besides arrays:
a ``Number`` (a Python or numpy scalar) or a ``NestedArray`` (a nested
sequence of them). `literal_shape` gives a literal's shape and refuses one
that is not rectangular.

Example:
    >>> from maxfx.experimental.tensor import NestedArray, Number
    >>> from maxfx.graph._literal import literal_shape
    >>> rows: NestedArray = [[1.0, 2.0], [3.0, 4.0]]
    >>> literal_shape(rows), literal_shape(2.5)
    ((2, 2), ())
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["NestedArray", "Number", "literal_shape"]

type Number = float | np.number[Any]
"""A scalar literal: a Python ``int``/``float`` (``int`` is accepted where ``float`` is) or a numpy scalar."""

type NestedArray = Sequence[Number | NestedArray]
"""A (nested) sequence of `Number`s: ``[1, 2]``, ``[[1.0, 2.0], [3.0, 4.0]]``."""


def literal_shape(literal: NestedArray | Number) -> tuple[int, ...]:
    """The shape of a nested literal (``()`` for a scalar).

    Raises:
        ValueError: the literal is ragged (rows of different shapes), naming them.
    """
    if isinstance(literal, (str, bytes)) or not isinstance(literal, Sequence):
        return ()
    inner = {literal_shape(x) for x in literal}
    if len(inner) > 1:
        raise ValueError(f"array literals must be rectangular: rows of shapes {sorted(inner)} in {literal!r}")
    return (len(literal), *next(iter(inner), ()))
