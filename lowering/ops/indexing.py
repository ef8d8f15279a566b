"""Indexing: ``slice_tensor`` (numpy basic indexing, ``x[...]``), ``gather``,
``gather_nd``, ``scatter`` and ``scatter_nd`` (each also with an ``_add``,
``_max``, ``_min`` and ``_mul`` reduction), ``masked_scatter``, ``nonzero``.

Out-of-range indices, slice bounds and axes raise `IndexOpError`, which is both
an IndexError (numpy; MAX's ``gather``) and a ValueError (MAX's other ops).

Slicing a symbolic dim with static bounds gives the matching dim expression
(``x[1:]`` of ``batch`` is ``batch - 1``); the bounds are then checked, and new
symbols of ``(slice, out_dim)`` pairs bound, when the graph runs.

``nonzero`` is the one data-dependent op here: its output length is the
number of nonzero inputs, so graphs using it run op by op and bind its
``out_dim`` symbol from the result.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering.context import bind, is_weak
from lowering.dims import Dim, StaticDim, bind_symbols
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.ops._indexing_util import DataDim, IndexOpError, axis_index, is_int, is_value, require_index_dtype
from lowering.registry import OpDef, front, register
from lowering.types import TensorType
from lowering.x64 import run

__all__ = [
    "slice_tensor",
    "gather",
    "gather_nd",
    "scatter",
    "scatter_add",
    "scatter_max",
    "scatter_min",
    "scatter_mul",
    "scatter_nd",
    "scatter_nd_add",
    "scatter_nd_max",
    "scatter_nd_min",
    "scatter_nd_mul",
    "masked_scatter",
    "nonzero",
    "IndexOpError",
]


# ─── slice_tensor ─────────────────────────────────────────────────────────
#
# The ``index`` param is a tuple of hashable specs, one per index entry:
#   ("i", k)                            int index (drops the dim)
#   ("t", j)                            scalar integer tensor, the j-th extra input (drops the dim)
#   ("s", start, stop, step, out_dim)   slice; start/stop are None, ints, Dims or ("t", j);
#                                       out_dim is a DataDim or None
#   ("n",)                              None: a new size-1 dim
#   ("e",)                              Ellipsis

_FULL = ("s", None, None, 1, None)


def _slice_bound(op: str, v: Any, what: str, pos: int, tensors: list[Any]) -> Any:
    if v is None:
        return None
    if is_int(v):
        return int(v)
    if isinstance(v, Dim):
        return v  # a symbolic bound (x[:seq]); resolved when the graph runs
    if is_value(v):
        tensors.append(v)
        return ("t", len(tensors) - 1)
    raise TypeError(
        f"{op}: slice {what} of index {pos} must be an int, a Dim, a scalar integer tensor or None, got "
        f"{type(v).__name__} {v!r}"
    )


def _is_named_slice(ix: Any) -> bool:
    return (
        isinstance(ix, tuple)
        and len(ix) == 2
        and isinstance(ix[0], slice)
        and (isinstance(ix[1], str) or (isinstance(ix[1], Dim) and not isinstance(ix[1], StaticDim)))
    )


def _parse_index(indices: Any) -> tuple[tuple, list[Any]]:
    """Index specs (see above) and the tensor-valued entries."""
    op = "slice_tensor"
    if not isinstance(indices, (list, tuple)):
        indices = (indices,)
    if _is_named_slice(indices):
        indices = (
            indices,
        )  # x[1:, "n"] cannot mean two entries: a str is no index, so it is one (slice, out_dim) pair
    specs: list[tuple] = []
    tensors: list[Any] = []
    for pos, ix in enumerate(indices):
        out_dim = None
        if isinstance(ix, tuple):
            if len(ix) != 2 or not isinstance(ix[0], slice):
                raise TypeError(f"{op}: index {pos} is a tuple {ix!r}; only (slice, out_dim) pairs are allowed")
            ix, out_dim = ix
            try:
                out_dim = DataDim(out_dim)
            except TypeError:
                raise TypeError(
                    f"{op}: out_dim of index {pos} must be an int, str or Dim, got {type(out_dim).__name__} {out_dim!r}"
                ) from None
        if ix is None:
            specs.append(("n",))
        elif ix is Ellipsis:
            specs.append(("e",))
        elif isinstance(ix, slice):
            step = 1 if ix.step is None else ix.step
            if not is_int(step):
                raise TypeError(f"{op}: slice step of index {pos} must be an int, got {type(step).__name__} {step!r}")
            if int(step) == 0:
                raise R.OpError(f"{op}: slice step of index {pos} cannot be zero")
            start = _slice_bound(op, ix.start, "start", pos, tensors)
            stop = _slice_bound(op, ix.stop, "stop", pos, tensors)
            specs.append(("s", start, stop, int(step), out_dim))
        elif is_int(ix):
            specs.append(("i", int(ix)))
        elif is_value(ix):
            specs.append(("t", len(tensors)))
            tensors.append(ix)
        else:
            raise TypeError(
                f"{op}: unsupported index {ix!r} ({type(ix).__name__}) at position {pos}; use ints, slices, None, "
                "Ellipsis, "
                "(slice, out_dim) pairs or scalar integer tensors (ops.gather selects by an index tensor)"
            )
    return tuple(specs), tensors


def _expand(op: str, specs: tuple, rank: int, what: str) -> list[tuple]:
    """Specs with the Ellipsis replaced by full slices and missing trailing dims filled."""
    n_real = sum(1 for s in specs if s[0] not in ("n", "e"))
    if sum(1 for s in specs if s[0] == "e") > 1:
        raise IndexOpError(f"{op}: an index can only have a single Ellipsis (...)")
    if n_real > rank:
        raise IndexOpError(f"{op}: too many indices ({n_real}) for {what} of rank {rank}")
    out: list[tuple] = []
    for s in specs:
        if s[0] == "e":
            out.extend([_FULL] * (rank - n_real))
        else:
            out.append(s)
    if not any(s[0] == "e" for s in specs):
        out.extend([_FULL] * (rank - n_real))
    return out


def _is_dynamic(s: tuple) -> bool:
    return isinstance(s[1], tuple) or isinstance(s[2], tuple)


def _check_slice_bounds(n: int, s: tuple, axis: int, what: str) -> None:
    # MAX: bounds within [-dim, dim] for a positive step, [-dim - 1, dim - 1] for a negative one.
    # Messages keep MAX's wording ("rmo.slice ..."), which its users and tests match.
    _, start, stop, step, _ = s
    _check_slice_overflow(n, start, stop, step, axis, what)
    lo, hi = (-n, n) if step > 0 else (-n - 1, n - 1)
    for name, v in (("start", start), ("stop", stop)):
        if isinstance(v, int) and not lo <= v <= hi:
            sign = "positive" if step > 0 else "negative"
            raise IndexOpError(
                f"slice_tensor: rmo.slice {name} index {v} out of range for dimension size {n} "
                f"(axis {axis} of {what}; a {sign} step needs {lo} <= {name} <= {hi})"
            )


_INT64_MAX = 2**63 - 1


def _check_slice_overflow(n: int, start: Any, stop: Any, step: int, axis: int, what: str) -> None:
    """Refuse bounds whose length computation, ceil((stop - start) / step), leaves int64."""
    if not (isinstance(start, int) and isinstance(stop, (int, type(None)))):
        return
    first = start + n if start < 0 else start
    end = (n if step > 0 else -1) if stop is None else (stop + n if stop < 0 else stop)
    span = end - first + step - (1 if step > 0 else -1)
    if max(abs(first), abs(end), abs(step), abs(span)) > _INT64_MAX:
        raise IndexOpError(
            f"slice_tensor: rmo.slice index computation overflow: start {start}, stop {stop}, step {step} "
            f"on axis {axis} of {what} leave the int64 range"
        )


def _norm_bound(d: Dim, v: Any) -> Dim:
    return d + v if isinstance(v, int) and v < 0 else Dim(v)


def _slice_len(d: Dim, s: tuple) -> Dim:
    """Length of ``d[start:stop:step]`` for in-range bounds, as a dim expression."""
    _, start, stop, step, _ = s
    if step > 0:
        lo = Dim(0) if start is None else _norm_bound(d, start)
        hi = d if stop is None else _norm_bound(d, stop)
        span, k = hi - lo, step
    else:
        hi = d - 1 if start is None else _norm_bound(d, start)
        lo = Dim(-1) if stop is None else _norm_bound(d, stop)  # -1: just before the first element
        span, k = hi - lo, -step
    n = span if k == 1 else (span + (k - 1)) // k
    if isinstance(n, StaticDim) and n.dim < 0:
        return StaticDim(0)
    return n


def _slice_rule(x, *index_types, index: tuple) -> TensorType:
    op = "slice_tensor"
    x = R.require_tensor(op, x)
    for t in index_types:
        t = R.require_tensor(op, t, "tensor index")
        if not t.dtype.is_integral():
            raise TypeError(f"{op}: tensor indices must have an integer dtype, got {R.fmt(t)}")
        if not all(isinstance(d, StaticDim) and d.dim == 1 for d in t.shape):
            raise R.OpError(f"{op}: a tensor index must be a scalar (one element), got {R.fmt(t)}")
    out: list[Dim] = []
    axis = 0
    for s in _expand(op, index, x.rank, R.fmt(x)):
        if s[0] == "n":
            out.append(StaticDim(1))
            continue
        d = x.shape[axis]
        if s[0] == "i":
            if isinstance(d, StaticDim) and not -d.dim <= s[1] < d.dim:
                raise IndexOpError(f"{op}: index {s[1]} is out of range for axis {axis} of size {d.dim} in {R.fmt(x)}")
        elif s[0] == "s":
            out.append(_slice_rule_dim(x, axis, d, s))
        axis += 1
    return TensorType(x.dtype, out, x.device)


def _slice_rule_dim(x: TensorType, axis: int, d: Dim, s: tuple) -> Dim:
    op = "slice_tensor"
    _, start, stop, step, out_dim = s
    if _is_dynamic(s):
        if out_dim is None:
            raise R.OpError(
                f"{op}: a slice with tensor bounds (axis {axis} of {R.fmt(x)}) needs an out_dim: pass (slice, out_dim)"
            )
        if step < 0:
            raise R.OpError(
                f"{op}: slices with tensor bounds need a positive step, got {step} (axis {axis} of {R.fmt(x)})"
            )
        return out_dim.dim
    if isinstance(d, StaticDim) and all(v is None or isinstance(v, int) for v in (start, stop)):
        _check_slice_bounds(d.dim, s, axis, R.fmt(x))
        n = StaticDim(len(range(*slice(start, stop, step).indices(d.dim))))
        if out_dim is not None and out_dim.dim != n:
            raise R.OpError(
                f"{op}: slice {slice(start, stop, step)} of axis {axis} in {R.fmt(x)} has {n} elements, but out_dim is "
                f"{out_dim}"
            )
        return n
    if (
        isinstance(start, int)
        and isinstance(stop, int)
        and (start < 0) == (stop < 0)
        and (start > stop if step > 0 else start < stop)
    ):
        # Both bounds counted from the same end of a symbolic dim: an empty or reversed range (MAX's wording).
        raise R.OpError(
            f"{op}: start and stop should be increasing for positive step and decreasing for negative step, "
            f"but got start {start}, stop {stop} for step {step} (axis {axis} of {R.fmt(x)})"
        )
    return out_dim.dim if out_dim is not None else _slice_len(d, s)


def _slice_apply(x, tensor_idx, index: tuple, env: dict[str, int]):
    """``x[index]`` on a concrete-shaped array; ``env`` binds the symbols of out_dims."""
    basic: list[Any] = []
    axis = 0
    for s in _expand("slice_tensor", index, x.ndim, f"an array of shape {list(x.shape)}"):
        if s[0] == "n":
            basic.append(None)
            continue
        n = x.shape[axis]
        if s[0] == "i":
            if not -n <= s[1] < n:
                raise IndexOpError(f"slice_tensor: index {s[1]} is out of range for axis {axis} of size {n}")
            basic.append(s[1])
        elif s[0] == "t":
            # A run-time position: negative counts from the end; out-of-range positions clamp (no errors under jit).
            i = jnp.reshape(tensor_idx[s[1]], ())
            x = lax.dynamic_index_in_dim(x, jnp.where(i < 0, i + n, i), axis, keepdims=True)
            basic.append(0)
        elif _is_dynamic(s):
            x = _dynamic_slice(x, tensor_idx, s, axis, env)
            basic.append(slice(None, None, s[3]))
        else:
            _check_slice_bounds(n, s, axis, f"an array of shape {list(x.shape)}")
            basic.append(slice(s[1], s[2], s[3]))
        axis += 1
    return x[tuple(basic)]


def _dynamic_slice(x, tensor_idx, s: tuple, axis: int, env: dict[str, int]):
    _, start, _, step, out_dim = s
    length = out_dim.evaluate(env)
    if length is None:
        raise ValueError(
            f"slice_tensor: out_dim {out_dim} of a slice with tensor bounds is not bound by the graph's input shapes; "
            "use a static int or a dim that appears in an input shape"
        )
    n = x.shape[axis]
    span = (length - 1) * step + 1 if length > 0 else 0
    if span > n:
        raise IndexOpError(
            f"slice_tensor: out_dim {out_dim} = {length} with step {step} needs {span} elements, but axis {axis} has "
            f"{n}"
        )
    if isinstance(start, tuple):
        i = jnp.reshape(tensor_idx[start[1]], ())
        begin = jnp.where(i < 0, i + n, i)
    else:
        begin = 0 if start is None else (start + n if start < 0 else start)
    # lax.dynamic_slice shifts the window back inside the dim if it would overrun (no errors under jit).
    return lax.dynamic_slice_in_dim(x, begin, span, axis=axis)


def _slice_impl(x, *tensor_idx, index: tuple):
    return _slice_apply(x, tensor_idx, index, {})


def _slice_interpret(interp, node, ins, params, env):
    # Graph replay: symbolic dims are concrete now; check the result against the
    # recorded type and bind new symbols of (slice, out_dim) pairs for later ops.
    out = _slice_apply(ins[0], ins[1:], params["index"], interp.dims)
    t = node.outputs[0].type
    err = bind_symbols(t.shape, out.shape, interp.dims)
    if err:
        raise IndexOpError(
            f"slice_tensor: at run time the result has shape {list(out.shape)} but the graph expects {R.fmt(t)} "
            f"({err}); "
            "slice bounds must lie within their dims ([-dim, dim] for a positive step, [-dim - 1, dim - 1] for a "
            "negative one)"
        )
    return out


slice_tensor_p = register(OpDef("slice_tensor", rule=_slice_rule, impl=_slice_impl, interpret=_slice_interpret))


@front(slice_tensor_p)
def slice_tensor(x, indices):
    """Numpy basic indexing; ``x[...]`` on a tensor value calls this.

    Each entry of ``indices`` is one of: an int (drops the dim; negative counts
    from the end), a ``slice`` (negative steps allowed), ``None`` (a new size-1
    dim), ``Ellipsis``, a scalar integer tensor (a run-time position; drops the
    dim), or a ``(slice, out_dim)`` pair naming the result size of a slice whose
    size cannot be derived (tensor bounds, or to give it a new symbolic name).

    Slice bounds must lie in ``[-dim, dim]`` for a positive step and in
    ``[-dim - 1, dim - 1]`` for a negative one (they are not clamped). Slicing
    a symbolic dim with int bounds gives a dim expression: ``x[1:]`` of
    ``batch`` is ``batch - 1``, ``x[::2]`` is ``(batch + 1) // 2``.

    Raises:
        IndexError: an int index or slice bound out of range, too many indices
            or several Ellipses (`IndexOpError`, also a ValueError).
        ValueError: a zero step, or a non-scalar tensor index.
        TypeError: an unsupported index type.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        >>> ops.slice_tensor(x, [slice(None, None, -1)])  # x[::-1]
        TensorType(dtype=float32, shape=[Dim(2), Dim(3)], device=cpu:0): [4.0, 5.0, 6.0, 1.0, 2.0, 3.0]
        >>> ops.slice_tensor(x, [..., None, slice(None)])  # x[..., None, :]
        TensorType(dtype=float32, shape=[Dim(2), Dim(1), Dim(3)], device=cpu:0): [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        >>> ops.slice_tensor(x, [1, slice(0, 2)])  # x[1, 0:2]
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [4.0, 5.0]
    """
    specs, tensors = _parse_index(indices)
    return bind(slice_tensor_p, x, *tensors, index=specs)


# ─── gather / gather_nd ───────────────────────────────────────────────────


def _gather_rule(x, idx, *, axis: int) -> TensorType:
    x = R.require_tensor("gather", x, "input")
    idx = R.require_tensor("gather", idx, "indices")
    require_index_dtype("gather", idx)
    a = axis_index("gather", axis, x.rank)
    device = R.input_device(x, idx)
    return TensorType(x.dtype, list(x.shape[:a]) + list(idx.shape) + list(x.shape[a + 1 :]), device)


def _gather_impl(x, idx, *, axis: int):
    n = x.shape[axis]
    # Negative indices count from the end (np.take); out-of-range ones clamp (no errors under jit).
    return jnp.take(x, jnp.where(idx < 0, idx + n, idx), axis=axis, mode="clip")


@partial(jax.jit, static_argnames="vectors")
def _device_extremes(idx, vectors: bool):
    flat = idx.reshape(-1, idx.shape[-1] if vectors else 1)
    return jnp.min(flat, axis=0), jnp.max(flat, axis=0)


def _index_extremes(idx: Any, vectors: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(min, max)`` of ``idx``, per component of its last axis when ``vectors`` (else one of each).

    Indices in host memory (CPU devices, numpy) are read in place; on an
    accelerator one fused reduction runs there and only the extremes come back,
    not the index tensor.
    """
    if isinstance(idx, np.ndarray) or all(d.platform == "cpu" for d in idx.devices()):
        a = np.asarray(idx)
        if not vectors:
            return a.min(keepdims=True).ravel(), a.max(keepdims=True).ravel()
        flat = a.reshape(-1, a.shape[-1])
        return flat.min(axis=0), flat.max(axis=0)
    lo, hi = run(_device_extremes, idx, vectors)  # run: int64 indices stay int64 through the reduction
    return np.asarray(lo), np.asarray(hi)


def check_index_bounds(op: str, idx: Any, sizes: tuple[int, ...], axes: tuple[int, ...]) -> None:
    """Raise `IndexOpError` unless every index in ``idx`` lies in ``[-size, size)``.

    With one size, every entry of ``idx`` indexes ``axes[0]``; with ``k`` sizes,
    ``idx [..., k]`` holds index vectors whose component ``j`` indexes axis
    ``axes[j]`` of size ``sizes[j]``. This is the eager-mode contract of ``gather``/``gather_nd`` (numpy's
    ``np.take``: out-of-range raises); compiled programs clamp instead.

    Example:
        >>> import numpy as np
        >>> from lowering.ops.indexing import check_index_bounds
        >>> check_index_bounds("gather", np.array([0, 7]), (3,), (0,))
        Traceback (most recent call last):
        ...
        lowering.ops._indexing_util.IndexOpError: gather: index 7 is out of range for axis 0 of size 3 (valid: -3 to 2)
    """
    if idx.size == 0:
        return
    lo, hi = _index_extremes(idx, vectors=len(sizes) > 1)
    for j, (n, axis) in enumerate(zip(sizes, axes)):
        bad = int(hi[j]) if hi[j] >= n else int(lo[j]) if lo[j] < -n else None
        if bad is not None:
            raise IndexOpError(
                f"{op}: index {bad} is out of range for axis {axis} of size {n} (valid: {-n} to {n - 1})"
            )


def _gather_check(x, idx, *, axis: int) -> None:
    check_index_bounds("gather", idx, (x.shape[axis],), (axis,))


gather_p = register(OpDef("gather", rule=_gather_rule, impl=_gather_impl, check_values=_gather_check))


@front(gather_p)
def gather(input, indices, axis):  # noqa: A002 - MAX's name
    """Select entries of ``input`` along ``axis`` by ``indices`` (``np.take``).

    The output shape is ``input.shape[:axis] + indices.shape + input.shape[axis + 1:]``.
    Negative indices count from the end. An index outside ``[-n, n)`` (``n =
    input.shape[axis]``) raises on eager tensors, as ``np.take`` does; inside
    ``jax.jit``, ``F.lazy()`` and graphs it is clamped to ``[0, n - 1]`` (the
    values are not known when the program is built; JAX's ``x[i]`` clamps too).

    Args:
        input: the tensor to select from.
        indices: int32 or int64 tensor of positions along ``axis``.
        axis: the axis to index; negative counts from the end.

    Raises:
        IndexError: ``axis`` out of range, or (eager tensors) an index out of
            range (`IndexOpError`, also a ValueError).
        ValueError: non-integer ``indices``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> table = Tensor([[0.0, 0.1], [1.0, 1.1], [2.0, 2.1]])
        >>> ids = Tensor([[2, 0], [1, -1]], dtype=DType.int64)
        >>> ops.gather(table, ids, axis=0)  # [3, 2] by [2, 2] -> [2, 2, 2]  # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(2), Dim(2), Dim(2)], device=cpu:0):
        [2.0, 2.1, 0.0, 0.1, 1.0, 1.1, 2.0, 2.1]
    """
    return bind(gather_p, input, indices, axis=int(axis) if is_int(axis) else axis)


def _gather_nd_rule(x, idx, *, batch_dims: int) -> TensorType:
    op = "gather_nd"
    x = R.require_tensor(op, x, "input")
    idx = R.require_tensor(op, idx, "indices")
    R.require_dtype(op, idx, lambda d: d.is_integral(), "an integer", "indices")
    if idx.rank < 1:
        raise R.OpError(f"{op}: indices must have rank >= 1, got {R.fmt(idx)}")
    k = R.static_int(op, idx.shape[-1], "the last dim of indices")
    b = batch_dims
    if b < 0 or b > idx.rank - 1:
        raise R.OpError(f"{op}: batch_dims={b} must be in [0, {idx.rank - 1}] for indices {R.fmt(idx)}")
    if b + k > x.rank:
        raise R.OpError(
            f"{op}: indices {R.fmt(idx)} index {k} dims after {b} batch dims, but input {R.fmt(x)} has rank {x.rank}"
        )
    for i in range(b):
        if x.shape[i] != idx.shape[i]:
            raise R.OpError(
                f"{op}: batch dim {i} differs between input {R.fmt(x)} and indices {R.fmt(idx)} (no broadcasting)"
            )
    device = R.input_device(x, idx)
    return TensorType(x.dtype, list(x.shape[:b]) + list(idx.shape[b:-1]) + list(x.shape[b + k :]), device)


def _gather_nd_impl(x, idx, *, batch_dims: int):
    if batch_dims:
        return jax.vmap(lambda xx, ii: _gather_nd_impl(xx, ii, batch_dims=batch_dims - 1))(x, idx)
    k = idx.shape[-1]
    flat = idx.reshape(-1, k)
    # Plain integer-array indexing: negative indices count from the end, out-of-range ones clamp.
    picked = x[tuple(flat[:, i] for i in range(k))]
    return picked.reshape(idx.shape[:-1] + x.shape[k:])


def _gather_nd_check(x, idx, *, batch_dims: int) -> None:
    axes = tuple(range(batch_dims, batch_dims + idx.shape[-1]))
    check_index_bounds("gather_nd", idx, tuple(x.shape[a] for a in axes), axes)


gather_nd_p = register(OpDef("gather_nd", rule=_gather_nd_rule, impl=_gather_nd_impl, check_values=_gather_nd_check))


@front(gather_nd_p)
def gather_nd(input, indices, batch_dims=0):  # noqa: A002 - MAX's name
    """Gather entries (or slices) of ``input`` addressed by the last dim of ``indices``.

    The output shape is ``input.shape[:b] + indices.shape[b:-1] + input.shape[b + k:]``
    with ``b = batch_dims`` leading dims shared exactly by input and indices
    (no broadcasting) and ``k = indices.shape[-1]`` (must be static).
    Negative components count from the end. Out-of-range components raise on
    eager tensors and are clamped inside ``jax.jit``, ``F.lazy()`` and graphs,
    as for `gather`.

    Raises:
        ValueError: non-integer indices, a symbolic last dim, ``batch_dims``
            out of range, too long index vectors or mismatched batch dims.
        IndexError: (eager tensors) an index component out of range for its
            axis (`IndexOpError`, also a ValueError).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> x = Tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> ops.gather_nd(x, Tensor([[1, 0], [0, 1]], dtype=DType.int32))  # x[1, 0], x[0, 1]
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [3.0, 2.0]
        >>> ops.gather_nd(x, Tensor([[1]], dtype=DType.int32))  # the row x[1]
        TensorType(dtype=float32, shape=[Dim(1), Dim(2)], device=cpu:0): [3.0, 4.0]
        >>> from maxfx.graph import Graph, TensorType
        >>> input_type = TensorType(DType.bfloat16, ["a", "b", "c", "d", "e"])
        >>> indices_type = TensorType(DType.int32, ["a", "f", 3])
        >>> with Graph("gather_nd", input_types=[input_type, indices_type]) as graph:
        ...     input, indices = graph.inputs
        ...     print(ops.gather_nd(input, indices, batch_dims=1).type)
        TensorType(dtype=bfloat16, shape=[Dim('a'), Dim('f'), Dim('e')], device=cpu:0)
    """
    if not is_int(batch_dims):
        raise TypeError(f"gather_nd: batch_dims must be an int, got {type(batch_dims).__name__} {batch_dims!r}")
    return bind(gather_nd_p, input, indices, batch_dims=int(batch_dims))


# ─── scatter / scatter_nd / masked_scatter ───────────────────────────────


def _same_dtype(op: str, x: TensorType, upd: TensorType) -> None:
    if x.dtype is not upd.dtype:
        raise R.OpError(f"{op}: input {R.fmt(x)} and updates {R.fmt(upd)} must have the same dtype")


def _scatter_dtypes(op: str, x: TensorType, upd: TensorType, idx: TensorType, *, quoted: bool) -> None:
    # MAX's wording: scatter quotes the dtypes, scatter_nd parenthesizes them.
    if x.dtype is not upd.dtype:
        pair = (
            f"'{x.dtype}' and updates dtype '{upd.dtype}' must match."
            if quoted
            else f"({x.dtype}) and updates dtype ({upd.dtype}) must match"
        )
        raise R.OpError(f"{op}: The input dtype {pair} (input {R.fmt(x)}, updates {R.fmt(upd)})")
    if idx.dtype not in (DType.int32, DType.int64):
        raise R.OpError(
            f"{op}: Invalid indices dtype: '{idx.dtype}'. Indices must be of type int32 or int64. (indices "
            f"{R.fmt(idx)})"
        )


def _check_scatter_devices(op: str, values: tuple[Any, ...]) -> None:
    """MAX's message, listing the three types, when typed inputs sit on different devices.

    Runs in the front: bind's own device check would answer first with a shorter message.
    """
    types = [getattr(v, "type", None) for v in values]
    if len({t.device for t in types if isinstance(t, TensorType)}) > 1:
        lines = [
            f"    {n}: {t!r}" if isinstance(t, TensorType) else f"    {n}: {type(v).__name__}"
            for n, v, t in zip(("input", "updates", "indices"), values, types)
        ]
        raise R.OpError(f"{op}: Input values must be on the same device\n" + "\n".join(lines))


# Each reduction: how the op combines an update with the value already there.
_SCATTER_WRITES = {
    None: lambda ref, upd: ref.set(upd),
    "add": lambda ref, upd: ref.add(upd),
    "max": lambda ref, upd: ref.max(upd),
    "min": lambda ref, upd: ref.min(upd),
    "mul": lambda ref, upd: ref.multiply(upd),
}


def _scatter_rule_for(op: str):
    def rule(x, upd, idx, *, axis: int) -> TensorType:
        x = R.require_tensor(op, x, "input")
        upd = R.require_tensor(op, upd, "updates")
        idx = R.require_tensor(op, idx, "indices")
        if isinstance(axis, bool) or not is_int(axis):
            raise TypeError(f"{op}: axis must be an int, got {type(axis).__name__}")
        if not -x.rank <= axis < x.rank:
            raise IndexOpError(
                f"{op}: Invalid axis value {axis}. Axis must be in range [-{x.rank}, {x.rank - 1}] (input {R.fmt(x)})"
            )
        _scatter_dtypes(op, x, upd, idx, quoted=True)
        # As in MAX, the ranks and shapes of updates and indices are checked when the graph runs.
        device = R.input_device(x, upd, idx)
        return TensorType(x.dtype, x.shape, device)

    rule.__name__ = rule.__qualname__ = f"_{op}_rule"
    return rule


def _scatter_impl_for(op: str, reduction: str | None):
    write = _SCATTER_WRITES[reduction]

    def impl(x, upd, idx, *, axis: int):
        axis %= x.ndim
        if not upd.ndim == idx.ndim == x.ndim:
            raise ValueError(
                f"{op}: input {x.shape}, updates {upd.shape} and indices {idx.shape} must have the same rank"
            )
        if upd.shape != idx.shape:
            raise ValueError(f"{op}: updates {upd.shape} and indices {idx.shape} must have the same shape")
        for d, (i, n) in enumerate(zip(idx.shape, x.shape)):
            if d != axis and i > n:
                raise ValueError(f"{op}: dim {d} of indices {idx.shape} exceeds that of input {x.shape}")
        n = x.shape[axis]
        # ScatterElements: out[..., idx[i, j, ...] (at axis), ...] = upd[i, j, ...]; other coordinates are i, j, ...
        where = list(jnp.indices(idx.shape, sparse=True))
        where[axis] = jnp.where(idx < 0, idx + n, idx)
        return write(x.at[tuple(where)], upd)

    return impl


def _scatter_op(op: str, reduction: str | None) -> OpDef:
    return register(OpDef(op, rule=_scatter_rule_for(op), impl=_scatter_impl_for(op, reduction)))


def _bind_scatter(p: OpDef, input, updates, indices, axis):  # noqa: A002 - MAX's name
    _check_scatter_devices(p.name, (input, updates, indices))
    return bind(p, input, updates, indices, axis=int(axis) if is_int(axis) else axis)


scatter_p = _scatter_op("scatter", None)
scatter_add_p = _scatter_op("scatter_add", "add")
scatter_max_p = _scatter_op("scatter_max", "max")
scatter_min_p = _scatter_op("scatter_min", "min")
scatter_mul_p = _scatter_op("scatter_mul", "mul")


@front(scatter_p)
def scatter(input, updates, indices, axis=-1):  # noqa: A002 - MAX's name
    """A copy of ``input`` with ``updates`` written at ``indices`` along ``axis``.

    ScatterElements semantics: ``updates`` and ``indices`` have the same shape
    and the rank of ``input``; for 2-D with ``axis=0``,
    ``out[indices[i][j]][j] = updates[i][j]``; with ``axis=1``,
    ``out[i][indices[i][j]] = updates[i][j]``. Negative indices count from the
    end; which of several updates to one position wins is unspecified.

    Raises:
        ValueError: ``axis`` out of range (`IndexOpError`, also an IndexError),
            dtype mismatch, non-int32/int64 indices, or inputs on different
            devices; mismatched ranks/shapes when the graph runs (as MAX).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> x = Tensor([1.0, 2.0, 3.0, 4.0, 5.0])
        >>> updates = Tensor([10.0, 20.0])
        >>> ops.scatter(x, updates, Tensor([0, 3], dtype=DType.int64), axis=0)
        TensorType(dtype=float32, shape=[Dim(5)], device=cpu:0): [10.0, 2.0, 3.0, 20.0, 5.0]
    """
    return _bind_scatter(scatter_p, input, updates, indices, axis)


@front(scatter_add_p)
def scatter_add(input, updates, indices, axis=-1):  # noqa: A002 - MAX's name
    """`scatter` that adds: ``out[indices[i][j]][j] += updates[i][j]`` (2-D, ``axis=0``); duplicates accumulate.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> x = Tensor([1.0, 1.0, 1.0])
        >>> ops.scatter_add(x, Tensor([5.0, 2.0, 4.0]), Tensor([0, 2, 0], dtype=DType.int64), axis=0)
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [10.0, 1.0, 3.0]
    """
    return _bind_scatter(scatter_add_p, input, updates, indices, axis)


@front(scatter_max_p)
def scatter_max(input, updates, indices, axis=-1):  # noqa: A002 - MAX's name
    """`scatter` keeping the maximum: ``out[indices[i][j]][j] = max(out[...], updates[i][j])`` (2-D, ``axis=0``).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> x = Tensor([1.0, 1.0, 1.0])
        >>> ops.scatter_max(x, Tensor([5.0, 0.5, 4.0]), Tensor([0, 2, 0], dtype=DType.int64), axis=0)
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [5.0, 1.0, 1.0]
    """
    return _bind_scatter(scatter_max_p, input, updates, indices, axis)


@front(scatter_min_p)
def scatter_min(input, updates, indices, axis=-1):  # noqa: A002 - MAX's name
    """`scatter` keeping the minimum: ``out[indices[i][j]][j] = min(out[...], updates[i][j])`` (2-D, ``axis=0``).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> x = Tensor([9.0, 9.0, 9.0])
        >>> ops.scatter_min(x, Tensor([5.0, 2.0, 4.0]), Tensor([0, 2, 0], dtype=DType.int64), axis=0)
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [4.0, 9.0, 2.0]
    """
    return _bind_scatter(scatter_min_p, input, updates, indices, axis)


@front(scatter_mul_p)
def scatter_mul(input, updates, indices, axis=-1):  # noqa: A002 - MAX's name
    """`scatter` that multiplies: ``out[indices[i][j]][j] *= updates[i][j]`` (2-D, ``axis=0``); duplicates accumulate.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> x = Tensor([1.0, 1.0, 1.0])
        >>> ops.scatter_mul(x, Tensor([5.0, 2.0, 4.0]), Tensor([0, 2, 0], dtype=DType.int64), axis=0)
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [20.0, 1.0, 2.0]
    """
    return _bind_scatter(scatter_mul_p, input, updates, indices, axis)


def _scatter_nd_rule_for(op: str):
    def rule(x, upd, idx) -> TensorType:
        x = R.require_tensor(op, x, "input")
        upd = R.require_tensor(op, upd, "updates")
        idx = R.require_tensor(op, idx, "indices")
        _scatter_dtypes(op, x, upd, idx, quoted=False)
        if idx.rank < 1:
            raise R.OpError(f"{op}: indices must have rank >= 1 ([num_updates, k]), got {R.fmt(idx)}")
        k = R.static_int(op, idx.shape[-1], "the last dim of indices")
        if k > x.rank:
            raise R.OpError(
                f"{op}: index vectors of length {k} (indices {R.fmt(idx)}) exceed the rank of input {R.fmt(x)}"
            )
        want = list(idx.shape[:-1]) + list(x.shape[k:])
        if len(want) != upd.rank or any(a != b for a, b in zip(want, upd.shape)):
            raise R.OpError(
                f"{op}: updates {R.fmt(upd)} must have shape indices.shape[:-1] + input.shape[{k}:] = "
                f"[{', '.join(str(d) for d in want)}] (input {R.fmt(x)}, indices {R.fmt(idx)})"
            )
        device = R.input_device(x, upd, idx)
        return TensorType(x.dtype, x.shape, device)

    rule.__name__ = rule.__qualname__ = f"_{op}_rule"
    return rule


def _scatter_nd_impl_for(reduction: str | None):
    write = _SCATTER_WRITES[reduction]

    def impl(x, upd, idx):
        k = idx.shape[-1]
        where = tuple(jnp.where(idx[..., i] < 0, idx[..., i] + x.shape[i], idx[..., i]) for i in range(k))
        return write(x.at[where], upd)

    return impl


def _scatter_nd_op(op: str, reduction: str | None) -> OpDef:
    return register(OpDef(op, rule=_scatter_nd_rule_for(op), impl=_scatter_nd_impl_for(reduction)))


def _bind_scatter_nd(p: OpDef, input, updates, indices):  # noqa: A002 - MAX's name
    _check_scatter_devices(p.name, (input, updates, indices))
    return bind(p, input, updates, indices)


scatter_nd_p = _scatter_nd_op("scatter_nd", None)
scatter_nd_add_p = _scatter_nd_op("scatter_nd_add", "add")
scatter_nd_max_p = _scatter_nd_op("scatter_nd_max", "max")
scatter_nd_min_p = _scatter_nd_op("scatter_nd_min", "min")
scatter_nd_mul_p = _scatter_nd_op("scatter_nd_mul", "mul")


@front(scatter_nd_p)
def scatter_nd(input, updates, indices):  # noqa: A002 - MAX's name
    """A copy of ``input`` with ``updates`` scattered at N-dimensional ``indices``.

    ``indices`` has shape ``[*Q, k]`` (``k <= rank``, static): each index vector
    selects an element (``k == rank``) or a slice of the trailing
    ``rank - k`` dims; ``updates`` has shape ``[*Q, *input.shape[k:]]``.

    Raises:
        ValueError: dtype mismatch, non-int32/int64 indices, inputs on
            different devices, ``k > rank`` or a wrong updates shape.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> x = Tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        >>> updates = Tensor([[10.0, 20.0], [50.0, 60.0]])
        >>> ops.scatter_nd(x, updates, Tensor([[0], [2]], dtype=DType.int64))  # rows 0 and 2
        TensorType(dtype=float32, shape=[Dim(3), Dim(2)], device=cpu:0): [10.0, 20.0, 3.0, 4.0, 50.0, 60.0]
    """
    return _bind_scatter_nd(scatter_nd_p, input, updates, indices)


@front(scatter_nd_add_p)
def scatter_nd_add(input, updates, indices):  # noqa: A002 - MAX's name
    """`scatter_nd` that adds the updates; updates to one position accumulate.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> x = Tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
        >>> updates = Tensor([[10.0, 10.0], [20.0, 20.0], [100.0, 100.0]])
        >>> ops.scatter_nd_add(x, updates, Tensor([[0], [2], [0]], dtype=DType.int64))
        TensorType(dtype=float32, shape=[Dim(3), Dim(2)], device=cpu:0): [111.0, 111.0, 2.0, 2.0, 23.0, 23.0]
    """
    return _bind_scatter_nd(scatter_nd_add_p, input, updates, indices)


@front(scatter_nd_max_p)
def scatter_nd_max(input, updates, indices):  # noqa: A002 - MAX's name
    """`scatter_nd` keeping the elementwise maximum of the current value and each update.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> x = Tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
        >>> updates = Tensor([[10.0, 10.0], [0.0, 0.0], [100.0, 100.0]])
        >>> ops.scatter_nd_max(x, updates, Tensor([[0], [2], [0]], dtype=DType.int64))
        TensorType(dtype=float32, shape=[Dim(3), Dim(2)], device=cpu:0): [100.0, 100.0, 2.0, 2.0, 3.0, 3.0]
    """
    return _bind_scatter_nd(scatter_nd_max_p, input, updates, indices)


@front(scatter_nd_min_p)
def scatter_nd_min(input, updates, indices):  # noqa: A002 - MAX's name
    """`scatter_nd` keeping the elementwise minimum of the current value and each update.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> x = Tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
        >>> updates = Tensor([[10.0, 10.0], [0.0, 0.0], [-1.0, 5.0]])
        >>> ops.scatter_nd_min(x, updates, Tensor([[0], [2], [0]], dtype=DType.int64))
        TensorType(dtype=float32, shape=[Dim(3), Dim(2)], device=cpu:0): [-1.0, 1.0, 2.0, 2.0, 0.0, 0.0]
    """
    return _bind_scatter_nd(scatter_nd_min_p, input, updates, indices)


@front(scatter_nd_mul_p)
def scatter_nd_mul(input, updates, indices):  # noqa: A002 - MAX's name
    """`scatter_nd` that multiplies by the updates; updates to one position accumulate.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> x = Tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
        >>> updates = Tensor([[10.0, 10.0], [2.0, 2.0], [3.0, 0.5]])
        >>> ops.scatter_nd_mul(x, updates, Tensor([[0], [2], [0]], dtype=DType.int64))
        TensorType(dtype=float32, shape=[Dim(3), Dim(2)], device=cpu:0): [30.0, 5.0, 2.0, 2.0, 6.0, 6.0]
    """
    return _bind_scatter_nd(scatter_nd_mul_p, input, updates, indices)


def _masked_scatter_rule(x, mask, upd, *, out_dim: DataDim) -> TensorType:
    op = "masked_scatter"
    x = R.require_tensor(op, x, "input")
    mask = R.require_tensor(op, mask, "mask")
    upd = R.require_tensor(op, upd, "updates")
    _same_dtype(op, x, upd)
    shape = R.broadcast_shapes(op, x.shape, mask.shape)
    if len(shape) != x.rank or any(a != b for a, b in zip(shape, x.shape)):
        raise R.OpError(f"{op}: mask {R.fmt(mask)} must broadcast to the shape of input {R.fmt(x)}")
    n = out_dim.dim
    count: Dim = StaticDim(1)
    for d in upd.shape:
        count = count * d
    if isinstance(n, StaticDim) and isinstance(count, StaticDim) and count.dim < n.dim:
        raise R.OpError(f"{op}: updates {R.fmt(upd)} have {count} elements, fewer than out_dim {n}")
    device = R.input_device(x, mask, upd)
    return TensorType(x.dtype, x.shape, device)


def _masked_scatter_impl(x, mask, upd, *, out_dim: DataDim):
    where = jnp.broadcast_to(mask != 0, x.shape).reshape(-1)
    src = upd.reshape(-1)
    if src.size == 0:
        return x
    # The k-th True position (row-major) takes the k-th update; computed without data-dependent shapes.
    pos = jnp.clip(jnp.cumsum(where) - 1, 0, src.size - 1)
    return jnp.where(where, src[pos], x.reshape(-1)).reshape(x.shape)


masked_scatter_p = register(OpDef("masked_scatter", rule=_masked_scatter_rule, impl=_masked_scatter_impl))


@front(masked_scatter_p)
def masked_scatter(input, mask, updates, out_dim):  # noqa: A002 - MAX's name
    """A copy of ``input`` with ``updates`` written where ``mask`` is true.

    True positions are filled in row-major order: the first takes the first
    element of (flattened) ``updates``, and so on. ``mask`` (bool, or any dtype
    with nonzero meaning true; Python lists are accepted) broadcasts to the
    shape of ``input``. ``out_dim`` names the number of true positions; the
    result has the shape of ``input``, so it needs no data-dependent shape.
    ``updates`` needs at least that many elements (extra ones are unused).

    Raises:
        ValueError: dtype mismatch between input and updates, a mask that does
            not broadcast to the input, or fewer updates than a static out_dim.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> mask = Tensor([[True, False], [False, True]])
        >>> ops.masked_scatter(x, mask, Tensor([10.0, 20.0]), out_dim=2)
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [10.0, 2.0, 3.0, 20.0]
    """
    try:
        od = DataDim(out_dim)
    except TypeError:
        raise TypeError(
            f"masked_scatter: out_dim must be an int, str or Dim, got {type(out_dim).__name__} {out_dim!r}"
        ) from None
    if is_weak(mask) and not isinstance(mask, Dim):
        mask = np.asarray(mask).astype(bool)
    return bind(masked_scatter_p, input, mask, updates, out_dim=od)


# ─── nonzero ──────────────────────────────────────────────────────────────


def _nonzero_rule(x, *, out_dim: DataDim) -> TensorType:
    x = R.require_tensor("nonzero", x)
    return TensorType(DType.int64, [out_dim.dim, x.rank], x.device)


def _nonzero_impl(x, *, out_dim: DataDim):
    size = out_dim.evaluate({})
    if isinstance(x, jax.core.Tracer):
        if size is None:
            raise ValueError(
                f"nonzero: under jax.jit/vmap the number of nonzero elements is unknown, so out_dim {out_dim} cannot "
                "be sized; "
                "pass a static int out_dim (the result is then padded with zero rows or truncated, like "
                "jnp.nonzero(size=...))"
            )
        return jnp.argwhere(x, size=size).astype(jnp.int64)
    out = jnp.argwhere(x).astype(jnp.int64)
    if size is not None and out.shape[0] != size:
        raise ValueError(f"nonzero: out_dim is {size} but the input has {out.shape[0]} nonzero elements")
    return out


nonzero_p = register(
    OpDef("nonzero", rule=_nonzero_rule, impl=_nonzero_impl, differentiable=False, data_dependent=True)
)


@front(nonzero_p)
def nonzero(x, out_dim):
    """Indices of the nonzero elements of ``x``: int64 ``[out_dim, rank]``, row-major order.

    ``out_dim`` names the data-dependent count: a new symbol (``"n_nonzero"``)
    is bound when the graph runs and may be used by later ops; an int asserts
    the count (a ValueError at run time if it differs). Graphs using
    ``nonzero`` run op by op rather than as one compiled program. Under
    ``jax.jit``, only an int ``out_dim`` works, and the result is padded with
    zero rows or truncated to it.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[0.0, 3.0], [4.0, 0.0]])
        >>> ops.nonzero(x, "nz")
        TensorType(dtype=int64, shape=[Dim(2), Dim(2)], device=cpu:0): [0, 1, 1, 0]
    """
    try:
        od = DataDim(out_dim)
    except TypeError:
        raise TypeError(
            f"nonzero: out_dim must be an int, str or Dim, got {type(out_dim).__name__} {out_dim!r}"
        ) from None
    return bind(nonzero_p, x, out_dim=od)
