"""Indexing: ``slice_tensor`` (numpy basic indexing), ``gather``, ``gather_nd``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from lowering.context import bind
from lowering.dims import Dim, StaticDim
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.registry import OpDef, front, register
from lowering.types import TensorType

__all__ = ["slice_tensor", "gather", "gather_nd", "scatter", "scatter_nd", "masked_scatter", "nonzero"]


# ─── slice_tensor ────────────────────────────────────────────────────────


def _slice_len(dim: Dim, s: slice) -> Dim:
    """Length of ``dim[s]`` (symbolic dims need static, in-bounds, forward bounds)."""
    if isinstance(dim, StaticDim):
        return Dim(len(range(*s.indices(dim.dim))))
    step = 1 if s.step is None else s.step
    if step != 1:
        raise R.OpError(f"slice_tensor: a step of {step} on symbolic dim {dim} needs an explicit out_dim: (slice, out_dim)")

    def bound(v: Any, default: Dim) -> Dim:
        if v is None:
            return default
        return dim + v if v < 0 else Dim(v)

    return bound(s.stop, dim) - bound(s.start, Dim(0))


def _normalize_index(x: TensorType, index: tuple) -> tuple[tuple, list[Dim]]:
    """Static index tuple for the impl and the output dims."""
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    if n_real > x.rank:
        raise IndexError(f"slice_tensor: too many indices ({n_real}) for {R.fmt(x)}")
    if sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexError("slice_tensor: an index can only have a single Ellipsis")
    expanded: list[Any] = []
    for i in index:
        if i is Ellipsis:
            expanded.extend([slice(None)] * (x.rank - n_real))
        else:
            expanded.append(i)
    if Ellipsis not in index:
        expanded.extend([slice(None)] * (x.rank - n_real))
    static: list[Any] = []
    out: list[Dim] = []
    axis = 0
    for i in expanded:
        if i is None:
            static.append(None)
            out.append(Dim(1))
            continue
        dim = x.shape[axis]
        if isinstance(i, tuple) and len(i) == 2 and isinstance(i[0], slice):
            static.append(i[0])
            out.append(Dim(i[1]))
        elif isinstance(i, slice):
            for part in (i.start, i.stop, i.step):
                if part is not None and not isinstance(part, int):
                    raise TypeError(f"slice_tensor: slice bounds must be ints or None, got {i!r}")
            if i.step == 0:
                raise ValueError("slice_tensor: slice step cannot be zero")
            static.append(i)
            out.append(_slice_len(dim, i))
        elif isinstance(i, int) and not isinstance(i, bool) or hasattr(i, "__index__") and not isinstance(i, bool):
            k = int(i)
            if isinstance(dim, StaticDim) and not -dim.dim <= k < dim.dim:
                raise IndexError(f"slice_tensor: index {k} is out of range for axis {axis} of size {dim.dim} in {R.fmt(x)}")
            static.append(k)
        else:
            raise TypeError(f"slice_tensor: unsupported index {i!r} ({type(i).__name__}); use ints, slices, None or Ellipsis")
        axis += 1
    return tuple(static), out


def _slice_rule(x, *, index: tuple) -> TensorType:
    x = R.require_tensor("slice_tensor", x)
    _, out = _normalize_index(x, index)
    return TensorType(x.dtype, out, x.device)


def _slice_impl(x, *, index: tuple):
    static = tuple(i[0] if isinstance(i, tuple) else i for i in index)
    return x[static]


slice_tensor_p = register(OpDef("slice_tensor", rule=_slice_rule, impl=_slice_impl))


@front(slice_tensor_p)
def slice_tensor(x, indices):
    """Numpy basic indexing: ints drop a dim, slices (negative steps too), None
    adds a dim, Ellipsis fills; ``(slice, out_dim)`` names the result size of a
    slice over a symbolic dim. ``x[...]`` on a TensorValue calls this.

    Raises:
        IndexError: an int index out of range for its dim.

    Example:
        >>> y = ops.slice_tensor(x, (0, slice(None, None, -1)))  # doctest: +SKIP  # x[0, ::-1]
    """
    index = tuple(indices) if isinstance(indices, (tuple, list)) else (indices,)
    return bind(slice_tensor_p, x, index=index)


# ─── gather / gather_nd ──────────────────────────────────────────────────


def _gather_rule(x, idx, *, axis: int) -> TensorType:
    x = R.require_tensor("gather", x, "input")
    idx = R.require_tensor("gather", idx, "indices")
    R.require_dtype("gather", idx, lambda d: d.is_integral(), "an integer", "indices")
    a = R.normalize_axis("gather", axis, x.rank)
    device = R.same_device("gather", x, idx)
    return TensorType(x.dtype, list(x.shape[:a]) + list(idx.shape) + list(x.shape[a + 1 :]), device)


gather_p = register(OpDef("gather", rule=_gather_rule, impl=lambda x, idx, *, axis: jnp.take(x, idx, axis=axis)))


@front(gather_p)
def gather(input, indices, axis):  # noqa: A002 - MAX's name
    """``np.take(input, indices, axis)``: out shape ``in[:axis] + indices.shape + in[axis+1:]``.

    Example:
        >>> rows = ops.gather(table, ids, axis=0)  # doctest: +SKIP
    """
    return bind(gather_p, input, indices, axis=int(axis))


def _gather_nd_rule(x, idx, *, batch_dims: int) -> TensorType:
    x = R.require_tensor("gather_nd", x, "input")
    idx = R.require_tensor("gather_nd", idx, "indices")
    R.require_dtype("gather_nd", idx, lambda d: d.is_integral(), "an integer", "indices")
    if idx.rank < 1:
        raise R.OpError(f"gather_nd: indices must have rank >= 1, got {R.fmt(idx)}")
    k = R.static_int("gather_nd", idx.shape[-1], "the last dim of indices")
    b = batch_dims
    if not 0 <= b < idx.rank or b > x.rank:
        raise R.OpError(f"gather_nd: batch_dims={b} is out of range for input {R.fmt(x)} and indices {R.fmt(idx)}")
    if b + k > x.rank:
        raise R.OpError(f"gather_nd: indices {R.fmt(idx)} index {k} dims after {b} batch dims, but input {R.fmt(x)} has rank {x.rank}")
    for i in range(b):
        if x.shape[i] != idx.shape[i]:
            raise R.OpError(f"gather_nd: batch dim {i} differs: input {R.fmt(x)} vs indices {R.fmt(idx)}")
    device = R.same_device("gather_nd", x, idx)
    return TensorType(x.dtype, list(x.shape[:b]) + list(idx.shape[b:-1]) + list(x.shape[b + k :]), device)


def _gather_nd_impl(x, idx, *, batch_dims: int):
    if batch_dims:
        return jax.vmap(lambda xx, ii: _gather_nd_impl(xx, ii, batch_dims=batch_dims - 1))(x, idx)
    k = idx.shape[-1]
    flat = idx.reshape(-1, k)
    picked = x[tuple(flat[:, i] for i in range(k))]
    return picked.reshape(idx.shape[:-1] + x.shape[k:])


gather_nd_p = register(OpDef("gather_nd", rule=_gather_nd_rule, impl=_gather_nd_impl))


@front(gather_nd_p)
def gather_nd(input, indices, batch_dims=0):  # noqa: A002 - MAX's name
    """Gather slices addressed by the last dim of ``indices``.

    Output shape: ``input[:b] + indices[b:-1] + input[b + indices[-1]:]`` with
    ``b = batch_dims`` leading dims shared by input and indices.

    Example:
        >>> y = ops.gather_nd(x, idx, batch_dims=1)  # doctest: +SKIP
    """
    return bind(gather_nd_p, input, indices, batch_dims=int(batch_dims))


# ─── scatter / scatter_nd / masked_scatter ───────────────────────────────


def _scatter_rule(x, updates, idx, *, axis: int) -> TensorType:
    x = R.require_tensor("scatter", x, "input")
    updates = R.require_tensor("scatter", updates, "updates")
    idx = R.require_tensor("scatter", idx, "indices")
    R.require_dtype("scatter", idx, lambda d: d.is_integral(), "an integer", "indices")
    if updates.dtype is not x.dtype:
        raise R.OpError(f"scatter: updates dtype must match input, got input {R.fmt(x)} and updates {R.fmt(updates)}")
    if list(idx.shape) != list(updates.shape):
        raise R.OpError(f"scatter: indices {R.fmt(idx)} must have the shape of updates {R.fmt(updates)}")
    if updates.rank != x.rank:
        raise R.OpError(f"scatter: updates {R.fmt(updates)} must have the rank of input {R.fmt(x)}")
    R.normalize_axis("scatter", axis, x.rank)
    return TensorType(x.dtype, x.shape, R.same_device("scatter", x, updates, idx))


def _scatter_impl(x, updates, idx, *, axis: int):
    axis = axis % x.ndim
    grids = list(jnp.indices(idx.shape, sparse=True))
    grids[axis] = jnp.where(idx < 0, idx + x.shape[axis], idx)
    return x.at[tuple(grids)].set(updates)


scatter_p = register(OpDef("scatter", rule=_scatter_rule, impl=_scatter_impl))


@front(scatter_p)
def scatter(input, updates, indices, axis=-1):  # noqa: A002 - MAX's name
    """Copy of ``input`` with ``updates`` written along ``axis`` at ``indices``
    (ONNX ScatterElements: ``out[..., indices[i, j], ...] = updates[i, j]``).

    Example:
        >>> y = ops.scatter(x, upd, idx, axis=0)  # doctest: +SKIP
    """
    return bind(scatter_p, input, updates, indices, axis=int(axis))


def _scatter_nd_rule(x, updates, idx) -> TensorType:
    x = R.require_tensor("scatter_nd", x, "input")
    updates = R.require_tensor("scatter_nd", updates, "updates")
    idx = R.require_tensor("scatter_nd", idx, "indices")
    R.require_dtype("scatter_nd", idx, lambda d: d.is_integral(), "an integer", "indices")
    if updates.dtype is not x.dtype:
        raise R.OpError(f"scatter_nd: updates dtype must match input, got {R.fmt(x)} and {R.fmt(updates)}")
    if idx.rank < 1:
        raise R.OpError(f"scatter_nd: indices must have rank >= 1, got {R.fmt(idx)}")
    k = R.static_int("scatter_nd", idx.shape[-1], "the last dim of indices")
    if k > x.rank:
        raise R.OpError(f"scatter_nd: indices {R.fmt(idx)} address {k} dims of input {R.fmt(x)}")
    want = list(idx.shape[:-1]) + list(x.shape[k:])
    if list(updates.shape) != want:
        raise R.OpError(f"scatter_nd: updates {R.fmt(updates)} must have shape [{', '.join(str(d) for d in want)}] for indices {R.fmt(idx)} into {R.fmt(x)}")
    return TensorType(x.dtype, x.shape, R.same_device("scatter_nd", x, updates, idx))


def _scatter_nd_impl(x, updates, idx):
    k = idx.shape[-1]
    return x.at[tuple(idx[..., j] for j in range(k))].set(updates)


scatter_nd_p = register(OpDef("scatter_nd", rule=_scatter_nd_rule, impl=_scatter_nd_impl))


@front(scatter_nd_p)
def scatter_nd(input, updates, indices):  # noqa: A002 - MAX's name
    """Copy of ``input`` with ``updates[i]`` written at the index tuple ``indices[i]``.

    ``indices`` is ``[..., k]``; ``updates`` is ``indices.shape[:-1] + input.shape[k:]``.

    Example:
        >>> y = ops.scatter_nd(x, rows, idx)  # doctest: +SKIP
    """
    return bind(scatter_nd_p, input, updates, indices)


def _masked_scatter_rule(x, mask, updates, *, out_dim: Dim) -> TensorType:
    x = R.require_tensor("masked_scatter", x, "input")
    mask = R.require_tensor("masked_scatter", mask, "mask")
    updates = R.require_tensor("masked_scatter", updates, "updates")
    R.require_dtype("masked_scatter", mask, lambda d: d is DType.bool, "bool", "mask")
    if updates.dtype is not x.dtype:
        raise R.OpError(f"masked_scatter: updates dtype must match input, got {R.fmt(x)} and {R.fmt(updates)}")
    shape = R.broadcast_shapes("masked_scatter", x.shape, mask.shape)
    if list(shape) != list(x.shape):
        raise R.OpError(f"masked_scatter: mask {R.fmt(mask)} must broadcast to input {R.fmt(x)}")
    return TensorType(x.dtype, x.shape, R.same_device("masked_scatter", x, mask, updates))


def _masked_scatter_impl(x, mask, updates, *, out_dim):
    # Like torch.masked_scatter: the k-th True position takes the k-th element of updates.
    mask = jnp.broadcast_to(mask, x.shape).reshape(-1)
    src = updates.reshape(-1)
    pos = jnp.clip(jnp.cumsum(mask) - 1, 0, max(src.shape[0] - 1, 0))
    taken = src[pos] if src.shape[0] else jnp.zeros_like(x.reshape(-1))
    return jnp.where(mask, taken, x.reshape(-1)).reshape(x.shape)


masked_scatter_p = register(OpDef("masked_scatter", rule=_masked_scatter_rule, impl=_masked_scatter_impl))


@front(masked_scatter_p)
def masked_scatter(input, mask, updates, out_dim):  # noqa: A002 - MAX's name
    """Copy of ``input`` where the positions of ``mask`` that are True take the
    elements of ``updates`` in row-major order (``out_dim`` names their count).

    Example:
        >>> y = ops.masked_scatter(x, x > 0, vals, out_dim="n")  # doctest: +SKIP
    """
    return bind(masked_scatter_p, input, mask, updates, out_dim=Dim(out_dim))


# ─── nonzero (data-dependent size) ───────────────────────────────────────


def _nonzero_rule(x, *, out_dim: Dim) -> TensorType:
    x = R.require_tensor("nonzero", x)
    if x.rank == 0:
        raise R.OpError(f"nonzero: input must have rank >= 1, got {R.fmt(x)}")
    return TensorType(DType.int64, [out_dim, x.rank], x.device)


def _nonzero_impl(x, *, out_dim):
    # Runs op by op (data_dependent): the count is known once x is concrete.
    return jnp.stack(jnp.nonzero(x), axis=1).astype(jnp.int64)


nonzero_p = register(OpDef("nonzero", rule=_nonzero_rule, impl=_nonzero_impl, differentiable=False, data_dependent=True))


@front(nonzero_p)
def nonzero(x, out_dim):
    """Row-major indices of the nonzero elements of ``x``: int64 ``[out_dim, rank]``.

    ``out_dim`` (usually a new symbolic name) is the count, known only at run
    time; graphs with ``nonzero`` therefore run op by op rather than as one
    compiled program.

    Example:
        >>> idx = ops.nonzero(mask, "n_true")  # doctest: +SKIP
    """
    return bind(nonzero_p, x, out_dim=Dim(out_dim))
