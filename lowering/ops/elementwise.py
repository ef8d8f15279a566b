"""Elementwise ops: unary math, binary arithmetic, comparisons, logic, select.

Binary ops promote their operands with MAX's rules (`lowering.dtypes`) before
their rule runs, so rules see equal dtypes; shapes broadcast numpy-style.
"""

from __future__ import annotations

import jax.numpy as jnp

from lowering.context import bind
from lowering.ops import _rules as R
from lowering.registry import OpDef, front, register

__all__ = ["add", "relu"]

add_p = register(OpDef("add", rule=R.elementwise("add", dtypes=R.is_numeric, expected="numeric"), impl=jnp.add, promote=(0, 1)))


@front(add_p)
def add(lhs, rhs):
    """Elementwise ``lhs + rhs`` with numpy broadcasting and MAX dtype promotion.

    Example:
        >>> y = ops.add(x, 1.0)  # doctest: +SKIP
    """
    return bind(add_p, lhs, rhs)


relu_p = register(OpDef("relu", rule=R.unary("relu", dtypes=R.is_numeric, expected="numeric"), impl=lambda x: jnp.maximum(x, jnp.zeros((), x.dtype))))


@front(relu_p)
def relu(x):
    """Rectified linear unit ``max(x, 0)``.

    Example:
        >>> y = ops.relu(x)  # doctest: +SKIP
    """
    return bind(relu_p, x)
