"""MAX's current functional ops that compose other ops: creation, clamping, ``bottom_k``, ``prod``.

MAX 26.x's ``max.experimental.functional`` has these beside the documented
names; ``maxfx.experimental.functional`` re-exports them (outside its
``__all__``). Each is built from registry fronts (``maxfx.graph.ops``), which
take their context from their tensor inputs, so nothing here defines op math:
on eager tensors they run eagerly, inside a ``Graph`` they record ops, under
``jax.jit`` they trace. This module does not import the functional module
(which imports it).

Example:
    >>> from maxfx import functional as F
    >>> F.clamp(F.constant([-2.0, 0.5, 3.0]), 0.0, 1.0).to_numpy().tolist()
    [0.0, 0.5, 1.0]
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from lowering.context import current_context, use_context
from lowering.dtypes import DType
from lowering.ops._indexing_util import dtype_of
from lowering.types import DeviceRef, TensorType
from maxfx.experimental import random as _random
from maxfx.experimental._defaults import defaults
from maxfx.experimental._tensor import EAGER as _EAGER
from maxfx.experimental._tensor import Tensor
from maxfx.graph import ops
from maxfx.graph._current import current_graph

__all__ = [
    "arange",
    "bottom_k",
    "clamp",
    "clip",
    "elementwise_max",
    "elementwise_min",
    "ensure_context",
    "full",
    "full_like",
    "gaussian",
    "gaussian_like",
    "in_graph_context",
    "normal",
    "normal_like",
    "ones",
    "ones_like",
    "prod",
    "uniform",
    "uniform_like",
    "zeros",
    "zeros_like",
]


# ─── contexts ─────────────────────────────────────────────────────────────


def in_graph_context() -> bool:
    """Whether a ``Graph`` is being built (ops record graph nodes rather than run).

    Example:
        >>> from maxfx.graph import Graph
        >>> in_graph_context()
        False
        >>> with Graph("g"):
        ...     in_graph_context()
        True
    """
    return current_graph() is not None


@contextlib.contextmanager
def ensure_context() -> Iterator[None]:
    """Run the block where ops have a context: the current one, else eager execution.

    maxfx ops find their context from their inputs, so this only matters for
    code that creates values from Python data alone.

    Example:
        >>> with ensure_context():
        ...     t = ops.constant(1.0, DType.float32, DeviceRef.CPU())
        >>> t.item()
        1.0
    """
    if current_context() is not None:
        yield
        return
    with use_context(_EAGER):
        yield


# ─── creation ─────────────────────────────────────────────────────────────


def full(shape: Any, value: Any, *, dtype: DType | None = None, device: Any = None) -> Any:
    """A tensor of ``shape`` filled with ``value`` (``float32`` on CPU unless ``dtype`` says otherwise).

    Outside a ``Graph`` this is `Tensor.full`; inside one it records a
    broadcast constant, so ``shape`` may hold symbolic dims there.

    Example:
        >>> full([2], 7.0).to_numpy().tolist()
        [7.0, 7.0]
    """
    if not in_graph_context():
        return Tensor.full(shape, value, dtype=dtype, device=device)
    dtype, dev = defaults(dtype, device)
    return ops.broadcast_to(ops.constant(value, dtype, DeviceRef.from_device(dev)), shape)


def ones(shape: Any, *, dtype: DType | None = None, device: Any = None) -> Any:
    """A tensor of ones (see `full`)."""
    return full(shape, 1, dtype=dtype, device=device)


def zeros(shape: Any, *, dtype: DType | None = None, device: Any = None) -> Any:
    """A tensor of zeros (see `full`)."""
    return full(shape, 0, dtype=dtype, device=device)


def _like(like: Any, what: str) -> TensorType:
    t = like if isinstance(like, TensorType) else getattr(like, "type", None)
    if not isinstance(t, TensorType):
        raise TypeError(f"{what}: like must be a Tensor, graph tensor value or TensorType, got {type(like).__name__}")
    return t


def full_like(like: Any, value: Any) -> Any:
    """A tensor with ``like``'s shape, dtype and device (a Tensor, tensor value or TensorType), filled with ``value``.

    Example:
        >>> full_like(Tensor([1, 2, 3], dtype=DType.int32), 5).to_numpy().tolist()
        [5, 5, 5]
    """
    t = _like(like, "full_like")
    return full(t.shape, value, dtype=t.dtype, device=t.device)


def ones_like(like: Any) -> Any:
    """Ones with ``like``'s shape, dtype and device."""
    return full_like(like, 1)


