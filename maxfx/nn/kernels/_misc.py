"""Small kernels of ``max.nn.kernels``: ``swish_glu``, ``scatter_set_constant``, ``merge_ragged_tensors``.

Example:
    >>> from maxfx.nn import kernels
    >>> callable(kernels.swish_glu)
    True
"""

from __future__ import annotations

from typing import Any

from lowering.dtypes import DType
from maxfx.graph import ops

__all__ = ["swish_glu", "scatter_set_constant", "merge_ragged_tensors"]


def swish_glu(a: Any, b0: Any, b1: Any) -> Any:
    """``silu(a @ b0.T) * (a @ b1.T)`` with ``b0``, ``b1`` of shape ``[N, K]``.

    Example:
        >>> y = swish_glu(x, gate_w, up_w)  # doctest: +SKIP
    """
    a, b0, b1 = (ops.constant(v, None, None) if getattr(v, "type", None) is None else v for v in (a, b0, b1))
    if b0.rank != 2 or b1.rank != 2 or list(b0.shape) != list(b1.shape) or b0.shape[1] != a.shape[-1]:
        raise ValueError(f"swish_glu: b0 and b1 must both be [N, {a.shape[-1]}], got {list(b0.shape)} and {list(b1.shape)}")
    return ops.silu(a @ b0.T) * (a @ b1.T)


def scatter_set_constant(data: Any, indices: Any, fill_val: float) -> None:
    """Set ``data[i, j] = fill_val`` for every row ``(i, j)`` of ``indices [K, 2]`` in the 2d buffer ``data``.

    Example:
        >>> scatter_set_constant(mask_buf, positions, float("-inf"))  # doctest: +SKIP
    """
    if getattr(data, "rank", None) != 2 or type(getattr(data, "type", None)).__name__ != "BufferType":
        raise ValueError(f"scatter_set_constant: data must be a 2d BufferValue, got {getattr(data, 'type', data)!r}")
    if indices.rank != 2 or indices.shape[1] != 2:
        raise ValueError(f"scatter_set_constant: indices must be [K, 2] (row, column) pairs, got {indices.dtype.name}{list(indices.shape)}")
    if indices.dtype not in (DType.int32, DType.int64):
        indices = indices.cast(DType.int64)
    fill = ops.broadcast_to(ops.constant(fill_val, data.dtype, data.device).reshape([1]), [indices.shape[0]])
    ops.buffer_store(data, ops.scatter_nd(ops.buffer_load(data), fill, indices))


def merge_ragged_tensors(a: Any, a_row_offsets: Any, b: Any, b_row_offsets: Any) -> tuple[Any, Any]:
    """Interleave two ragged batches sequence by sequence; returns ``(merged, merged_row_offsets)``.

    Example (seed 002): ``a = [1..6]``, offsets ``[0, 2, 6]``; ``b = [7..10]``,
    offsets ``[0, 3, 4]`` → ``[1, 2, 7, 8, 9, 3, 4, 5, 6, 10]``, ``[0, 5, 10]``.

        >>> merged, offsets = merge_ragged_tensors(a, ao, b, bo)  # doctest: +SKIP
    """
    merged, offsets = ops.merge_ragged_tensors(a, a_row_offsets, b, b_row_offsets)
    return merged, offsets
