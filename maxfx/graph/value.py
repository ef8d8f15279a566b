"""Graph values (``max.graph.value``): `Value`, `TensorValue`, `BufferValue` and
the type aliases of what converts to a tensor value.

``BufferValueLike`` is a `BufferValue` or an object converting itself to one
(``__buffervalue__()``, MAX's ``HasBufferValue``).

``TensorValueLike`` is anything an op accepts where it expects a tensor: a graph
value, a `Weight`, a `Shape` or `Dim`, an array (numpy or DLPack), or a Python /
numpy scalar. The *strong* ones carry their own dtype; Python scalars are *weak*
(they take the dtype of the other operand).

Example:
    >>> import numpy as np
    >>> from maxfx.graph.value import _is_strong_tensor_value_like
    >>> _is_strong_tensor_value_like(np.ones(3)), _is_strong_tensor_value_like(1.0)
    (True, False)
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from lowering.dims import Dim, Shape
from maxfx.graph._value import BufferValue, TensorValue, Value

__all__ = [
    "BufferValue",
    "BufferValueLike",
    "HasBufferValue",
    "HasTensorValue",
    "Numeric",
    "StrongTensorValueLike",
    "TensorValue",
    "TensorValueLike",
    "Value",
]


@runtime_checkable
class HasTensorValue(Protocol):
    """An object that converts itself to a `TensorValue` (``__tensorvalue__()``)."""

    def __tensorvalue__(self) -> TensorValue: ...


@runtime_checkable
class HasBufferValue(Protocol):
    """An object that converts itself to a `BufferValue` (``__buffervalue__()``), where an op takes a buffer."""

    def __buffervalue__(self) -> BufferValue: ...


@runtime_checkable
class DLPackArray(Protocol):
    """An array exchangeable through DLPack (numpy, driver `Buffer`, torch, ...)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...

    def __dlpack_device__(self) -> Any: ...


Numeric = int | float | np.integer | np.floating | np.ndarray
"""Python and numpy numbers and arrays (constants an op converts)."""

StrongTensorValueLike = TensorValue | Shape | Dim | HasTensorValue | DLPackArray | np.ndarray
"""Tensor-like values with a dtype of their own."""

TensorValueLike = StrongTensorValueLike | int | float | np.integer | np.floating
"""Anything an op converts to a tensor value (Python scalars are weakly typed)."""


BufferValueLike = BufferValue | HasBufferValue
"""What an op accepts where it writes or reads a buffer: a `BufferValue`, or an object that converts itself to one."""


def _is_strong_tensor_value_like(obj: Any) -> bool:
    """True if ``obj`` converts to a tensor value with a dtype of its own.

    A graph `Value` counts only if its type is a tensor (a buffer is not).
    """
    if isinstance(obj, Value):
        return isinstance(obj, TensorValue)
    return isinstance(obj, (Shape, Dim, np.ndarray, HasTensorValue, DLPackArray))


def _is_tensor_value_like(obj: Any) -> bool:
    """True if ``obj`` converts to a tensor value (strong, or a weak Python/numpy scalar)."""
    if isinstance(obj, bool):
        return True
    return _is_strong_tensor_value_like(obj) or isinstance(obj, (int, float, np.integer, np.floating))
