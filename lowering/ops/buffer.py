"""Mutable buffers: ``buffer_create``, ``buffer_load``, ``buffer_store``, ``buffer_store_slice``.

A buffer var names a mutable tensor. Writes are functional underneath: a store
op's impl returns the buffer's new value and the interpreter rebinds the buffer
var to it (``OpDef.mutates``), so later loads in program order see the write.
Buffer *inputs* of a graph get their final values written back into the driver
Tensors passed to ``Model.execute``.
"""

from __future__ import annotations

import builtins
import numbers
from typing import Any

import jax.numpy as jnp
import numpy as np

from lowering.context import GraphBuilder, bind, find_context, is_weak, own_value
from lowering.dims import Dim, StaticDim
from lowering.ops._rules import OpError, broadcast_shapes, fmt
from lowering.registry import OpDef, front, register
from lowering.types import BufferType, DeviceRef, TensorType, Type

__all__ = ["buffer_create", "buffer_load", "buffer_store", "buffer_store_slice"]


def _require_buffer(op: str, t: Any, name: str) -> BufferType:
    if not isinstance(t, BufferType):
        got = fmt(t) if isinstance(t, Type) else type(t).__name__
        raise TypeError(
            f"{op}: {name} must be a BufferValue (a BufferType graph input or ops.buffer_create), got {got}"
        )
    return t


def _graph_of(op: str, destination: Any) -> GraphBuilder:
    ctx = find_context(op, [destination])
    if getattr(ctx, "tensors_are_buffers", False):
        return ctx  # an eager tensor is its own buffer, as in MAX: the write updates it
    _require_buffer(op, getattr(destination, "type", destination), "destination")
    if not isinstance(ctx, GraphBuilder):
        raise TypeError(f"{op}: buffers exist only in a Graph being built")
    return ctx


def _source_var(op: str, ctx: GraphBuilder, dest: BufferType, source: Any) -> tuple[Any, bool]:
    """The source as a graph value; Python/numpy data becomes a constant of the buffer's dtype.

    Returns (value, broadcast): constants from Python data may broadcast to the
    written region (``buf[0:2] = 0.0``); tensor sources must match it exactly.
    """
    source = ctx.capture(source)
    if getattr(source, "type", None) is not None:
        return source, False
    if not is_weak(source):
        raise TypeError(f"{op}: source must be a tensor value or Python/numpy data, got {type(source).__name__}")
    arr = np.asarray(source)
    if arr.dtype.kind == "f" and not (dest.dtype.is_float()):
        raise OpError(f"{op}: cannot store float data {source!r} into a {dest.dtype.name} buffer")
    return ctx.constant(arr.astype(dest.dtype.to_numpy()), dest.dtype, dest.device), True


def _check_source(op: str, dest: BufferType, src: Type, region: list[Dim], broadcast: bool) -> None:
    if not isinstance(src, TensorType):
        raise TypeError(f"{op}: source must be a tensor, got {fmt(src)}; load buffers with ops.buffer_load")
    if src.dtype is not dest.dtype:
        raise OpError(
            f"{op}: source dtype {src.dtype.name} does not match the buffer's dtype {dest.dtype.name} ({fmt(src)} into "
            f"{fmt(dest)})"
        )
    if src.device != dest.device:
        raise OpError(f"{op}: source is on {src.device} but the buffer is on {dest.device}; transfer it first")
    if broadcast:
        if broadcast_shapes(op, src.shape, region) != region:
            raise OpError(f"{op}: source {fmt(src)} cannot be broadcast to the written shape {list(region)}")
    elif list(src.shape) != list(region):
        raise OpError(
            f"{op}: expected source to have shape {list(region)}, but source had shape {list(src.shape)} ({fmt(src)} "
            f"into {fmt(dest)})"
        )


# ─── buffer_create ────────────────────────────────────────────────────────


