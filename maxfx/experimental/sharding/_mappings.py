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

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jax.sharding import NamedSharding, PartitionSpec

from lowering.dims import Dim, StaticDim, SymbolicDim
from maxfx.experimental.sharding._mesh import DeviceMesh, get_active_mesh
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

    @property
    def is_fully_resolved(self) -> bool:
        """Whether eager dispatch can use this mapping (False for compiler-only annotations such as priorities)."""
        raise NotImplementedError

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
                raise TypeError(
                    f"PlacementMapping: placements must be Replicated(), Sharded(axis) or Partial(), got {p!r}"
                )

    @property
    def mesh(self) -> DeviceMesh:
        return self._mesh

    @property
    def placements(self) -> tuple[Placement, ...]:
        """The placements, one per mesh axis."""
        return self._placements

    @property
    def is_fully_resolved(self) -> bool:
        """True: placements are always concrete.

        Example:
            >>> from maxfx.driver import CPU
            >>> PlacementMapping(DeviceMesh.single(CPU()), (Replicated(),)).is_fully_resolved
            True
        """
        return True

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


_NO_VALUE: Any = object()  # tells "not passed" from None in NamedMapping's keyword aliases


@dataclass(frozen=True, repr=False, init=False)
class NamedMapping(DeviceMapping):
    """One entry per tensor dim naming the mesh axes that split it (JAX ``PartitionSpec`` style).

    An entry is a mesh axis name (``"dp"``), a tuple of names (split over
    both, outer first) or None (whole on every device). Names the mesh lacks
    resolve to None (Replicated), as in MAX, so one spec written for
    ``("dp", "tp")`` runs on a TP-only mesh; `original_spec` keeps the spec as
    given.

    Args:
        _mesh: the mesh; None takes the one published by `mesh_context`.
        _spec: one entry per tensor dim.
        _unreduced: mesh axes holding partial sums (`Partial` placements).
        _priorities: one propagation priority per dim (int or None), a
            compiler-only hint: a mapping with priorities is not
            `is_fully_resolved` and has no placements.
        _memory_kind: the memory tier of the shards (``"device"``,
            ``"pinned_host"``), passed to JAX's ``NamedSharding``.
        _original_spec: the spec before mesh resolution (defaults to ``_spec``).

    ``mesh=``, ``spec=`` and ``unreduced=`` are accepted as keyword spellings
    of the first three (MAX's later signature, ``NamedMapping(spec=("tp",))``).

    Raises:
        ValueError: no mesh and no `mesh_context` active, priorities of
            another length than the spec, or an axis both splitting and unreduced.
        TypeError: a mesh that is not a `DeviceMesh`, a spec entry that is not
            a name, a tuple of names or None, ``_unreduced`` given as one string,
            a non-int priority or a non-str memory kind.

    Example:
        >>> from maxfx.driver import CPU
        >>> mesh = DeviceMesh((CPU(), CPU()), (2,), ("tp",))
        >>> m = NamedMapping(mesh, ("dp", "tp"))
        >>> m.spec, m.original_spec, m.to_placements(), m.is_fully_resolved
        ((None, 'tp'), ('dp', 'tp'), (Sharded(axis=1),), True)
        >>> NamedMapping(mesh, ("tp", None), _priorities=(1, None)).is_fully_resolved
        False
    """

    _mesh: DeviceMesh
    _spec: tuple[SpecEntry, ...]
    _unreduced: frozenset[str]
    _priorities: tuple[int | None, ...]
    _memory_kind: str | None
    _original_spec: tuple[SpecEntry, ...]

    def __init__(
        self,
        _mesh: DeviceMesh | None = None,
        _spec: Sequence[SpecEntry] = (),
        _unreduced: Any = frozenset(),
        _priorities: Sequence[int | None] = (),
        _memory_kind: str | None = None,
        _original_spec: Sequence[SpecEntry] | None = None,
        *,
        mesh: Any = _NO_VALUE,
        spec: Any = _NO_VALUE,
        unreduced: Any = _NO_VALUE,
    ) -> None:
        for alias, value, field in (("mesh", mesh, _mesh), ("spec", spec, _spec), ("unreduced", unreduced, _unreduced)):
            given_field = field is not None and not (isinstance(field, (tuple, list, set, frozenset)) and not field)
            if value is not _NO_VALUE and given_field:
                raise TypeError(f"NamedMapping: got both _{alias} and {alias}; pass one")
        _mesh = _mesh if mesh is _NO_VALUE else mesh
        _spec = _spec if spec is _NO_VALUE else spec
        _unreduced = _unreduced if unreduced is _NO_VALUE else unreduced
        if _mesh is None:
            _mesh = get_active_mesh()
            if _mesh is None:
                raise ValueError(
                    "NamedMapping needs a mesh to resolve its spec against: pass one, or build it inside "
                    "mesh_context(mesh)"
                )
        if not isinstance(_mesh, DeviceMesh):
            raise TypeError(f"NamedMapping: expected a DeviceMesh, got {type(_mesh).__name__}")
        original = _check_spec(_spec if _original_spec is None else _original_spec)
        given = _check_spec(_spec)
        if isinstance(_unreduced, str):
            raise TypeError(
                f"NamedMapping: unreduced is a set of mesh axis names, got the string {_unreduced!r} (write "
                f"{{{_unreduced!r}}})"
            )
        unreduced_set = frozenset(_unreduced)
        for name in unreduced_set:
            if not isinstance(name, str):
                raise TypeError(f"NamedMapping: unreduced names mesh axes (str), got {type(name).__name__} {name!r}")
        priorities = tuple(_priorities)
        for pr in priorities:
            if pr is not None and (isinstance(pr, bool) or not isinstance(pr, numbers.Integral)):
                raise TypeError(f"NamedMapping: priorities are ints or None, got {type(pr).__name__} {pr!r}")
        if priorities and len(priorities) != len(given):
            raise ValueError(f"priorities length ({len(priorities)}) must match spec length ({len(given)}).")
        if _memory_kind is not None and not isinstance(_memory_kind, str):
            raise TypeError(
                f"NamedMapping: memory_kind is a str (e.g. 'device') or None, got {type(_memory_kind).__name__}"
            )
        names = set(_mesh.axis_names)
        resolved = tuple(_resolve_entry(entry, names) for entry in given)
        unreduced_set &= names
        used = {name for entry in resolved for name in _axes(entry)}
        if used & unreduced_set:
            raise ValueError(f"Mesh axes {used & unreduced_set} are used for both sharding and unreduced.")
        for name, value in (
            ("_mesh", _mesh),
            ("_spec", resolved),
            ("_unreduced", unreduced_set),
            ("_priorities", tuple(None if pr is None else int(pr) for pr in priorities)),
            ("_memory_kind", _memory_kind),
            ("_original_spec", original),
        ):
            object.__setattr__(self, name, value)

    @classmethod
    def from_spec(
        cls,
        spec: Sequence[SpecEntry] = (),
        mesh: DeviceMesh | None = None,
        *,
        _unreduced: Any = frozenset(),
        _priorities: Sequence[int | None] = (),
        _memory_kind: str | None = None,
    ) -> NamedMapping:
        """A mapping for ``spec``, on ``mesh``, else the `mesh_context` one, else `DeviceMesh.default`.

        The constructor for layer code that names axes and lets the caller
        choose the mesh.

        Example:
            >>> from maxfx.driver import CPU
            >>> from maxfx.experimental.sharding import mesh_context
            >>> NamedMapping.from_spec(("tp", None))
            NamedMapping(DeviceMesh(_=1), (None, None))
            >>> with mesh_context(DeviceMesh((CPU(), CPU()), (2,), ("tp",))):
            ...     NamedMapping.from_spec(("tp", None)).to_placements()
            (Sharded(axis=0),)
        """
        if mesh is None:
            mesh = get_active_mesh() or DeviceMesh.default()
        return cls(mesh, spec, _unreduced, _priorities, _memory_kind)

    @property
    def mesh(self) -> DeviceMesh:
        """The device mesh this layout is on."""
        return self._mesh

    @property
    def spec(self) -> tuple[SpecEntry, ...]:
        """The per-dim entries, resolved against the mesh."""
        return self._spec

    @property
    def original_spec(self) -> tuple[SpecEntry, ...]:
        """The spec as given, before names the mesh lacks were dropped."""
        return self._original_spec

    @property
    def unreduced(self) -> frozenset[str]:
        """Mesh axes with pending reductions."""
        return self._unreduced

    @property
    def priorities(self) -> tuple[int | None, ...]:
        """Per-dim propagation priorities (compiler-only; empty for none)."""
        return self._priorities

    @property
    def memory_kind(self) -> str | None:
        """The memory tier of the shards, or None."""
        return self._memory_kind

    @property
    def is_fully_replicated(self) -> bool:
        """True when no dim is split and nothing is unreduced."""
        return all(entry is None for entry in self._spec) and not self._unreduced

    @property
    def is_fully_resolved(self) -> bool:
        """Whether eager dispatch can use this mapping: False when it carries priorities."""
        return not self._priorities

    def to_placements(self) -> tuple[Placement, ...]:
        """One placement per mesh axis.

        Raises:
            ConversionError: priorities (compiler-only), or one mesh axis
                splitting two tensor dims.
        """
        if self._priorities:
            raise ConversionError(
                f"{self}: priorities {self._priorities} are compiler-only annotations with no placements; drop them "
                "for eager use"
            )
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
        """The ``jax.sharding.NamedSharding`` of this layout (with `memory_kind`; priorities, compiler hints, are
        dropped).

        Raises:
            ConversionError: unreduced axes (JAX arrays hold reduced values).
        """
        if self._unreduced:
            raise ConversionError(
                f"{self}: partial sums over {sorted(self._unreduced)} have no NamedSharding; reduce them first"
            )
        return NamedSharding(self._mesh.jax_mesh(), PartitionSpec(*self._spec), memory_kind=self._memory_kind)

    def __repr__(self) -> str:
        extra = f", unreduced={set(self._unreduced)!r}" if self._unreduced else ""
        extra += f", priorities={self._priorities!r}" if self._priorities else ""
        extra += f", memory_kind={self._memory_kind!r}" if self._memory_kind else ""
        return f"NamedMapping({self._mesh}, ({', '.join(map(repr, self._spec))}){extra})"


