"""Device placement and collectives: ``transfer_to`` and ``allgather``.

A compiled graph runs as one XLA program on one device (the session picks it
from the graph's types), so inside that program a transfer is an identity and
an allgather is a concatenation whose result every "device" shares. On
concrete arrays (eager Tensors, op-by-op graphs) ``transfer_to`` really moves
the data with ``jax.device_put``. Types carry the MAX placement either way, so
device checks (``assert_same_device``, same-device rules) behave as in MAX.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp

from lowering.context import bind
from lowering.devices import jax_device
from lowering.dims import Dim
from lowering.ops._rules import OpError, fmt, require_tensor
from lowering.registry import OpDef, front, register
from lowering.types import BufferType, DeviceRef, TensorType, Type

__all__ = ["transfer_to", "allgather"]


# ─── transfer_to ─────────────────────────────────────────────────────────


def _transfer_rule(x: Type, *, device: DeviceRef) -> TensorType:
    t = require_tensor("transfer_to", x, "x")
    return TensorType(t.dtype, t.shape, device)


def _transfer_impl(x, *, device: DeviceRef):
    if isinstance(x, jax.core.Tracer):
        # Inside one jitted program every value lives on the program's device.
        return x
    return jax.device_put(x, jax_device(device))


transfer_to_p = register(OpDef("transfer_to", rule=_transfer_rule, impl=_transfer_impl, immediate=True, cross_device=True))


@front(transfer_to_p)
def transfer_to(x: Any, device: Any):
    """Copy ``x`` to ``device`` (a `DeviceRef` or driver Device).

    The result's type has the new device. Transferring to the device ``x`` is
    already on returns ``x`` itself.

    Example:
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> with Graph("g", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())]) as g:
        ...     x = g.inputs[0]
        ...     print(ops.transfer_to(x, DeviceRef.GPU()).type)  # recorded; runs where a GPU exists
        ...     print(ops.transfer_to(x, DeviceRef.CPU()) is x)
        TensorType(dtype=float32, shape=[Dim(2)], device=gpu:0)
        True
    """
    ref = DeviceRef.from_device(device)
    t = getattr(x, "type", None)
    if isinstance(t, TensorType) and t.device == ref:
        return x
    return bind(transfer_to_p, x, device=ref)


# ─── allgather ──────────────────────────────────────────────────────────────


def _allgather_rule(*types: Type, n: int, axis: int) -> tuple[TensorType, ...]:
    inputs, signals = types[:n], types[n:]
    ts = [require_tensor("allgather", t, f"input {i}") for i, t in enumerate(inputs)]
    for i, s in enumerate(signals):
        if not isinstance(s, BufferType):
            raise TypeError(f"allgather: signal buffer {i} must be a BufferValue, got {fmt(s)}")
    first = ts[0]
    for i, t in enumerate(ts[1:], 1):
        if t.rank != first.rank:
            raise OpError(f"allgather: inputs must have the same rank; input 0 is {fmt(first)}, input {i} is {fmt(t)}")
        if t.dtype is not first.dtype:
            raise OpError(f"allgather: inputs must have the same dtype; got {', '.join(x.dtype.name for x in ts)}")
    seen: list[DeviceRef] = []
    for t in ts:
        if t.device in seen:
            raise OpError(f"allgather: inputs must be on distinct devices; got {', '.join(str(x.device) for x in ts)}")
        seen.append(t.device)
    if not -first.rank <= axis < first.rank:
        raise IndexError(f"allgather: axis {axis} is out of range for rank {first.rank} (expected {-first.rank} <= axis < {first.rank})")
    axis = axis % first.rank
    for i, t in enumerate(ts[1:], 1):
        for d in range(first.rank):
            if d != axis and t.shape[d] != first.shape[d]:
                raise OpError(
                    f"allgather: inputs must have the same shape except on axis {axis}; "
                    f"input 0 is {fmt(first)}, input {i} is {fmt(t)} (dim {d})"
                )
    total: Dim = Dim(0)
    for t in ts:
        total = total + t.shape[axis]
    shape = list(first.shape)
    shape[axis] = total
    return tuple(TensorType(first.dtype, shape, t.device) for t in ts)


def _allgather_impl(*arrays, n: int, axis: int):
    gathered = jnp.concatenate(arrays[:n], axis=axis)
    return tuple(gathered for _ in range(n))


allgather_p = register(OpDef("allgather", rule=_allgather_rule, impl=_allgather_impl, multiple_results=True, cross_device=True))


@front(allgather_p)
def allgather(inputs: Iterable[Any], signal_buffers: Iterable[Any], axis: int = 0) -> list[Any]:
    """Concatenate one tensor per device along ``axis``; every device gets the result.

    Args:
        inputs: one tensor per device (distinct devices, same dtype/rank, equal
            dims except ``axis``).
        signal_buffers: one synchronization `BufferValue` per device (MAX's
            peer-to-peer signals; required for the API, unused by XLA).
        axis: the concatenation axis (negative counts from the end).

    Returns:
        One gathered tensor per input, placed on that input's device.

    Raises:
        ValueError: different numbers of inputs and signal buffers, repeated
            devices, or mismatched dtypes/shapes.
        IndexError: ``axis`` out of range.

    Example:
        >>> import numpy as np
        >>> from maxfx.driver import Tensor
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> devices = [DeviceRef.CPU(0), DeviceRef.CPU(1)]
        >>> types = [TensorType(DType.float32, [1, 2], d) for d in devices]
        >>> signals = [BufferType(DType.uint8, [16], d) for d in devices]
        >>> with Graph("gather", input_types=types + signals) as g:
        ...     g.output(*ops.allgather(g.inputs[:2], g.inputs[2:], axis=0))
        >>> x0, x1 = np.array([[1.0, 2.0]], np.float32), np.array([[3.0, 4.0]], np.float32)
        >>> sig = [Tensor.from_numpy(np.zeros(16, np.uint8)) for _ in devices]
        >>> [o.to_numpy().tolist() for o in InferenceSession().load(g).execute(x0, x1, *sig)]  # one copy per device
        [[[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0, 4.0]]]
    """
    inputs = list(inputs)
    signal_buffers = list(signal_buffers)
    if len(inputs) != len(signal_buffers):
        raise ValueError(f"allgather: expected number of inputs ({len(inputs)}) and number of signal buffers ({len(signal_buffers)}) to match")
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"allgather: axis must be an int, got {type(axis).__name__}")
    if len(inputs) < 2:
        # One device: nothing to gather (as in MAX).
        return inputs
    return list(bind(allgather_p, *inputs, *signal_buffers, n=len(inputs), axis=axis))
