"""Mappings: a `DeviceMesh` plus how a tensor is laid out on it.

* `PlacementMapping`: one `Placement` per mesh axis (PyTorch DTensor style),
  what eager dispatch reads.
* `NamedMapping`: one entry per tensor dim naming the mesh axes that split it
  (JAX ``PartitionSpec`` style); `NamedMapping.named_sharding` is the
  ``jax.sharding.NamedSharding`` of the layout.

`local_shard_shape` gives one device's shard shape of a global shape.

Example:
    >>> from maxfx.driver import CPU
    >>> from maxfx.experimental.sharding import DeviceMesh, Sharded
    >>> mesh = DeviceMesh((CPU(), CPU()), (2,), ("dp",))
    >>> m = PlacementMapping(mesh, (Sharded(0),))
    >>> m.to_named_sharding(2).spec, local_shard_shape([5, 3], m, 1)
    (('dp', None), [2, 3])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jax.sharding import NamedSharding, PartitionSpec

from lowering.dims import Dim, StaticDim, SymbolicDim
from maxfx.experimental.sharding._mesh import DeviceMesh
from maxfx.experimental.sharding._placements import Partial, Placement, Replicated, Sharded

__all__ = [
    "ConversionError",
    "DeviceMapping",
    "NamedMapping",
    "PlacementMapping",
    "SpecEntry",
    "is_fully_replicated",
    "local_shard_shape",
    "shard_sizes",
]

SpecEntry = str | tuple[str, ...] | None


class ConversionError(ValueError):
    """A layout that one mapping style cannot express in the other."""


class DeviceMapping:
    """Base of the mappings: a mesh and the layout of a tensor on it."""

    @property
    def mesh(self) -> DeviceMesh:
        raise NotImplementedError

    @property
    def is_fully_replicated(self) -> bool:
        """True when every device holds the whole, reduced tensor."""
        return all(isinstance(p, Replicated) for p in self.to_placements())

    def to_placements(self) -> tuple[Placement, ...]:
        """One placement per mesh axis."""
        raise NotImplementedError

    def to_named_sharding(self, tensor_rank: int) -> NamedMapping:
        """The same layout as a `NamedMapping` for a tensor of rank ``tensor_rank``."""
        raise NotImplementedError


@dataclass(frozen=True, repr=False)
class PlacementMapping(DeviceMapping):
    """One `Placement` per mesh axis.

    Raises:
        ValueError: the placement count differs from the mesh's axis count.
    """

    _mesh: DeviceMesh
    _placements: tuple[Placement, ...]

    def __post_init__(self) -> None:
        if not isinstance(self._mesh, DeviceMesh):
            raise TypeError(f"PlacementMapping: expected a DeviceMesh, got {type(self._mesh).__name__}")
        object.__setattr__(self, "_placements", tuple(self._placements))
        if len(self._placements) != self._mesh.ndim:
            raise ValueError(f"Need one placement per mesh axis ({self._mesh.ndim}), got {len(self._placements)}.")
        for p in self._placements:
            if not isinstance(p, Placement):
                raise TypeError(f"PlacementMapping: placements must be Replicated(), Sharded(axis) or Partial(), got {p!r}")

    @property
    def mesh(self) -> DeviceMesh:
        return self._mesh

    @property
    def placements(self) -> tuple[Placement, ...]:
        """The placements, one per mesh axis."""
        return self._placements

    def to_placements(self) -> tuple[Placement, ...]:
        return self._placements

    def to_named_sharding(self, tensor_rank: int) -> NamedMapping:
        """Raises `ConversionError` for a ``Sharded`` axis outside ``tensor_rank``."""
        spec: list[Any] = [None] * tensor_rank
        unreduced: set[str] = set()
        for name, p in zip(self._mesh.axis_names, self._placements):
            if isinstance(p, Sharded):
                if not 0 <= p.axis < tensor_rank:
                    raise ConversionError(f"Sharded(axis={p.axis}) is out of range for tensor with rank {tensor_rank}.")
                cur = spec[p.axis]
                spec[p.axis] = name if cur is None else (*((cur,) if isinstance(cur, str) else cur), name)
            elif isinstance(p, Partial):
                unreduced.add(name)
        return NamedMapping(self._mesh, tuple(spec), frozenset(unreduced))

    def __repr__(self) -> str:
        return f"PlacementMapping({self._mesh}, [{', '.join(map(repr, self._placements))}])"


@dataclass(frozen=True, repr=False)
class NamedMapping(DeviceMapping):
    """One entry per tensor dim: a mesh axis name, a tuple of names, or None (whole).

    ``_unreduced`` names mesh axes holding partial sums (`Partial` placements).

    Raises:
        ValueError: an unknown axis name, or an axis both splitting and unreduced.
    """

    _mesh: DeviceMesh
    _spec: tuple[SpecEntry, ...]
    _unreduced: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_spec", tuple(self._spec))
        object.__setattr__(self, "_unreduced", frozenset(self._unreduced))
        used: set[str] = set()
        for i, entry in enumerate(self._spec):
            for name in _axes(entry):
                if name not in self._mesh.axis_names:
                    raise ValueError(f"Unknown mesh axis {name!r} at tensor dim {i}. Available: {self._mesh.axis_names}")
                used.add(name)
        for name in self._unreduced:
            if name not in self._mesh.axis_names:
                raise ValueError(f"Unknown mesh axis {name!r} in unreduced set. Available: {self._mesh.axis_names}")
        if used & self._unreduced:
            raise ValueError(f"Mesh axes {used & self._unreduced} are used for both sharding and unreduced.")

    @property
    def mesh(self) -> DeviceMesh:
        return self._mesh

    @property
    def spec(self) -> tuple[SpecEntry, ...]:
        """The per-dim entries."""
        return self._spec

    @property
    def unreduced(self) -> frozenset[str]:
        """Mesh axes with pending reductions."""
        return self._unreduced

    def to_placements(self) -> tuple[Placement, ...]:
        """Raises `ConversionError` when one mesh axis splits two tensor dims."""
        out: list[Placement] = [Replicated()] * self._mesh.ndim
        for dim, entry in enumerate(self._spec):
            for name in _axes(entry):
                ax = self._mesh.axis_names.index(name)
                if not isinstance(out[ax], Replicated):
                    raise ConversionError(f"Mesh axis {name!r} is already assigned to a different tensor dimension.")
                out[ax] = Sharded(dim)
        for name in self._unreduced:
            out[self._mesh.axis_names.index(name)] = Partial()
        return tuple(out)

    def to_named_sharding(self, tensor_rank: int) -> NamedMapping:
        return self

    def named_sharding(self) -> Any:
        """The ``jax.sharding.NamedSharding`` of this layout.

        Raises:
            ConversionError: unreduced axes (JAX arrays hold reduced values).
        """
        if self._unreduced:
            raise ConversionError(f"{self}: partial sums over {sorted(self._unreduced)} have no NamedSharding; reduce them first")
        return NamedSharding(self._mesh.jax_mesh(), PartitionSpec(*self._spec))

    def __repr__(self) -> str:
        extra = f", unreduced={set(self._unreduced)!r}" if self._unreduced else ""
        return f"NamedMapping({self._mesh}, ({', '.join(map(repr, self._spec))}){extra})"


def _axes(entry: SpecEntry) -> tuple[str, ...]:
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def is_fully_replicated(mapping: DeviceMapping) -> bool:
    """True when ``mapping`` puts the whole tensor on every device."""
    return mapping.is_fully_replicated


def shard_sizes(size: int, parts: int) -> list[int]:
    """Balanced split of ``size`` into ``parts`` (the first ``size % parts`` get one more).

    Example:
        >>> shard_sizes(5, 2)
        [3, 2]
    """
    q, r = divmod(int(size), int(parts))
    return [q + (i < r) for i in range(parts)]


def shard_slices(shape: Sequence[int], mapping: DeviceMapping, coord: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, stop)`` per tensor dim of the shard at mesh coordinate ``coord``.

    Mesh axes splitting the same dim split it in mesh-axis order (the first is outermost).
    """
    mesh = mapping.mesh
    bounds = [(0, int(d)) for d in shape]
    for ax, p in enumerate(mapping.to_placements()):
        if isinstance(p, Sharded):
            if not 0 <= p.axis < len(bounds):
                raise ValueError(f"{mapping}: Sharded(axis={p.axis}) is out of range for a tensor of shape {list(shape)}")
            lo, hi = bounds[p.axis]
            sizes = shard_sizes(hi - lo, mesh.mesh_shape[ax])
            start = lo + sum(sizes[: coord[ax]])
            bounds[p.axis] = (start, start + sizes[coord[ax]])
    return bounds


