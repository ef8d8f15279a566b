"""`DistributedTensor`: an eager tensor laid out over a `DeviceMesh` as one local shard per device.

A distributed tensor is its shards (ordinary single-device `Tensor`\\ s, in
mesh order) plus a `PlacementMapping` saying how they make the global tensor:
``Sharded(d)`` shards are slices of dim ``d``, ``Replicated()`` shards are
copies, ``Partial()`` shards are terms of a reduction. Ops on distributed
tensors run shard by shard (SPMD) when every distributed operand is fully
replicated; other layouts must be `redistribute`\\ d first (layers that know
their layout, like tensor-parallel MoE, work on `local_shards` directly).

Reading values (``to_numpy``, ``item``, printing) assembles the global tensor
on the mesh's first device; `DistributedTensor.jax_array` gives it as a
``jax.Array`` with a ``NamedSharding`` over `DeviceMesh.jax_mesh`.

Example:
    >>> import numpy as np
    >>> from maxfx.driver import CPU
    >>> from maxfx.experimental.tensor import Tensor
    >>> from maxfx.experimental.sharding import DeviceMesh, PlacementMapping, Sharded, distribute
    >>> mesh = DeviceMesh((CPU(), CPU()), (2,), ("dp",))
    >>> t = distribute(Tensor(np.arange(6.0, dtype=np.float32).reshape(3, 2)), PlacementMapping(mesh, (Sharded(0),)))
    >>> [list(s.shape) for s in t.local_shards], float(t.to_numpy().sum())
    ([[Dim(2), Dim(2)], [Dim(1), Dim(2)]], 15.0)
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from lowering.context import Context, find_context
from lowering.dims import StaticDim
from lowering.types import TensorType
from maxfx.driver import Device
from maxfx.experimental._tensor import DISTRIBUTED, EAGER, Tensor, _Done
from maxfx.experimental.sharding._mappings import DeviceMapping, PlacementMapping, local_shard_shape, shard_slices
from maxfx.experimental.sharding._mesh import DeviceMesh
from maxfx.experimental.sharding._placements import Partial, ReduceOp, Replicated, Sharded
from maxfx.graph import ops

__all__ = [
    "DistributedTensor",
    "ShardingError",
    "as_mapping",
    "assemble",
    "distribute",
    "filled",
    "from_shards",
    "redistribute",
]


class ShardingError(ValueError):
    """An op or conversion that the operands' layouts do not allow."""


def as_mapping(target: Any, where: str = "sharding") -> PlacementMapping:
    """A `PlacementMapping` for ``target``: a mapping, a mesh (replicated) or a device (one-device mesh)."""
    if isinstance(target, PlacementMapping):
        return target
    if isinstance(target, DeviceMapping):
        return PlacementMapping(target.mesh, target.to_placements())
    if isinstance(target, DeviceMesh):
        return PlacementMapping(target, (Replicated(),) * target.ndim)
    if isinstance(target, Device):
        return PlacementMapping(DeviceMesh.single(target), (Replicated(),))
    raise TypeError(f"{where}: expected a Device, DeviceMesh or DeviceMapping, got {type(target).__name__}")


