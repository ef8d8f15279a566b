"""``max.experimental.nn.common_layers.kv_cache``: the paged KV cache as distributed eager tensors.

`PagedCacheValues` holds each cache input (block pool, lengths, lookup table,
...) as one tensor over a `DeviceMesh`: its shard ``i`` is device ``i``'s
value. Eager layers (`LatentAttentionWithRope`) take it as ``kv_collection``
and run each device on `for_device` ``(i)``.

Example:
    >>> from maxfx.driver import CPU
    >>> from maxfx.dtype import DType
    >>> from maxfx.experimental.sharding import DeviceMesh, PlacementMapping, Replicated
    >>> from maxfx.experimental.tensor import Tensor
    >>> from maxfx.graph import DeviceRef
    >>> from maxfx.nn.kv_cache import MLAKVCacheParams
    >>> params = MLAKVCacheParams(DType.float32, head_dim=24, num_layers=1, devices=[DeviceRef.CPU()], num_q_heads=4,
    ...     page_size=4)
    >>> sizes = {"total_num_pages": 2, "batch_size": 1, "max_num_pages": 2}
    >>> size = lambda d: int(d) if str(d).isdigit() else sizes[next(k for k in sizes if str(d).endswith(k))]
    >>> shape = lambda t: [size(d) for d in t.shape]
    >>> symbols = params.get_symbolic_inputs()
    >>> values = [Tensor.zeros(shape(t), dtype=t.dtype) for t in symbols.flatten()]
    >>> mapping = PlacementMapping(DeviceMesh((CPU(),), (1,), ("x",)), (Replicated(),))
    >>> kv = PagedCacheValues.from_upstream(symbols.unflatten(iter(values)).inputs, mapping)
    >>> kv.n_devices, list(map(int, kv.kv_blocks.shape))
    (1, [2, 1, 1, 4, 1, 24])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lowering.types import BufferType
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.sharding import DeviceMesh, DistributedTensor, PlacementMapping, as_mapping, from_shards
from maxfx.graph._value import BufferValue, Value
from maxfx.nn.kv_cache._symbolic_inputs import KVCacheInputsPerDevice

__all__ = ["PagedCacheValues"]

_FIELDS = tuple(f.name for f in dataclasses.fields(KVCacheInputsPerDevice) if f.name != "kv_blocks_per_layer")


def _as_tensor(value: Any, where: str) -> Tensor:
    """An eager tensor for one device's input: eager tensors pass, graph values are wrapped."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, Value):
        if isinstance(value, BufferValue) or isinstance(value.type, BufferType):
            raise TypeError(
                f"PagedCacheValues.from_upstream: {where} is a graph buffer value, which an eager Tensor cannot wrap; "
                "pass the eager tensor itself"
            )
        return Tensor.from_graph_value(value)
    raise TypeError(
        f"PagedCacheValues.from_upstream: {where} must be an eager Tensor or a graph value, got {type(value).__name__}"
    )


def _mapping_for(shards: list[Tensor], mapping: PlacementMapping, name: str) -> PlacementMapping:
    """``mapping``, or for inputs that live on the host (``max_prompt_length``, ...) the same layout over their devices.

    Device ``i``'s host-side value stays shard ``i``: the mesh keeps its shape and
    axis names, its slots hold the host devices (a mesh simulated on one device).
    """
    mesh = mapping.mesh
    devices = tuple(s.device for s in shards)
    if all(s._gv is not None for s in shards) or all(d == m for d, m in zip(devices, mesh.devices)):
        return mapping
    if len(set(devices)) != 1:
        raise ValueError(
            f"PagedCacheValues.from_upstream: {name} lives on {list(devices)}, neither the mesh's devices "
            f"{list(mesh.devices)} nor one host device"
        )
    return PlacementMapping(DeviceMesh(devices, mesh.mesh_shape, mesh.axis_names), mapping.to_placements())


@dataclass
class PagedCacheValues(KVCacheInputsPerDevice):
    """Distributed view of the paged KV cache inputs: every field is a tensor over one mesh (shard ``i`` = device
    ``i``).

    Build it with `from_upstream` from the per-device records that
    ``KVCacheParams.get_symbolic_inputs().unflatten(...)`` gives.
    """

    @classmethod
    def from_upstream(cls, per_device: Sequence[KVCacheInputsPerDevice], mapping: Any) -> PagedCacheValues:
        """The distributed cache made of ``per_device`` records (one per device of ``mapping``'s mesh, in mesh order).

        Raises:
            ValueError: the record count differs from the mesh's device count, or the records set different optional
            fields.
            TypeError: a field is neither an eager tensor nor a graph value.
        """
        per_device = list(per_device)
        mapping = as_mapping(mapping, "PagedCacheValues.from_upstream")
        n = mapping.mesh.num_devices
        if len(per_device) != n:
            raise ValueError(
                f"PagedCacheValues.from_upstream: {len(per_device)} per-device records for a mesh of {n} devices "
                f"({mapping.mesh})"
            )
        if per_device[0].kv_blocks_per_layer:
            raise ValueError(
                "PagedCacheValues.from_upstream: per-layer block buffers (kv_blocks_per_layer) are not supported"
            )
        fields: dict[str, Any] = {}
        for name in _FIELDS:
            values = [getattr(d, name) for d in per_device]
            present = [v is not None for v in values]
            if any(present) and not all(present):
                raise ValueError(
                    f"PagedCacheValues.from_upstream: {name} is set on some devices but not on others ({present})"
                )
            if values[0] is not None:
                shards = [_as_tensor(v, f"{name} of device {i}") for i, v in enumerate(values)]
                fields[name] = from_shards(shards, _mapping_for(shards, mapping, name))
        return cls(**fields)

    @property
    def n_devices(self) -> int:
        """The number of devices the paged KV cache is located on."""
        return len(self.kv_blocks.local_shards)

    def __iter__(self) -> Iterator[Tensor]:
        """The cache tensors in MAX's ABI order (``kv_scales`` only when set; dispatch metadata never)."""
        yield from (
            self.kv_blocks,
            self.cache_lengths,
            self.lookup_table,
            self.max_prompt_length,
            self.max_cache_length,
        )
        if self.kv_scales is not None:
            yield self.kv_scales

    def for_device(self, i: int) -> KVCacheInputsPerDevice:
        """Device ``i``'s record (its local shards): what maxfx's attention kernels take as ``kv_collection``.

        Raises:
            IndexError: ``i`` is not a device of the mesh.
        """
        if not 0 <= i < self.n_devices:
            raise IndexError(
                f"PagedCacheValues.for_device: device {i} is out of range for a cache on {self.n_devices} devices"
            )

        def local(name: str) -> Any:
            value = getattr(self, name)
            if value is None:
                return None
            return value.local_shards[i] if isinstance(value, DistributedTensor) else value

        return KVCacheInputsPerDevice(**{name: local(name) for name in _FIELDS})
