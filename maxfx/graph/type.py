"""Graph value types (``max.graph.type``)."""

from lowering.types import BufferType, ConvInputLayout, DeviceKind, DeviceRef, FilterLayout, OpaqueType, TensorType, Type

__all__ = ["BufferType", "ConvInputLayout", "DeviceKind", "DeviceRef", "FilterLayout", "OpaqueType", "TensorType", "Type"]
