"""``max.nn.sequential``: `Sequential`."""

from maxfx.nn._basic import Sequential

__all__ = ["Sequential"]
