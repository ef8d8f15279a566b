"""``max.experimental.nn.common_layers.activation``: eager activation functions by config name.

Example:
    >>> from maxfx.experimental import functional as F
    >>> activation_function_from_name("silu") is F.silu
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from maxfx.experimental import functional as F
from maxfx.nn.activation import activation_table, lookup_activation

__all__ = ["activation_function_from_name"]

_ACTIVATIONS = activation_table(F)


def activation_function_from_name(name: str) -> Callable[..., Any]:
    """The ``maxfx.experimental.functional`` function for activation ``name``.

    ``silu`` (``swish``), ``gelu``, ``gelu_tanh``, ``gelu_quick`` (``quick_gelu``),
    ``relu``, ``tanh``, ``sigmoid``; the gelu variants are
    ``functools.partial(F.gelu, approximate=...)``.

    Raises:
        ValueError: for any other name.

    Example:
        >>> from maxfx.experimental.tensor import Tensor
        >>> activation_function_from_name("quick_gelu")(Tensor([0.0])).item()
        0.0
    """
    return lookup_activation(_ACTIVATIONS, name)