def _create_rule(*, dtype, shape: tuple[Dim, ...], device: DeviceRef) -> BufferType:
    return BufferType(dtype, list(shape), device)


buffer_create_p = register(
    OpDef(
        "buffer_create",
        rule=_create_rule,
        impl=lambda *, dtype, shape, device: jnp.zeros(shape, dtype.to_numpy()),
        differentiable=False,
    )
)


@front(buffer_create_p)
def buffer_create(type: BufferType):  # noqa: A002 - MAX's parameter name
    """A new buffer of ``type`` inside the graph, filled with zeros.

    Args:
        type: the `BufferType` (a `TensorType` is taken as its buffer type).

    Returns:
        A `BufferValue`.

    Example:
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("g") as g:
        ...     buf = ops.buffer_create(BufferType(DType.float32, [4], DeviceRef.CPU()))
        ...     zeros = ops.buffer_load(buf)
        ...     ops.buffer_store(buf, zeros + 1)
        ...     g.output(zeros, ops.buffer_load(buf))
        >>> [t.to_numpy().tolist() for t in InferenceSession().load(g).execute()]
        [[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    """
    if isinstance(type, TensorType):
        type = type.as_buffer()
    if not isinstance(type, BufferType):
        raise TypeError(f"buffer_create: type must be a BufferType, got {builtins.type(type).__name__} {type!r}")
    return bind(buffer_create_p, dtype=type.dtype, shape=tuple(type.shape), device=type.device)


# ─── buffer_load ──────────────────────────────────────────────────────────


def _load_rule(x: Type) -> TensorType:
    return _require_buffer("buffer_load", x, "x").as_tensor()


buffer_load_p = register(OpDef("buffer_load", rule=_load_rule, impl=lambda x: x, differentiable=False))


@front(buffer_load_p)
def buffer_load(x: Any):
    """An immutable tensor holding the buffer's current contents (a copy).

    Later writes to the buffer do not change the returned tensor.

    Example:
        >>> import numpy as np
        >>> from maxfx.driver import Tensor
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("g", input_types=[BufferType(DType.float32, [2], DeviceRef.CPU())]) as g:
        ...     buf = g.inputs[0]
        ...     before = ops.buffer_load(buf)  # a copy: the store below does not change it
        ...     ops.buffer_store(buf, before * 10)
        ...     g.output(before, ops.buffer_load(buf))
        >>> state = Tensor.from_numpy(np.array([1.0, 2.0], np.float32))
        >>> [t.to_numpy().tolist() for t in InferenceSession().load(g).execute(state)]
        [[1.0, 2.0], [10.0, 20.0]]
    """
    x = own_value(x)
    _require_buffer("buffer_load", getattr(x, "type", x), "x")
    return bind(buffer_load_p, x)


# ─── buffer_store ─────────────────────────────────────────────────────────


def _store_rule(dest: Type, src: Type, *, broadcast: bool) -> None:
    dest = _require_buffer("buffer_store", dest, "destination")
    _check_source("buffer_store", dest, src, list(dest.shape), broadcast)
    return None


def _store_impl(dest, src, *, broadcast: bool):
    return (jnp.broadcast_to(src, dest.shape).astype(dest.dtype),)


buffer_store_p = register(OpDef("buffer_store", rule=_store_rule, impl=_store_impl, mutates=(0,), differentiable=False))


