"""``max.nn.norm.group_norm``: `GroupNorm`."""

from maxfx.nn._norm_layers import GroupNorm

__all__ = ["GroupNorm"]
