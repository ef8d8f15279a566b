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

__all__ = ["activation_function_from_name", "activation_table"]


def activation_table(ops_namespace: Any) -> dict[str, Callable[..., Any]]:
    """Activation name -> function of ``ops_namespace`` (``maxfx.graph.ops`` or ``maxfx.experimental.functional``).

    ``swish`` is ``silu``; ``gelu_tanh`` / ``gelu_quick`` (alias ``quick_gelu``)
    are ``functools.partial(gelu, approximate="tanh" / "quick")``.

    Example:
        >>> from maxfx.graph import ops
        >>> activation_table(ops)["swish"] is ops.silu
        True
    """
    ns = ops_namespace
    return {
        "silu": ns.silu,
        "swish": ns.silu,
        "gelu": ns.gelu,
        "gelu_tanh": functools.partial(ns.gelu, approximate="tanh"),
        "gelu_quick": functools.partial(ns.gelu, approximate="quick"),
        "quick_gelu": functools.partial(ns.gelu, approximate="quick"),
        "relu": ns.relu,
        "tanh": ns.tanh,
        "sigmoid": ns.sigmoid,
    }


_ACTIVATIONS = activation_table(ops)


def lookup_activation(table: dict[str, Callable[..., Any]], name: str) -> Callable[..., Any]:
    """``table[name]``, or MAX's ValueError naming the accepted names."""
    try:
        return table[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"activation_function_from_name: Unrecognized activation function name {name!r}; expected one of "
            f"{sorted(table)}"
        ) from None


def activation_function_from_name(name: str) -> Callable[..., Any]:
    """The graph op for activation ``name``: ``silu`` (``swish``), ``gelu``, ``gelu_tanh``, ``gelu_quick``
    (``quick_gelu``), ``relu``, ``tanh`` or ``sigmoid``.

    ``gelu_tanh`` is ``functools.partial(ops.gelu, approximate="tanh")`` (and
    the quick variants ``approximate="quick"``); the others are the ops themselves.

    Raises:
        ValueError: for any other name.

    Example:
        >>> activation_function_from_name("gelu_tanh").keywords
        {'approximate': 'tanh'}
    """
    return lookup_activation(_ACTIVATIONS, name)
