"""Device placement and collectives: ``transfer_to``, ``allgather``,
``allreduce_sum``, ``distributed_broadcast`` and ``shard_and_stack``.

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
from lowering.dims import Dim, StaticDim
from lowering.ops._rules import AxisError, OpError, fmt, require_tensor
from lowering.registry import OpDef, front, register
from lowering.types import BufferType, DeviceRef, TensorType, Type

__all__ = ["transfer_to", "allgather", "allreduce_sum", "distributed_broadcast", "shard_and_stack"]


# ─── transfer_to ─────────────────────────────────────────────────────────


def _transfer_rule(x: Type, *, device: DeviceRef) -> TensorType:
    t = require_tensor("transfer_to", x, "x")
    return TensorType(t.dtype, t.shape, device)


def _transfer_impl(x, *, device: DeviceRef):
    if isinstance(x, jax.core.Tracer):
        # Inside one jitted program every value lives on the program's device.
        return x
    return jax.device_put(x, jax_device(device))


transfer_to_p = register(
    OpDef("transfer_to", rule=_transfer_rule, impl=_transfer_impl, immediate=True, cross_device=True)
)


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
        raise IndexError(
            f"allgather: axis {axis} is out of range for rank {first.rank} (expected {-first.rank} <= axis < "
            f"{first.rank})"
        )
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


allgather_p = register(
    OpDef("allgather", rule=_allgather_rule, impl=_allgather_impl, multiple_results=True, cross_device=True)
)


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
        raise ValueError(
            f"allgather: expected number of inputs ({len(inputs)}) and number of signal buffers "
            f"({len(signal_buffers)}) to match"
        )
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"allgather: axis must be an int, got {type(axis).__name__}")
    if len(inputs) < 2:
        # One device: nothing to gather (as in MAX).
        return inputs
    return list(bind(allgather_p, *inputs, *signal_buffers, n=len(inputs), axis=axis))


# ─── allreduce ─────────────────────────────────────────────────────────────


def _allreduce_rule(*types: Type, n: int) -> tuple[TensorType, ...]:
    inputs, signals = types[:n], types[n:]
    ts = [require_tensor("allreduce.sum", t, f"input {i}") for i, t in enumerate(inputs)]
    for i, (t, s) in enumerate(zip(ts, signals)):
        if not isinstance(s, BufferType):
            raise TypeError(f"allreduce.sum: signal buffer {i} must be a BufferValue, got {fmt(s)}")
        if s.device != t.device:
            raise OpError(f"allreduce.sum: signal buffer {i} is on {s.device} but input {i} is on {t.device}")
    first = ts[0]
    for i, t in enumerate(ts[1:], 1):
        if t.dtype is not first.dtype or list(t.shape) != list(first.shape):
            raise OpError(
                f"allreduce.sum: inputs must share dtype and shape; input 0 is {fmt(first)}, input {i} is {fmt(t)}"
            )
    return tuple(TensorType(first.dtype, first.shape, t.device) for t in ts)


def _allreduce_impl(*arrays, n: int):
    # Added in device order everywhere, so every device holds bit-identical sums.
    total = arrays[0]
    for a in arrays[1:n]:
        total = total + a
    return tuple(total for _ in range(n))


allreduce_sum_p = register(
    OpDef("allreduce_sum", rule=_allreduce_rule, impl=_allreduce_impl, multiple_results=True, cross_device=True)
)


@front(allreduce_sum_p)
def allreduce_sum(inputs: Iterable[Any], signal_buffers: Iterable[Any]) -> list[Any]:
    """Sum one tensor per device; every device gets the total (MAX's ``ops.allreduce.sum``).

    Args:
        inputs: one tensor per device, all of one dtype and shape.
        signal_buffers: one synchronization `BufferValue` per input, on that
            input's device (MAX's peer-to-peer signals; unused by XLA).

    Returns:
        One sum per input, placed on that input's device.

    Raises:
        ValueError: different numbers of inputs and signal buffers,
            mismatched dtypes/shapes, or a signal buffer on another device.

    Example:
        >>> import numpy as np
        >>> from maxfx.driver import Tensor
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> devices = [DeviceRef.CPU(0), DeviceRef.CPU(1)]
        >>> types = [TensorType(DType.float32, [2], d) for d in devices]
        >>> signals = [BufferType(DType.uint8, [16], d) for d in devices]
        >>> with Graph("sum", input_types=types + signals) as g:
        ...     g.output(*ops.allreduce.sum(g.inputs[:2], g.inputs[2:]))
        >>> x0, x1 = np.array([1.0, 2.0], np.float32), np.array([10.0, 20.0], np.float32)
        >>> sig = [Tensor.from_numpy(np.zeros(16, np.uint8)) for _ in devices]
        >>> [o.to_numpy().tolist() for o in InferenceSession().load(g).execute(x0, x1, *sig)]
        [[11.0, 22.0], [11.0, 22.0]]
    """
    inputs, signal_buffers = list(inputs), list(signal_buffers)
    if not inputs:
        raise ValueError("allreduce.sum: need at least one input")
    if len(inputs) != len(signal_buffers):
        raise ValueError(
            f"allreduce.sum: expected number of inputs ({len(inputs)}) and number of signal buffers "
            f"({len(signal_buffers)}) to match"
        )
    return list(bind(allreduce_sum_p, *inputs, *signal_buffers, n=len(inputs)))


# ─── distributed_broadcast ──────────────────────────────────────────────────


def _broadcast_rule(x: Type, *signals: Type, root: int) -> tuple[TensorType, ...]:
    t = require_tensor("distributed_broadcast", x, "input")
    for i, b in enumerate(signals):
        if not isinstance(b, BufferType):
            raise TypeError(f"distributed_broadcast: signal buffer {i} must be a BufferValue, got {fmt(b)}")
    return tuple(TensorType(t.dtype, t.shape, b.device) for b in signals)


def _broadcast_impl(x, *signals, root: int):
    # One program: every device's copy is the root's tensor.
    return tuple(x for _ in signals)


distributed_broadcast_p = register(
    OpDef("distributed_broadcast", rule=_broadcast_rule, impl=_broadcast_impl, multiple_results=True, cross_device=True)
)


@front(distributed_broadcast_p)
def distributed_broadcast(input: Any, signal_buffers: Iterable[Any]) -> list[Any]:  # noqa: A002 - MAX's name
    """Copy ``input`` from its device (the root) to every device of ``signal_buffers``.

    Args:
        input: the tensor to broadcast; its device is the source and must be
            one of the signal buffers' devices.
        signal_buffers: one synchronization `BufferValue` per participating
            device (MAX's peer-to-peer signals; unused by XLA).

    Returns:
        One tensor per signal buffer, on that buffer's device, with the input's
        shape and dtype. With one buffer, ``[input]`` itself.

    Raises:
        ValueError: no signal buffers, the input's device is not among theirs,
            or a device appears twice.

    Example:
        >>> import numpy as np
        >>> from maxfx.driver import Tensor
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> devices = [DeviceRef.CPU(0), DeviceRef.CPU(1)]
        >>> signals = [BufferType(DType.uint8, [16], d) for d in devices]
        >>> with Graph("bcast", input_types=[TensorType(DType.float32, [2], devices[1]), *signals]) as g:
        ...     outs = ops.distributed_broadcast(g.inputs[0], [b.buffer for b in g.inputs[1:]])
        ...     print([str(o.device) for o in outs])
        ...     g.output(*outs)
        ['cpu:0', 'cpu:1']
        >>> sig = [Tensor.from_numpy(np.zeros(16, np.uint8)) for _ in devices]
        >>> [o.to_numpy().tolist() for o in InferenceSession().load(g).execute(np.array([1.0, 2.0], np.float32), *sig)]
        [[1.0, 2.0], [1.0, 2.0]]
    """
    signal_buffers = list(signal_buffers)
    if not signal_buffers:
        raise ValueError("distributed_broadcast requires at least 1 signal buffer")
    if len(signal_buffers) == 1:
        return [input]
    t = getattr(input, "type", None)
    devices = [getattr(getattr(b, "type", None), "device", None) for b in signal_buffers]
    device = getattr(t, "device", None)
    if device is not None and all(d is not None for d in devices):
        if device not in devices:
            raise ValueError(
                f"distributed_broadcast: input tensor device {device} not found in signal buffer devices: "
                f"[{', '.join(map(str, devices))}]"
            )
        if len(set(devices)) < len(devices):
            raise ValueError(
                "distributed_broadcast requires unique devices across signal buffers, got "
                f"[{', '.join(map(str, devices))}]"
            )
        root = devices.index(device)
    else:
        root = 0
    return list(bind(distributed_broadcast_p, input, *signal_buffers, root=root))


# ─── shard_and_stack ────────────────────────────────────────────────────────


def _shard_and_stack_rule(*types: Type, devices: tuple[DeviceRef, ...], axis: int) -> tuple[TensorType, ...]:
    op = "shard_and_stack"
    ts = [require_tensor(op, t, f"input {i}") for i, t in enumerate(types)]
    first = ts[0]
    for i, t in enumerate(ts[1:], 1):
        if t.device != first.device:
            raise OpError(
                f"{op}: Input values must be on the same device; input 0 is on {first.device}, input {i} on {t.device}"
            )
        if t.dtype is not first.dtype:
            raise OpError(
                f"{op}: All input tensors must have the same dtype; input 0 is {fmt(first)}, input {i} is {fmt(t)}"
            )
        if list(t.shape) != list(first.shape):
            raise OpError(
                f"{op}: All input tensors must have the same shape. "
                f"Input 0 has shape {list(first.shape)!r}, but input {i} has shape {list(t.shape)!r}"
            )
    rank = first.rank
    if not -rank <= axis < rank:
        raise AxisError(f"{op}: Axis must be in range [{-rank}, {rank}), got {axis} (inputs {fmt(first)})")
    if not first.device.is_cpu():
        raise OpError(f"{op}: inputs must be on the host (cpu), got {fmt(first)} on {first.device}")
    axis %= rank
    n = len(devices)
    dim = first.shape[axis]
    if isinstance(dim, StaticDim) and dim.dim % n:
        raise OpError(
            f"{op}: Dimension size along axis {axis} ({dim}) must be evenly divisible by number of devices ({n})"
        )
    shape = [Dim(len(ts)), *first.shape]
    shape[axis + 1] = dim // n
    return tuple(TensorType(first.dtype, shape, d) for d in devices)


def _shard_and_stack_impl(*arrays, devices: tuple[DeviceRef, ...], axis: int):
    stacked = jnp.stack(arrays)
    ax = axis % arrays[0].ndim + 1
    n = len(devices)
    if stacked.shape[ax] % n:
        raise ValueError(
            f"shard_and_stack: dimension size along axis {ax - 1} ({stacked.shape[ax]}) must be evenly divisible by "
            f"number of devices ({n})"
        )
    parts = jnp.split(stacked, n, axis=ax)
    if isinstance(stacked, jax.core.Tracer):
        return tuple(parts)
    return tuple(jax.device_put(p, jax_device(d)) for p, d in zip(parts, devices))


shard_and_stack_p = register(
    OpDef(
        "shard_and_stack",
        rule=_shard_and_stack_rule,
        impl=_shard_and_stack_impl,
        multiple_results=True,
        immediate=True,
        cross_device=True,
    )
)


@front(shard_and_stack_p)
def shard_and_stack(inputs: Iterable[Any], devices: Iterable[Any], axis: int = 0) -> list[Any]:
    """Split each host tensor into ``len(devices)`` chunks along ``axis``; output ``i`` stacks the ``i``-th chunks.

    For weights distributed in tensor parallelism: with inputs ``A``, ``B`` of
    shape ``[10, D]``, ``axis=0`` and two devices, output 0 is
    ``stack([A[0:5], B[0:5]])`` (``[2, 5, D]``) on ``devices[0]`` and output 1
    is ``stack([A[5:10], B[5:10]])`` on ``devices[1]``.

    Args:
        inputs: tensors of one shape, dtype and device (the host).
        devices: the target devices; their number is the number of chunks.
        axis: the axis to split (negative counts from the end).

    Returns:
        ``len(devices)`` tensors of shape ``[len(inputs), D0, ..., D_axis / len(devices), ...]``,
        output ``i`` on ``devices[i]``.

    Raises:
        ValueError: no inputs or no devices, mismatched shapes/dtypes/devices,
            inputs not on the host, or a static ``D_axis`` not divisible by
            ``len(devices)``.
        IndexError: ``axis`` out of range.

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import DeviceRef, ops
        >>> from maxfx.tensor import Tensor
        >>> a = Tensor(np.arange(4, dtype=np.float32))
        >>> b = Tensor(np.arange(4, 8, dtype=np.float32))
        >>> first, second = ops.shard_and_stack([a, b], [DeviceRef.CPU(), DeviceRef.CPU()])
        >>> first.to_numpy().tolist(), second.to_numpy().tolist()
        ([[0.0, 1.0], [4.0, 5.0]], [[2.0, 3.0], [6.0, 7.0]])
    """
    inputs = list(inputs)
    if not inputs:
        raise ValueError("shard_and_stack: Must provide at least one input tensor.")
    refs = tuple(DeviceRef.from_device(d) for d in devices)
    if not refs:
        raise ValueError("shard_and_stack: Must provide at least one device.")
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TypeError(f"shard_and_stack: axis must be an int, got {type(axis).__name__}")
    return list(bind(shard_and_stack_p, *inputs, devices=refs, axis=int(axis)))
