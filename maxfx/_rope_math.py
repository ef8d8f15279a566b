"""Rotary-embedding math shared by the RoPE layers of both module APIs.

Example:
    >>> default_inv_freq(10000.0, 4).tolist()
    [1.0, 0.01]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.rope_math import rotate_pairs
from maxfx.graph import ops

__all__ = ["apply_rope", "default_inv_freq", "rope_cos_sin", "rotate_by_table"]


def apply_rope(x: Any, cos: Any, sin: Any, *, interleaved: bool) -> Any:
    """Rotate the pairs of ``x``'s last dim (``head_dim``) by the angles whose cos/sin are given.

    Args:
        x: ``[..., head_dim]`` (e.g. ``[batch, seq, heads, head_dim]``); the result has its shape and
            dtype. The arithmetic is float32 whatever ``x``'s dtype, as in the ``rope_ragged``
            kernel: both are `lowering.rope_math.rotate_pairs`.
        cos, sin: ``[..., head_dim // 2]``, broadcastable against ``x[..., :head_dim // 2]``.
        interleaved: rotate pairs ``(2i, 2i + 1)`` (GPT-J/Meta layout); False rotates
            ``(i, i + head_dim / 2)`` (Hugging Face's ``rotate_half`` layout).

    Example:
        >>> cos, sin = rope_cos_sin(positions, inv_freq)  # doctest: +SKIP
        >>> q = apply_rope(q, ops.unsqueeze(cos, 2), ops.unsqueeze(sin, 2), interleaved=False)  # doctest: +SKIP
    """
    return rotate_pairs(x, cos, sin, interleaved=interleaved, xp=_GRAPH_ARRAYS)


def rotate_by_table(x: Any, table: Any, start: Any, length: Any, *, interleaved: bool) -> Any:
    """`apply_rope` of a ``[batch, seq, heads, head_dim]`` ``x`` by rows ``start ... start + length - 1`` of a
    ``(L, head_dim // 2, 2)`` table of ``[cos, sin]`` pairs (both RoPE layers' table layout).
    """
    rows = table[start : start + length]  # [seq, d/2, 2]
    cos = ops.unsqueeze(rows[:, :, 0], 1)  # [seq, 1, d/2]: broadcasts over batch and heads
    sin = ops.unsqueeze(rows[:, :, 1], 1)
    return apply_rope(x, cos, sin, interleaved=interleaved)


def rope_cos_sin(positions: Any, inv_freq: Any) -> tuple[Any, Any]:
    """cos and sin of the angles ``positions[..., None] * inv_freq``: float32 ``[*positions.shape, len(inv_freq)]``.

    Written over ``maxfx.graph.ops``, so ``positions`` and ``inv_freq`` may be
    graph values, eager Tensors or traced Tensors (any int or float dtype).
    """
    angles = ops.unsqueeze(ops.cast(positions, DType.float32), -1) * inv_freq
    return ops.cos(angles), ops.sin(angles)


class _GraphArrays:
    """`lowering.rope_math.RopeArrays` over graph values and Tensors (``maxfx.graph.ops``)."""

    def to_float32(self, x: Any) -> Any:
        return x if x.dtype == DType.float32 else ops.cast(x, DType.float32)

    def cast(self, x: Any, dtype: DType) -> Any:
        return x if x.dtype == dtype else ops.cast(x, dtype)

    def split_interleaved(self, x: Any) -> tuple[Any, Any]:
        pairs = ops.as_interleaved_complex(x)
        return pairs[..., 0], pairs[..., 1]

    def join_interleaved(self, re: Any, im: Any, like: Any) -> Any:
        return ops.reshape(ops.stack([re, im], axis=-1), like.shape)

    def concat_last(self, parts: list[Any]) -> Any:
        return ops.concat(parts, axis=-1)

    def last_dim(self, x: Any) -> int:
        return int(x.shape[-1])


_GRAPH_ARRAYS = _GraphArrays()


def default_inv_freq(theta: float, rope_dim: int) -> np.ndarray:
    """``[rope_dim // 2]`` float64 ``theta ** (-2i / rope_dim)`` (host-side, for the scaled variants and
    `maxfx.models`).
    """
    return 1.0 / float(theta) ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