def local_shard_shape(shape: Sequence[Any], mapping: DeviceMapping, device_index: int) -> list[Any]:
    """Shape of device ``device_index``'s shard of a tensor of global ``shape``.

    Unsplit dims keep their value (symbolic ones included). A named dim split
    over mesh axis ``ax`` becomes a fresh name per shard, as in MAX:
    ``"batch"`` split over ``dp`` is ``batch_dp_0`` on the first shard.

    Raises:
        ValueError: an algebraic dim (``batch + 1``) split over a mesh axis.

    Example:
        >>> from maxfx.driver import CPU
        >>> m = PlacementMapping(DeviceMesh((CPU(), CPU()), (2,), ("dp",)), (Sharded(0),))
        >>> local_shard_shape(["batch", 3], m, 1)
        [Dim('batch_dp_1'), 3]
    """
    mesh = mapping.mesh
    coord = list(mesh.coords())[device_index]
    placements = mapping.to_placements()
    split = {p.axis for p in placements if isinstance(p, Sharded)}
    dims = [Dim(d) for d in shape]
    static = []
    for i, d in enumerate(dims):
        if isinstance(d, StaticDim) or i not in split:
            static.append(int(d) if isinstance(d, StaticDim) else 0)
        elif isinstance(d, SymbolicDim):
            for ax, p in enumerate(placements):
                if isinstance(p, Sharded) and p.axis == i:
                    d = SymbolicDim(f"{d.name}_{mesh.axis_names[ax]}_{coord[ax]}")
            dims[i] = d
            static.append(0)
        else:
            raise ValueError(f"{mapping}: cannot split the algebraic dim {d} of shape {list(shape)} over the mesh")
    bounds = shard_slices(static, mapping, coord)
    return [
        hi - lo if i in split and isinstance(d, StaticDim) else int(d) if isinstance(d, StaticDim) else d
        for i, ((lo, hi), d) in enumerate(zip(bounds, dims))
    ]


