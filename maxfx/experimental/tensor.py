"""Eager tensors (``max.experimental.tensor``, also ``maxfx.tensor``).

Example:
    >>> from maxfx.tensor import Tensor
    >>> print(Tensor([1.0, 2.0]) * 3)
    TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [3.0, 6.0]
"""

from lowering.types import TensorType
from maxfx.experimental._defaults import _default_device as _default_device  # MAX's private helpers, used by its tests
from maxfx.experimental._defaults import _default_dtype as _default_dtype
from maxfx.experimental._defaults import contextvar_context, default_device, default_dtype, defaults, defaults_like
from maxfx.experimental._tensor import ComputeGraph, Tensor, driver_tensor_type
from maxfx.graph._literal import NestedArray, Number

__all__ = [
    "ComputeGraph",
    "NestedArray",
    "Number",
    "Tensor",
    "TensorType",
    "contextvar_context",
    "default_device",
    "default_dtype",
    "defaults",
    "defaults_like",
    "driver_tensor_type",
]
