"""Advanced (numpy) indexing: ``x[idx]``, ``x[mask]``, ``x[idx] = v`` with index arrays.

Three registry ops, named after MAX's kernels (``ops.custom`` reaches them by
these names with MAX's argument conventions, see `custom_kernel` below):

- ``advanced_indexing_getitem``: ``(x, *indices)`` → ``x[index]``;
- ``advanced_indexing_setitem``: ``(x, updates, *indices)`` → a copy of ``x``
  with ``updates`` written at ``x[index]``;
- ``advanced_indexing_setitem_inplace``: ``(buffer, updates, *indices)``
  writes the buffer.

Each takes one param, ``index``: a tuple of entries, one per index entry of
``x[...]`` after the Ellipsis is expanded (trailing full slices may be left out):

    ("a", j)                    the j-th index tensor (integer; all broadcast together)
    ("i", k)                    an int
    ("s", start, stop, step)    a slice with int (or None) bounds
    ("n",)                      None: a new size-1 dim

The result follows numpy: the index tensors broadcast to one shape ``B``; if
the array (and int) entries are adjacent, ``B`` replaces their dims in place,
otherwise it comes first. MAX's kernels are the case ``(":",) * start_axis +
arrays``.

`getitem` and `setitem` are what ``Tensor`` and ``TensorValue`` indexing call
(plain ints and slices stay with ``slice_tensor``). They convert Python/numpy
index data to constants (checked against static dims at once: an out-of-range
index raises `IndexOpError` even under ``jax.jit``), and a boolean mask to the
index arrays of its True entries (numpy's ``x[mask] == x[mask.nonzero()]``).
A mask whose values are unknown (``jax.jit``, a graph being built) gives a
data-dependent shape and raises `DataDependentShapeError`, as JAX does; only
``x[mask] = v`` keeps its shape, so it works there (``where``/``masked_scatter``).

Out-of-range index *tensors* raise on eager tensors (the ops' ``check_values``,
as ``gather`` does); inside ``jax.jit``, ``F.lazy()`` and graphs reads clamp and
writes are dropped (XLA's gather/scatter).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.context import bind
from lowering.dims import Dim, StaticDim
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.ops._indexing_util import IndexOpError, dtype_of, is_int, is_value
from lowering.ops.buffer import _require_buffer
from lowering.ops.core import cast_p
from lowering.ops.custom import custom_kernel
from lowering.ops.elementwise import where_p
from lowering.ops.indexing import _slice_rule_dim, check_index_bounds, masked_scatter, slice_tensor
from lowering.ops.shape import broadcast_to, rebind, reshape
from lowering.registry import OpDef, register
from lowering.types import BufferType, TensorType

__all__ = ["getitem", "setitem", "setitem_inplace", "is_advanced", "DataDependentShapeError"]


class DataDependentShapeError(IndexOpError):
    """``x[mask]`` where the mask's values are unknown: the result's shape would depend on them (JAX's
    NonConcreteBooleanIndexError).
    """


_FULL = ("s", None, None, 1)


# ─── shape rule ───────────────────────────────────────────────────────────


def _consumes(s: tuple) -> bool:
    return s[0] != "n"


def _filled(op: str, index: tuple, x: TensorType) -> tuple:
    """``index`` with trailing full slices up to the rank of ``x``."""
    used = sum(1 for s in index if _consumes(s))
    if used > x.rank:
        raise IndexOpError(f"{op}: too many indices ({used}) for a tensor of rank {x.rank} ({R.fmt(x)})")
    return tuple(index) + (_FULL,) * (x.rank - used)


def _broadcast_indices(op: str, types: Sequence[TensorType]) -> list[Dim]:
    try:
        return list(R.broadcast_shapes(op, *(t.shape for t in types)))
    except R.OpError:
        shapes = " ".join("[" + ", ".join(str(d) for d in t.shape) + "]" for t in types)
        raise IndexOpError(
            f"{op}: shape mismatch: indexing arrays could not be broadcast together with shapes {shapes}"
        ) from None


def _region(op: str, x: TensorType, index_types: Sequence[Any], index: tuple) -> list[Dim]:
    """Shape of ``x[index]`` (numpy's rules), checking ints and slices against static dims."""
    types = [R.require_tensor(op, t, f"index {j}") for j, t in enumerate(index_types)]
    for j, t in enumerate(types):
        if not t.dtype.is_integral():
            raise IndexOpError(
                f"{op}: index tensors must have an integer dtype, got index {j}: {R.fmt(t)} "
                "(MAX's kernel takes no boolean masks: x[mask] converts a known mask to the positions of its True "
                "entries)"
            )
    specs = _filled(op, index, x)
    arrays = any(s[0] == "a" for s in specs)
    basic: list[tuple[int, Dim]] = []  # (position in specs, dim) of the dims slices and Nones keep
    axis = 0
    for pos, s in enumerate(specs):
        if s[0] == "n":
            basic.append((pos, StaticDim(1)))
            continue
        d = x.shape[axis]
        if s[0] == "i" and isinstance(d, StaticDim) and not -d.dim <= s[1] < d.dim:
            raise IndexOpError(f"{op}: index {s[1]} is out of range for axis {axis} of size {d.dim} in {R.fmt(x)}")
        if s[0] == "s":
            basic.append((pos, _slice_rule_dim(x, axis, d, (*s, None))))
        axis += 1
    if not arrays:
        return [d for _, d in basic]
    where = [pos for pos, s in enumerate(specs) if s[0] in ("a", "i")]
    bshape = _broadcast_indices(op, [types[s[1]] for s in specs if s[0] == "a"])
    if where == list(range(where[0], where[-1] + 1)):  # adjacent: B takes their place
        return [d for p, d in basic if p < where[0]] + bshape + [d for p, d in basic if p > where[-1]]
    return bshape + [d for _, d in basic]


def _check_updates(op: str, x: TensorType, upd: Any, region: list[Dim]) -> None:
    upd = R.require_tensor(op, upd, "updates")
    if upd.dtype is not x.dtype:
        raise R.OpError(f"{op}: updates {R.fmt(upd)} must have the dtype of input {R.fmt(x)}")
    extra = upd.rank - len(region)
    lead, rest = upd.shape[: max(extra, 0)], upd.shape[max(extra, 0) :]
    ok = all(d == 1 for d in lead)
    if ok:
        try:
            ok = list(R.broadcast_shapes(op, region, rest)) == list(region)
        except R.OpError:
            ok = False
    if not ok:
        raise R.OpError(
            f"{op}: updates {R.fmt(upd)} cannot be broadcast to the indexed region "
            f"[{', '.join(str(d) for d in region)}] of input {R.fmt(x)}"
        )


def _getitem_rule(x, *index_types, index: tuple) -> TensorType:
    op = "advanced_indexing_getitem"
    x = R.require_tensor(op, x)
    device = R.input_device(x, *index_types)
    return TensorType(x.dtype, _region(op, x, index_types, index), device)


def _setitem_rule(x, upd, *index_types, index: tuple) -> TensorType:
    op = "advanced_indexing_setitem"
    x = R.require_tensor(op, x)
    _check_updates(op, x, upd, _region(op, x, index_types, index))
    device = R.input_device(x, upd, *index_types)
    return TensorType(x.dtype, x.shape, device)


def _setitem_inplace_rule(buf, upd, *index_types, index: tuple) -> None:
    op = "advanced_indexing_setitem_inplace"
    buf = _require_buffer(op, buf, "input")
    x = TensorType(buf.dtype, buf.shape, buf.device)
    _check_updates(op, x, upd, _region(op, x, index_types, index))
    R.input_device(x, upd, *index_types)
    return None


# ─── implementation ───────────────────────────────────────────────────────


def _jnp_index(x, arrays: Sequence[Any], index: tuple) -> tuple:
    """``index`` as a jnp index of ``x``; negative array entries count from the end."""
    out: list[Any] = []
    axis = 0
    for s in index:
        if s[0] == "n":
            out.append(None)
            continue
        if s[0] == "a":
            a, n = arrays[s[1]], x.shape[axis]
            out.append(jnp.where(a < 0, a + n, a) if jnp.issubdtype(a.dtype, jnp.signedinteger) else a)
        elif s[0] == "i":
            out.append(s[1])
        else:
            out.append(slice(s[1], s[2], s[3]))
        axis += 1
    return tuple(out)


def _getitem_impl(x, *arrays, index: tuple):
    return x.at[_jnp_index(x, arrays, index)].get(mode="clip")  # out-of-range reads clamp (no errors under jit)


def _setitem_impl(x, upd, *arrays, index: tuple):
    return x.at[_jnp_index(x, arrays, index)].set(upd.astype(x.dtype), mode="drop")  # out-of-range writes are dropped


def _setitem_inplace_impl(buf, upd, *arrays, index: tuple):
    return (_setitem_impl(buf, upd, *arrays, index=index),)


def _check_bounds(op: str, x, arrays: Sequence[Any], index: tuple) -> None:
    """Eager tensors: every index tensor entry lies in ``[-n, n)`` for its axis (numpy raises there)."""
    axis = 0
    for s in index:
        if s[0] == "n":
            continue
        if s[0] == "a":
            check_index_bounds(op, arrays[s[1]], (x.shape[axis],), (axis,))
        axis += 1


def _getitem_check(x, *arrays, index: tuple) -> None:
    _check_bounds("advanced_indexing_getitem", x, arrays, index)


def _setitem_check(x, upd, *arrays, index: tuple) -> None:
    _check_bounds("advanced_indexing_setitem", x, arrays, index)


def _setitem_inplace_check(buf, upd, *arrays, index: tuple) -> None:
    _check_bounds("advanced_indexing_setitem_inplace", buf, arrays, index)


getitem_p = register(
    OpDef("advanced_indexing_getitem", rule=_getitem_rule, impl=_getitem_impl, check_values=_getitem_check)
)
setitem_p = register(
    OpDef("advanced_indexing_setitem", rule=_setitem_rule, impl=_setitem_impl, check_values=_setitem_check)
)
setitem_inplace_p = register(
    OpDef(
        "advanced_indexing_setitem_inplace",
        rule=_setitem_inplace_rule,
        impl=_setitem_inplace_impl,
        mutates=(0,),
        differentiable=False,
        check_values=_setitem_inplace_check,
    )
)


# ─── parsing x[...] ───────────────────────────────────────────────────────


def _shape_of(x: Any) -> tuple:
    t = getattr(x, "type", None)
    return tuple(t.shape) if isinstance(t, (TensorType, BufferType)) else tuple(x.shape)


def _is_array_entry(ix: Any) -> bool:
    """An entry that makes ``x[...]`` advanced: a list, a numpy array (not a 0-d int), a typed tensor of rank >= 1, or
    any bool.
    """
    if isinstance(ix, (bool, np.bool_, list)):
        return True
    if isinstance(ix, np.ndarray):
        return ix.ndim > 0 or ix.dtype == np.bool_
    if is_value(ix):
        return len(_shape_of(ix)) > 0 or dtype_of(ix) is DType.bool
    return False


def is_advanced(index: Any) -> bool:
    """Whether ``x[index]`` needs advanced indexing (an index array or a mask) rather than ``slice_tensor``.

    Example:
        >>> import numpy as np
        >>> from lowering.ops.advanced_indexing import is_advanced
        >>> is_advanced((0, slice(1, None))), is_advanced([0, 2]), is_advanced((slice(None), np.array([1])))
        (False, True, True)
    """
    if isinstance(index, tuple):
        return any(_is_array_entry(ix) for ix in index)
    return _is_array_entry(index)


def _index_array(op: str, ix: Any, pos: int) -> tuple[str, Any]:
    """``("arr", ...)`` for an integer index array, ``("mask", ...)`` for a boolean one."""
    if is_value(ix):
        dt = dtype_of(ix)
        if dt is DType.bool:
            return ("mask", ix)
        if not dt.is_integral():
            raise IndexOpError(
                f"{op}: arrays used as indices must be of integer (or boolean) type, got {dt.name} at position {pos}"
            )
        return ("arr", ix)
    try:
        arr = np.asarray(ix)
    except ValueError as e:
        raise IndexOpError(f"{op}: index {pos} is not a rectangular array: {e}") from None
    if arr.size == 0 and arr.dtype.kind == "f":
        arr = arr.astype(np.int32)  # x[[]]: numpy takes an empty list as integer positions
    if arr.dtype == np.bool_:
        return ("mask", arr)
    if arr.dtype.kind not in "iu":
        raise IndexOpError(
            f"{op}: arrays used as indices must be of integer (or boolean) type, got {arr.dtype} at position {pos}"
        )
    return ("arr", arr)


def _entry(op: str, ix: Any, pos: int) -> tuple:
    if ix is None:
        return ("n",)
    if ix is Ellipsis:
        return ("e",)
    if isinstance(ix, slice):
        for what, v in (("start", ix.start), ("stop", ix.stop), ("step", ix.step)):
            if v is not None and not is_int(v):
                raise TypeError(
                    f"{op}: next to index arrays, slice {what}s must be ints or None, got {type(v).__name__} {v!r} at "
                    f"position {pos}"
                )
        step = 1 if ix.step is None else int(ix.step)
        if step == 0:
            raise R.OpError(f"{op}: slice step of index {pos} cannot be zero")
        return ("s", None if ix.start is None else int(ix.start), None if ix.stop is None else int(ix.stop), step)
    if isinstance(ix, (bool, np.bool_)):
        raise TypeError(
            f"{op}: a bool scalar index ({ix!r} at position {pos}) is not supported; index with a boolean array"
        )
    if is_int(ix):
        return ("i", int(ix))
    if isinstance(ix, (list, np.ndarray)) or is_value(ix):
        return _index_array(op, ix, pos)
    raise TypeError(
        f"{op}: unsupported index {ix!r} ({type(ix).__name__}) at position {pos}; use ints, slices, None, Ellipsis or "
        "integer/boolean arrays"
    )


def _rank_used(e: tuple) -> int:
    if e[0] in ("n", "e"):
        return 0
    return len(_shape_of(e[1])) if e[0] == "mask" else 1


def _expand_ellipsis(op: str, entries: list[tuple], rank: int) -> list[tuple]:
    used = sum(_rank_used(e) for e in entries)
    if sum(1 for e in entries if e[0] == "e") > 1:
        raise IndexOpError(f"{op}: an index can only have a single Ellipsis (...)")
    if used > rank:
        raise IndexOpError(f"{op}: too many indices for a tensor of rank {rank}: {used} were indexed")
    out: list[tuple] = []
    for e in entries:
        out.extend([("s", None, None, 1)] * (rank - used) if e[0] == "e" else [e])
    return out


def _host_mask(m: Any) -> np.ndarray | None:
    """The values of a boolean mask if they are known now (numpy data, a realized or pending eager tensor), else
    None.
    """
    if isinstance(m, np.ndarray):
        return m
    if isinstance(m, jax.core.Tracer) or isinstance(getattr(getattr(m, "_var", None), "array", None), jax.core.Tracer):
        return None
    ctx = getattr(m, "__lowering_context__", None)
    if ctx is not None and not ctx.concrete:
        return None  # a value of a graph being built
    try:
        return np.asarray(m)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None


def _mask_positions(op: str, mask: np.ndarray, shape: Sequence[Dim], axis: int) -> list[tuple]:
    """The int arrays of ``mask.nonzero()`` (numpy's meaning of ``x[mask]``), after checking the mask's dims."""
    for j, m in enumerate(mask.shape):
        d = shape[axis + j]
        if isinstance(d, StaticDim) and d.dim != m:
            raise IndexOpError(
                f"{op}: boolean index did not match indexed tensor along axis {axis + j}; size of axis is {d.dim} but "
                f"size of corresponding boolean axis is {m}"
            )
    return [("arr", p.astype(np.int32 if mask.size < 2**31 else np.int64)) for p in np.nonzero(mask)]


def _data_dependent(op: str) -> DataDependentShapeError:
    return DataDependentShapeError(
        f"{op}: indexing with a boolean mask gives a result whose shape depends on the mask's values (how many are "
        "True), "
        "which are not known inside jax.jit/grad/vmap or while a graph is built; use ops.where(mask, x, fill) to keep "
        "the shape, "
        "pass the mask as numpy data (known when the program is built), or name the count with ops.nonzero(mask, "
        "out_dim) and gather"
    )


def _constant_indices(op: str, a: np.ndarray, d: Dim, axis: int) -> np.ndarray:
    """Python/numpy positions, checked now against a static dim, as int32 (or int64 if they need it)."""
    if isinstance(d, StaticDim):
        check_index_bounds(op, a, (d.dim,), (axis,))
    small = a.size == 0 or (a.min() >= -(2**31) and a.max() < 2**31)
    return a.astype(np.int32 if small else np.int64)


def _clamped(s: tuple, n: int) -> tuple:
    """A slice of a static dim with numpy's clamped bounds (next to index arrays, slices follow numpy, not MAX's strict
    bounds).
    """
    if s == _FULL:
        return s
    r = range(*slice(s[1], s[2], s[3]).indices(n))
    if not r:
        return ("s", 0, 0, 1)
    stop = r[-1] + r.step
    return ("s", r[0], None if stop < 0 else stop, r.step)


def _parse(op: str, x: Any, index: Any) -> tuple[tuple, list[Any]]:
    """The ``index`` param and the index tensors of ``x[index]``."""
    shape = _shape_of(x)
    raw = index if isinstance(index, tuple) else (index,)
    entries = _expand_ellipsis(op, [_entry(op, ix, pos) for pos, ix in enumerate(raw)], len(shape))
    specs: list[tuple] = []
    tensors: list[Any] = []
    axis = 0
    for e in entries:
        if e[0] == "mask":
            values = _host_mask(e[1])
            if values is None:
                raise _data_dependent(op)
            expanded = _mask_positions(op, values, shape, axis)
        else:
            expanded = [e]
        for s in expanded:
            if s[0] == "arr":
                a = _constant_indices(op, s[1], Dim(shape[axis]), axis) if isinstance(s[1], np.ndarray) else s[1]
                specs.append(("a", len(tensors)))
                tensors.append(a)
            elif s[0] == "s" and isinstance(Dim(shape[axis]), StaticDim):
                specs.append(_clamped(s, int(Dim(shape[axis]))))
            else:
                specs.append(s)
            axis += 1 if s[0] != "n" else 0
    while specs and specs[-1] == _FULL:
        specs.pop()  # trailing full slices are implied
    return tuple(specs), tensors


# ─── getitem / setitem ─────────────────────────────────────────────────────


def getitem(x: Any, index: Any) -> Any:
    """``x[index]`` with numpy's indexing: ints, slices, None, ``...``, integer and boolean arrays.

    Plain ints and slices go to ``slice_tensor``; anything with an index array
    (a list, numpy array, or tensor of rank >= 1) or a boolean mask to the
    ``advanced_indexing_getitem`` op. Index arrays broadcast together; negative
    entries count from the end.

    Raises:
        IndexError: an index out of range (`IndexOpError`, naming the axis and
            its size), a mask whose dims differ from the tensor's, index arrays
            that do not broadcast, or a mask whose values are unknown
            (`DataDependentShapeError`: under ``jax.jit`` or in a graph).
        TypeError: an unsupported index entry.

    Example:
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        >>> x[[1, 0, -1]]  # rows 1, 0 and the last one
        TensorType(dtype=float32, shape=[Dim(3), Dim(3)], device=cpu:0): [4.0, 5.0, 6.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        >>> x[x > 2.5]
        TensorType(dtype=float32, shape=[Dim(4)], device=cpu:0): [3.0, 4.0, 5.0, 6.0]
        >>> x[:, [2, 0]]
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [3.0, 1.0, 6.0, 4.0]
    """
    if not is_advanced(index):
        return slice_tensor(x, index if isinstance(index, tuple) else (index,))
    specs, tensors = _parse(getitem_p.name, x, index)
    return bind(getitem_p, x, *tensors, index=specs)


def _updates_for(op: str, x: Any, value: Any) -> Any:
    """``value`` in the dtype of ``x``: Python/numpy data converted, tensors cast; floats never go into integer
    tensors.
    """
    dt = dtype_of(x)
    if is_value(value):
        vdt = dtype_of(value)
        if vdt is dt:
            return value
        if vdt.is_float() and not dt.is_float():
            raise TypeError(f"{op}: cannot store {vdt.name} values into a {dt.name} tensor")
        return bind(cast_p, value, dtype=dt)
    arr = np.asarray(value)
    if arr.dtype.kind in "fc" and not (dt.is_float() or arr.dtype.kind == dt.to_numpy().kind):
        raise TypeError(f"{op}: cannot store {arr.dtype} values into a {dt.name} tensor")
    return arr.astype(dt.to_numpy())


def _ints_as_tensors(op: str, specs: tuple, tensors: list[Any], shape: Sequence[Any]) -> tuple:
    """Int entries as 0-d index tensors (appended to ``tensors``), checked now against static dims.

    The region's shape is the same (an int is a 0-d index array in numpy's
    rules), and the op's program no longer depends on the position: a loop of
    ``t[i] = row`` on eager tensors compiles once, not once per ``i``.
    """
    out: list[tuple] = []
    axis = 0
    for s in specs:
        if s[0] == "i":
            d = Dim(shape[axis])
            if isinstance(d, StaticDim) and not -d.dim <= s[1] < d.dim:
                raise IndexOpError(f"{op}: index {s[1]} is out of range for axis {axis} of size {d.dim}")
            small = -(2**31) <= s[1] < 2**31
            out.append(("a", len(tensors)))
            tensors.append(np.asarray(s[1], np.int32 if small else np.int64))
        else:
            out.append(s)
        axis += 1 if s[0] != "n" else 0
    return tuple(out)


def _only_mask(index: Any) -> Any:
    """The mask of ``x[mask]`` / ``x[mask, ...]`` when its values are unknown (jit, graphs), else None."""
    raw = index if isinstance(index, tuple) else (index,)
    if not raw or raw[-1] is Ellipsis and len(raw) == 2:
        raw = raw[:1]
    if len(raw) != 1 or not is_value(raw[0]) or dtype_of(raw[0]) is not DType.bool:
        return None
    return raw[0] if _host_mask(raw[0]) is None else None


def _set_by_mask(op: str, x: Any, mask: Any, value: Any) -> Any:
    """``x[mask] = value`` with the shape of ``x``: ``where`` for a value that broadcasts over the masked rows, else
    ``masked_scatter``.
    """
    shape, k = _shape_of(x), len(_shape_of(mask))
    rest = list(shape[k:])
    keep = list(_shape_of(mask)) + [1] * len(rest)
    m = reshape(mask, keep) if rest else mask
    vshape = list(_shape_of(value)) if is_value(value) else list(np.shape(value))
    while len(vshape) > len(rest) and vshape[0] == 1:
        vshape = vshape[1:]  # numpy drops leading size-1 dims of the value: one row for every True entry
        value = reshape(value, vshape) if is_value(value) else np.reshape(value, vshape)
    if len(vshape) <= len(rest):
        return bind(where_p, m, value, x)
    if vshape[1:] != rest:  # one value row per True entry, each broadcast to the row shape
        value = (
            broadcast_to(value, [vshape[0], *rest]) if is_value(value) else np.broadcast_to(value, [vshape[0], *rest])
        )
    return masked_scatter(x, m, value, vshape[0])


def setitem(x: Any, index: Any, value: Any) -> Any:
    """A copy of ``x`` with ``value`` written at ``x[index]`` (numpy's ``x[index] = value``); ``x`` itself is unchanged.

    ``index`` is anything `getitem` takes; ``value`` broadcasts to the indexed
    region and is converted to the dtype of ``x`` (float data into an integer
    tensor is refused). With a mask whose values are unknown (under
    ``jax.jit``, in a graph), ``x[mask] = value`` keeps its shape and works.
    Eager ``Tensor`` assignment (``t[index] = value``) calls this and rebinds
    the tensor.

    Raises:
        IndexError: as for `getitem`.
        ValueError: a value that does not broadcast to the region.
        TypeError: float values into an integer tensor.

    Example:
        >>> from maxfx.tensor import Tensor
        >>> from lowering.ops.advanced_indexing import setitem
        >>> x = Tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        >>> setitem(x, [2, 0], Tensor([[-1.0, -2.0], [-3.0, -4.0]]))  # rows 2 and 0
        TensorType(dtype=float32, shape=[Dim(3), Dim(2)], device=cpu:0): [-3.0, -4.0, 3.0, 4.0, -1.0, -2.0]
        >>> x[x > 3.5] = 0.0  # a Tensor is written in place
        >>> x
        TensorType(dtype=float32, shape=[Dim(3), Dim(2)], device=cpu:0): [1.0, 2.0, 3.0, 0.0, 0.0, 0.0]
    """
    op = setitem_p.name
    updates = _updates_for(op, x, value)
    mask = _only_mask(index)
    if mask is not None:
        return _set_by_mask(op, x, mask, updates)
    specs, tensors = _parse(op, x, index)
    specs = _ints_as_tensors(op, specs, tensors, _shape_of(x))
    return bind(setitem_p, x, updates, *tensors, index=specs)


def setitem_inplace(buffer: Any, index: Any, value: Any) -> None:
    """Write ``value`` at ``buffer[index]`` of a graph buffer (``buf[index] = value`` with index arrays).

    Example:
        >>> import numpy as np
        >>> from maxfx.driver import Tensor
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, TensorType
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> types = [BufferType(DType.float32, [3, 2], DeviceRef.CPU()), TensorType(DType.int32, [2], DeviceRef.CPU())]
        >>> with Graph("scatter_rows", input_types=types) as g:
        ...     buf, rows = g.inputs
        ...     buf[rows] = 7.0  # advanced_indexing_setitem_inplace
        ...     g.output()
        >>> state = Tensor.from_numpy(np.zeros((3, 2), np.float32))
        >>> _ = InferenceSession().load(g).execute(state, np.array([2, 0], np.int32))
        >>> state.to_numpy().tolist()
        [[7.0, 7.0], [0.0, 0.0], [7.0, 7.0]]
    """
    op = setitem_inplace_p.name
    t = buffer.type
    as_tensor = _TypedShape(TensorType(t.dtype, t.shape, t.device))
    updates = _updates_for(op, as_tensor, value)
    specs, tensors = _parse(op, as_tensor, index)
    bind(setitem_inplace_p, buffer, updates, *tensors, index=specs)


class _TypedShape:
    """A stand-in with only a ``type``: lets a buffer's index be parsed like a tensor's."""

    def __init__(self, t: TensorType):
        self.type = t


# ─── MAX's kernels through ops.custom / ops.inplace_custom ─────────────────


def _max_index(parameters: Mapping[str, Any], n: int) -> tuple:
    """MAX's convention: ``n`` index tensors on consecutive axes from ``start_axis``."""
    start = parameters.get("start_axis", 0)
    if not is_int(start) or isinstance(start, bool) or int(start) < 0:
        raise TypeError(f"advanced indexing kernels: parameter start_axis must be an int >= 0, got {start!r}")
    if n == 0:
        raise R.OpError("advanced indexing kernels: expected at least one index tensor after the input (and updates)")
    return (_FULL,) * int(start) + tuple(("a", j) for j in range(n))


def _declared(op: str, out: Any, out_types: Sequence[Any] | None) -> Any:
    """``out`` with the type the call declared (symbolic dims are bound when the graph runs)."""
    if not out_types:
        return out
    want = out_types[0]
    if want.dtype is not out.type.dtype or want.rank != out.type.rank:
        raise R.OpError(f"custom: kernel {op!r} gives {R.fmt(out.type)}, but out_types declares {R.fmt(want)}")
    if list(want.shape) == list(out.type.shape):
        return out
    return rebind(out, want.shape, message=f"{op}: the result's shape differs from the declared out_types")


@custom_kernel("advanced_indexing_getitem")
def _getitem_kernel(values: Sequence[Any], out_types: Sequence[Any] | None, parameters: Mapping[str, Any]) -> list[Any]:
    x, *indices = values
    out = bind(getitem_p, x, *indices, index=_max_index(parameters, len(indices)))
    return [_declared(getitem_p.name, out, out_types)]


@custom_kernel("advanced_indexing_setitem")
def _setitem_kernel(values: Sequence[Any], out_types: Sequence[Any] | None, parameters: Mapping[str, Any]) -> list[Any]:
    x, updates, *indices = values
    out = bind(setitem_p, x, updates, *indices, index=_max_index(parameters, len(indices)))
    return [_declared(setitem_p.name, out, out_types)]


@custom_kernel("advanced_indexing_setitem_inplace", inplace=True)
def _setitem_inplace_kernel(
    values: Sequence[Any], out_types: Sequence[Any] | None, parameters: Mapping[str, Any]
) -> list[Any]:
    buffer, updates, *indices = values
    bind(setitem_inplace_p, buffer, updates, *indices, index=_max_index(parameters, len(indices)))
    return []
