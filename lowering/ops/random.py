"""Random ops: ``random_normal`` and ``random_uniform``.

Both take the randomness as an *input*: a ``uint32[2]`` tensor ``(seed,
counter)``, folded into a JAX PRNG key inside the program. Keeping the key a
value (not a param) means a loop that draws fresh samples every step records
the same graph each time, so it compiles once; the counter makes every draw
different and the whole sequence reproducible from the seed.
"""

from __future__ import annotations

from typing import Any

import jax

from lowering.context import bind
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.registry import OpDef, front, register
from lowering.types import DeviceRef, TensorType

__all__ = ["random_normal", "random_uniform"]


def _key_type(op: str, key: Any) -> TensorType:
    key = R.require_tensor(op, key)
    if key.dtype is not DType.uint32 or list(key.shape) != [2]:
        raise R.OpError(f"{op}: the key must be a uint32 tensor of shape [2] (seed, counter), got {R.fmt(key)}")
    return key


def _sample_type(op: str, key: Any, shape: tuple, dtype: DType, device: DeviceRef) -> TensorType:
    _key_type(op, key)
    if not isinstance(dtype, DType) or not dtype.is_float():
        raise R.OpError(f"{op}: samples must have a floating-point dtype, got {dtype}")
    return TensorType(dtype, list(shape), device)


def _prng_key(key: jax.Array) -> jax.Array:
    return jax.random.fold_in(jax.random.key(key[0]), key[1])


def _normal_rule(key, *, shape, dtype, device, mean, std) -> TensorType:
    if not std > 0:
        raise R.OpError(f"random_normal: std must be > 0, got {std}")
    return _sample_type("random_normal", key, shape, dtype, device)


def _work_dtype(dtype: DType) -> Any:
    """The dtype to sample in: float32 at least, since bfloat16/float16 samples straight from jax.random are coarse."""
    return dtype.to_numpy() if dtype.size_in_bytes >= 4 else "float32"


def _normal_impl(key, *, shape, dtype, device, mean, std):
    z = jax.random.normal(_prng_key(key), tuple(shape), _work_dtype(dtype))
    return (z * std + mean).astype(dtype.to_numpy())


def _uniform_rule(key, *, shape, dtype, device, low, high) -> TensorType:
    if not low < high:
        raise R.OpError(f"random_uniform: the range must satisfy low < high, got ({low}, {high})")
    return _sample_type("random_uniform", key, shape, dtype, device)


def _uniform_impl(key, *, shape, dtype, device, low, high):
    u = jax.random.uniform(_prng_key(key), tuple(shape), _work_dtype(dtype), minval=low, maxval=high)
    # Rounding to a narrow dtype may reach `high`; keep the interval half-open.
    out = u.astype(dtype.to_numpy())
    return jax.numpy.where(out >= high, jax.numpy.asarray(low, out.dtype), out)


random_normal_p = register(OpDef("random_normal", rule=_normal_rule, impl=_normal_impl, differentiable=False))
random_uniform_p = register(OpDef("random_uniform", rule=_uniform_rule, impl=_uniform_impl, differentiable=False))


def _shape_param(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    return tuple(int(d) for d in shape)


@front(random_normal_p)
def random_normal(key, shape, dtype: DType, device: DeviceRef, mean: float = 0.0, std: float = 1.0):
    """Normal samples of ``shape`` drawn with ``key`` (uint32 ``[seed, counter]``).

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import DeviceRef, Graph, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("g") as g:
        ...     key = ops.constant(np.array([42, 0], np.uint32), DType.uint32, DeviceRef.CPU())
        ...     g.output(ops.random_normal(key, [1000], DType.float32, DeviceRef.CPU(), mean=5.0, std=0.5))
        >>> z = InferenceSession().load(g).execute()[0].to_numpy()
        >>> z.shape, z.dtype
        ((1000,), dtype('float32'))
        >>> round(float(z.mean()), 1), round(float(z.std()), 1)
        (5.0, 0.5)
    """
    return bind(random_normal_p, key, shape=_shape_param(shape), dtype=dtype, device=DeviceRef.from_device(device), mean=float(mean), std=float(std))


@front(random_uniform_p)
def random_uniform(key, shape, dtype: DType, device: DeviceRef, low: float = 0.0, high: float = 1.0):
    """Uniform samples in ``[low, high)`` of ``shape`` drawn with ``key`` (uint32 ``[seed, counter]``).

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import DeviceRef, Graph, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("g") as g:
        ...     key = ops.constant(np.array([42, 0], np.uint32), DType.uint32, DeviceRef.CPU())
        ...     g.output(ops.random_uniform(key, [1000], DType.float32, DeviceRef.CPU(), 2.0, 3.0))
        >>> u = InferenceSession().load(g).execute()[0].to_numpy()
        >>> u.shape, bool(u.min() >= 2.0), bool(u.max() < 3.0)
        ((1000,), True, True)
    """
    return bind(random_uniform_p, key, shape=_shape_param(shape), dtype=dtype, device=DeviceRef.from_device(device), low=float(low), high=float(high))
