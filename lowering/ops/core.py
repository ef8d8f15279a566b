"""Ops every context relies on: ``constant``, ``cast`` and graph ``weight`` inputs."""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.context import GraphBuilder, bind, current_context
from lowering.dtypes import DType, result_dtype_for_python_scalar
from lowering.ir import ConstantValue
from lowering.ops._rules import OpError, fmt, require_tensor
from lowering.registry import OpDef, front, register
from lowering.types import DevicePlacementPolicy, DeviceRef, TensorType

__all__ = ["constant", "cast", "weight_p", "constant_p", "cast_p", "to_constant_array"]


# ─── constant ─────────────────────────────────────────────────────────────


def _constant_rule(*, value: ConstantValue, dtype: DType, device: DeviceRef) -> TensorType:
    return TensorType(dtype, value.array.shape, device)


constant_p = register(
    OpDef(
        "constant",
        rule=_constant_rule,
        impl=lambda *, value, dtype, device: jnp.asarray(value, dtype=dtype.to_numpy()),
        differentiable=False,
    )
)


def _length(x: Any) -> int | None:
    """How many items a nested-list element has (None for a scalar or a 0-d array)."""
    if isinstance(x, (list, tuple)):
        return len(x)
    if isinstance(x, np.ndarray) and x.ndim:
        return len(x)
    return None


def ragged_at(value: Any) -> str | None:
    """Where nested list ``value`` is ragged ("at depth 1, value[0] has 2 items but value[1] has 1"); None if it is not.

    Every element at one depth (across all parents) is compared with the first
    element at that depth: a list of another length, or a scalar beside a list.

    Example:
        >>> from lowering.ops.core import ragged_at
        >>> ragged_at([[1.0, 2.0], [3.0]])
        'at depth 1, value[0] has 2 items but value[1] has 1 item'
        >>> ragged_at([[1, 2], [3, 4]]) is None
        True
    """

    def name(path: tuple[int, ...]) -> str:
        return "value" + "".join(f"[{i}]" for i in path)

    def what(path: tuple[int, ...], n: int | None) -> str:
        return f"{name(path)} is a scalar" if n is None else f"{name(path)} has {n} item" + ("" if n == 1 else "s")

    if _length(value) is None:
        return None
    level: list[tuple[tuple[int, ...], Any]] = [((), value)]
    depth = 0
    while level:
        depth += 1
        first: tuple[tuple[int, ...], int | None] | None = None
        children = []
        for path, seq in level:
            for i, item in enumerate(seq):
                n = _length(item)
                if first is None:
                    first = (path + (i,), n)
                elif n != first[1]:
                    return f"at depth {depth}, {what(*first)} but {what(path + (i,), n)}"
                if n is not None:
                    children.append((path + (i,), item))
        level = children
    return None


def to_constant_array(value: Any, dtype: DType | None, op: str = "constant") -> tuple[np.ndarray, DType]:
    """Host array and dtype for constant data (scalar, nested list or DLPack array).

    Precision loss is allowed (16777217 becomes 16777216.0 in float32); values
    outside an integer dtype's range are an error.

    Raises:
        ValueError: a ragged nested list (the message says at which depth and
            which lengths differ, `ragged_at`), or a value out of an int dtype's range.
        TypeError: a value that is not numbers.
    """
    if hasattr(value, "__dlpack__") and not isinstance(value, np.ndarray):
        try:
            value = np.from_dlpack(value)
        except (TypeError, BufferError, RuntimeError):
            value = np.asarray(value)
    try:
        arr = np.asarray(value)
    except ValueError:
        where = ragged_at(value)
        if where is None:
            raise
        raise ValueError(
            f"{op}: the nested list is ragged: {where}; every list at one depth must have the same length (pad the "
            "shorter lists)"
        ) from None
    if arr.dtype == object:
        raise TypeError(
            f"{op}: value must be a number, a nested sequence of numbers or a DLPack array, got {type(value).__name__}"
        )
    if dtype is None:
        if isinstance(value, (np.ndarray, np.generic)) or arr.dtype not in (np.float64, np.int64, np.bool_):
            dtype = DType.from_numpy(arr.dtype)
        elif arr.dtype == np.float64:
            dtype = DType.float32
        else:
            dtype = (
                result_dtype_for_python_scalar(arr.flat[0] if arr.size else 0.0)
                if arr.dtype != np.bool_
                else DType.bool
            )
    if dtype.is_integral() and arr.size:
        info = np.iinfo(dtype.to_numpy())
        if arr.dtype.kind in "iub" and (int(arr.min()) < info.min or int(arr.max()) > info.max):
            raise ValueError(f"{op}: value out of range for dtype {dtype.name} (range [{info.min}, {info.max}])")
    with np.errstate(over="ignore"):  # a float too large for a float dtype becomes inf, as in MAX: not a warning
        return np.asarray(arr, dtype=dtype.to_numpy()), dtype


