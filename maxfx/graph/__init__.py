"""Explicit graph construction (``max.graph``): build, then compile with `maxfx.engine`.

Example:
    >>> from maxfx.graph import Graph, TensorType, ops
    >>> from maxfx.dtype import DType
    >>> with Graph("add_one", input_types=[TensorType(DType.float32, ["batch", 2])]) as g:
    ...     g.output(g.inputs[0] + 1)
"""

from lowering.debug import GraphDebugConfig
from maxfx.graph import dim, dtype_promotion, ops, shape, type, value, weight  # noqa: A004
from maxfx.graph._graph import Graph, KernelLibrary, _ChainValue
from maxfx.graph._module import Module
from maxfx.graph._value import BufferValue, TensorValue, Value
from maxfx.graph._weight import ShardingStrategy, Weight
from maxfx.graph.dim import AlgebraicDim, Dim, DimLike, StaticDim, SymbolicDim
from maxfx.graph.shape import Shape, ShapeLike
from maxfx.graph.type import (
    BufferType,
    ConvInputLayout,
    DeviceKind,
    DevicePlacementPolicy,
    DeviceRef,
    FilterLayout,
    OpaqueType,
    TensorType,
    Type,
    _ChainType,
    _OpaqueType,
)
from maxfx.graph.value import BufferValueLike, TensorValueLike

__all__ = [
    "AlgebraicDim",
    "BufferType",
    "BufferValue",
    "BufferValueLike",
    "ConvInputLayout",
    "DeviceKind",
    "DevicePlacementPolicy",
    "DeviceRef",
    "Dim",
    "DimLike",
    "FilterLayout",
    "Graph",
    "GraphDebugConfig",
    "KernelLibrary",
    "Module",
    "OpaqueType",
    "Shape",
    "ShapeLike",
    "ShardingStrategy",
    "StaticDim",
    "SymbolicDim",
    "TensorType",
    "TensorValue",
    "TensorValueLike",
    "Type",
    "Value",
    "Weight",
    "_ChainType",
    "_ChainValue",
    "_OpaqueType",
    "dim",
    "dtype_promotion",
    "ops",
    "shape",
    "type",
    "value",
    "weight",
]
