"""``max.graph.ops.elementwise``: the elementwise ops, ``max``/``min`` as the two-operand maximum/minimum.

The same functions as ``maxfx.graph.ops`` (defined in `lowering.ops.elementwise`),
except that here ``max(x, y)`` and ``min(x, y)`` always take two operands, as in
MAX (``ops.max`` also reduces when given one).

Example:
    >>> from maxfx.graph import ops
    >>> from maxfx.tensor import Tensor
    >>> ops.elementwise.max(Tensor([1.0, 5.0]), Tensor([3.0, 3.0]))
    TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [3.0, 5.0]
"""

from lowering.ops.elementwise import (  # noqa: A004 - abs, pow, round: MAX's names
    abs,
    acos,
    add,
    atanh,
    ceil,
    cos,
    div,
    equal,
    erf,
    exp,
    floor,
    floor_div,
    gelu,
    greater,
    greater_equal,
    is_inf,
    is_nan,
    log,
    log1p,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    mod,
    mul,
    negate,
    not_equal,
    pow,
    relu,
    round,
    rsqrt,
    sigmoid,
    silu,
    sin,
    sqrt,
    sub,
    tanh,
    trunc,
)
from lowering.ops.reduction import max_ as _max
from lowering.ops.reduction import min_ as _min

__all__ = [
    "abs",
    "acos",
    "add",
    "atanh",
    "ceil",
    "cos",
    "div",
    "equal",
    "erf",
    "exp",
    "floor",
    "floor_div",
    "gelu",
    "greater",
    "greater_equal",
    "is_inf",
    "is_nan",
    "log",
    "log1p",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "max",
    "min",
    "mod",
    "mul",
    "negate",
    "not_equal",
    "pow",
    "relu",
    "round",
    "rsqrt",
    "sigmoid",
    "silu",
    "sin",
    "sqrt",
    "sub",
    "tanh",
    "trunc",
]


def max(x, y):  # noqa: A001 - MAX's name
    """Elementwise maximum of ``x`` and ``y`` (broadcasting and promotion as ``add``)."""
    return _max(x, y)


def min(x, y):  # noqa: A001 - MAX's name
    """Elementwise minimum of ``x`` and ``y`` (broadcasting and promotion as ``add``)."""
    return _min(x, y)