def _check_spec(spec: Any) -> tuple[SpecEntry, ...]:
    """``spec`` as a tuple of entries (lists become tuples).

    Raises:
        TypeError: not a sequence, or an entry that is not a name, a tuple of names or None.
    """
    if isinstance(spec, str) or not isinstance(spec, Sequence):
        raise TypeError(
            f"NamedMapping: spec is a tuple with one entry per tensor dim, got {type(spec).__name__} {spec!r}"
        )
    out: list[SpecEntry] = []
    for i, entry in enumerate(spec):
        if entry is None or isinstance(entry, str):
            out.append(entry)
        elif isinstance(entry, (tuple, list)) and all(isinstance(n, str) for n in entry):
            out.append(tuple(entry))
        else:
            raise TypeError(
                f"NamedMapping: spec entry {i} must be a mesh axis name, a tuple of names or None, got {entry!r}"
            )
    return tuple(out)


def _resolve_entry(entry: SpecEntry, names: set[str]) -> SpecEntry:
    """``entry`` without the axis names the mesh lacks (None when none is left)."""
    kept = tuple(n for n in _axes(entry) if n in names)
    if not kept:
        return None
    return kept[0] if isinstance(entry, str) or len(kept) == 1 else kept


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
                raise ValueError(
                    f"{mapping}: Sharded(axis={p.axis}) is out of range for a tensor of shape {list(shape)}"
                )
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