def zeros_like(like: Any) -> Any:
    """Zeros with ``like``'s shape, dtype and device."""
    return full_like(like, 0)


def arange(
    start: Any = 0, stop: Any = None, step: Any = 1, *, dtype: DType | None = None, device: Any = None
) -> Tensor:
    """``start, start + step, ...`` up to (not including) ``stop``; ``arange(n)`` is ``0 .. n-1`` (`Tensor.arange`).

    Example:
        >>> arange(4).to_numpy().tolist()
        [0.0, 1.0, 2.0, 3.0]
    """
    return Tensor.arange(start, stop, step, dtype=dtype, device=device)


uniform = _random.uniform
gaussian = _random.gaussian
normal = _random.normal


def uniform_like(like: Any, range: tuple[float, float] = (0, 1)) -> Tensor:  # noqa: A002 - MAX's name
    """Uniform samples in ``[range[0], range[1])`` with ``like``'s shape, dtype and device."""
    return _random.uniform_like(_like(like, "uniform_like"), range)


def gaussian_like(like: Any, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """Normal samples with ``like``'s shape, dtype and device."""
    return _random.gaussian_like(_like(like, "gaussian_like"), mean, std)


normal_like = gaussian_like


# ─── elementwise and reductions ───────────────────────────────────────────


def elementwise_max(lhs: Any, rhs: Any) -> Any:
    """The elementwise maximum of ``lhs`` and ``rhs`` (broadcast; Python numbers take the tensor's dtype).

    Example:
        >>> elementwise_max(Tensor([1.0, 5.0]), 3.0).to_numpy().tolist()
        [3.0, 5.0]
    """
    return ops.max(lhs, rhs)


def elementwise_min(lhs: Any, rhs: Any) -> Any:
    """The elementwise minimum of ``lhs`` and ``rhs``."""
    return ops.min(lhs, rhs)


def clamp(x: Any, lower_bound: Any, upper_bound: Any) -> Any:
    """``x`` limited to ``[lower_bound, upper_bound]``: ``max(min(x, upper_bound), lower_bound)``.

    The bounds are tensors or Python numbers; a lower bound above the upper one
    gives the lower bound, as in MAX.

    Example:
        >>> clamp(Tensor([-1.0, 0.5, 2.0]), 0.0, 1.0).to_numpy().tolist()
        [0.0, 0.5, 1.0]
    """
    if lower_bound is None or upper_bound is None:
        raise TypeError("clamp: lower_bound and upper_bound are both required (a tensor or a number each)")
    return elementwise_max(elementwise_min(x, upper_bound), lower_bound)


clip = clamp


def prod(x: Any, axis: int | None = -1) -> Any:
    """The product along ``axis``, kept as a size-1 dim; ``axis=None`` multiplies every element (shape ``[1]``).

    Example:
        >>> prod(Tensor([[1.0, 2.0], [3.0, 4.0]]), axis=None).to_numpy().tolist()
        [24.0]
    """
    if axis is None:
        return ops.prod(ops.reshape(x, [-1]), 0)
    return ops.prod(x, axis)


def bottom_k(input: Any, k: int, axis: int = -1) -> tuple[Any, Any]:  # noqa: A002 - MAX's name
    """The ``k`` smallest values along ``axis`` in ascending order, and their int64 indices.

    ``top_k`` of an order-reversing map of ``input`` (``-x`` for floats,
    ``-1 - x`` for signed and ``max - x`` for unsigned integers, ``not x``
    for bools), mapped back: no value overflows.

    Example:
        >>> values, indices = bottom_k(Tensor([3.0, 1.0, 2.0, 0.5]), 2)
        >>> values.to_numpy().tolist(), indices.to_numpy().tolist()
        ([0.5, 1.0], [3, 1])
    """
    dtype = dtype_of(input)
    if dtype is DType.bool:
        flip = ops.logical_not
    elif dtype.is_float():
        flip = ops.negate
    elif dtype.is_signed_integral():
        flip = lambda t: ops.sub(-1, t)  # noqa: E731 - the map and its inverse are the same
    else:
        top = int(np.iinfo(dtype.to_numpy()).max)
        flip = lambda t: ops.sub(top, t)  # noqa: E731
    values, indices = ops.top_k(flip(input), k, axis)
    return flip(values), indices
