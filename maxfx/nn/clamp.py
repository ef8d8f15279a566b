"""``max.nn.clamp``: `clamp`."""

from maxfx.nn._basic import clamp

__all__ = ["clamp"]
