"""``max.nn.activation``: activation functions by the names model configs use.

Example:
    >>> from maxfx.nn.activation import activation_function_from_name
    >>> from maxfx.graph import ops
    >>> activation_function_from_name("silu") is ops.silu
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from maxfx.graph import ops

__all__ = ["activation_function_from_name"]

_ACTIVATIONS: dict[str, Callable[..., Any]] = {
    "silu": ops.silu,
    "gelu": ops.gelu,
    "gelu_tanh": functools.partial(ops.gelu, approximate="tanh"),
    "relu": ops.relu,
    "tanh": ops.tanh,
    "sigmoid": ops.sigmoid,
}


def activation_function_from_name(name: str) -> Callable[..., Any]:
    """The graph op for activation ``name``: ``silu``, ``gelu``, ``gelu_tanh``, ``relu``, ``tanh`` or ``sigmoid``.

    ``gelu_tanh`` is ``functools.partial(ops.gelu, approximate="tanh")``; the
    others are the ops themselves.

    Raises:
        ValueError: for any other name.

    Example:
        >>> activation_function_from_name("gelu_tanh").keywords
        {'approximate': 'tanh'}
    """
    try:
        return _ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"activation_function_from_name: Unrecognized activation function name {name!r}; expected one of {sorted(_ACTIVATIONS)}") from None
