"""Small helpers shared by the graph-API layers of this package (no op math here)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops


def as_value(x: Any) -> Any:
    """A graph `TensorValue` for a value, Weight or array (arrays become CPU constants)."""
    if hasattr(x, "type"):
        return getattr(x, "tensor", x)
    arr = np.asarray(x)
    return ops.constant(arr, DType.from_numpy(arr.dtype), DeviceRef.CPU())


def device_ref(device: Any) -> DeviceRef:
    """A layer's ``device`` argument as a graph `DeviceRef` (a driver Device or DeviceRef; None: the CPU)."""
    return DeviceRef.from_device(device) if device is not None else DeviceRef.CPU()


def on_device(value: Any, device: DeviceRef) -> Any:
    """``value`` (a Weight or graph value) moved to ``device`` when it lives elsewhere; ``None`` (an absent bias) stays
    ``None``.
    """
    if value is None:
        return None
    return value if value.device == device else value.to(device)