class DistributedTensor(Tensor):
    """A tensor held as one local shard per device of a mesh (see the module docs).

    Build one with `distribute`, `from_shards` or ``Tensor.zeros(shape, device=mapping)``.
    """

    __slots__ = ("_shards", "_mapping", "_shape")

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError(
            "DistributedTensor: build one with sharding.distribute, sharding.from_shards or Tensor.zeros(shape, "
            "device=mapping)"
        )

    @classmethod
    def _make(cls, shards: Sequence[Tensor], mapping: PlacementMapping) -> DistributedTensor:
        t = object.__new__(cls)
        t._var = None
        t._gv = None
        t._shards = tuple(shards)
        t._mapping = mapping
        t._shape = _global_shape(t._shards, mapping)
        return t

    # -- layout ------------------------------------------------------------
    @property
    def __lowering_context__(self) -> Context:
        return SHARDWISE

    @property
    def mapping(self) -> PlacementMapping:
        """How the shards make the global tensor."""
        return self._mapping

    @property
    def mesh(self) -> DeviceMesh:
        """The mesh holding the shards."""
        return self._mapping.mesh

    @property
    def placements(self) -> tuple[Any, ...]:
        """One placement per mesh axis."""
        return self._mapping.to_placements()

    @property
    def local_shards(self) -> tuple[Tensor, ...]:
        """Each device's shard, in mesh order."""
        return self._shards

    # -- type --------------------------------------------------------------
    @property
    def type(self) -> TensorType:
        """Global dtype and shape, on the mesh's first device."""
        return TensorType(self._shards[0].dtype, self._shape, self._shards[0].type.device)

    @property
    def shape(self) -> Any:
        return self.type.shape

    @property
    def device(self) -> Device:
        """The device of a one-device mesh.

        Raises:
            ValueError: the mesh has several devices (see `mapping`).
        """
        if self.mesh.num_devices != 1:
            raise ValueError(f"a tensor distributed over {self.mesh} has no single device; see .mapping")
        return self._shards[0].device

    # -- values --------------------------------------------------------------
    @property
    def real(self) -> bool:
        return all(s.real for s in self._shards)

    @property
    def realize(self) -> _Done:
        for s in self._shards:
            s._array()
        return _Done(self)

    @property
    def storage(self) -> None:
        return None

    def _array(self) -> Any:
        return assemble(self)._array()

    def jax_array(self) -> Any:
        """The global value as a ``jax.Array`` sharded by ``NamedSharding`` over `DeviceMesh.jax_mesh`.

        Raises:
            ShardingError: partial sums (reduce them first), a simulated mesh or uneven shards.
        """
        named = self._mapping.to_named_sharding(self.rank)
        sizes = {tuple(int(d) for d in s.shape) for s in self._shards}
        if named.unreduced or self.mesh.is_simulated or len(sizes) != 1:
            raise ShardingError(
                f"jax_array: {self._mapping} with shard shapes {sorted(sizes)} has no NamedSharding (needs real "
                "devices, even shards, no Partial)"
            )
        return jax.make_array_from_single_device_arrays(
            tuple(int(d) for d in self._shape), named.named_sharding(), [s._array() for s in self._shards]
        )

    def to(self, target: Any) -> Tensor:
        """The tensor on ``target``: a Device (the assembled tensor), a DeviceMesh (replicated) or a mapping."""
        if isinstance(target, Device) and not isinstance(target, DeviceMesh):
            return assemble(self).to(target)
        return redistribute(self, target)

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError(
            "DistributedTensor.__setitem__: distributed tensors are immutable; assemble or redistribute first"
        )

    def __repr__(self) -> str:
        head = f"DistributedTensor(dtype={self.dtype}, shape={list(self.shape)}, mapping={self._mapping})"
        return f"{head}: {assemble(self)!s}" if self.real else head

    __str__ = __repr__


# ─── construction ──────────────────────────────────────────────────────────


def _global_shape(shards: tuple[Tensor, ...], mapping: PlacementMapping) -> list[Any]:
    mesh = mapping.mesh
    if len(shards) != mesh.num_devices:
        raise ShardingError(f"from_shards: {mesh} has {mesh.num_devices} devices but {len(shards)} shards were given")
    first = shards[0]
    for i, s in enumerate(shards):
        if not isinstance(s, Tensor) or isinstance(s, DistributedTensor):
            raise TypeError(f"from_shards: shard {i} must be a single-device Tensor, got {type(s).__name__}")
        if s.dtype != first.dtype or s.rank != first.rank:
            raise ShardingError(
                f"from_shards: shard {i} is {s.dtype.name}{list(s.shape)} but shard 0 is "
                f"{first.dtype.name}{list(first.shape)}"
            )
    coords = list(mesh.coords())
    shape: list[Any] = list(first.shape)
    for dim in range(first.rank):
        axes = [ax for ax, p in enumerate(mapping.to_placements()) if isinstance(p, Sharded) and p.axis == dim]
        if axes:  # the shards at coordinate 0 on every other axis tile this dim
            tiles = [
                s.shape[dim]
                for s, c in zip(shards, coords)
                if all(c[a] == 0 for a in range(mesh.ndim) if a not in axes)
            ]
            shape[dim] = functools.reduce(operator.add, tiles)  # named shard dims add up to an algebraic dim
            if isinstance(shape[dim], StaticDim):
                shape[dim] = int(shape[dim])
    for p in mapping.to_placements():
        if isinstance(p, Sharded) and not 0 <= p.axis < first.rank:
            raise ShardingError(f"from_shards: {p} is out of range for shards of rank {first.rank}")
    return shape


