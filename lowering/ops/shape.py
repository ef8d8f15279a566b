"""Shape and layout ops: reshape, flatten, squeeze/unsqueeze, transpose/permute,
broadcast_to, rebind, concat/stack, split/chunk, tile, repeat_interleave, pad,
band_part, as_interleaved_complex, shape_to_tensor.

Rules work on symbolic dims with `Dim` algebra (``reshape([batch, 4] → [-1, 2])``
gives ``[batch * 2, 2]``). Dims in node params become ints at replay time, once
the graph's symbolic dims are bound to the concrete input shapes, so the impls
see plain Python ints.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.context import bind, current_context
from lowering.dims import (
    Dim,
    StaticDim,
    _from_poly,
    _make_poly,
    bind_symbols,
    format_shape,
)  # exact division by a monomial (see _exact_div)
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.ops._indexing_util import DataDim
from lowering.ops.core import constant
from lowering.registry import OpDef, front, register
from lowering.types import DeviceRef, TensorType

__all__ = [
    "reshape",
    "flatten",
    "squeeze",
    "unsqueeze",
    "transpose",
    "permute",
    "broadcast_to",
    "rebind",
    "concat",
    "stack",
    "split",
    "chunk",
    "tile",
    "repeat_interleave",
    "pad",
    "band_part",
    "as_interleaved_complex",
    "shape_to_tensor",
]


# ─── helpers ──────────────────────────────────────────────────────────────


def _prod(dims: Iterable[Dim]) -> Dim:
    dims = list(dims)
    if any(isinstance(d, StaticDim) and d.dim == 0 for d in dims):
        return StaticDim(0)  # without multiplying the others (their product may not fit in 64 bits)
    return functools.reduce(operator.mul, dims, StaticDim(1))


def _exact_div(n: Dim, p: Dim) -> Dim | None:
    """``n / p`` when ``p`` divides ``n`` exactly as a polynomial, else None.

    Handles constant divisors (``(batch * 4) / 2``) and single-monomial ones
    (``(batch * seq * 4) / batch``), which covers reshapes like
    ``[batch, seq, d] → [batch, -1]``.
    """
    if p == 0:
        return None
    q = n // p
    if q * p == n:
        return q
    terms = p._poly
    if len(terms) != 1:
        return None
    ((p_mono, p_coeff),) = terms
    out: dict[tuple, int] = {}
    for mono, coeff in n._poly:
        if coeff % p_coeff:
            return None
        rest = list(mono)
        for atom in p_mono:
            if atom not in rest:
                return None
            rest.remove(atom)
        key = tuple(rest)
        out[key] = out.get(key, 0) + coeff // p_coeff
    return _from_poly(_make_poly(out))


def _as_dims(op: str, shape: Any, what: str = "shape") -> tuple[Dim, ...]:
    """A tuple of Dims from an iterable of ints / strings / Dims."""
    if hasattr(shape, "type") or isinstance(shape, (jax.Array, jax.core.Tracer)):
        raise TypeError(f"{op}: {what} must be a list of dims (ints, strings or Dims), got a tensor value")
    if isinstance(shape, (str, Dim)) or not isinstance(shape, Iterable):
        raise TypeError(
            f"{op}: {what} must be a list of dims (ints, strings or Dims), got {type(shape).__name__} {shape!r}"
        )
    dims = []
    for d in shape:
        try:
            dims.append(Dim(d))
        except TypeError:
            raise TypeError(
                f"{op}: {what} entries must be ints, strings or Dims, got {type(d).__name__} {d!r}"
            ) from None
    return tuple(dims)


def _as_ints(op: str, values: Any, what: str) -> tuple[int, ...]:
    if (
        hasattr(values, "type")
        or isinstance(values, (str, jax.Array, jax.core.Tracer))
        or not isinstance(values, Iterable)
    ):
        raise TypeError(f"{op}: {what} must be a list of ints, got {type(values).__name__} {values!r}")
    out = []
    for v in values:
        if isinstance(v, (bool, np.bool_)) or not hasattr(v, "__index__"):
            raise TypeError(f"{op}: {what} entries must be ints, got {type(v).__name__} {v!r}")
        out.append(int(v))
    return tuple(out)


def _all_static(dims: Iterable[Dim]) -> bool:
    return all(isinstance(d, StaticDim) for d in dims)


def _opt_int(v: Any) -> Any:
    """``int(v)`` for int-like values; anything else (None, bad types) is left for the rule to judge."""
    return int(v) if hasattr(v, "__index__") and not isinstance(v, (bool, np.bool_)) else v


def _is_tensor_value(x: Any) -> bool:
    return isinstance(getattr(x, "type", None), TensorType) or isinstance(x, (jax.Array, jax.core.Tracer))


# ─── reshape / flatten ────────────────────────────────────────────────────


def _reshape_rule(x, *, shape: tuple[Dim, ...]) -> TensorType:
    x = R.require_tensor("reshape", x)
    holes = [i for i, d in enumerate(shape) if d == -1]
    if len(holes) > 1:
        raise R.OpError(f"reshape: at most one -1 is allowed in the target shape, got {format_shape(shape)}")
    bad = [d for d in shape if isinstance(d, StaticDim) and d.dim < -1]
    if bad:
        raise R.OpError(f"reshape: negative dim {bad[0]} in target shape {format_shape(shape)} (only -1 is allowed)")
    total = _prod(x.shape)
    known = _prod(d for i, d in enumerate(shape) if i not in holes)
    out = list(shape)
    if holes and known == 0:
        # MAX's wording.
        raise R.OpError(
            f"reshape(): cannot infer -1 dimension when another dimension is 0 (reshape of {R.fmt(x)} to "
            f"{format_shape(shape)})"
        )
    if holes:
        q = _exact_div(total, known)
        if q is None:
            if _all_static(x.shape) and _all_static(shape):
                raise R.OpError(
                    f"reshape: cannot reshape {R.fmt(x)} ({total} elements) to {format_shape(shape)}: "
                    f"{total} is not divisible by {known}"
                )
            raise R.OpError(
                f"reshape: cannot infer the -1 in {format_shape(shape)} for input {R.fmt(x)}: "
                f"{total} elements is not a provable multiple of {known}; give the dim explicitly or rebind first"
            )
        out[holes[0]] = q
    elif total != known:
        # MAX's layout of the message, which suggests the rebind that fixes a symbolic mismatch.
        raise R.OpError(
            "reshape: Failed to create op 'ReshapeOp':\nInputs:\n"
            f"    input = TensorValue{repr(x).removeprefix('TensorType')}\n"
            f"    new_shape = {[Dim(d) for d in shape]!r}\n\nDiagnostics:\n"
            f"    [reshape] input and output number of elements must match: input {R.fmt(x)} has {total} "
            f"elements but target shape {format_shape(shape)} has {known}. If you are confident this is correct, "
            "consider a rebind to assert that the reshape is valid"
        )
    return TensorType(x.dtype, out, x.device)


reshape_p = register(OpDef("reshape", rule=_reshape_rule, impl=lambda x, *, shape: jnp.reshape(x, shape)))


@front(reshape_p)
def reshape(x, shape):
    """Same elements in row-major order, new shape. One dim may be ``-1`` (inferred).

    Symbolic dims work: ``[batch, 4]`` → ``["batch", 2, 2]`` or ``[-1, 2]``
    (the ``-1`` becomes ``batch * 2``).

    Raises:
        ValueError: the element counts differ, or more than one ``-1``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.reshape(Tensor([[1.0, 2.0, 3.0, 4.0]]), [-1, 2])
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [1.0, 2.0, 3.0, 4.0]
        >>> from maxfx.graph import Graph, TensorType
        >>> from maxfx.dtype import DType
        >>> with Graph("g", input_types=[TensorType(DType.float32, ["batch", 4])]) as g:
        ...     print(ops.reshape(g.inputs[0], [-1, 2]).type)
        TensorType(dtype=float32, shape=[Dim('batch') * Dim(2), Dim(2)], device=cpu:0)
    """
    return bind(reshape_p, x, shape=_as_dims("reshape", shape))


def _flatten_rule(x, *, start_dim: int, end_dim: int) -> TensorType:
    x = R.require_tensor("flatten", x)
    if x.rank == 0:
        return TensorType(x.dtype, [1], x.device)
    s = R.normalize_axis("flatten", start_dim, x.rank, name="start_dim")
    e = R.normalize_axis("flatten", end_dim, x.rank, name="end_dim")
    if s > e:
        raise R.OpError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for {R.fmt(x)}")
    shape = list(x.shape[:s]) + [_prod(x.shape[s : e + 1])] + list(x.shape[e + 1 :])
    return TensorType(x.dtype, shape, x.device)


def _flatten_impl(x, *, start_dim: int, end_dim: int):
    if x.ndim == 0:
        return jnp.reshape(x, (1,))
    s, e = start_dim % x.ndim, end_dim % x.ndim
    return jnp.reshape(x, x.shape[:s] + (-1,) + x.shape[e + 1 :])


flatten_p = register(OpDef("flatten", rule=_flatten_rule, impl=_flatten_impl))


@front(flatten_p)
def flatten(x, start_dim=0, end_dim=-1):
    """Merge dims ``start_dim`` through ``end_dim`` (inclusive) into one.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])  # [2, 2, 2]
        >>> ops.flatten(x, 1)
        TensorType(dtype=float32, shape=[Dim(2), Dim(4)], device=cpu:0): [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    """
    return bind(flatten_p, x, start_dim=start_dim, end_dim=end_dim)


# ─── squeeze / unsqueeze / transpose / permute ────────────────────────────


def _squeeze_rule(x, *, axis: int) -> TensorType:
    x = R.require_tensor("squeeze", x)
    ax = R.normalize_axis("squeeze", axis, x.rank)
    if x.shape[ax] != 1:
        raise R.OpError(f"squeeze: dim {axis} of {R.fmt(x)} must have size 1, got {x.shape[ax]}")
    return TensorType(x.dtype, x.shape[:ax] + x.shape[ax + 1 :], x.device)


squeeze_p = register(OpDef("squeeze", rule=_squeeze_rule, impl=lambda x, *, axis: jnp.squeeze(x, axis % x.ndim)))


@front(squeeze_p)
def squeeze(x, axis):
    """Remove the size-1 dim ``axis`` (negative counts from the end).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.squeeze(Tensor([[1.0], [2.0], [3.0]]), -1)
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [1.0, 2.0, 3.0]
    """
    return bind(squeeze_p, x, axis=axis)


def _unsqueeze_rule(x, *, axis: int) -> TensorType:
    x = R.require_tensor("unsqueeze", x)
    ax = R.normalize_axis("unsqueeze", axis, x.rank, new_axis=True)
    return TensorType(x.dtype, list(x.shape[:ax]) + [StaticDim(1)] + list(x.shape[ax:]), x.device)


unsqueeze_p = register(
    OpDef("unsqueeze", rule=_unsqueeze_rule, impl=lambda x, *, axis: jnp.expand_dims(x, axis % (x.ndim + 1)))
)


@front(unsqueeze_p)
def unsqueeze(x, axis):
    """Insert a size-1 dim at ``axis``; negative axes count from ``rank + 1``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.unsqueeze(Tensor([1.0, 2.0, 3.0]), -1)
        TensorType(dtype=float32, shape=[Dim(3), Dim(1)], device=cpu:0): [1.0, 2.0, 3.0]
    """
    return bind(unsqueeze_p, x, axis=axis)


def _transpose_axis(axis: Any, rank: int, name: str) -> int:
    # A rank-0 input accepts axes 0 and -1 (PyTorch's convention, as MAX).
    n = max(rank, 1)
    if isinstance(axis, (bool, np.bool_)) or not hasattr(axis, "__index__"):
        raise TypeError(f"transpose: {name} must be an int, got {type(axis).__name__}")
    if not -n <= int(axis) < n:
        raise R.AxisError(
            f"transpose: Axis {name} out of range (expected to be in range of [{-n}, {n - 1}], but got {int(axis)})"
        )
    return int(axis) % n


def _transpose_rule(x, *, axis_1: int, axis_2: int) -> TensorType:
    x = R.require_tensor("transpose", x)
    a = _transpose_axis(axis_1, x.rank, "axis_1")
    b = _transpose_axis(axis_2, x.rank, "axis_2")
    if x.rank == 0:
        return x
    shape = list(x.shape)
    shape[a], shape[b] = shape[b], shape[a]
    return TensorType(x.dtype, shape, x.device)


transpose_p = register(
    OpDef(
        "transpose",
        rule=_transpose_rule,
        impl=lambda x, *, axis_1, axis_2: x if x.ndim == 0 else jnp.swapaxes(x, axis_1 % x.ndim, axis_2 % x.ndim),
    )
)


@front(transpose_p)
def transpose(x, axis_1, axis_2):
    """Swap two axes (negative axes count from the end).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.transpose(Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), -1, -2)
        TensorType(dtype=float32, shape=[Dim(3), Dim(2)], device=cpu:0): [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    """
    return bind(transpose_p, x, axis_1=axis_1, axis_2=axis_2)


def _permute_rule(x, *, dims: tuple[int, ...]) -> TensorType:
    x = R.require_tensor("permute", x)
    if len(dims) != x.rank:
        raise R.OpError(f"permute: dims {list(dims)} must list all {x.rank} dims of {R.fmt(x)}")
    norm = [R.normalize_axis("permute", d, x.rank, name="dim") for d in dims]
    if sorted(norm) != list(range(x.rank)):
        raise R.OpError(f"permute: dims {list(dims)} is not a permutation of the {x.rank} dims of {R.fmt(x)}")
    return TensorType(x.dtype, [x.shape[i] for i in norm], x.device)


permute_p = register(
    OpDef("permute", rule=_permute_rule, impl=lambda x, *, dims: jnp.transpose(x, [d % x.ndim for d in dims]))
)


@front(permute_p)
def permute(x, dims):
    """Reorder all dims: output dim ``i`` is input dim ``dims[i]``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[[1.0, 2.0, 3.0]], [[4.0, 5.0, 6.0]]])  # [2, 1, 3]
        >>> ops.permute(x, [2, 0, 1])  # -> [3, 2, 1]
        TensorType(dtype=float32, shape=[Dim(3), Dim(2), Dim(1)], device=cpu:0): [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    """
    return bind(permute_p, x, dims=_as_ints("permute", dims, "dims"))


# ─── broadcast_to ─────────────────────────────────────────────────────────


def _broadcast_to_rule(x, *shape_tensor, shape: tuple[Dim, ...]) -> TensorType:
    x = R.require_tensor("broadcast_to", x)
    if shape_tensor:
        st = R.require_tensor("broadcast_to", shape_tensor[0], "shape")
        R.require_rank("broadcast_to", st, lambda r: r == 1, "1", "shape")
        R.require_dtype("broadcast_to", st, R.is_int, "an integer", "shape")
        if isinstance(st.shape[0], StaticDim) and st.shape[0] != len(shape):
            raise R.OpError(
                f"broadcast_to: shape tensor {R.fmt(st)} has {st.shape[0]} entries but out_dims {format_shape(shape)} "
                f"has {len(shape)}"
            )
    if len(shape) < x.rank:
        raise R.OpError(f"broadcast_to: cannot broadcast {R.fmt(x)} to the lower-rank shape {format_shape(shape)}")
    for i in range(1, x.rank + 1):
        d, t = x.shape[-i], shape[-i]
        if shape_tensor and not (isinstance(d, StaticDim) and isinstance(t, StaticDim)):
            continue  # out_dims of a tensor-valued shape name values known only when the graph runs
        if d != 1 and d != t:
            # MAX's wording, then the types.
            raise R.OpError(
                f"[broadcast_to] input dimension at index {x.rank - i} ({d}) must be either 1 or equal to "
                f"corresponding output dimension at index {len(shape) - i} ({t}); cannot broadcast {R.fmt(x)} to "
                f"{format_shape(shape)}"
            )
    return TensorType(x.dtype, shape, x.device)


broadcast_to_p = register(
    OpDef("broadcast_to", rule=_broadcast_to_rule, impl=lambda x, *shape_tensor, shape: jnp.broadcast_to(x, shape))
)


@front(broadcast_to_p)
def broadcast_to(x, shape, out_dims=None):
    """Broadcast ``x`` to ``shape``: each input dim (right-aligned) must be 1 or equal the target.

    Args:
        x: the tensor to broadcast.
        shape: the target dims, or a 1-D integer tensor holding them (then
            ``out_dims`` gives the output's symbolic dims).
        out_dims: output dims for a tensor-valued ``shape``.

    Raises:
        ValueError: incompatible dims, or a tensor-valued shape without ``out_dims``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.broadcast_to(Tensor([[1.0, 2.0, 3.0]]), [2, 3])
        TensorType(dtype=float32, shape=[Dim(2), Dim(3)], device=cpu:0): [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
        >>> from maxfx.graph import Graph, TensorType
        >>> from maxfx.dtype import DType
        >>> with Graph("g", input_types=[TensorType(DType.float32, ["batch", 1])]) as g:
        ...     print(ops.broadcast_to(g.inputs[0], ["batch", 3]).type)
        TensorType(dtype=float32, shape=[Dim('batch'), Dim(3)], device=cpu:0)
    """
    if _is_tensor_value(shape):
        if out_dims is None:
            raise ValueError("broadcast_to: a tensor-valued shape needs out_dims (the output's dims)")
        return bind(broadcast_to_p, x, shape, shape=_as_dims("broadcast_to", out_dims, "out_dims"))
    return bind(broadcast_to_p, x, shape=_as_dims("broadcast_to", shape))


# ─── rebind ───────────────────────────────────────────────────────────────


class _ShapeSpec:
    """Rebind's target dims, kept as Dims in the node params.

    Params holding bare Dims are resolved before an op runs, which fails for
    symbols that nothing has bound yet; rebind is what binds them, so its dims
    travel in this wrapper and are unified with the concrete shape at replay.
    """

    __slots__ = ("dims",)

    def __init__(self, dims: Iterable[Dim]):
        self.dims = tuple(dims)

    def __maxfx_param_key__(self) -> tuple:
        return ("shape_spec", tuple(str(d) for d in self.dims))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _ShapeSpec) and self.__maxfx_param_key__() == other.__maxfx_param_key__()

    def __hash__(self) -> int:
        return hash(self.__maxfx_param_key__())

    def __repr__(self) -> str:
        return format_shape(self.dims)


def _rebind_rule(x, *, shape: _ShapeSpec, message: str, layout: Any) -> TensorType:
    x = R.require_tensor("rebind", x)
    dims = shape.dims
    why = f" ({message})" if message else ""
    if len(dims) != x.rank:
        raise R.OpError(f"rebind: cannot rebind {R.fmt(x)} to {format_shape(dims)}: rank {x.rank} vs {len(dims)}{why}")
    for i, (d, t) in enumerate(zip(x.shape, dims)):
        if isinstance(d, StaticDim) and isinstance(t, StaticDim) and d != t:
            raise R.OpError(f"rebind: cannot rebind {R.fmt(x)} to {format_shape(dims)}: dim {i} is {d}, not {t}{why}")
    return TensorType(x.dtype, dims, x.device, _layout=layout)


def _rebind_check(x, spec: _ShapeSpec, message: str, env: dict[str, int]) -> None:
    err = bind_symbols(spec.dims, x.shape, env)
    if err:
        raise ValueError(
            f"rebind: {message + ': ' if message else ''}shape {list(x.shape)} does not match "
            f"{format_shape(spec.dims)}: {err}"
        )


def _rebind_impl(x, *, shape: _ShapeSpec, message: str, layout: Any):
    # Direct (traced) use: shapes are concrete, so the check is complete except for cross-op symbol bindings.
    _rebind_check(x, shape, message, {})
    return x


def _rebind_interpret(interp, node, ins, params, env):
    # Graph replay: unify with the graph's symbol binding, binding new symbols for later ops.
    _rebind_check(ins[0], params["shape"], params["message"], interp.dims)
    return ins[0]


rebind_p = register(OpDef("rebind", rule=_rebind_rule, impl=_rebind_impl, interpret=_rebind_interpret))


@front(rebind_p)
def rebind(x, shape, message="", layout=None):
    """Assert that ``x`` has ``shape`` and give it those (symbolic) dims.

    A mismatch between static dims is an error at build time; symbolic dims are
    checked when the graph runs (maxfx compiles per concrete shape), raising a
    ValueError that includes ``message``. New symbols in ``shape`` are bound to
    the actual sizes, so later ops may use them.

    Args:
        x: the tensor.
        shape: the dims to assert.
        message: text of the run-time error.
        layout: optional filter layout recorded on the result type (for conv filters).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.graph import Graph, TensorType
        >>> from maxfx.dtype import DType
        >>> with Graph("g", input_types=[TensorType(DType.float32, ["seq", "d"])]) as g:
        ...     y = ops.rebind(g.inputs[0], ["seq", 64], message="expected 64 features")
        ...     print(y.type)
        TensorType(dtype=float32, shape=[Dim('seq'), Dim(64)], device=cpu:0)
    """
    if not isinstance(message, str):
        raise TypeError(f"rebind: message must be a str, got {type(message).__name__}")
    return bind(rebind_p, x, shape=_ShapeSpec(_as_dims("rebind", shape)), message=message, layout=layout)


# ─── concat / stack ───────────────────────────────────────────────────────


def _same_dtype_rank(op: str, ts: list[TensorType]) -> None:
    # MAX's wording ("All inputs to stack must be the same rank"), then the types.
    if len({t.rank for t in ts}) > 1:
        raise R.OpError(f"{op}: All inputs to {op} must be the same rank, got {R.fmt_all(ts)}")
    if len({t.dtype for t in ts}) > 1:
        raise R.OpError(f"{op}: All inputs to {op} must have the same dtype, got {R.fmt_all(ts)}")


def _check_same_device(op: str, values: list[Any]) -> None:
    """MAX's message, listing the inputs, when typed inputs sit on different devices.

    Runs in the front: bind's own device check would answer first with a shorter message.
    """
    types = [getattr(v, "type", None) for v in values]
    if len({t.device for t in types if isinstance(t, TensorType)}) > 1:
        lines = [
            f"    {i}: {R.fmt(t)} on {t.device}" if isinstance(t, TensorType) else f"    {i}: {type(v).__name__}"
            for i, (v, t) in enumerate(zip(values, types))
        ]
        raise R.OpError(f"{op}: Input values must be on the same device\n" + "\n".join(lines))


def _concat_rule(*xs, axis: int) -> TensorType:
    if not xs:
        raise R.OpError("concat: needs at least one input")
    ts = [R.require_tensor("concat", t, f"input {i}") for i, t in enumerate(xs)]
    _same_dtype_rank("concat", ts)
    R.require_rank("concat", ts[0], lambda r: r >= 1, ">= 1", "input 0")
    ax = R.normalize_axis("concat", axis, ts[0].rank)
    first = ts[0]
    for i, t in enumerate(ts[1:], 1):
        for j, (a, b) in enumerate(zip(first.shape, t.shape)):
            if j != ax and a != b:
                raise R.OpError(
                    f"concat: inputs must match in every dim but axis {axis}; input 0 {R.fmt(first)} and input {i} "
                    f"{R.fmt(t)} differ in dim {j}"
                )
    shape = list(first.shape)
    shape[ax] = functools.reduce(operator.add, (t.shape[ax] for t in ts), StaticDim(0))
    return TensorType(first.dtype, shape, first.device)


concat_p = register(
    OpDef("concat", rule=_concat_rule, impl=lambda *xs, axis: jnp.concatenate(xs, axis=axis % xs[0].ndim))
)


@front(concat_p)
def concat(original_vals, axis=0):
    """Concatenate tensors along ``axis`` (same dtype and rank; other dims equal).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> a = Tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> b = Tensor([[5.0], [6.0]])
        >>> ops.concat([a, b], axis=-1)
        TensorType(dtype=float32, shape=[Dim(2), Dim(3)], device=cpu:0): [1.0, 2.0, 5.0, 3.0, 4.0, 6.0]
    """
    vals = list(original_vals)
    if not vals:
        raise ValueError("concat: original_vals must contain at least one tensor")
    _check_same_device("concat", vals)
    return bind(concat_p, *vals, axis=axis)


def _stack_rule(*xs, axis: int) -> TensorType:
    if not xs:
        raise R.OpError("stack: needs at least one input")
    ts = [R.require_tensor("stack", t, f"input {i}") for i, t in enumerate(xs)]
    _same_dtype_rank("stack", ts)
    first = ts[0]
    for i, t in enumerate(ts[1:], 1):
        if list(t.shape) != list(first.shape):
            raise R.OpError(
                f"stack: inputs must have the same shape; input 0 is {R.fmt(first)}, input {i} is {R.fmt(t)}"
            )
    n = first.rank + 1
    if isinstance(axis, (bool, np.bool_)) or not hasattr(axis, "__index__"):
        raise TypeError(f"stack: axis must be an int, got {type(axis).__name__}")
    if not -n <= int(axis) < n:
        raise R.AxisError(
            f"stack: Axis out of range (expected to be in range of [{-n}, {n - 1}], but got {int(axis)}) for inputs "
            f"{R.fmt(first)}"
        )
    ax = int(axis) % n
    shape = list(first.shape[:ax]) + [StaticDim(len(ts))] + list(first.shape[ax:])
    return TensorType(first.dtype, shape, first.device)


stack_p = register(OpDef("stack", rule=_stack_rule, impl=lambda *xs, axis: jnp.stack(xs, axis=axis % (xs[0].ndim + 1))))


@front(stack_p)
def stack(values, axis=0):
    """Stack equal-shaped tensors along a new ``axis`` (negative counts from ``rank + 1``).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> a = Tensor([1.0, 2.0])
        >>> b = Tensor([3.0, 4.0])
        >>> ops.stack([a, b], axis=0)
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [1.0, 2.0, 3.0, 4.0]
        >>> ops.stack([a, b], axis=1)
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [1.0, 3.0, 2.0, 4.0]
    """
    vals = list(values)
    if not vals:
        raise ValueError("stack: Expected at least one value to stack")
    _check_same_device("stack", vals)
    return bind(stack_p, *vals, axis=axis)


# ─── split / chunk ────────────────────────────────────────────────────────


def _split_rule(x, *, split_sizes: tuple[Dim, ...], axis: int) -> tuple[TensorType, ...]:
    x = R.require_tensor("split", x)
    R.require_rank("split", x, lambda r: r >= 1, ">= 1")
    if not -x.rank <= axis < x.rank:
        raise R.AxisError(f"split: Axis must be in range [{-x.rank}, {x.rank}), got {axis} (input {R.fmt(x)})")
    ax = axis % x.rank
    sizes = [int(s) for s in split_sizes]
    if any(s < 0 for s in sizes):
        raise R.OpError(f"split: Split sizes must be positive: sizes={sizes}")
    if x.shape[ax] != sum(sizes):
        raise R.OpError(
            f"split: Split sizes must sum to dimension value; x.shape[axis]={x.shape[ax]!r} != sum(sizes={sizes}) "
            f"(input {R.fmt(x)}, axis {axis})"
        )
    outs = []
    for s in split_sizes:
        shape = list(x.shape)
        shape[ax] = s
        outs.append(TensorType(x.dtype, shape, x.device))
    return tuple(outs)


def _split_impl(x, *, split_sizes: tuple[int, ...], axis: int):
    ax = axis % x.ndim
    outs, start = [], 0
    for s in split_sizes:
        outs.append(jax.lax.slice_in_dim(x, start, start + s, axis=ax))
        start += s
    return tuple(outs)


split_p = register(OpDef("split", rule=_split_rule, impl=_split_impl, multiple_results=True))


@front(split_p)
def split(x, split_sizes, axis=0):
    """Split ``x`` along ``axis`` into pieces of ``split_sizes`` (which must sum to the dim).

    Returns:
        A list with one tensor per size.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> a, b = ops.split(Tensor([1.0, 2.0, 3.0, 4.0, 5.0]), [2, 3], axis=0)
        >>> a
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [1.0, 2.0]
        >>> b
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [3.0, 4.0, 5.0]
    """
    sizes = _as_dims("split", split_sizes, "split_sizes")
    symbolic = [d for d in sizes if not isinstance(d, StaticDim)]
    if symbolic:
        # MAX's split slices at static offsets: every size must be known.
        raise TypeError(
            f"split: split_sizes must be static ints, got symbolic dim {symbolic[0]} in {format_shape(sizes)}"
        )
    if isinstance(axis, (bool, np.bool_)) or not hasattr(axis, "__index__"):
        raise TypeError(f"split: axis must be an int, got {type(axis).__name__}")
    return list(bind(split_p, x, split_sizes=sizes, axis=int(axis)))


def _chunk_rule(x, *, chunks: int, axis: int) -> tuple[TensorType, ...]:
    x = R.require_tensor("chunk", x)
    R.require_rank("chunk", x, lambda r: r >= 1, ">= 1")
    ax = R.normalize_axis("chunk", axis, x.rank)
    d = x.shape[ax]
    if not isinstance(d, StaticDim):
        # MAX's chunk needs a static dim (a TypeError there too).
        raise TypeError(
            f"chunk: dim {axis} of {R.fmt(x)} must be static to chunk, got symbolic dim {d}; rebind it to a static "
            "size first"
        )
    if chunks <= 0:
        raise R.OpError(f"chunk: chunks must be positive, got {chunks}")
    if d.dim % chunks:
        raise R.OpError(f"chunk: chunks={chunks} must statically divide dim {axis} of {R.fmt(x)} (size {d})")
    shape = list(x.shape)
    shape[ax] = StaticDim(d.dim // chunks)
    return tuple(TensorType(x.dtype, shape, x.device) for _ in range(chunks))


chunk_p = register(
    OpDef(
        "chunk",
        rule=_chunk_rule,
        impl=lambda x, *, chunks, axis: tuple(jnp.split(x, chunks, axis=axis % x.ndim)),
        multiple_results=True,
    )
)


@front(chunk_p)
def chunk(x, chunks, axis=0):
    """Split ``x`` into ``chunks`` equal pieces along ``axis``.

    ``chunks`` must evenly divide the dim (MAX's rule; the doc example that
    splits 5 elements into 2 chunks contradicts it and raises here).

    Raises:
        ValueError: ``chunks`` does not divide ``x.shape[axis]``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> a, b = ops.chunk(Tensor([1.0, 2.0, 3.0, 4.0]), 2, axis=0)
        >>> a
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [1.0, 2.0]
        >>> b
        TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [3.0, 4.0]
    """
    if isinstance(chunks, bool) or not hasattr(chunks, "__index__"):
        raise TypeError(f"chunk: chunks must be an int, got {type(chunks).__name__} {chunks!r}")
    return list(bind(chunk_p, x, chunks=int(chunks), axis=axis))


# ─── tile / repeat_interleave ─────────────────────────────────────────────


def _tile_rule(x, *, repeats: tuple[Dim, ...]) -> TensorType:
    x = R.require_tensor("tile", x)
    if len(repeats) != x.rank:
        raise R.OpError(f"tile: repeats {format_shape(repeats)} must have one entry per dim of {R.fmt(x)}")
    if any(isinstance(r, StaticDim) and r.dim < 1 for r in repeats):
        # MAX: each repeat is at least 1.
        raise R.OpError(f"tile: repeats must be positive, got {format_shape(repeats)}")
    return TensorType(x.dtype, [d * r for d, r in zip(x.shape, repeats)], x.device)


tile_p = register(OpDef("tile", rule=_tile_rule, impl=lambda x, *, repeats: jnp.tile(x, repeats)))


@front(tile_p)
def tile(x, repeats):
    """Repeat the whole tensor ``repeats[i]`` times along each dim ``i``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.tile(Tensor([[1.0, 2.0]]), [2, 3])  # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(2), Dim(6)], device=cpu:0):
        [1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    """
    return bind(tile_p, x, repeats=_as_dims("tile", repeats, "repeats"))


def _repeat_interleave_rule(x, *rep, repeats: int | None, axis: int | None, out_dim: Dim | None) -> TensorType:
    x = R.require_tensor("repeat_interleave", x)
    if axis is None:
        base, ax = [_prod(x.shape)], 0
    else:
        R.require_rank("repeat_interleave", x, lambda r: r >= 1, ">= 1")
        base, ax = list(x.shape), R.normalize_axis("repeat_interleave", axis, x.rank)
    shape = list(base)
    if not rep:
        if repeats is None or repeats <= 0:
            raise R.OpError(f"repeat_interleave: repeats must be positive, got {repeats}")
        shape[ax] = base[ax] * repeats
        if out_dim is not None and out_dim != shape[ax]:
            raise R.OpError(f"repeat_interleave: out_dim {out_dim} does not match the output size {shape[ax]}")
        return TensorType(x.dtype, shape, x.device)
    r = R.require_tensor("repeat_interleave", rep[0], "repeats")
    R.require_dtype("repeat_interleave", r, R.is_int, "an integer", "repeats")
    R.require_rank("repeat_interleave", r, lambda k: k <= 1, "0 or 1", "repeats")
    if r.rank == 1 and r.shape[0] != 1 and r.shape[0] != base[ax]:
        raise R.OpError(
            f"repeat_interleave: repeats {R.fmt(r)} must have 1 or {base[ax]} entries (dim {axis} of input {R.fmt(x)})"
        )
    if out_dim is None:
        raise R.OpError("repeat_interleave: tensor-valued repeats need out_dim (the size of the repeated axis)")
    # A DataDim is a new symbol, sized by sum(repeats) when the op runs (as MAX's out_dim).
    shape[ax] = out_dim.dim if isinstance(out_dim, DataDim) else out_dim
    return TensorType(x.dtype, shape, x.device)


def _repeat_interleave_impl(x, *rep, repeats, axis, out_dim):
    if rep and isinstance(out_dim, DataDim):
        if isinstance(x, jax.core.Tracer) or isinstance(rep[0], jax.core.Tracer):
            raise ValueError(
                f"repeat_interleave: under jax.jit/vmap sum(repeats) is unknown, so out_dim {out_dim} cannot be sized; "
                "pass a static int out_dim, or one made of input dims"
            )
        return jnp.repeat(x, rep[0], axis=axis)
    if rep:
        # total_repeat_length keeps the output size static (jit-able); it must equal sum(repeats).
        return jnp.repeat(x, rep[0], axis=axis, total_repeat_length=out_dim)
    return jnp.repeat(x, repeats, axis=axis)


repeat_interleave_p = register(
    OpDef(
        "repeat_interleave",
        rule=_repeat_interleave_rule,
        impl=_repeat_interleave_impl,
        data_dependent=lambda params: isinstance(params.get("out_dim"), DataDim),
    )
)


@front(repeat_interleave_p)
def repeat_interleave(x, repeats, axis=None, out_dim=None):
    """Repeat each element ``repeats`` times along ``axis`` (``torch.repeat_interleave``).

    Args:
        x: input tensor.
        repeats: a positive int, or a 1-D integer tensor (or list) with one count
            per element along ``axis``.
        axis: the axis to repeat along; None flattens ``x`` first.
        out_dim: size of the repeated axis; required for tensor-valued
            ``repeats`` (it must equal their sum). A new symbolic name (as in
            MAX) is sized by ``sum(repeats)`` when the graph runs; the graph
            then runs op by op, and not under ``jax.jit``. Lists of ints are
            summed for you.

    Raises:
        ValueError: non-positive ``repeats``, bad ``axis``, or tensor repeats without ``out_dim``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> ops.repeat_interleave(x, 2, axis=0)
        TensorType(dtype=float32, shape=[Dim(4), Dim(2)], device=cpu:0): [1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]
        >>> ops.repeat_interleave(x, 2, axis=1)
        TensorType(dtype=float32, shape=[Dim(2), Dim(4)], device=cpu:0): [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
        >>> ops.repeat_interleave(x, [2, 3], axis=0)  # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(5), Dim(2)], device=cpu:0):
        [1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0, 3.0, 4.0]
        >>> ops.repeat_interleave(x, 2)  # axis=None flattens first
        TensorType(dtype=float32, shape=[Dim(8)], device=cpu:0): [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]
    """
    if axis is not None and (isinstance(axis, bool) or not hasattr(axis, "__index__")):
        raise TypeError(f"repeat_interleave: axis must be an int or None, got {type(axis).__name__} {axis!r}")
    axis = None if axis is None else int(axis)
    out = None if out_dim is None else Dim(out_dim)
    if isinstance(repeats, (bool, np.bool_)):
        raise TypeError("repeat_interleave: repeats must be an int or an integer tensor, got bool")
    if hasattr(repeats, "__index__") and not _is_tensor_value(repeats):
        n = int(repeats)
        if n <= 0:
            raise ValueError(f"repeat_interleave: repeats must be positive, got {n}")
        return bind(repeat_interleave_p, x, repeats=n, axis=axis, out_dim=out)
    if isinstance(repeats, (list, tuple, np.ndarray)):
        counts = np.asarray(repeats)
        if counts.ndim > 1 or (counts.size and counts.dtype.kind not in "iu"):
            raise TypeError(f"repeat_interleave: repeats must be an int or a 1-D list of ints, got {repeats!r}")
        if (counts < 0).any():
            raise ValueError(f"repeat_interleave: repeats must be non-negative, got {counts.tolist()}")
        if counts.size == 1:
            return repeat_interleave(x, int(counts.reshape(())), axis, out_dim)
        total = int(counts.sum())
        if out is not None and out != total:
            raise ValueError(f"repeat_interleave: out_dim {out} differs from sum(repeats) = {total}")
        return bind(repeat_interleave_p, x, counts.astype(np.int64), repeats=None, axis=axis, out_dim=StaticDim(total))
    if not _is_tensor_value(repeats):
        raise TypeError(f"repeat_interleave: repeats must be an int or an integer tensor, got {type(repeats).__name__}")
    if out is None:
        raise ValueError("repeat_interleave: tensor-valued repeats need out_dim (the size of the repeated axis)")
    input_dims = {
        p.name for v in (x, repeats) for d in getattr(getattr(v, "type", None), "shape", ()) for p in d.parameters
    }
    if any(p.name not in input_dims for p in out.parameters):
        # A symbol no input carries: the output's size comes from the values of repeats.
        out = DataDim(out)
    return bind(repeat_interleave_p, x, repeats, repeats=None, axis=axis, out_dim=out)


# ─── pad / band_part / as_interleaved_complex ─────────────────────────────


_PAD_MODES = ("constant", "reflect", "edge")


def _pad_rule(x, value, *, paddings: tuple[int, ...], mode: str = "constant") -> TensorType:
    x = R.require_tensor("pad", x)
    v = R.require_tensor("pad", value, "value")
    R.require_rank("pad", v, lambda r: r == 0, "0 (a scalar)", "value")
    if len(paddings) != 2 * x.rank:
        raise R.OpError(
            f"pad: paddings must have 2 * rank = {2 * x.rank} values [before0, after0, ...] for {R.fmt(x)}, got "
            f"{list(paddings)}"
        )
    if any(p < 0 for p in paddings):
        raise R.OpError(f"pad: paddings must be non-negative, got {list(paddings)}")
    shape = [d + paddings[2 * i] + paddings[2 * i + 1] for i, d in enumerate(x.shape)]
    return TensorType(x.dtype, shape, x.device)


def _pad_impl(x, value, *, paddings, mode="constant"):
    if mode != "constant":
        # numpy's modes: "reflect" mirrors without repeating the edge, "edge" repeats it.
        return jnp.pad(x, [(paddings[2 * i], paddings[2 * i + 1]) for i in range(x.ndim)], mode=mode)
    config = [(paddings[2 * i], paddings[2 * i + 1], 0) for i in range(x.ndim)]
    return jax.lax.pad(x, value.astype(x.dtype), config)


pad_p = register(OpDef("pad", rule=_pad_rule, impl=_pad_impl, promote=(0, 1)))


@front(pad_p)
def pad(input, paddings, mode="constant", value=0):
    """Pad a tensor: ``paddings = [before0, after0, before1, after1, ...]``.

    Args:
        input: the tensor to pad.
        paddings: 2 * rank non-negative ints.
        mode: ``"constant"`` fills with ``value``; ``"reflect"`` mirrors the
            input without repeating its edge (``[1, 2, 3]`` padded by 2 before:
            ``[3, 2, 1, 2, 3]``); ``"edge"`` repeats the edge value.
        value: the fill value of ``"constant"`` (a scalar; must fit the input's dtype).

    Raises:
        ValueError: another mode, negative paddings, or the wrong number of paddings.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> # rows: 1 before; cols: 2 after
        >>> ops.pad(Tensor([[1.0, 2.0], [3.0, 4.0]]), [1, 0, 0, 2], value=9.0)  # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(3), Dim(4)], device=cpu:0):
        [9.0, 9.0, 9.0, 9.0, 1.0, 2.0, 9.0, 9.0, 3.0, 4.0, 9.0, 9.0]
        >>> ops.pad(Tensor([1.0, 2.0, 3.0]), [2, 1], mode="reflect")
        TensorType(dtype=float32, shape=[Dim(6)], device=cpu:0): [3.0, 2.0, 1.0, 2.0, 3.0, 2.0]
        >>> ops.pad(Tensor([1.0, 2.0, 3.0]), [2, 1], mode="edge")
        TensorType(dtype=float32, shape=[Dim(6)], device=cpu:0): [1.0, 1.0, 1.0, 2.0, 3.0, 3.0]
    """
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: unsupported padding mode {mode!r}; expected one of {', '.join(map(repr, _PAD_MODES))}")
    params = {"paddings": _as_ints("pad", paddings, "paddings")}
    if mode != "constant":
        params["mode"] = mode
    return bind(pad_p, input, value, **params)


def _band_part_rule(x, *, num_lower: int | None, num_upper: int | None, exclude: bool) -> TensorType:
    x = R.require_tensor("band_part", x)
    if x.rank < 2:
        raise R.OpError(
            f"band_part: input must have at least 2 dimensions (the last two are the matrix), got {R.fmt(x)}"
        )
    for name, v, d in (("num_lower", num_lower, x.shape[-2]), ("num_upper", num_upper, x.shape[-1])):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"band_part: {name} must be an int or None, got {type(v).__name__} {v!r}")
        if v < 0:
            raise R.OpError(f"band_part: {name} must be non-negative (or None, or -1 meaning None), got {v}")
        if isinstance(d, StaticDim) and v >= d.dim:
            raise R.OpError(
                f"band_part: {name}={v} is out of bounds for {R.fmt(x)} (expected 0 <= {name} < {d}, or None)"
            )
    return x


def _band_part_impl(x, *, num_lower, num_upper, exclude):
    m = jax.lax.broadcasted_iota(jnp.int64, x.shape[-2:], 0)
    n = jax.lax.broadcasted_iota(jnp.int64, x.shape[-2:], 1)
    keep = jnp.ones(x.shape[-2:], jnp.bool_)
    if num_lower is not None:
        keep = keep & (m - n <= num_lower)
    if num_upper is not None:
        keep = keep & (n - m <= num_upper)
    if exclude:
        keep = ~keep
    return jnp.where(keep, x, jnp.zeros((), x.dtype))


band_part_p = register(OpDef("band_part", rule=_band_part_rule, impl=_band_part_impl))


@front(band_part_p)
def band_part(x, num_lower=None, num_upper=None, exclude=False):
    """Zero everything outside a diagonal band of the last two dims.

    Keeps ``x[..., m, n]`` where ``(num_lower is None or m - n <= num_lower)`` and
    ``(num_upper is None or n - m <= num_upper)``; ``exclude=True`` zeroes the
    band instead. A bound of -1 means None, as in MAX.

    Raises:
        ValueError: rank < 2, a bound below -1, or a bound not smaller than its static dim.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ones = Tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
        >>> ops.band_part(ones, num_lower=None, num_upper=0)  # lower triangle: a causal mask
        TensorType(dtype=float32, shape=[Dim(3), Dim(3)], device=cpu:0): [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
        >>> ops.band_part(ones, num_lower=0, num_upper=0)  # the diagonal
        TensorType(dtype=float32, shape=[Dim(3), Dim(3)], device=cpu:0): [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    """
    # MAX: -1 is a historical spelling of None (no bound).
    num_lower, num_upper = (
        None if v is not None and _opt_int(v) == -1 else _opt_int(v) for v in (num_lower, num_upper)
    )
    return bind(band_part_p, x, num_lower=num_lower, num_upper=num_upper, exclude=bool(exclude))


def _interleaved_rule(x) -> TensorType:
    x = R.require_tensor("as_interleaved_complex", x)
    R.require_rank("as_interleaved_complex", x, lambda r: r >= 1, ">= 1")
    last = x.shape[-1]
    half = _exact_div(last, StaticDim(2))
    if half is None and not isinstance(last, StaticDim):
        # MAX: a TypeError for a symbolic last dim (maxfx also takes one that is provably even, like 2 * n).
        raise TypeError(
            f"as_interleaved_complex: the last dim of {R.fmt(x)} must be static or provably even (pairs of real, "
            f"imag), got {last}"
        )
    if half is None:
        raise R.OpError(
            f"as_interleaved_complex: the last dim of {R.fmt(x)} must be divisible by 2 (pairs of real, imag)"
        )
    return TensorType(x.dtype, list(x.shape[:-1]) + [half, StaticDim(2)], x.device)


as_interleaved_complex_p = register(
    OpDef(
        "as_interleaved_complex",
        rule=_interleaved_rule,
        impl=lambda x: jnp.reshape(x, x.shape[:-1] + (x.shape[-1] // 2, 2)),
    )
)


@front(as_interleaved_complex_p)
def as_interleaved_complex(x):
    """View alternating (real, imag) values as complex pairs: ``[..., n]`` → ``[..., n/2, 2]``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.as_interleaved_complex(Tensor([[1.0, 2.0, 3.0, 4.0]]))  # [1, 4] -> [1, 2, 2]
        TensorType(dtype=float32, shape=[Dim(1), Dim(2), Dim(2)], device=cpu:0): [1.0, 2.0, 3.0, 4.0]
    """
    return bind(as_interleaved_complex_p, x)


# ─── shape_to_tensor ──────────────────────────────────────────────────────


def _shape_to_tensor_rule(*, shape: tuple[Dim, ...], device: DeviceRef) -> TensorType:
    return TensorType(DType.int64, [len(shape)], device)


shape_to_tensor_p = register(
    OpDef(
        "shape_to_tensor",
        rule=_shape_to_tensor_rule,
        impl=lambda *, shape, device: jnp.asarray(shape, dtype=jnp.int64).reshape((len(shape),)),
        differentiable=False,
    )
)


@front(shape_to_tensor_p)
def shape_to_tensor(shape):
    """The dims of ``shape`` as a 1-D int64 tensor.

    Static shapes become a constant; symbolic dims are read when the graph runs.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> import numpy as np
        >>> from maxfx.engine import InferenceSession
        >>> from maxfx.graph import Graph, TensorType
        >>> from maxfx.dtype import DType
        >>> with Graph("g", input_types=[TensorType(DType.float32, ["batch", 3])]) as g:
        ...     g.output(ops.shape_to_tensor(g.inputs[0].shape))
        >>> model = InferenceSession().load(g)
        >>> model.execute(np.zeros((5, 3), np.float32))[0].to_numpy()  # batch is read at run time
        array([5, 3])
    """
    if isinstance(shape, str):
        # MAX reads a string as a sequence of one-letter dims and rejects it as a ValueError.
        raise ValueError(
            f"shape_to_tensor: shape must be a list of dims (ints, strings or Dims), got the string {shape!r}"
        )
    dims = _as_dims("shape_to_tensor", shape)
    if _all_static(dims):
        return constant(np.asarray([d.dim for d in dims], dtype=np.int64).reshape((len(dims),)), DType.int64)
    device = getattr(current_context(), "default_device", None) or DeviceRef.CPU()
    return bind(shape_to_tensor_p, shape=dims, device=device)
