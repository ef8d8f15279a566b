"""Placements: what one mesh axis does to a tensor (`Replicated`, `Sharded`, `Partial`).

A tensor on an N-axis `DeviceMesh` has N placements. `Replicated` and
`Partial` are interned (``Replicated() is Replicated()``).

Example:
    >>> Sharded(0), Replicated() is Replicated(), Partial()
    (Sharded(axis=0), True, Partial(reduce_op='sum'))
"""

from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass

__all__ = ["Partial", "Placement", "ReduceOp", "Replicated", "Sharded"]


class Placement:
    """Base of the placement vocabulary."""

    __slots__ = ()

    def localized_axis(self) -> int | None:
        """The tensor axis this placement splits (`Sharded`), or None (`Replicated`, `Partial`).

        Example:
            >>> Sharded(1).localized_axis(), Replicated().localized_axis()
            (1, None)
        """
        return None


class Replicated(Placement):
    """Every device on the mesh axis holds the whole tensor."""

    __slots__ = ()
    _instance: Replicated | None = None

    def __new__(cls) -> Replicated:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "Replicated()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Replicated)

    def __hash__(self) -> int:
        return hash("Replicated")


@dataclass(frozen=True, repr=False)
class Sharded(Placement):
    """Every device on the mesh axis holds one slice of tensor axis ``axis``.

    Slices are balanced: a dim of size ``n`` over ``k`` devices gives the first
    ``n % k`` devices ``n // k + 1`` entries and the others ``n // k``.

    Args:
        axis: the tensor axis split along this mesh axis.
        even: MAX's flag for splitting a *dynamic* (symbolic) axis when a
            tensor is scattered: True keeps the shards' extents tied to the
            parent (``parent // n`` each), False gives every shard a fresh
            extent of its own. It changes nothing for static dims, which split
            unevenly (balanced) either way, as in MAX; maxfx cannot scatter a
            tensor with symbolic dims (``distribute`` needs a static shape), so
            the flag is recorded and compared but has no effect yet.

    Raises:
        TypeError: ``axis`` is not an int, or ``even`` not a bool.

    Example:
        >>> Sharded(0), Sharded(0, even=False), Sharded(0) == Sharded(0, even=False)
        (Sharded(axis=0), Sharded(axis=0, even=False), False)
    """

    axis: int
    even: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.axis, bool) or not isinstance(self.axis, numbers.Integral):
            raise TypeError(
                f"Sharded: axis must be an int (the tensor axis to split), got {type(self.axis).__name__} {self.axis!r}"
            )
        if not isinstance(self.even, bool):
            raise TypeError(f"Sharded: even must be a bool, got {type(self.even).__name__} {self.even!r}")
        object.__setattr__(self, "axis", int(self.axis))

    def localized_axis(self) -> int:
        """The tensor axis this placement splits."""
        return self.axis

    def __repr__(self) -> str:
        return f"Sharded(axis={self.axis})" if self.even else f"Sharded(axis={self.axis}, even=False)"


class ReduceOp(str, enum.Enum):
    """How `Partial` values combine."""

    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"


class Partial(Placement):
    """Every device on the mesh axis holds a partial result; the tensor is their reduction.

    Example:
        >>> Partial(ReduceOp.MAX).reduce_op
        <ReduceOp.MAX: 'max'>
    """

    __slots__ = ("_reduce_op",)
    _cache: dict[ReduceOp, Partial] = {}

    def __new__(cls, reduce_op: ReduceOp | str = ReduceOp.SUM) -> Partial:
        op = ReduceOp(reduce_op)
        inst = cls._cache.get(op)
        if inst is None:
            inst = super().__new__(cls)
            inst._reduce_op = op
            cls._cache[op] = inst
        return inst

    @property
    def reduce_op(self) -> ReduceOp:
        """The reduction that combines the partial values."""
        return self._reduce_op

    def __repr__(self) -> str:
        return f"Partial(reduce_op={self._reduce_op.value!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Partial) and other._reduce_op is self._reduce_op

    def __hash__(self) -> int:
        return hash(("Partial", self._reduce_op))
