"""Layer normalisation of the eager Module API (``max.experimental.nn.norm.layer_norm``)."""

from maxfx.experimental import functional as F
from maxfx.experimental.nn._layers import LayerNorm

__all__ = ["LayerNorm", "layer_norm"]

layer_norm = F.layer_norm
