"""``max.nn.norm``: `LayerNorm`, `RMSNorm`, `GroupNorm`, `ConstantLayerNorm` and the V1 norms.

As in MAX, each norm also has its own module (``max.nn.norm.rms_norm``,
``layer_norm``, ``group_norm``), which the layer guides import from.

Example:
    >>> from maxfx.nn.norm.rms_norm import RMSNorm
    >>> from maxfx.nn.norm import RMSNorm as SameRMSNorm
    >>> RMSNorm is SameRMSNorm
    True
"""

from maxfx.nn.norm.group_norm import GroupNorm
from maxfx.nn.norm.layer_norm import ConstantLayerNorm, LayerNorm, LayerNormV1
from maxfx.nn.norm.rms_norm import RMSNorm, RMSNormV1

__all__ = ["ConstantLayerNorm", "GroupNorm", "LayerNorm", "LayerNormV1", "RMSNorm", "RMSNormV1"]
