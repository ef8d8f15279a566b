"""``max.nn.norm.layer_norm``: `LayerNorm`, `ConstantLayerNorm` (and the V1 `LayerNormV1`)."""

from maxfx.nn._basic import LayerNorm
from maxfx.nn._v1 import ConstantLayerNorm, LayerNormV1

__all__ = ["ConstantLayerNorm", "LayerNorm", "LayerNormV1"]
