"""Normalisation layers of the eager Module API (``max.experimental.nn.norm``).

Example:
    >>> from maxfx.experimental.nn.norm import GemmaRMSNorm, GroupNorm, LayerNorm, RMSNorm
    >>> from maxfx.experimental.tensor import Tensor
    >>> RMSNorm(4)(Tensor.ones([2, 4])).shape
    [Dim(2), Dim(4)]
"""

from maxfx.experimental.nn.norm.group_norm import GroupNorm, group_norm
from maxfx.experimental.nn.norm.layer_norm import LayerNorm, layer_norm
from maxfx.experimental.nn.norm.rms_norm import GemmaRMSNorm, RMSNorm, rms_norm

__all__ = ["GemmaRMSNorm", "GroupNorm", "LayerNorm", "RMSNorm", "group_norm", "layer_norm", "rms_norm"]
