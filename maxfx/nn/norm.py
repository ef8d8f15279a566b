"""``max.nn.norm``: `LayerNorm`, `RMSNorm`."""

from maxfx.nn._basic import LayerNorm, RMSNorm

__all__ = ["LayerNorm", "RMSNorm"]
