"""Default dtype and device of eager tensors, and the context managers that change them.

MAX's rule: the default device is the first accelerator if there is one, else
the CPU; the default dtype is float32 on the CPU and bfloat16 on an
accelerator. Set ``MAXFX_DEFAULT_DEVICE=cpu`` to keep eager tensors on the CPU
of a GPU machine (the guide's expected outputs assume a CPU).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import Any

from lowering.dtypes import DType
from maxfx.driver import CPU, Accelerator, Device, accelerator_count
from maxfx.driver._device import as_device

__all__ = ["defaults", "default_device", "default_dtype", "defaults_like", "contextvar_context"]

_DEVICE: contextvars.ContextVar[Device | None] = contextvars.ContextVar("maxfx_default_device", default=None)
_DTYPE: contextvars.ContextVar[DType | None] = contextvars.ContextVar("maxfx_default_dtype", default=None)


@contextlib.contextmanager
def contextvar_context(var: contextvars.ContextVar, value: Any) -> Iterator[None]:
    """Set the ContextVar ``var`` to ``value`` for the ``with`` block.

    Example:
        >>> import contextvars
        >>> v = contextvars.ContextVar("v", default=1)
        >>> with contextvar_context(v, 2):
        ...     v.get()
        2
    """
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def _machine_default_device() -> Device:
    forced = os.environ.get("MAXFX_DEFAULT_DEVICE", "").strip().lower()
    if forced in ("cpu", "host"):
        return CPU()
    if forced.startswith(("gpu", "accelerator")):
        _, _, idx = forced.partition(":")
        return Accelerator(int(idx or 0))
    if forced:
        raise ValueError(f"MAXFX_DEFAULT_DEVICE={forced!r}: expected 'cpu', 'gpu' or 'gpu:N'")
    return Accelerator() if accelerator_count() > 0 else CPU()


def defaults(dtype: DType | None = None, device: Device | None = None) -> tuple[DType, Device]:
    """The (dtype, device) a new tensor gets when ``dtype``/``device`` are None.

    Example:
        >>> from maxfx.experimental.tensor import defaults
        >>> defaults()  # doctest: +SKIP
        (<DType.float32: 81>, CPU())
    """
    if device is None:
        device = _DEVICE.get() or _machine_default_device()
    else:
        device = as_device(device, "defaults")
    if dtype is None:
        dtype = _DTYPE.get() or (DType.float32 if device.is_host else DType.bfloat16)
    elif not isinstance(dtype, DType):
        raise TypeError(f"defaults: dtype must be a DType, got {type(dtype).__name__}")
    return dtype, device


def default_device(device: Device) -> contextlib.AbstractContextManager[None]:
    """Context manager: tensors created inside without ``device=`` go to ``device``.

    Example:
        >>> from maxfx.driver import CPU
        >>> from maxfx.experimental.tensor import Tensor, default_device
        >>> with default_device(CPU()):
        ...     Tensor.zeros([2]).device
        CPU()
    """
    return contextvar_context(_DEVICE, as_device(device, "default_device"))


def default_dtype(dtype: DType) -> contextlib.AbstractContextManager[None]:
    """Context manager: tensors created inside without ``dtype=`` get ``dtype``.

    Example:
        >>> from maxfx.dtype import DType
        >>> from maxfx.experimental.tensor import Tensor, default_dtype
        >>> with default_dtype(DType.float16):
        ...     Tensor.ones([2]).dtype
        <DType.float16: 79>
    """
    if not isinstance(dtype, DType):
        raise TypeError(f"default_dtype: expected a DType, got {type(dtype).__name__}")
    return contextvar_context(_DTYPE, dtype)


def _default_device() -> Device:
    """The device a new tensor gets without ``device=`` (MAX's private helper, used by its tests)."""
    return defaults()[1]


def _default_dtype(device: Device | None = None) -> DType:
    """The dtype a new tensor on ``device`` gets without ``dtype=`` (MAX's private helper)."""
    return defaults(None, device)[0]


@contextlib.contextmanager
def defaults_like(like: Any) -> Iterator[None]:
    """Context manager: new tensors take the dtype and device of ``like`` (a Tensor or TensorType).

    Example:
        >>> from maxfx.dtype import DType
        >>> from maxfx.experimental.tensor import Tensor, defaults_like
        >>> with defaults_like(Tensor.zeros([1], dtype=DType.float64)):
        ...     Tensor.ones([2]).dtype
        <DType.float64: 82>
    """
    t = getattr(like, "type", like)
    dtype, device = getattr(t, "dtype", None), getattr(t, "device", None)
    if not isinstance(dtype, DType) or device is None:
        raise TypeError(f"defaults_like: expected a Tensor or TensorType, got {type(like).__name__}")
    device = device.to_device() if hasattr(device, "to_device") else as_device(device, "defaults_like")
    with contextvar_context(_DEVICE, device), contextvar_context(_DTYPE, dtype):
        yield