@front(constant_p)
def constant(value: Any, dtype: DType | None = None, device: Any = None):
    """A constant tensor from a scalar, nested list or DLPack array.

    Args:
        value: the data; its shape becomes the tensor's shape.
        dtype: element type (default: from numpy arrays, float32 for Python floats,
            int64 for Python ints). Required for a list inside a Graph.
        device: ``DeviceRef`` or driver ``Device`` (default: the graph's device).
            Required for a list inside a Graph.

    Raises:
        TypeError: a list inside a Graph without ``dtype`` or ``device`` (MAX's rule).

    Example:
        >>> from maxfx.graph import DeviceRef, Graph, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("g") as g:
        ...     c = ops.constant([1, 2, 3], DType.int32, DeviceRef.CPU())
        ...     print(c.type)
        ...     g.output(c * 2)
        TensorType(dtype=int32, shape=[Dim(3)], device=cpu:0)
        >>> InferenceSession().load(g).execute()[0].to_numpy()
        array([2, 4, 6], dtype=int32)
    """
    ctx = current_context()
    source = None
    if isinstance(ctx, GraphBuilder):
        _check_graph_constant(value, dtype, device)
        source = _accelerator_of(value)
    if source is not None:
        _check_placement(ctx, source)
        value = _to_host(value)
    arr, dtype = to_constant_array(value, dtype)
    if device is None:
        device = source or getattr(ctx, "default_device", None) or DeviceRef.CPU()
    return bind(constant_p, value=ConstantValue(arr), dtype=dtype, device=DeviceRef.from_device(device))


def _check_graph_constant(value: Any, dtype: DType | None, device: Any) -> None:
    """MAX's rule for constants added to a Graph (eager constants keep their defaults):
    a nested list has no type of its own, so it needs both ``dtype`` and ``device``.

    (A numpy array of another dtype is converted, as MAX's documented
    ``shape_to_tensor`` example does, though MAX's own tests expect a ValueError.)
    """
    if isinstance(value, (list, tuple)):
        missing = [name for name, given in (("dtype", dtype), ("device", device)) if given is None]
        if missing:
            raise TypeError(
                f"constant: a list constant in a Graph needs {' and '.join(missing)} (e.g. ops.constant(value, "
                "DType.float32, DeviceRef.CPU()))"
            )


def _accelerator_of(value: Any) -> DeviceRef | None:
    """The accelerator that holds ``value`` (a driver Buffer or eager Tensor), None for host data."""
    if isinstance(value, (np.ndarray, np.generic, list, tuple, int, float, bool)):
        return None
    device = getattr(value, "device", None)
    if device is None:
        return None
    try:
        ref = DeviceRef.from_device(device)
    except (TypeError, ValueError):
        return None
    return None if ref.is_cpu() else ref


def _to_host(value: Any) -> Any:
    to_numpy = getattr(value, "to_numpy", None)
    if to_numpy is not None:
        return to_numpy()
    return np.asarray(jax.device_get(value))


def _check_placement(ctx: Any, source: DeviceRef) -> None:
    """Apply the graph's `DevicePlacementPolicy` to constant data held by ``source``."""
    policy = DevicePlacementPolicy.Warn
    while ctx is not None:
        found = getattr(ctx, "strict_device_placement", None)
        if found is not None:
            policy = found
            break
        ctx = getattr(ctx, "parent", None)
    message = (
        f"ops.constant: the data lives on {source}; a graph constant is embedded from host memory, "
        "so it is copied to the CPU while building the graph (pass it as a graph input to avoid the copy)"
    )
    if policy is DevicePlacementPolicy.Error:
        raise ValueError(message + " [strict_device_placement=DevicePlacementPolicy.Error]")
    if policy is DevicePlacementPolicy.Warn:
        warnings.warn(message, UserWarning, stacklevel=4)


# ─── cast ─────────────────────────────────────────────────────────────────


def _cast_rule(x, *, dtype: DType) -> TensorType:
    x = require_tensor("cast", x)
    if not isinstance(dtype, DType):
        raise TypeError(f"cast: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    return TensorType(dtype, x.shape, x.device)


def _cast_impl(x, *, dtype: DType):
    target = dtype.to_numpy()
    if dtype is DType.bool:
        return x != 0
    return x.astype(target)


cast_p = register(OpDef("cast", rule=_cast_rule, impl=_cast_impl))


@front(cast_p)
def cast(x: Any, dtype: DType):
    """Elementwise conversion to ``dtype`` (floats truncate toward zero into ints).

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> from maxfx.dtype import DType
        >>> ops.cast(Tensor([-1.7, 0.5, 2.9]), DType.int32)  # truncates toward zero
        TensorType(dtype=int32, shape=[Dim(3)], device=cpu:0): [-1, 0, 2]
    """
    return bind(cast_p, x, dtype=dtype)


# ─── weights (graph inputs bound at load time) ────────────────────────────


def _weight_rule(
    *, name: str, type: TensorType, shard: tuple[int, tuple[tuple[int, int], ...], int] | None = None
) -> TensorType:
    return type


def _weight_interpret(interp, node, ins, params, env):
    name = params["name"]
    try:
        value = interp.weights[name]
    except KeyError:
        raise KeyError(f"weight {name!r} has no value: pass it in weights_registry") from None
    shard = params.get("shard")
    if shard is not None:  # (axis, ((start, length), ...), full size): a shard is its slices, concatenated
        axis, parts, _ = shard
        pieces = [jax.lax.slice_in_dim(value, start, start + length, axis=axis) for start, length in parts]
        value = pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=axis)
    return _check_weight_value(name, value, node.outputs[0].type)


def _check_weight_value(name: str, value: Any, t: TensorType):
    got = DType.from_numpy(value.dtype)
    if got is not t.dtype or len(value.shape) != t.rank:
        raise OpError(f"weight {name!r}: expected {fmt(t)}, got {got.name}{list(value.shape)}")
    return value


weight_p = register(OpDef("weight", rule=_weight_rule, interpret=_weight_interpret, differentiable=False))
