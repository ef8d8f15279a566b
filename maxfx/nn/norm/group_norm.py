"""``max.nn.norm.group_norm``: `GroupNorm`."""

from maxfx.nn._v1 import GroupNorm

__all__ = ["GroupNorm"]
