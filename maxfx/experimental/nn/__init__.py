"""Eager-API neural-network modules (``max.experimental.nn``; also ``maxfx.nn.module_v3``).

Example:
    >>> from maxfx.experimental.nn import Linear, Sequential
    >>> from maxfx.experimental.tensor import Tensor
    >>> net = Sequential(Linear(4, 8), Linear(8, 2))
    >>> net(Tensor.ones([3, 4])).shape
    [Dim(3), Dim(2)]
"""

from maxfx.experimental.nn._extra_layers import QuantizedLinear
from maxfx.experimental.nn._fields import StaticFieldWarning, static_field
from maxfx.experimental.nn._layers import Embedding, Linear, ModuleList, Sequential
from maxfx.experimental.nn.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d
from maxfx.experimental.nn.module import Module, module_dataclass
from maxfx.experimental.nn.norm import GemmaRMSNorm, GroupNorm, LayerNorm, RMSNorm
from maxfx.experimental.nn.rope import RotaryEmbedding, TransposedRotaryEmbedding

__all__ = [
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "Embedding",
    "GemmaRMSNorm",
    "GroupNorm",
    "LayerNorm",
    "Linear",
    "Module",
    "ModuleList",
    "QuantizedLinear",
    "RMSNorm",
    "RotaryEmbedding",
    "Sequential",
    "TransposedRotaryEmbedding",
    "StaticFieldWarning",
    "module_dataclass",
    "static_field",
]
