"""Eager-API neural-network modules (``max.experimental.nn``; also ``maxfx.nn.module_v3``).

Example:
    >>> from maxfx.experimental.nn import Linear, Sequential
    >>> from maxfx.experimental.tensor import Tensor
    >>> net = Sequential(Linear(4, 8), Linear(8, 2))
    >>> net(Tensor.ones([3, 4])).shape
    [Dim(3), Dim(2)]
"""

from maxfx.experimental.nn._fields import StaticFieldWarning, static_field
from maxfx.experimental.nn._layers import Embedding, Linear, ModuleList, Sequential
from maxfx.experimental.nn._quantized_linear import QuantizedLinear
from maxfx.experimental.nn.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d
from maxfx.experimental.nn.module import (
    CompiledModel,
    Module,
    PinnedDeviceTensor,
    module_dataclass,
    replace_module,
    subgraphable,
)
from maxfx.experimental.nn.norm import GemmaRMSNorm, GroupNorm, LayerNorm, RMSNorm
from maxfx.experimental.nn.rope import RotaryEmbedding, TransposedRotaryEmbedding

__all__ = [
    "CompiledModel",
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
    "PinnedDeviceTensor",
    "QuantizedLinear",
    "RMSNorm",
    "RotaryEmbedding",
    "Sequential",
    "TransposedRotaryEmbedding",
    "StaticFieldWarning",
    "module_dataclass",
    "replace_module",
    "static_field",
    "subgraphable",
]
