"""`TensorLayout` and `BufferLayout`: a tensor's dtype, global shape and mapping, without its data.

MAX's input specs: ``module.compile(TensorLayout(dtype, ["batch", 2], device))``
declares an input the way a `TensorType` does, with a mapping (a device, a
mesh to replicate over, or a `DeviceMapping`) in place of one device. The
layout is itself a `DeviceMapping`, so code that reads placements takes it
directly.

Example:
    >>> from maxfx.driver import CPU
    >>> from maxfx.dtype import DType
    >>> layout = TensorLayout(DType.float32, ["batch", 2], CPU())
    >>> layout.rank, layout.is_fully_replicated, layout.to_type()
    (2, True, TensorType(dtype=float32, shape=[Dim('batch'), Dim(2)], device=cpu:0))
"""

from __future__ import annotations

from typing import Any

from lowering.dims import Dim, Shape
from lowering.dtypes import DType
from lowering.types import BufferType, DeviceRef, TensorType
from maxfx.experimental.sharding._mappings import DeviceMapping, NamedMapping, local_shard_shape
from maxfx.experimental.sharding._mesh import DeviceMesh
from maxfx.experimental.sharding._placements import Placement, Sharded
from maxfx.experimental.sharding._tensor import as_mapping

__all__ = ["BufferLayout", "TensorLayout"]


class TensorLayout(DeviceMapping):
    """A tensor's dtype, global shape (static or named dims) and mapping over a device mesh.

    Args:
        dtype: the element type.
        shape: the global shape; dims are ints or names (``"batch"``).
        mapping: a `Device` (one-device mesh), a `DeviceMesh` (replicated on
            every device) or a `DeviceMapping`.

    Raises:
        TypeError: ``dtype`` is not a `DType`, or ``mapping`` is not a device, mesh or mapping.
        ValueError: a ``Sharded`` placement names an axis the shape does not have.
    """

    _graph_type = TensorType

    def __init__(self, dtype: DType, shape: Any, mapping: Any):
        name = type(self).__name__
        if not isinstance(dtype, DType):
            raise TypeError(f"{name}: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
        self._dtype = dtype
        self._shape = Shape([Dim(d) for d in ([shape] if isinstance(shape, (int, str, Dim)) else shape)])
        self._mapping = mapping if isinstance(mapping, DeviceMapping) else as_mapping(mapping, name)
        if self._mapping.is_fully_resolved:
            for p in self._mapping.to_placements():
                if isinstance(p, Sharded) and not 0 <= p.axis < len(self._shape):
                    raise ValueError(
                        f"{name}: {p!r} is out of range for the rank-{len(self._shape)} shape {list(self._shape)}"
                    )
        elif isinstance(self._mapping, NamedMapping):  # compiler-only priorities: no placements, check the spec
            for i, entry in enumerate(self._mapping.spec):
                if entry is not None and i >= len(self._shape):
                    raise ValueError(
                        f"{name}: spec entry {i} ({entry!r}) is out of range for the rank-{len(self._shape)} shape "
                        f"{list(self._shape)}"
                    )

    @property
    def dtype(self) -> DType:
        """The element data type of the tensor."""
        return self._dtype

    @property
    def shape(self) -> Shape:
        """The global shape of the tensor."""
        return self._shape

    @property
    def mapping(self) -> DeviceMapping:
        """The distribution mapping over the device mesh."""
        return self._mapping

    @property
    def rank(self) -> int:
        """The number of dimensions."""
        return len(self._shape)

    @property
    def mesh(self) -> DeviceMesh:
        """The device mesh of the mapping."""
        return self._mapping.mesh

    @property
    def is_fully_replicated(self) -> bool:
        """True when every device holds the whole, reduced tensor (as the mapping says)."""
        return self._mapping.is_fully_replicated

    @property
    def is_fully_resolved(self) -> bool:
        """Whether eager dispatch can use this layout: the mapping's answer (False for a `NamedMapping` with
        priorities).
        """
        return self._mapping.is_fully_resolved

    def to_placements(self) -> tuple[Placement, ...]:
        return self._mapping.to_placements()

    def to_named_sharding(self, tensor_rank: int | None = None) -> NamedMapping:
        """The layout as a `NamedMapping` (for this layout's rank unless ``tensor_rank`` is given)."""
        return self._mapping.to_named_sharding(self.rank if tensor_rank is None else tensor_rank)

    def local_shape(self, device_index: int) -> list[Any]:
        """The shape of device ``device_index``'s shard (named dims split over a mesh axis get per-shard names)."""
        return local_shard_shape(list(self._shape), self._mapping, device_index)

    def to_type(self) -> TensorType | BufferType:
        """The graph input type of a layout on one device (what `Module.compile` declares).

        Raises:
            ValueError: the mesh has several devices (a graph input lives on one).
        """
        mesh = self.mesh
        if mesh.num_devices != 1:
            raise ValueError(
                f"{self!r}: a graph input lives on one device, but this layout spans {mesh.num_devices} devices; "
                "compile for one device (a layout over a one-device mesh, or a TensorType) and lay tensors out "
                "with sharding.distribute when calling"
            )
        return self._graph_type(self._dtype, list(self._shape), DeviceRef.from_device(mesh.devices[0]))

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return (self._dtype, list(self._shape), self._mapping) == (other._dtype, list(other._shape), other._mapping)

    def __hash__(self) -> int:
        return hash((type(self), self._dtype, tuple(self._shape), self._mapping))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dtype={self._dtype.name}, shape={list(self._shape)}, mapping={self._mapping!r})"


class BufferLayout(TensorLayout):
    """A `TensorLayout` for a mutable buffer: `to_type` gives a `BufferType`.

    Example:
        >>> from maxfx.driver import CPU
        >>> from maxfx.dtype import DType
        >>> BufferLayout(DType.int32, [4], CPU()).to_type()
        BufferType(dtype=int32, shape=[Dim(4)], device=cpu:0)
    """

    _graph_type = BufferType
