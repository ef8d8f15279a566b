"""``max.graph.ops.reduction``: the axis reductions, ``max``/``min`` as one-operand reductions.

The same functions as ``maxfx.graph.ops`` (defined in `lowering.ops.reduction`);
here ``max(x, axis=-1)`` and ``min(x, axis=-1)`` always reduce, as in MAX
(``ops.max`` also takes a second operand).

Example:
    >>> from maxfx.graph import ops
    >>> from maxfx.tensor import Tensor
    >>> ops.reduction.max(Tensor([[1.0, 5.0], [4.0, 0.0]]), axis=0)
    TensorType(dtype=float32, shape=[Dim(1), Dim(2)], device=cpu:0): [[4.0, 5.0]]
"""

from lowering.ops.reduction import argmax, argmin, mean, prod
from lowering.ops.reduction import max_ as _max
from lowering.ops.reduction import min_ as _min
from lowering.ops.reduction import sum_ as sum  # noqa: A004 - MAX's name

__all__ = ["argmax", "argmin", "max", "mean", "min", "prod", "sum"]


def max(x, axis: int = -1):  # noqa: A001 - MAX's name
    """Maximum of ``x`` along ``axis`` (kept with size 1)."""
    return _max(x, axis=axis)


def min(x, axis: int = -1):  # noqa: A001 - MAX's name
    """Minimum of ``x`` along ``axis`` (kept with size 1)."""
    return _min(x, axis=axis)
