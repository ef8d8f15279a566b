"""`Identity`, the graph-API layer that returns its input unchanged (public as ``max.nn.identity.Identity`` and
``max.nn.Identity``).

Example:
    >>> from maxfx.nn import Identity
    >>> x = object()
    >>> Identity()(x) is x
    True
"""

from __future__ import annotations

from typing import Any

from maxfx.nn._layer import Module

__all__ = ["Identity"]


class Identity(Module):
    """A graph-API layer that passes its input through unchanged (MAX: where an architecture skips a step,
    e.g. EAGLE's draft model receiving already-normalized hidden states)."""

    def __call__(self, x: Any) -> Any:
        """Return ``x`` itself."""
        return x
