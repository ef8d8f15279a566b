"""Random tensors (``max.experimental.random``, also ``maxfx.random``).

Draws are recorded lazily like any other op and are reproducible: each call
folds a per-process counter into the key made from the seed (`seed`, default
0), so the n-th draw after ``seed(s)`` is always the same.

Example:
    >>> from maxfx import random
    >>> from maxfx.dtype import DType
    >>> random.seed(0)
    >>> w = random.gaussian([2, 2], mean=0.0, std=0.1, dtype=DType.float32)
    >>> w.shape
    [Dim(2), Dim(2)]
"""

from __future__ import annotations

import sys
import types
from collections.abc import Sequence
from typing import Any

from lowering.context import current_context
from lowering.dtypes import DType
from lowering.types import DeviceRef, TensorType
from maxfx.experimental import _random_state
from maxfx.experimental._defaults import defaults
from maxfx.experimental._tensor import Tensor, _static_shape
from maxfx.graph import ops

__all__ = ["seed", "set_seed", "uniform", "uniform_like", "gaussian", "gaussian_like", "normal", "normal_like"]


def seed(value: int) -> None:
    """Restart the random stream from ``value`` (deterministic afterwards).

    Example:
        >>> seed(1); a = uniform([3]).to_numpy()
        >>> seed(1); b = uniform([3]).to_numpy()
        >>> bool((a == b).all())
        True
    """
    _random_state.seed(value)


set_seed = seed
_next_key = _random_state.next_key


def _check_range(range: Sequence[float]) -> tuple[float, float]:  # noqa: A002 - MAX's name
    try:
        low, high = range
    except (TypeError, ValueError):
        raise ValueError(f"uniform: range must be a (min, max) pair, got {range!r}") from None
    if not low < high:
        raise ValueError(f"uniform: range must have min < max, got ({low}, {high})")
    return float(low), float(high)


def _check_std(std: float) -> float:
    if not std > 0:
        raise ValueError(f"gaussian: std must be > 0, got {std}")
    return float(std)


def _eager_key(device) -> Tensor:
    return Tensor._constant(_next_key(), device=device)


def uniform(
    shape: Any = (), range: Sequence[float] = (0, 1), *, dtype: DType | None = None, device: Any = None
) -> Tensor:  # noqa: A002
    """Samples uniform in ``[min, max)`` of ``range``.

    Example:
        >>> x = uniform([4], range=(-1, 1))
        >>> bool(((x.to_numpy() >= -1) & (x.to_numpy() < 1)).all())
        True
    """
    shape = _static_shape(shape, "random.uniform")  # the check Tensor.zeros makes: no float, bool or negative dims
    low, high = _check_range(range)
    dtype, dev = defaults(dtype, device)
    return ops.random_uniform(_eager_key(dev), shape, dtype, DeviceRef.from_device(dev), low, high)


def gaussian(
    shape: Any = (), mean: float = 0.0, std: float = 1.0, *, dtype: DType | None = None, device: Any = None
) -> Tensor:
    """Normal samples with ``mean`` and ``std``.

    Example:
        >>> x = gaussian([1000], mean=2.0, std=0.5)
        >>> abs(float(x.to_numpy().mean()) - 2.0) < 0.1
        True
    """
    shape = _static_shape(shape, "random.gaussian")
    std = _check_std(std)
    dtype, dev = defaults(dtype, device)
    return ops.random_normal(_eager_key(dev), shape, dtype, DeviceRef.from_device(dev), float(mean), std)


normal = gaussian


def _like_parts(like: Any, where: str) -> TensorType:
    t = like.type if hasattr(like, "type") and not isinstance(like, TensorType) else like
    if not isinstance(t, TensorType):
        raise TypeError(f"{where}: expected a TensorType, got {type(like).__name__}")
    return t


def _graph_key(t: TensorType) -> Any:
    return ops.constant(_next_key(), DType.uint32, t.device)


def uniform_like(like: TensorType, range: Sequence[float] = (0, 1)):  # noqa: A002
    """Uniform samples with ``like``'s dtype, shape and device.

    Inside a Graph being built this records graph ops (a `TensorValue`);
    otherwise it returns an eager `Tensor`.
    """
    t = _like_parts(like, "uniform_like")
    low, high = _check_range(range)
    key = _graph_key(t) if current_context() is not None else _eager_key(t.device.to_device())
    return ops.random_uniform(key, [int(d) for d in t.shape], t.dtype, t.device, low, high)


def gaussian_like(like: TensorType, mean: float = 0, std: float = 1):
    """Normal samples with ``like``'s dtype, shape and device (graph value inside a Graph)."""
    t = _like_parts(like, "gaussian_like")
    std = _check_std(std)
    key = _graph_key(t) if current_context() is not None else _eager_key(t.device.to_device())
    return ops.random_normal(key, [int(d) for d in t.shape], t.dtype, t.device, float(mean), std)


normal_like = gaussian_like


class _CallableModule(types.ModuleType):
    """Seed 003 calls the module itself (``random([3, 2], dtype=...)``): that draws `uniform` samples."""

    def __call__(self, shape: Any = (), *, dtype: DType | None = None, device: Any = None) -> Tensor:
        return uniform(shape, dtype=dtype, device=device)


sys.modules[__name__].__class__ = _CallableModule