@front(buffer_store_p)
def buffer_store(destination: Any, source: Any) -> None:
    """Overwrite the buffer ``destination`` with the tensor ``source``.

    ``source`` must have the buffer's dtype and shape; Python/numpy data is
    converted to the buffer's dtype and broadcast. Loads after this call see the
    new contents; a buffer that is a graph input is updated in place when the
    model runs.

    Example:
        >>> import numpy as np
        >>> from maxfx.driver import Tensor
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("counter", input_types=[BufferType(DType.int32, [2], DeviceRef.CPU())]) as g:
        ...     buf = g.inputs[0]
        ...     ops.buffer_store(buf, ops.buffer_load(buf) + 1)
        ...     g.output()
        >>> model = InferenceSession().load(g)
        >>> state = Tensor.from_numpy(np.array([0, 10], np.int32))
        >>> _ = model.execute(state)
        >>> _ = model.execute(state)  # the input buffer is updated in place, run after run
        >>> state.to_numpy()
        array([ 2, 12], dtype=int32)
    """
    destination = own_value(destination)
    ctx = _graph_of("buffer_store", destination)
    src, broadcast = _source_var("buffer_store", ctx, destination.type, source)
    ctx.bind(buffer_store_p, [destination, src], {"broadcast": broadcast})


# ─── buffer_store_slice ─────────────────────────────────────────────────────


def _parse_indices(op: str, indices: Any) -> tuple[list[tuple], list[Any]]:
    """Index entries as hashable specs plus the tensor indices (extra node inputs).

    Specs: ``("i", int)``, ``("s", start, stop, step, out_dim)``, ``("e",)`` for
    Ellipsis, ``("t", k)`` for the k-th tensor index.
    """
    if not isinstance(indices, (list, tuple)):
        indices = (indices,)
    specs: list[tuple] = []
    tensors: list[Any] = []
    for i, ix in enumerate(indices):
        out_dim = None
        if isinstance(ix, tuple) and len(ix) == 2 and isinstance(ix[0], slice):
            ix, out_dim = ix
            out_dim = Dim(out_dim)
        if ix is Ellipsis:
            specs.append(("e",))
        elif isinstance(ix, slice):
            parts = []
            for name in ("start", "stop", "step"):
                p = getattr(ix, name)
                if p is not None and (isinstance(p, bool) or not isinstance(p, (numbers.Integral, StaticDim))):
                    raise TypeError(
                        f"{op}: slice {name} of index {i} must be an int or None, got {type(p).__name__} {p!r}"
                    )
                parts.append(None if p is None else int(p))
            if parts[2] == 0:
                raise OpError(f"{op}: slice step of index {i} cannot be zero")
            specs.append(("s", *parts, out_dim))
        elif isinstance(ix, (numbers.Integral, StaticDim)) and not isinstance(ix, bool):
            specs.append(("i", int(ix)))
        elif getattr(ix, "type", None) is not None:
            specs.append(("t", len(tensors)))
            tensors.append(ix)
        else:
            raise TypeError(
                f"{op}: index {i} must be an int, slice, Ellipsis or integer scalar tensor, got {type(ix).__name__} "
                f"{ix!r}"
            )
    if sum(s[0] == "e" for s in specs) > 1:
        raise IndexError(f"{op}: an index can only have a single ellipsis ('...')")
    return specs, tensors


def _region(op: str, dest: BufferType, specs: tuple[tuple, ...], index_types: tuple[Type, ...]) -> list[Dim]:
    """Shape of ``dest[indices]`` (ints and tensor indices drop their dim)."""
    rank = dest.rank
    n = sum(s[0] != "e" for s in specs)
    if n > rank:
        raise IndexError(f"{op}: too many indices ({n}) for buffer of rank {rank} ({fmt(dest)})")
    expanded: list[tuple] = []
    for s in specs:
        if s[0] == "e":
            expanded.extend([("s", None, None, None, None)] * (rank - n))
        else:
            expanded.append(s)
    expanded.extend([("s", None, None, None, None)] * (rank - len(expanded)))
    out: list[Dim] = []
    for axis, (s, d) in enumerate(zip(expanded, dest.shape)):
        if s[0] == "i":
            if isinstance(d, StaticDim) and not -d.dim <= s[1] < d.dim:
                raise IndexError(f"{op}: index {s[1]} is out of bounds for axis {axis} with size {d.dim} ({fmt(dest)})")
        elif s[0] == "t":
            t = index_types[s[1]]
            if not isinstance(t, TensorType) or not t.dtype.is_integral() or any(x != 1 for x in t.shape):
                raise TypeError(f"{op}: tensor index for axis {axis} must be an integer scalar, got {fmt(t)}")
        else:
            _, start, stop, step, out_dim = s
            if isinstance(d, StaticDim):
                size = len(range(*slice(start, stop, step).indices(d.dim)))
                if out_dim is not None and out_dim != size:
                    raise OpError(f"{op}: slice on axis {axis} has {size} elements but out_dim is {out_dim}")
                out.append(StaticDim(size))
            elif start is None and stop is None and step in (None, 1):
                out.append(d)
            elif out_dim is not None:
                out.append(out_dim)
            elif step in (None, 1) and start is not None and stop is not None and 0 <= start <= stop:
                out.append(StaticDim(stop - start))
            else:
                raise OpError(
                    f"{op}: slicing symbolic dim {d} (axis {axis}) with {slice(start, stop, step)} needs an out_dim: "
                    "pass (slice, out_dim)"
                )
    return out


