"""Graph value types (``max.graph.type``)."""

from lowering.dims import Shape, ShapeLike
from lowering.driver_devices import Accelerator  # noqa: F401 - in MAX's module too (its tests patch max.graph.type.Accelerator)
from lowering.types import (
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
)

_OpaqueType = OpaqueType  # MAX's private name of the same class

__all__ = [
    "BufferType",
    "ConvInputLayout",
    "DeviceKind",
    "DevicePlacementPolicy",
    "DeviceRef",
    "FilterLayout",
    "OpaqueType",
    "Shape",
    "ShapeLike",
    "TensorType",
    "Type",
    "_ChainType",
    "_OpaqueType",
]
