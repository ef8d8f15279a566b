"""Rotary-embedding math shared by the RoPE layers of both module APIs.

Example:
    >>> default_inv_freq(10000.0, 4).tolist()
    [1.0, 0.01]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maxfx.graph import ops

__all__ = ["apply_rope", "default_inv_freq"]


def apply_rope(x: Any, cos: Any, sin: Any, *, interleaved: bool) -> Any:
    """Rotate the pairs of ``x``'s last dim (``head_dim``) by the angles whose cos/sin are given.

    Args:
        x: ``[..., head_dim]`` (e.g. ``[batch, seq, heads, head_dim]``); the result has its shape and dtype.
        cos, sin: ``[..., head_dim // 2]``, broadcastable against ``x[..., :head_dim // 2]``.
        interleaved: rotate pairs ``(2i, 2i + 1)`` (GPT-J/Meta layout); False rotates
            ``(i, i + head_dim / 2)`` (Hugging Face's ``rotate_half`` layout).

    Example:
        >>> cos, sin = rope_cos_sin(positions, inv_freq)  # doctest: +SKIP
        >>> q = apply_rope(q, ops.unsqueeze(cos, 2), ops.unsqueeze(sin, 2), interleaved=False)  # doctest: +SKIP
    """
    if cos.dtype != x.dtype:
        cos, sin = ops.cast(cos, x.dtype), ops.cast(sin, x.dtype)
    if interleaved:
        pairs = ops.as_interleaved_complex(x)
        re, im = pairs[..., 0], pairs[..., 1]
    else:
        half = int(x.shape[-1]) // 2
        re, im = x[..., :half], x[..., half:]
    out_re, out_im = re * cos - im * sin, re * sin + im * cos
    if interleaved:
        return ops.reshape(ops.stack([out_re, out_im], axis=-1), x.shape)
    return ops.concat([out_re, out_im], axis=-1)


def default_inv_freq(theta: float, rope_dim: int) -> np.ndarray:
    """``[rope_dim // 2]`` float64 ``theta ** (-2i / rope_dim)`` (host-side, for the scaled variants and `maxfx.models`)."""
    return 1.0 / float(theta) ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
