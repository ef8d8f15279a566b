"""``max.nn.linear``: `Linear` and the gated `MLP`."""

from maxfx.nn._basic import MLP, Linear

__all__ = ["Linear", "MLP"]
