"""Reductions, scans and normalisations: argmax/argmin, sum/mean, max/min, cumsum,
softmax/logsoftmax, top_k, argsort, layer_norm.

Reductions accept every dtype, bool included (MAX's graph does): bool inputs
reduce as the integers 0/1 and the result is cast back to bool (nonzero is
True), so ``sum`` is "any", ``prod`` "all" and ``mean`` (the floor of the
integer mean, as for ints) "all". Reducing an axis of size 0 builds (MAX does
not check it) and fails when run for ``max``/``min``/``argmax``/``argmin``,
which have no value for an empty axis.

Every axis reduction KEEPS the reduced axis with size 1 (MAX semantics,
API_INVENTORY §3.2): ``[2, 3]`` reduced over ``axis=1`` is ``[2, 1]``. Negative
axes count from the end. Index results (argmax, argmin, argsort, top_k indices)
are int64.

``max``/``min`` have one front each, MAX's overload ``max(x, y=None, /, axis=None)``:
with two operands it is the elementwise ``maximum`` op (MAX dtype promotion,
broadcasting), with one it is the ``reduce_max`` reduction (``axis=None`` means -1).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from lowering.context import bind
from lowering.dims import StaticDim
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.registry import OpDef, front, register
from lowering.types import TensorType

__all__ = [
    "argmax",
    "argmin",
    "mean",
    "prod",
    "sum_",
    "max_",
    "min_",
    "cumsum",
    "softmax",
    "logsoftmax",
    "top_k",
    "argsort",
    "layer_norm",
]


# ─── helpers ──────────────────────────────────────────────────────────────


def _any_dtype(d: DType) -> bool:
    return True


def _reduce_rule(name: str, *, out_dtype: DType | None = None):
    """Rule of a keepdim reduction along one ``axis`` (any dtype)."""

    def rule(x, *, axis: int) -> TensorType:
        x = R.require_tensor(name, x)
        R.require_rank(name, x, lambda r: r >= 1, ">= 1 (a rank-0 tensor has no axis to reduce)")
        ax = R.normalize_axis(name, axis, x.rank)
        shape = list(x.shape)
        shape[ax] = StaticDim(1)
        return TensorType(out_dtype or x.dtype, shape, x.device)

    return rule


def _nonempty(name: str, impl):
    """``impl`` refusing an empty reduced axis (no maximum/minimum/index exists), when the op runs."""

    def run(x, *, axis: int):
        if x.shape[axis % x.ndim] == 0:
            raise ValueError(f"{name}: cannot reduce the empty axis {axis} of a tensor of shape {list(x.shape)}")
        return impl(x, axis=axis)

    return run


def _bool_as_int(impl, work=jnp.int64):
    """``impl`` on a bool input computed on 0/1 integers of ``work``, cast back to bool (nonzero is True)."""

    def run(x, **params):
        if x.dtype == jnp.bool_:
            return impl(x.astype(work), **params) != 0
        return impl(x, **params)

    return run


def _axis(x, axis: int) -> int:
    return axis % x.ndim


def _compute_dtype(dtype) -> jnp.dtype:
    """float32 for narrow floats (float16/bfloat16/float8): accumulate precisely, cast back."""
    dt = jnp.dtype(dtype)
    if jnp.issubdtype(dt, jnp.floating) and dt.itemsize < 4:
        return jnp.dtype(jnp.float32)
    return dt


def _check_axis_param(name: str, axis) -> int:
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TypeError(f"{name}: axis must be an int, got {type(axis).__name__} {axis!r}")
    return int(axis)


# ─── argmax / argmin ──────────────────────────────────────────────────────


def _argmax_impl(x, *, axis: int):
    # jnp.argmax returns the first index among equal maxima, as MAX does on CPU.
    return jnp.argmax(x, axis=_axis(x, axis), keepdims=True).astype(jnp.int64)


def _argmin_impl(x, *, axis: int):
    return jnp.argmin(x, axis=_axis(x, axis), keepdims=True).astype(jnp.int64)


argmax_p = register(
    OpDef(
        "argmax",
        rule=_reduce_rule("argmax", out_dtype=DType.int64),
        impl=_nonempty("argmax", _argmax_impl),
        differentiable=False,
    )
)
argmin_p = register(
    OpDef(
        "argmin",
        rule=_reduce_rule("argmin", out_dtype=DType.int64),
        impl=_nonempty("argmin", _argmin_impl),
        differentiable=False,
    )
)


@front(argmax_p)
def argmax(x, axis=-1):
    """Index of the largest value along ``axis`` (int64; the axis is kept with size 1).

    Ties resolve to the first index.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 5.0, 5.0], [7.0, 2.0, 3.0]])
        >>> ops.argmax(x, axis=-1)  # ties pick the first index
        TensorType(dtype=int64, shape=[Dim(2), Dim(1)], device=cpu:0): [1, 0]
    """
    return bind(argmax_p, x, axis=_check_axis_param("argmax", axis))


@front(argmin_p)
def argmin(x, axis=-1):
    """Index of the smallest value along ``axis`` (int64; the axis is kept with size 1).

    Ties resolve to the first index.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 5.0, 5.0], [7.0, 2.0, 3.0]])
        >>> ops.argmin(x, axis=0)
        TensorType(dtype=int64, shape=[Dim(1), Dim(3)], device=cpu:0): [0, 1, 1]
    """
    return bind(argmin_p, x, axis=_check_axis_param("argmin", axis))


# ─── sum / mean ───────────────────────────────────────────────────────────


def _sum_impl(x, *, axis: int):
    return jnp.sum(x, axis=_axis(x, axis), keepdims=True, dtype=x.dtype)


def _mean_impl(x, *, axis: int):
    ax = _axis(x, axis)
    if jnp.issubdtype(x.dtype, jnp.integer):
        # Integer mean stays integral (the result has the input's dtype): floor of sum / n,
        # accumulated in 64 bits so that narrow ints do not wrap around before the division.
        wide = jnp.uint64 if jnp.issubdtype(x.dtype, jnp.unsignedinteger) else jnp.int64
        total = jnp.sum(x, axis=ax, keepdims=True, dtype=wide)
        return (total // jnp.asarray(max(x.shape[ax], 1), wide)).astype(x.dtype)
    ct = _compute_dtype(x.dtype)
    return jnp.mean(x.astype(ct), axis=ax, keepdims=True).astype(x.dtype)


def _prod_impl(x, *, axis: int):
    ct = _compute_dtype(x.dtype)
    return jnp.prod(x.astype(ct), axis=_axis(x, axis), keepdims=True).astype(x.dtype)


sum_p = register(OpDef("sum", rule=_reduce_rule("sum"), impl=_bool_as_int(_sum_impl)))
mean_p = register(OpDef("mean", rule=_reduce_rule("mean"), impl=_bool_as_int(_mean_impl)))
prod_p = register(OpDef("prod", rule=_reduce_rule("prod"), impl=_bool_as_int(_prod_impl)))


@front(sum_p, name="sum")
def sum_(x, axis=-1):
    """Sum along ``axis``; the axis is kept with size 1 and the dtype is unchanged.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        >>> ops.sum(x, axis=1)
        TensorType(dtype=float32, shape=[Dim(2), Dim(1)], device=cpu:0): [6.0, 15.0]
        >>> ops.sum(x, axis=0)
        TensorType(dtype=float32, shape=[Dim(1), Dim(3)], device=cpu:0): [5.0, 7.0, 9.0]
    """
    return bind(sum_p, x, axis=_check_axis_param("sum", axis))


@front(mean_p)
def mean(x, axis=-1):
    """Mean along ``axis``; the axis is kept with size 1 and the dtype is unchanged.

    Integer inputs give the floor of the exact mean.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> ops.mean(Tensor([[1.0, 2.0], [3.0, 5.0]]))
        TensorType(dtype=float32, shape=[Dim(2), Dim(1)], device=cpu:0): [1.5, 4.0]
        >>> ops.mean(Tensor([1, 2], dtype=DType.int32))  # floor of 1.5
        TensorType(dtype=int32, shape=[Dim(1)], device=cpu:0): [1]
    """
    return bind(mean_p, x, axis=_check_axis_param("mean", axis))


@front(prod_p)
def prod(x, axis=-1):
    """Product along ``axis``; the axis is kept with size 1 and the dtype is unchanged.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        >>> ops.prod(x, axis=1)
        TensorType(dtype=float32, shape=[Dim(2), Dim(1)], device=cpu:0): [6.0, 120.0]
        >>> ops.prod(Tensor([[True, False], [True, True]]))  # bool: "all"
        TensorType(dtype=bool, shape=[Dim(2), Dim(1)], device=cpu:0): [False, True]
    """
    return bind(prod_p, x, axis=_check_axis_param("prod", axis))


# ─── max / min (elementwise and reducing) ─────────────────────────────────


maximum_p = register(OpDef("maximum", rule=R.elementwise("max"), impl=jnp.maximum, promote=(0, 1)))
minimum_p = register(OpDef("minimum", rule=R.elementwise("min"), impl=jnp.minimum, promote=(0, 1)))
reduce_max_p = register(
    OpDef(
        "reduce_max",
        rule=_reduce_rule("max"),
        impl=_nonempty("max", lambda x, *, axis: jnp.max(x, axis=_axis(x, axis), keepdims=True)),
    )
)
reduce_min_p = register(
    OpDef(
        "reduce_min",
        rule=_reduce_rule("min"),
        impl=_nonempty("min", lambda x, *, axis: jnp.min(x, axis=_axis(x, axis), keepdims=True)),
    )
)


@front(maximum_p, reduce_max_p, name="max")
def max_(x, y=None, /, axis=None):
    """Elementwise maximum of ``x`` and ``y``, or the maximum of ``x`` along ``axis``.

    With two operands the operands broadcast and promote like ``add`` (giving
    ``axis`` too is a ValueError). With one operand the reduction keeps ``axis`` with size 1
    (``axis=None`` reduces the last axis).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 5.0, 2.0], [4.0, 0.0, 6.0]])
        >>> ops.max(x, Tensor([3.0, 3.0, 3.0]))  # elementwise, broadcasting
        TensorType(dtype=float32, shape=[Dim(2), Dim(3)], device=cpu:0): [3.0, 5.0, 3.0, 4.0, 3.0, 6.0]
        >>> ops.max(x, axis=0)
        TensorType(dtype=float32, shape=[Dim(1), Dim(3)], device=cpu:0): [4.0, 5.0, 6.0]
        >>> ops.max(x)  # the last axis
        TensorType(dtype=float32, shape=[Dim(2), Dim(1)], device=cpu:0): [5.0, 6.0]
    """
    if y is not None:
        if axis is not None:
            raise ValueError(
                f"max: pass either y (elementwise maximum) or axis (reduction), not both; got axis={axis!r}"
            )
        return bind(maximum_p, x, y)
    return bind(reduce_max_p, x, axis=-1 if axis is None else _check_axis_param("max", axis))


@front(minimum_p, reduce_min_p, name="min")
def min_(x, y=None, /, axis=None):
    """Elementwise minimum of ``x`` and ``y``, or the minimum of ``x`` along ``axis``.

    Mirror of `max`: two operands → elementwise (``axis`` must be None); one operand →
    reduction keeping ``axis`` with size 1 (``axis=None`` reduces the last axis).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, -5.0, 2.0], [4.0, 0.0, -6.0]])
        >>> ops.min(x, 0.0)  # elementwise with a scalar
        TensorType(dtype=float32, shape=[Dim(2), Dim(3)], device=cpu:0): [0.0, -5.0, 0.0, 0.0, 0.0, -6.0]
        >>> ops.min(x)  # the last axis
        TensorType(dtype=float32, shape=[Dim(2), Dim(1)], device=cpu:0): [-5.0, -6.0]
    """
    if y is not None:
        if axis is not None:
            raise ValueError(
                f"min: pass either y (elementwise minimum) or axis (reduction), not both; got axis={axis!r}"
            )
        return bind(minimum_p, x, y)
    return bind(reduce_min_p, x, axis=-1 if axis is None else _check_axis_param("min", axis))


# ─── cumsum ───────────────────────────────────────────────────────────────


def _cumsum_rule(x, *, axis: int, exclusive: bool, reverse: bool) -> TensorType:
    x = R.require_tensor("cumsum", x)
    R.require_rank("cumsum", x, lambda r: r >= 1, ">= 1")
    R.normalize_axis("cumsum", axis, x.rank)
    return x


def _cumsum_impl(x, *, axis: int, exclusive: bool, reverse: bool):
    ax = _axis(x, axis)
    ct = _compute_dtype(x.dtype)
    out = jax.lax.cumsum(x.astype(ct), axis=ax, reverse=reverse)
    n = x.shape[ax]
    if exclusive and n > 0:
        # Shift by one element: the first (last, if reversed) value becomes 0 and the total drops out.
        zeros = jnp.zeros_like(jax.lax.slice_in_dim(out, 0, 1, axis=ax))
        if reverse:
            out = jnp.concatenate([jax.lax.slice_in_dim(out, 1, n, axis=ax), zeros], axis=ax)
        else:
            out = jnp.concatenate([zeros, jax.lax.slice_in_dim(out, 0, n - 1, axis=ax)], axis=ax)
    return out.astype(x.dtype)


cumsum_p = register(OpDef("cumsum", rule=_cumsum_rule, impl=_bool_as_int(_cumsum_impl)))


@front(cumsum_p)
def cumsum(x, axis=-1, exclusive=False, reverse=False):
    """Cumulative sum along ``axis`` (same shape and dtype as ``x``; on bool, a cumulative "any").

    Args:
        x: input tensor.
        axis: the axis to accumulate along (negative counts from the end).
        exclusive: start at 0 and leave out the current element.
        reverse: accumulate from the back of the axis to the front.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([1.0, 2.0, 3.0])
        >>> ops.cumsum(x)
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [1.0, 3.0, 6.0]
        >>> ops.cumsum(x, exclusive=True)
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [0.0, 1.0, 3.0]
        >>> ops.cumsum(x, reverse=True)
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [6.0, 5.0, 3.0]
    """
    return bind(cumsum_p, x, axis=_check_axis_param("cumsum", axis), exclusive=bool(exclusive), reverse=bool(reverse))


# ─── softmax / logsoftmax ─────────────────────────────────────────────────


def _softmax_rule(name: str):
    def rule(x, *, axis: int) -> TensorType:
        x = R.require_tensor(name, x)
        R.require_dtype(name, x, R.is_float, "a floating-point")
        R.require_rank(name, x, lambda r: r >= 1, ">= 1")
        R.normalize_axis(name, axis, x.rank)
        return x

    return rule


def _softmax_impl(x, *, axis: int):
    return jax.nn.softmax(x.astype(_compute_dtype(x.dtype)), axis=_axis(x, axis)).astype(x.dtype)


def _logsoftmax_impl(x, *, axis: int):
    return jax.nn.log_softmax(x.astype(_compute_dtype(x.dtype)), axis=_axis(x, axis)).astype(x.dtype)


softmax_p = register(OpDef("softmax", rule=_softmax_rule("softmax"), impl=_softmax_impl))
logsoftmax_p = register(OpDef("logsoftmax", rule=_softmax_rule("logsoftmax"), impl=_logsoftmax_impl))


@front(softmax_p)
def softmax(value, axis=-1):
    """Softmax along ``axis``: ``exp(x - max) / sum(exp(x - max))``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.softmax(Tensor([[0.0, 1.0, 2.0], [5.0, 5.0, 5.0]]))  # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(2), Dim(3)], device=cpu:0):
        [0.0900..., 0.2447..., 0.6652..., 0.3333..., 0.3333..., 0.3333...]
    """
    return bind(softmax_p, value, axis=_check_axis_param("softmax", axis))


@front(logsoftmax_p)
def logsoftmax(value, axis=-1):
    """Log of the softmax along ``axis``, computed stably (``x - logsumexp(x)``).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.logsoftmax(Tensor([0.0, 0.0, 0.0, 0.0]))  # log(1/4)
        TensorType(dtype=float32, shape=[Dim(4)], device=cpu:0): [-1.3862..., -1.3862..., -1.3862..., -1.3862...]
    """
    return bind(logsoftmax_p, value, axis=_check_axis_param("logsoftmax", axis))


# ─── top_k / argsort ──────────────────────────────────────────────────────


def _top_k_rule(x, *, k: int, axis: int) -> tuple[TensorType, TensorType]:
    x = R.require_tensor("top_k", x)
    R.require_dtype("top_k", x, R.is_numeric, "numeric (not bool)")
    R.require_rank("top_k", x, lambda r: r >= 1, ">= 1")
    if not -x.rank <= axis < x.rank:  # MAX's wording
        raise R.AxisError(f"top_k: axis ({axis}) out of bound for {R.fmt(x)} (rank {x.rank})")
    ax = R.normalize_axis("top_k", axis, x.rank)
    d = x.shape[ax]
    if k < 0:
        raise R.OpError(f"top_k: k must be non-negative, got k={k}")
    if isinstance(d, StaticDim) and k > d.dim:
        raise R.OpError(f"top_k: k ({k}) cannot be larger than dimension size along axis {ax} ({d.dim}) of {R.fmt(x)}")
    shape = list(x.shape)
    shape[ax] = StaticDim(k)
    return TensorType(x.dtype, shape, x.device), TensorType(DType.int64, shape, x.device)


def _top_k_impl(x, *, k: int, axis: int):
    ax = _axis(x, axis)
    xt = jnp.moveaxis(x, ax, -1)
    if k > xt.shape[-1]:
        raise ValueError(f"top_k: k={k} is larger than dim {axis} (size {xt.shape[-1]})")
    values, indices = jax.lax.top_k(xt, k)
    return jnp.moveaxis(values, -1, ax), jnp.moveaxis(indices.astype(jnp.int64), -1, ax)


top_k_p = register(OpDef("top_k", rule=_top_k_rule, impl=_top_k_impl, multiple_results=True))


@front(top_k_p)
def top_k(input, k, axis=-1):
    """The ``k`` largest values along ``axis`` (descending) and their int64 indices.

    Equal values keep their original order (lower index first).

    Returns:
        ``(values, indices)``, each the shape of ``input`` with ``k`` along ``axis``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> values, indices = ops.top_k(Tensor([3.0, 1.0, 4.0, 1.0, 5.0]), 3)
        >>> values
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [5.0, 4.0, 3.0]
        >>> indices
        TensorType(dtype=int64, shape=[Dim(3)], device=cpu:0): [4, 2, 0]
    """
    if isinstance(k, bool) or not hasattr(k, "__index__"):
        raise TypeError(f"top_k: k must be an int, got {type(k).__name__} {k!r}")
    return bind(top_k_p, input, k=int(k), axis=_check_axis_param("top_k", axis))


def _argsort_rule(x, *, ascending: bool) -> TensorType:
    x = R.require_tensor("argsort", x)  # any dtype, bool included (False before True), as in MAX
    if x.rank != 1:  # MAX's wording
        raise R.OpError(f"argsort only implemented for input tensors of rank 1, got {R.fmt(x)}")
    return TensorType(DType.int64, x.shape, x.device)


def _argsort_impl(x, *, ascending: bool):
    return jnp.argsort(x, axis=0, stable=True, descending=not ascending).astype(jnp.int64)


argsort_p = register(OpDef("argsort", rule=_argsort_rule, impl=_argsort_impl, differentiable=False))


@front(argsort_p)
def argsort(x, ascending=True):
    """Indices (int64) that sort the rank-1 tensor ``x``; ties keep their order.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.argsort(Tensor([0.3, 0.1, 0.2]))
        TensorType(dtype=int64, shape=[Dim(3)], device=cpu:0): [1, 2, 0]
        >>> ops.argsort(Tensor([0.3, 0.1, 0.2]), ascending=False)
        TensorType(dtype=int64, shape=[Dim(3)], device=cpu:0): [0, 2, 1]
    """
    return bind(argsort_p, x, ascending=bool(ascending))


# ─── layer_norm ───────────────────────────────────────────────────────────


def _layer_norm_rule(x, gamma, beta, *, epsilon: float) -> TensorType:
    x = R.require_tensor("layer_norm", x)
    gamma = R.require_tensor("layer_norm", gamma, "gamma")
    beta = R.require_tensor("layer_norm", beta, "beta")
    R.require_dtype("layer_norm", x, R.is_float, "a floating-point")
    R.require_rank("layer_norm", x, lambda r: r >= 1, ">= 1")
    R.input_device(x, gamma, beta)
    last = x.shape[-1]
    for what, t in (("gamma", gamma), ("beta", beta)):
        if t.rank != 1 or t.shape[0] != last:
            raise R.OpError(
                f"layer_norm: {what} shape {list(t.shape)} does not match dimension of reduction [{last}] (the last "
                f"dim of input {R.fmt(x)})"
            )
    return x


def _layer_norm_impl(x, gamma, beta, *, epsilon: float):
    ct = _compute_dtype(x.dtype)
    xc = x.astype(ct)
    mu = jnp.mean(xc, axis=-1, keepdims=True)
    centered = xc - mu
    var = jnp.mean(centered * centered, axis=-1, keepdims=True)
    out = centered * jax.lax.rsqrt(var + jnp.asarray(epsilon, ct)) * gamma.astype(ct) + beta.astype(ct)
    return out.astype(x.dtype)


layer_norm_p = register(OpDef("layer_norm", rule=_layer_norm_rule, impl=_layer_norm_impl, promote=(0, 1, 2)))


@front(layer_norm_p)
def layer_norm(input, gamma, beta, epsilon):
    """Layer normalization over the last dimension: ``(x - mean) / sqrt(var + epsilon) * gamma + beta``.

    Args:
        input: floating-point tensor ``[..., d]``.
        gamma: scale, shape ``[d]``.
        beta: offset, shape ``[d]``.
        epsilon: positive constant added to the (population) variance.

    Raises:
        ValueError: gamma or beta is not of size ``d``, or ``epsilon <= 0``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 3.0]])
        >>> gamma = Tensor([1.0, 1.0, 2.0])
        >>> beta = Tensor([0.0, 0.0, 0.5])
        >>> ops.layer_norm(x, gamma, beta, epsilon=1e-5)  # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(2), Dim(3)], device=cpu:0):
        [-1.2247..., 0.0, 2.9494..., -0.7071..., -0.7071..., 3.3284...]
    """
    return bind(layer_norm_p, input, gamma, beta, epsilon=check_epsilon("layer_norm", epsilon))


def check_epsilon(op: str, epsilon: Any) -> float:
    """``epsilon`` as a positive float (the normalisations' variance offset); TypeError/ValueError naming ``op``
    otherwise.
    """
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: epsilon must be a number, got {type(epsilon).__name__} {epsilon!r}") from None
    if not eps > 0:
        raise ValueError(f"{op}: epsilon must be positive, got {epsilon!r}")
    return eps
