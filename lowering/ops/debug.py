"""Debugging ops: run-time ``print`` and the build-time ``assert_same_device`` check."""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import numpy as np

from lowering.context import bind
from lowering.debug_print import emit_message, emit_tensor
from lowering.ops._rules import OpError, fmt
from lowering.registry import OpDef, front, register
from lowering.types import BufferType, DeviceRef, TensorType, Type

__all__ = ["print_", "export_tensor", "assert_same_device"]


def _print_rule(*types: Type, label: str, message: str | None) -> None:
    if message is None:
        if len(types) != 1 or not isinstance(types[0], (TensorType, BufferType)):
            raise OpError(
                f"print: value must be a str or a tensor, got {', '.join(fmt(t) for t in types) or 'nothing'}"
            )
    return None


def _print_impl(*xs, label: str, message: str | None):
    # An ordered callback stays in jitted programs, branches and loops, and
    # prints run in program order (MAX orders them with its chain).
    # The callback reads the print options in effect when it runs (the session's: `lowering.debug_print`).
    if message is not None:
        jax.debug.callback(functools.partial(emit_message, label, message), ordered=True)
    else:
        jax.debug.callback(functools.partial(emit_tensor, label), xs[0], ordered=True)
    return None


print_p = register(OpDef("print", rule=_print_rule, impl=_print_impl, effect=True, differentiable=False))


@front(print_p)
def print_(value: Any, label: str = "debug_tensor") -> None:
    """Print a tensor's contents (or a string) when the graph runs.

    Output looks like ``label = tensor([[4.0000, 6.0000]], dtype=f32, shape=[2])``
    (``label = text`` for a string), MAX's ``COMPACT`` style; a session's
    ``set_debug_print_options`` picks another (``FULL``, ``NONE``, or files:
    ``BINARY``, ``BINARY_MAX_CHECKPOINT``; see `lowering.debug_print`). Printing
    happens while the model executes, in program order, also inside ``cond``
    branches and loop bodies; ``Model.execute`` returns after its prints.

    Args:
        value: a tensor (or buffer) value, or a str.
        label: printed before the value (and the file name of the binary styles).

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> input_type = TensorType(DType.float32, [2], DeviceRef.CPU())
        >>> with Graph("simple_add_graph", input_types=(input_type, input_type)) as graph:
        ...     out = ops.add(*graph.inputs)
        ...     ops.print(out, label="addition_output")
        ...     graph.output(out)
        >>> a, b = np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32)
        >>> model = InferenceSession().load(graph)
        >>> _ = model.execute(a, b)
        addition_output = tensor([[4.0000, 6.0000]], dtype=f32, shape=[2])
    """
    if not isinstance(label, str):
        raise TypeError(f"print: label must be a str, got {type(label).__name__}")
    if isinstance(value, str):
        return bind(print_p, label=label, message=value)
    if getattr(value, "type", None) is None and not hasattr(value, "shape"):
        raise TypeError(f"print: value must be a str or a tensor value, got {type(value).__name__}")
    bind(print_p, value, label=label, message=None)
    return None


print_.__name__ = print_.__qualname__ = "print"  # exported as ops.print


def _save_tensor(path: str, label: str, x: Any) -> None:
    os.makedirs(path, exist_ok=True)
    np.save(os.path.join(path, f"{label}.npy"), np.asarray(x))


def _export_rule(x: Type, *, path: str, label: str) -> None:
    if not isinstance(x, (TensorType, BufferType)):
        raise OpError(f"export_tensor: value must be a tensor, got {fmt(x)}")
    if not label or "/" in label or label.startswith("."):
        raise OpError(f"export_tensor: label must be a plain file name, got {label!r}")
    return None


def _export_impl(x, *, path: str, label: str):
    # Same ordered callback as print: the file is written when the graph runs.
    jax.debug.callback(functools.partial(_save_tensor, path, label), x, ordered=True)
    return None


export_tensor_p = register(
    OpDef("export_tensor", rule=_export_rule, impl=_export_impl, effect=True, differentiable=False)
)


@front(export_tensor_p)
def export_tensor(value: Any, path: str, label: str) -> None:
    """Save a tensor's contents to ``{path}/{label}.npy`` when the graph runs (debug checkpoints).

    Example:
        >>> import os, shutil, tempfile
        >>> import jax
        >>> import numpy as np
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> path = tempfile.mkdtemp()
        >>> with Graph("g", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())]) as g:
        ...     hidden = g.inputs[0] * 2
        ...     ops.export_tensor(hidden, path, "layer0-output")
        ...     g.output(hidden)
        >>> _ = InferenceSession().load(g).execute(np.array([1.0, 2.0], np.float32))
        >>> jax.effects_barrier()  # the file is written while the model runs
        >>> np.load(os.path.join(path, "layer0-output.npy"))
        array([2., 4.], dtype=float32)
        >>> shutil.rmtree(path)
    """
    if not isinstance(path, str) or not isinstance(label, str):
        raise TypeError(f"export_tensor: path and label must be str, got {type(path).__name__}, {type(label).__name__}")
    bind(export_tensor_p, value, path=path, label=label)
    return None


def _device_of(v: Any) -> DeviceRef:
    dev = getattr(v, "device", None)
    if dev is None:
        raise TypeError(f"assert_same_device: expected TensorValue or BufferValue, got {type(v).__name__}")
    return dev if isinstance(dev, DeviceRef) else DeviceRef.from_device(dev)


@front(name="assert_same_device")
def assert_same_device(*values: Any, **named_values: Any) -> None:
    """Raise ValueError unless every value lives on the same device.

    Example:
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> types = [TensorType(DType.float32, [2], DeviceRef.CPU()), TensorType(DType.float32, [2], DeviceRef.GPU())]
        >>> with Graph("g", input_types=types) as g:
        ...     x, w = g.inputs
        ...     ops.assert_same_device(x, x * 2)  # fine: both on the CPU
        ...     ops.assert_same_device(x, bias=w)
        Traceback (most recent call last):
            ...
        ValueError: assert_same_device: input values must be on the same device
            0: float32[2] on cpu:0
            bias: float32[2] on gpu:0
    """
    named = {**{str(i): v for i, v in enumerate(values)}, **named_values}
    devices = {k: _device_of(v) for k, v in named.items()}
    if len(set(devices.values())) > 1:
        lines = "\n".join(f"    {k}: {fmt(getattr(named[k], 'type', named[k]))} on {d}" for k, d in devices.items())
        raise ValueError(f"assert_same_device: input values must be on the same device\n{lines}")
    return None
