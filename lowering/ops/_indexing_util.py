"""Helpers shared by the indexing and creation families.

- `IndexOpError`: an index or axis out of range. numpy (and MAX's ``gather``)
  raise IndexError there, MAX's other ops ValueError; this is both, like
  numpy's own ``AxisError``.
- `DataDim`: a dim carried unresolved in node params. Params holding bare
  Dims are resolved to ints before an op runs, which fails for a symbol that
  only the op itself determines (``nonzero``'s count, ``range``'s length);
  such dims travel in this wrapper and are evaluated (or bound) when it runs.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from lowering.dims import Dim, StaticDim, UnboundDimError
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.types import TensorType

__all__ = ["IndexOpError", "DataDim", "is_value", "is_int", "dtype_of", "axis_index", "require_index_dtype"]


class IndexOpError(R.OpError, IndexError):
    """An index, slice bound or axis out of range (an IndexError and a ValueError)."""


class DataDim:
    """A `Dim` kept as is in node params, evaluated when the op runs."""

    __slots__ = ("dim",)

    def __init__(self, dim: Any):
        self.dim = Dim(dim)

    def evaluate(self, env: Mapping[str, int]) -> int | None:
        """The size under ``env``, or None while a symbol of it is unbound."""
        try:
            return self.dim.evaluate(env)
        except UnboundDimError:
            return None

    def __maxfx_param_key__(self) -> tuple:
        return ("data_dim", str(self.dim))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, DataDim) and self.dim == other.dim

    def __hash__(self) -> int:
        return hash(self.__maxfx_param_key__())

    def __repr__(self) -> str:
        return str(self.dim)


def is_value(x: Any) -> bool:
    """A typed tensor: graph value, eager tensor, JAX array or tracer."""
    return isinstance(getattr(x, "type", None), TensorType) or isinstance(x, (jax.Array, jax.core.Tracer))


def is_int(x: Any) -> bool:
    """A Python/numpy integer (or 0-d integer array) or a static Dim; bools excluded."""
    if isinstance(x, (bool, np.bool_)):
        return False
    if isinstance(x, np.ndarray):
        return x.ndim == 0 and x.dtype.kind in "iu"
    return isinstance(x, (numbers.Integral, np.integer, StaticDim))


def dtype_of(x: Any) -> DType:
    """Element type of a typed tensor (see `is_value`)."""
    t = getattr(x, "type", None)
    if isinstance(t, TensorType):
        return t.dtype
    return DType.from_numpy(x.dtype)


def axis_index(op: str, axis: Any, rank: int) -> int:
    """`R.normalize_axis`, raising `IndexOpError` for an out-of-range axis."""
    try:
        return R.normalize_axis(op, axis, rank)
    except R.OpError as e:
        raise IndexOpError(str(e)) from None


def require_index_dtype(op: str, t: TensorType, name: str = "indices") -> None:
    """Indices must be int32 or int64 (MAX's gather/scatter kernels)."""
    if t.dtype not in (DType.int32, DType.int64):
        raise R.OpError(f"{op}: {name} must have dtype int32 or int64, got {R.fmt(t)}")
