"""``max.nn.norm``: `LayerNorm`, `RMSNorm`, `GroupNorm`, `ConstantLayerNorm` and the V1 norms."""

from maxfx.nn._basic import LayerNorm, RMSNorm
from maxfx.nn._v1 import ConstantLayerNorm, GroupNorm, LayerNormV1, RMSNormV1

__all__ = ["ConstantLayerNorm", "GroupNorm", "LayerNorm", "LayerNormV1", "RMSNorm", "RMSNormV1"]