def _store_slice_rule(dest: Type, src: Type, *index_types: Type, index: tuple[tuple, ...], broadcast: bool) -> None:
    op = "buffer_store_slice"
    dest = _require_buffer(op, dest, "destination")
    region = _region(op, dest, index, index_types)
    _check_source(op, dest, src, region, broadcast)
    return None


def _store_slice_impl(dest, src, *tensor_indices, index, broadcast: bool):
    idx = []
    for s in index:
        if s[0] == "i":
            idx.append(s[1])
        elif s[0] == "s":
            idx.append(slice(s[1], s[2], s[3]))
        elif s[0] == "e":
            idx.append(Ellipsis)
        else:
            idx.append(jnp.reshape(tensor_indices[s[1]], ()))
    return (dest.at[tuple(idx)].set(src.astype(dest.dtype)),)


buffer_store_slice_p = register(
    OpDef("buffer_store_slice", rule=_store_slice_rule, impl=_store_slice_impl, mutates=(0,), differentiable=False)
)


@front(buffer_store_slice_p)
def buffer_store_slice(destination: Any, source: Any, indices: Any) -> None:
    """Write ``source`` into the region ``destination[indices]`` of a buffer.

    ``indices`` work like ``slice_tensor``'s: ints (drop the dim), slices,
    ``Ellipsis``, integer scalar tensors (a run-time position) and
    ``(slice, out_dim)`` pairs naming the size of a slice of a symbolic dim.
    ``source`` must have the region's shape and the buffer's dtype (Python data
    is converted and broadcast). ``buf[indices] = source`` does the same.

    Example:
        >>> import numpy as np
        >>> from maxfx.driver import Tensor
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> types = [BufferType(DType.float32, [2, 3], DeviceRef.CPU()), TensorType(DType.float32, [3],
        ...     DeviceRef.CPU())]
        >>> with Graph("g", input_types=types) as g:
        ...     buf, row = g.inputs
        ...     ops.buffer_store_slice(buf, row, [0, slice(None)])  # buf[0, :] = row
        ...     buf[1, 1:] = 7.0  # the same op, via indexing
        ...     g.output()
        >>> state = Tensor.from_numpy(np.zeros((2, 3), np.float32))
        >>> _ = InferenceSession().load(g).execute(state, np.array([1.0, 2.0, 3.0], np.float32))
        >>> state.to_numpy().tolist()
        [[1.0, 2.0, 3.0], [0.0, 7.0, 7.0]]
    """
    op = "buffer_store_slice"
    destination = own_value(destination)
    ctx = _graph_of(op, destination)
    specs, tensors = _parse_indices(op, indices)
    src, broadcast = _source_var(op, ctx, destination.type, source)
    ctx.bind(buffer_store_slice_p, [destination, src, *tensors], {"index": tuple(specs), "broadcast": broadcast})
