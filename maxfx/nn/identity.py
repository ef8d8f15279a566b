"""``max.nn.identity``: `Identity`."""

from maxfx.nn._identity import Identity

__all__ = ["Identity"]
