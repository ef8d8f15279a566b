"""Creation ops: ``range``, ``hann_window``, ``constant_external``.

(``constant`` lives in ``lowering/ops/core.py``: every context needs it.)
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import jax.numpy as jnp

from lowering.context import bind, current_context, type_of
from lowering.dims import Dim
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.ops.core import constant, weight_p
from lowering.registry import OpDef, front, register
from lowering.types import DeviceRef, TensorType

__all__ = ["range", "hann_window", "constant_external"]


# ─── range ───────────────────────────────────────────────────────────────


def _range_rule(*bounds: TensorType, static: tuple | None, out_dim: Dim, dtype: DType, device: DeviceRef) -> TensorType:
    for b in bounds:
        if b.dtype is not dtype or b.rank != 0:
            raise R.OpError(f"range: start, stop and step must be scalars of dtype {dtype.name}, got {R.fmt(b)}")
    return TensorType(dtype, [out_dim], device)


def _range_impl(*bounds, static, out_dim, dtype, device):
    if static is not None:
        start, _, step = static
        return (start + step * jnp.arange(out_dim)).astype(dtype.to_numpy())
    start, _, step = bounds
    return (start + step * jnp.arange(out_dim, dtype=start.dtype)).astype(dtype.to_numpy())


range_p = register(OpDef("range", rule=_range_rule, impl=_range_impl, differentiable=False))


@front(range_p)
def range(start, stop, step=1, out_dim=None, *, dtype, device):  # noqa: A001 - MAX's name
    """Values ``start, start + step, ...`` below ``stop`` (above it for a negative step).

    Python numbers give a static length; tensor bounds need ``out_dim`` (the
    length, checked against nothing at run time).

    Raises:
        ValueError: ``step`` is 0, or its sign does not lead from start to stop.

    Example:
        >>> idx = ops.range(0, 10, 2, dtype=DType.int64, device=DeviceRef.CPU())  # doctest: +SKIP
    """
    if not isinstance(dtype, DType):
        raise TypeError(f"range: dtype must be a DType, got {type(dtype).__name__}")
    device = DeviceRef.from_device(device)
    numbers_only = all(isinstance(v, numbers.Number) for v in (start, stop, step))
    if numbers_only:
        if step == 0:
            raise ValueError("range: step must be non-zero")
        if (stop - start) * step < 0:
            raise ValueError(f"range: step {step} does not lead from {start} to {stop}")
        length = max(0, math.ceil((stop - start) / step))
        if out_dim is not None and Dim(out_dim) != length:
            raise ValueError(f"range: out_dim {out_dim} does not match the length {length} of range({start}, {stop}, {step})")
        return bind(range_p, static=(start, stop, step), out_dim=Dim(length), dtype=dtype, device=device)
    if out_dim is None:
        raise ValueError("range: tensor-valued start/stop/step need out_dim (the result length)")
    ctx = current_context()
    vals = []
    for v in (start, stop, step):
        vals.append(_scalar_constant(v, dtype, device) if type_of(ctx, v) is None else v)
    return bind(range_p, *vals, static=None, out_dim=Dim(out_dim), dtype=dtype, device=device)


def _scalar_constant(v: Any, dtype: DType, device: DeviceRef):
    return constant(v, dtype, device)


# ─── hann_window ─────────────────────────────────────────────────────────


def _hann_rule(*, window_length: int, periodic: bool, dtype: DType, device: DeviceRef) -> TensorType:
    return TensorType(dtype, [window_length], device)


def _hann_impl(*, window_length, periodic, dtype, device):
    n = window_length + 1 if periodic else window_length
    if window_length == 0:
        return jnp.zeros((0,), dtype.to_numpy())
    if n == 1:
        return jnp.ones((1,), dtype.to_numpy())
    k = jnp.arange(window_length, dtype=jnp.float64)
    return (0.5 - 0.5 * jnp.cos(2 * jnp.pi * k / (n - 1))).astype(dtype.to_numpy())


hann_window_p = register(OpDef("hann_window", rule=_hann_rule, impl=_hann_impl, differentiable=False))


@front(hann_window_p)
def hann_window(window_length, device, periodic=True, dtype=DType.float32):
    """Hann window of ``window_length`` points; ``periodic=True`` equals
    ``hann_window(L + 1, periodic=False)[:-1]`` (for spectral analysis).

    Raises:
        TypeError: ``window_length`` is not an int.
        ValueError: ``window_length`` is negative.

    Example:
        >>> w = ops.hann_window(8, DeviceRef.CPU())  # doctest: +SKIP
    """
    if isinstance(window_length, bool) or not isinstance(window_length, numbers.Integral):
        raise TypeError(f"hann_window: window_length must be an int, got {type(window_length).__name__}")
    if window_length < 0:
        raise ValueError(f"hann_window: window_length must be >= 0, got {window_length}")
    return bind(hann_window_p, window_length=int(window_length), periodic=bool(periodic), dtype=dtype, device=DeviceRef.from_device(device))


# ─── constant_external ───────────────────────────────────────────────────


@front(name="constant_external")
def constant_external(name: str, type: TensorType):  # noqa: A002 - MAX's name
    """A named external constant: a graph weight whose value comes from
    ``InferenceSession.load(..., weights_registry={name: array})``.

    The same name and type give the same value; the same name with another
    type is a ValueError.

    Example:
        >>> w = ops.constant_external("w", TensorType(DType.float32, [2, 2]))  # doctest: +SKIP
    """
    if not isinstance(type, TensorType):
        raise TypeError(f"constant_external: type must be a TensorType, got {type!r}")
    ctx = current_context()
    weights = getattr(ctx, "weights", None)
    if weights is None:
        raise RuntimeError("constant_external: no active Graph")
    existing = weights.get(name)
    if existing is not None:
        if existing.type != type:
            raise ValueError(f"constant_external: {name!r} already has type {existing.type}, not {type}")
        return existing
    value = bind(weight_p, name=name, type=type)
    weights[name] = value
    return value
