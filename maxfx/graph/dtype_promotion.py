"""MAX's dtype promotion of weak values (``max.graph.dtype_promotion``).

A *weak* value (a Python or numpy scalar, a numpy array, a driver `Buffer`)
has no dtype of its own in an op: it takes the dtype of the *strong* operand
(a graph value) and must convert without loss. A float converts to any float
dtype and to no integer dtype; an int converts when it lies in the dtype's
full-precision range, `_DTYPE_MIN_AND_MAX_FULL_PRECISION` (the whole range of
an int dtype; ``+-2**24`` for float32, ``+-2**11`` for float16...). The rule
itself is `lowering.dtypes.promote_weak`, which every binary op applies; this
module is MAX's entry point to it.

Example:
    >>> from maxfx.dtype import DType
    >>> from maxfx.graph import DeviceRef, Graph, dtype_promotion
    >>> with Graph("g"):
    ...     print(dtype_promotion._promote_to_strong(3, DType.float16, DeviceRef.CPU()).type)
    TensorType(dtype=float16, shape=[], device=cpu:0)
    >>> dtype_promotion._DTYPE_MIN_AND_MAX_FULL_PRECISION[DType.float32]
    (-16777216, 16777216)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowering.dtypes import _DTYPE_MIN_AND_MAX_FULL_PRECISION, DType, check_weak_array, promote_weak  # noqa: F401 - the table under MAX's name
from lowering.ops.core import constant
from lowering.types import DeviceRef, TensorType

__all__: list[str] = []


def _as_array(value: Any) -> np.ndarray | None:
    """``value`` as a numpy array if it is array data (numpy, a driver Buffer, DLPack); None for Python scalars."""
    if isinstance(value, (bool, int, float)):
        return None
    if hasattr(value, "to_numpy"):
        return np.asarray(value.to_numpy())
    return np.asarray(value)


def _promote_to_strong(value: Any, strong_dtype: DType, device: DeviceRef | Any) -> Any:
    """``value`` as a constant graph value of ``strong_dtype`` on ``device``, when MAX's rule allows it.

    A graph value is returned as is when it already has ``strong_dtype``.

    Raises:
        ValueError: "Unsafe cast: ..." when ``value`` does not convert without loss.
    """
    t = getattr(value, "type", None)
    if isinstance(t, TensorType):
        if t.dtype is not strong_dtype:
            raise ValueError(f"Unsafe cast: a {t.dtype} value is not weak; cast it to dtype({strong_dtype}) explicitly")
        return value
    arr = _as_array(value)
    if arr is None:
        promote_weak(strong_dtype, value)
        return constant(value, strong_dtype, device)
    check_weak_array(strong_dtype, arr)
    return constant(arr.astype(strong_dtype.to_numpy()), strong_dtype, device)
