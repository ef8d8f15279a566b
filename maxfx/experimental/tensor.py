"""Eager tensors (``max.experimental.tensor``, also ``maxfx.tensor``).

Example:
    >>> from maxfx.tensor import Tensor
    >>> print(Tensor.constant([1.0, 2.0]) * 3)
    TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [3.0, 6.0]
"""

from lowering.types import TensorType
from maxfx.experimental._defaults import contextvar_context, default_device, default_dtype, defaults
from maxfx.experimental._tensor import ComputeGraph, Tensor, driver_tensor_type

__all__ = [
    "ComputeGraph",
    "Tensor",
    "TensorType",
    "contextvar_context",
    "default_device",
    "default_dtype",
    "defaults",
    "driver_tensor_type",
]