def from_shards(shards: Sequence[Tensor], mapping: Any) -> DistributedTensor:
    """A distributed tensor made of ``shards`` (one per mesh device, in mesh order) laid out by ``mapping``.

    Raises:
        ShardingError: the shard count, dtypes or ranks do not fit the mesh.
    """
    mapping = as_mapping(mapping, "from_shards")
    for i, (s, dev) in enumerate(zip(shards, mapping.mesh.devices)):
        if isinstance(s, Tensor) and s._gv is None and not isinstance(s, DistributedTensor) and s.device != dev:
            raise ShardingError(f"from_shards: shard {i} is on {s.device}, but mesh slot {i} is {dev}")
    return DistributedTensor._make(shards, mapping)


def distribute(tensor: Any, target: Any) -> DistributedTensor:
    """Lay ``tensor`` out over a mesh as ``target`` (a mapping, or a mesh to replicate over) says.

    ``Sharded`` axes slice it, ``Replicated`` axes copy it; a ``Partial(sum)``
    axis puts the value on its first device and zeros on the others.

    Example:
        >>> from maxfx.driver import CPU
        >>> mesh = DeviceMesh((CPU(),), (1,), ("tp",))
        >>> distribute(Tensor([1.0, 2.0]), mesh).placements
        (Replicated(),)
    """
    mapping = as_mapping(target, "distribute")
    if isinstance(tensor, DistributedTensor):
        return redistribute(tensor, mapping)
    if not isinstance(tensor, Tensor):
        tensor = Tensor(tensor)
    try:
        shape = [int(d) for d in tensor.shape]
    except TypeError:
        raise ShardingError(f"distribute: cannot lay out a tensor of symbolic shape {list(tensor.shape)}") from None
    partial_sum = [
        ax for ax, p in enumerate(mapping.to_placements()) if isinstance(p, Partial) and p.reduce_op is ReduceOp.SUM
    ]
    shards = []
    for dev, coord in zip(mapping.mesh.devices, mapping.mesh.coords()):
        bounds = shard_slices(shape, mapping, coord)
        piece = tensor
        if any((lo, hi) != (0, n) for (lo, hi), n in zip(bounds, shape)):
            piece = tensor[tuple(slice(lo, hi) for lo, hi in bounds)]
        if any(coord[ax] for ax in partial_sum):
            piece = piece * 0
        shards.append(piece.to(dev))
    return DistributedTensor._make(shards, mapping)


def filled(shape: Any, value: Any, dtype: Any, target: Any, where: str = "Tensor.full") -> DistributedTensor:
    """``Tensor.full(shape, value)`` laid out by ``target``, made shard by shard on each device."""
    mapping = as_mapping(target, where)
    dims = [shape] if isinstance(shape, int) else list(shape)
    partial_sum = [
        ax for ax, p in enumerate(mapping.to_placements()) if isinstance(p, Partial) and p.reduce_op is ReduceOp.SUM
    ]
    shards = []
    for i, (dev, coord) in enumerate(zip(mapping.mesh.devices, mapping.mesh.coords())):
        local = local_shard_shape(dims, mapping, i)
        v = 0 if any(coord[ax] for ax in partial_sum) else value
        shards.append(Tensor.full(local, v, dtype=dtype, device=dev))
    return DistributedTensor._make(shards, mapping)


