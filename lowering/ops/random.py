"""Random ops: ``random_normal`` and ``random_uniform``, and MAX's graph-level ``ops.random``.

Both ops take the randomness as an *input*: a ``uint32[2]`` tensor ``(seed,
counter)`` or a ``uint64[1]`` seed, folded into a JAX PRNG key inside the
program. Keeping the key a value (not a param) means a loop that draws fresh
samples every step records the same graph each time, so it compiles once; the
counter makes every draw different and the whole sequence reproducible from the
seed.

MAX's ``max.graph.ops.random`` (`set_seed`, `SeedType`, `uniform`, `gaussian`,
`normal`) keeps one seed per graph being built: `set_seed` sets it (a Python
int or a ``uint64`` graph value), each draw uses it and then advances it by one,
so successive draws differ and a graph input seed makes the whole graph
reproducible. Samples of a non-float dtype are drawn in float64 and converted
(ints round toward -inf, bool is ``sample != 0``).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.context import bind, current_context
from lowering.dims import Dim, StaticDim
from lowering.dtypes import DType, promote_weak
from lowering.ops import _rules as R
from lowering.ops.core import cast, constant
from lowering.ops.elementwise import add
from lowering.ops.shape import _as_ints, reshape
from lowering.registry import OpDef, front, register
from lowering.types import DeviceRef, TensorType

__all__ = ["random_normal", "random_uniform", "SeedType", "set_seed", "uniform", "gaussian", "normal"]


def _key_type(op: str, key: Any) -> TensorType:
    key = R.require_tensor(op, key)
    shape = list(key.shape)
    if not (key.dtype is DType.uint32 and shape == [2] or key.dtype is DType.uint64 and shape == [1]):
        raise R.OpError(
            f"{op}: the key must be a uint32 tensor of shape [2] (seed, counter) or a uint64 seed of shape [1], got "
            f"{R.fmt(key)}"
        )
    return key


def _sample_type(op: str, key: Any, shape: tuple, dtype: DType, device: DeviceRef) -> TensorType:
    _key_type(op, key)
    if not isinstance(dtype, DType):
        raise TypeError(f"{op}: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    return TensorType(dtype, list(shape), device)


def _prng_key(key: jax.Array) -> jax.Array:
    if key.dtype == jnp.uint64:
        return jax.random.key(key[0])
    return jax.random.fold_in(jax.random.key(key[0]), key[1])


def _normal_rule(key, *, shape, dtype, device, mean, std) -> TensorType:
    return _sample_type("random_normal", key, shape, dtype, device)


def _work_dtype(dtype: DType) -> Any:
    """The dtype to sample in: float32 at least (bfloat16/float16 samples straight from jax.random are coarse); float64
    for non-floats.
    """
    if not dtype.is_float():
        return "float64"
    return dtype.to_numpy() if dtype.size_in_bytes >= 4 else "float32"


def _convert(samples: jax.Array, dtype: DType) -> jax.Array:
    """Float samples as ``dtype``: floats rounded, ints floored (saturating at the dtype's range), bool ``!= 0``."""
    if dtype is DType.bool:
        return samples != 0
    if dtype.is_float():
        return samples.astype(dtype.to_numpy())
    info = np.iinfo(dtype.to_numpy())
    return jnp.clip(jnp.floor(samples), float(info.min), float(info.max)).astype(dtype.to_numpy())


def _normal_impl(key, *, shape, dtype, device, mean, std):
    z = jax.random.normal(_prng_key(key), tuple(shape), _work_dtype(dtype))
    return _convert(z * std + mean, dtype)


def _uniform_rule(key, *, shape, dtype, device, low, high) -> TensorType:
    if not low < high:
        raise R.OpError(f"random_uniform: the range must satisfy low < high, got ({low}, {high})")
    return _sample_type("random_uniform", key, shape, dtype, device)


def _uniform_impl(key, *, shape, dtype, device, low, high):
    u = jax.random.uniform(_prng_key(key), tuple(shape), _work_dtype(dtype), minval=low, maxval=high)
    # Rounding to a narrow dtype may reach `high`; keep the interval half-open.
    out = _convert(u, dtype)
    if dtype.is_float():
        out = jnp.where(out >= high, jnp.asarray(low, out.dtype), out)
    return out


random_normal_p = register(OpDef("random_normal", rule=_normal_rule, impl=_normal_impl, differentiable=False))
random_uniform_p = register(OpDef("random_uniform", rule=_uniform_rule, impl=_uniform_impl, differentiable=False))


def _shape_param(op: str, shape: Any) -> tuple[int, ...]:
    """``shape`` as ints, refusing floats, bools and strings (``int(2.5)`` would silently draw 2 samples)."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    return _as_ints(op, shape, "shape")


def _require_float(op: str, dtype: Any) -> None:
    if not isinstance(dtype, DType) or not dtype.is_float():
        raise R.OpError(f"{op}: samples must have a floating-point dtype, got {dtype}")


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
    if not std > 0:
        raise R.OpError(f"random_normal: std must be > 0, got {std}")
    _require_float("random_normal", dtype)
    return bind(
        random_normal_p,
        key,
        shape=_shape_param("random_normal", shape),
        dtype=dtype,
        device=DeviceRef.from_device(device),
        mean=float(mean),
        std=float(std),
    )


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
    _require_float("random_uniform", dtype)
    return bind(
        random_uniform_p,
        key,
        shape=_shape_param("random_uniform", shape),
        dtype=dtype,
        device=DeviceRef.from_device(device),
        low=float(low),
        high=float(high),
    )


# ─── MAX's graph-level API (max.graph.ops.random) ─────────────────────────

# The seed of each graph being built (a uint64[1] value), advanced by every draw.
_seeds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def SeedType(device: DeviceRef) -> TensorType:  # noqa: N802 - MAX's name
    """The type of a seed graph input: ``uint64[1]`` on ``device``.

    Example:
        >>> from maxfx.graph import DeviceRef, ops
        >>> ops.random.SeedType(DeviceRef.CPU())
        TensorType(dtype=uint64, shape=[Dim(1)], device=cpu:0)
    """
    return TensorType(DType.uint64, [1], DeviceRef.from_device(device))


def _graph(where: str):
    ctx = current_context()
    if ctx is None:
        raise RuntimeError(f"ops.random.{where}: no graph is being built; call it inside a `with Graph(...)` block")
    return ctx


def set_seed(seed: Any = 0) -> None:
    """Seed the random ops of the graph being built.

    Args:
        seed: a Python int in ``[0, 2**64)``, or a graph value holding one
            element (``SeedType(device)`` is the input type to use; other
            dtypes are cast to uint64, rank 0 is reshaped to ``[1]``).

    Raises:
        RuntimeError: outside a graph being built.
        ValueError: an int outside ``[0, 2**64)``, or a value with more than one element.

    Example:
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> with Graph("g", input_types=[ops.random.SeedType(DeviceRef.CPU())]) as g:
        ...     ops.random.set_seed(g.inputs[0].tensor)
        ...     g.output(ops.random.uniform(TensorType(DType.float32, [3], DeviceRef.CPU())))
        >>> model = InferenceSession().load(g)
        >>> import numpy as np
        >>> a = model.execute(np.array([5], np.uint64))[0].to_numpy()
        >>> b = model.execute(np.array([5], np.uint64))[0].to_numpy()
        >>> bool((a == b).all()), bool(((a >= 0) & (a < 1)).all())
        (True, True)
    """
    ctx = _graph("set_seed")
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        if not 0 <= int(seed) < 2**64:
            raise ValueError(f"ops.random.set_seed: seed must be in [0, 2**64), got {seed}")
        value = constant(np.array([int(seed)], np.uint64), DType.uint64, DeviceRef.CPU())
    else:
        t = getattr(seed, "type", None)
        if not isinstance(t, TensorType):
            raise TypeError(
                f"ops.random.set_seed: seed must be an int or a graph tensor value, got {type(seed).__name__}"
            )
        if not all(isinstance(d, StaticDim) and d.dim == 1 for d in t.shape):
            raise ValueError(
                f"ops.random.set_seed: the seed must hold one element (uint64[1], see SeedType), got {R.fmt(t)}"
            )
        value = seed if t.dtype is DType.uint64 else cast(seed, DType.uint64)
        if list(t.shape) != [1]:
            value = reshape(value, [1])
    _seeds[ctx] = value


def _next_seed(where: str):
    ctx = _graph(where)
    seed = _seeds.get(ctx)
    if seed is None:
        raise RuntimeError(f"ops.random.{where}: no seed set for this graph; call ops.random.set_seed(seed) first")
    _seeds[ctx] = add(seed, 1)
    return seed


def _like(where: str, like: Any) -> TensorType:
    t = like if isinstance(like, TensorType) else getattr(like, "type", None)
    if not isinstance(t, TensorType):
        raise TypeError(f"ops.random.{where}: like must be a TensorType, got {type(like).__name__}")
    return t


def _like_shape(t: TensorType) -> tuple[Dim, ...]:
    return tuple(d.dim if isinstance(d, StaticDim) else d for d in t.shape)


def uniform(like: TensorType, range: Sequence[float] = (0, 1)):  # noqa: A002 - MAX's name
    """Uniform samples in ``[range[0], range[1])`` with ``like``'s dtype, shape and device.

    Uses (and advances) the graph's seed (`set_seed`).

    Raises:
        RuntimeError: no seed set for the graph being built.
        ValueError: a bound not representable in ``like.dtype`` ("Unsafe cast"),
            or ``range[0] >= range[1]``.

    Example:
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> with Graph("g") as g:
        ...     ops.random.set_seed(42)
        ...     g.output(ops.random.uniform(TensorType(DType.int32, [1000], DeviceRef.CPU()), range=(0, 10)))
        >>> x = InferenceSession().load(g).execute()[0].to_numpy()
        >>> x.dtype, int(x.min()), int(x.max())
        (dtype('int32'), 0, 9)
    """
    t = _like("uniform", like)
    low, high = range
    for v in (low, high):
        promote_weak(t.dtype, v)  # MAX: "Unsafe cast" when a bound does not fit the dtype
    seed = _next_seed("uniform")
    return bind(
        random_uniform_p, seed, shape=_like_shape(t), dtype=t.dtype, device=t.device, low=float(low), high=float(high)
    )


def gaussian(like: TensorType, mean: float = 0.0, std: float = 1.0):
    """Normal samples ``mean + std * N(0, 1)`` with ``like``'s dtype, shape and device.

    Uses (and advances) the graph's seed (`set_seed`). ``mean`` and ``std`` are
    used as float64 whatever the dtype.

    Raises:
        RuntimeError: no seed set for the graph being built.

    Example:
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> with Graph("g") as g:
        ...     ops.random.set_seed(0)
        ...     g.output(ops.random.gaussian(TensorType(DType.float32, [4000], DeviceRef.CPU()), mean=3.0, std=0.5))
        >>> z = InferenceSession().load(g).execute()[0].to_numpy()
        >>> round(float(z.mean()), 1), round(float(z.std()), 1)
        (3.0, 0.5)
    """
    t = _like("gaussian", like)
    seed = _next_seed("gaussian")
    return bind(
        random_normal_p, seed, shape=_like_shape(t), dtype=t.dtype, device=t.device, mean=float(mean), std=float(std)
    )


normal = gaussian
