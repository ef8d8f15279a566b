"""``max.nn.norm.layer_norm``: `LayerNorm`, `ConstantLayerNorm` (and the V1 `LayerNormV1`)."""

from maxfx.nn._basic import LayerNorm
from maxfx.nn._norm_layers import ConstantLayerNorm
from maxfx.nn._v1 import LayerNormV1

__all__ = ["ConstantLayerNorm", "LayerNorm", "LayerNormV1"]