# ─── assembling and redistributing ─────────────────────────────────────────


def _combine(parts: list[Tensor], placement: Any) -> Tensor:
    if isinstance(placement, Sharded):
        return parts[0] if len(parts) == 1 else ops.concat(parts, axis=placement.axis)
    if isinstance(placement, Partial):
        op = placement.reduce_op
        if op is ReduceOp.MAX:
            return functools.reduce(ops.max, parts)
        if op is ReduceOp.MIN:
            return functools.reduce(ops.min, parts)
        total = functools.reduce(ops.add, parts)
        return total / len(parts) if op is ReduceOp.AVG else total
    return parts[0]


def assemble(tensor: DistributedTensor) -> Tensor:
    """The global tensor on the mesh's first device: shards concatenated, partials reduced, copies dropped.

    Mesh axes are folded from the last to the first, so several axes splitting
    one dim concatenate inner chunks before outer ones.
    """
    mesh, first = tensor.mesh, tensor.mesh.devices[0]
    grid = np.empty(mesh.mesh_shape, dtype=object)
    for s, coord in zip(tensor.local_shards, mesh.coords()):
        grid[coord] = s if s._gv is not None or s.device == first else s.to(first)
    for ax in reversed(range(mesh.ndim)):
        grid = np.moveaxis(grid, ax, -1)
        out = np.empty(grid.shape[:-1], dtype=object)
        for idx in np.ndindex(*out.shape):
            out[idx] = _combine(list(grid[idx]), tensor.placements[ax])
        grid = out
    return grid[()]


def redistribute(tensor: Tensor, target: Any) -> DistributedTensor:
    """``tensor`` laid out as ``target`` says (a mapping, or a mesh to replicate over).

    Partials are reduced and shards gathered on the first device, then the
    value is laid out again (an all-reduce / all-gather through one device).
    """
    mapping = as_mapping(target, "redistribute")
    if isinstance(tensor, DistributedTensor):
        if tensor.mapping == mapping:
            return tensor
        tensor = assemble(tensor)
    return distribute(tensor, mapping)


# ─── shard-by-shard dispatch ───────────────────────────────────────────────


class _Shardwise(Context):
    """Runs an op on each device's shards; the result keeps the operands' (replicated) layout."""

    concrete = True
    parent = EAGER  # so a distributed operand beside eager tensors picks this context

    def bind(self, op: Any, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        dist = [x for x in inputs if isinstance(x, DistributedTensor)]
        mesh = dist[0].mesh
        for x in dist:
            if x.mesh != mesh:
                raise ShardingError(f"{op.name}: operands live on different meshes ({mesh} and {x.mesh})")
            if not x.mapping.is_fully_replicated:
                layouts = ", ".join(str(list(x.placements)) for x in dist)
                raise ShardingError(
                    f"{op.name}: no sharding rule for operands laid out as {layouts}; redistribute them to "
                    "Replicated() first (sharding.redistribute) or work on .local_shards"
                )
        for x in inputs:
            if isinstance(x, Tensor) and not isinstance(x, DistributedTensor) and mesh.num_devices > 1:
                raise ShardingError(
                    f"{op.name}: a single-device tensor on {x.device} next to a tensor distributed over {mesh}; "
                    "distribute it first"
                )
        results = []
        for i in range(mesh.num_devices):
            local = [x.local_shards[i] if isinstance(x, DistributedTensor) else x for x in inputs]
            results.append(find_context(op.name, local).bind(op, local, params))
        first, mapping = results[0], dist[0].mapping
        if first is None:
            return None
        if isinstance(first, tuple):
            return tuple(DistributedTensor._make([r[k] for r in results], mapping) for k in range(len(first)))
        return DistributedTensor._make(results, mapping)


SHARDWISE = _Shardwise()
DISTRIBUTED["filled"] = filled  # Tensor.zeros/ones/full(device=mapping)
