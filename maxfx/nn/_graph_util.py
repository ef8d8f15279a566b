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


def shape_str(shape: Any) -> str:
    """``[2, 'seq', 8]``-style text for error messages (symbolic dims by name)."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def on_device(value: Any, device: DeviceRef) -> Any:
    """``value`` (a Weight or graph value) moved to ``device`` when it lives elsewhere; ``None`` (an absent bias) stays ``None``."""
    if value is None:
        return None
    return value if value.device == device else value.to(device)
