"""``max.experimental.torch``: dtype conversion between PyTorch and MAX (needs torch installed).

MAX's module also runs Mojo custom ops and MAX graphs as PyTorch ops
(``CustomOpLibrary``, ``graph_op``); maxfx does not provide those (no Mojo
compiler; custom ops here are Python/JAX functions, ``maxfx.graph.ops.custom``).
Eager Tensors exchange data with torch through DLPack (``Tensor.from_dlpack``,
``torch.from_dlpack``).

Example:
    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> from maxfx.dtype import DType
    >>> torch_dtype_to_max(torch.bfloat16), max_dtype_to_torch(DType.int8)
    (<DType.bfloat16: 80>, torch.int8)
"""

from __future__ import annotations

from typing import Any

from lowering.dtypes import DType

__all__ = ["max_dtype_to_torch", "torch_dtype_to_max"]


def max_dtype_to_torch(dtype: DType) -> Any:
    """The ``torch.dtype`` of a MAX `DType`.

    Raises:
        ValueError: torch has no such dtype.
        ImportError: torch is not installed.
    """
    if not isinstance(dtype, DType):
        raise ValueError(f"unsupported MAX DType to convert to torch: {dtype!r}")
    return dtype.to_torch()


def torch_dtype_to_max(dtype: Any) -> DType:
    """The MAX `DType` of a ``torch.dtype``.

    Raises:
        ValueError: MAX has no such dtype.
        ImportError: torch is not installed.
    """
    return DType.from_torch(dtype)
