"""Eager-API neural-network modules (``max.experimental.nn``; also ``maxfx.nn.module_v3``).

Example:
    >>> from maxfx.experimental.nn import Linear, Sequential
    >>> from maxfx.experimental.tensor import Tensor
    >>> net = Sequential(Linear(4, 8), Linear(8, 2))
    >>> net(Tensor.ones([3, 4])).shape
    [Dim(3), Dim(2)]
"""

from maxfx.experimental.nn._extra_layers import QuantizedLinear, RMSNorm
from maxfx.experimental.nn._fields import StaticFieldWarning, static_field
from maxfx.experimental.nn._layers import Embedding, LayerNorm, Linear, ModuleList, Sequential
from maxfx.experimental.nn.module import Module, module_dataclass

__all__ = [
    "Embedding",
    "LayerNorm",
    "Linear",
    "Module",
    "ModuleList",
    "QuantizedLinear",
    "RMSNorm",
    "Sequential",
    "StaticFieldWarning",
    "module_dataclass",
    "static_field",
]
