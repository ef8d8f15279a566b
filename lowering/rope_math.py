"""The rotary-embedding rotation, written once for JAX arrays and graph values.

``rotate_pairs`` is the one definition of RoPE's arithmetic: the ``rope_ragged``
kernel (`lowering.ops.attention`, over JAX arrays) and the RoPE layers of both
module APIs (`maxfx._rope_math.apply_rope`, over graph values / Tensors) call
it with their own `RopeArrays` namespace. It computes in float32 whatever the
input dtype (bfloat16 inputs included) and casts the result back to the
input's dtype, so the eager, graph and kernel paths give the same numbers.

Example:
    >>> import numpy as np
    >>> x = np.array([[1.0, 0.0]], np.float32)
    >>> rotate_pairs(x, np.zeros((1, 1), np.float32), np.ones((1, 1), np.float32), interleaved=True,
    ...     xp=JAX_ARRAYS).tolist()
    [[0.0, 1.0]]
"""

from __future__ import annotations

from typing import Any, Protocol

import jax.numpy as jnp

__all__ = ["RopeArrays", "JAX_ARRAYS", "rotate_pairs"]


class RopeArrays(Protocol):
    """The few array operations `rotate_pairs` needs beyond ``+ - *`` and ``[..., a:b]``."""

    def to_float32(self, x: Any) -> Any: ...
    def cast(self, x: Any, dtype: Any) -> Any: ...
    def split_interleaved(self, x: Any) -> tuple[Any, Any]: ...  # [..., D] -> ([..., D/2] even, [..., D/2] odd)
    def join_interleaved(self, re: Any, im: Any, like: Any) -> Any: ...  # the inverse, shaped like ``like``
    def concat_last(self, parts: list[Any]) -> Any: ...
    def last_dim(self, x: Any) -> int: ...


class _JaxArrays:
    def to_float32(self, x):
        return jnp.asarray(x).astype(jnp.float32)

    def cast(self, x, dtype):
        return x.astype(dtype)

    def split_interleaved(self, x):
        return x[..., 0::2], x[..., 1::2]

    def join_interleaved(self, re, im, like):
        return jnp.stack([re, im], axis=-1).reshape(like.shape)

    def concat_last(self, parts):
        return jnp.concatenate(parts, axis=-1)

    def last_dim(self, x):
        return int(x.shape[-1])


JAX_ARRAYS: RopeArrays = _JaxArrays()
"""`RopeArrays` over JAX (and numpy) arrays."""


def rotate_pairs(x: Any, cos: Any, sin: Any, *, interleaved: bool, xp: RopeArrays) -> Any:
    """Rotate the pairs of ``x [..., D]`` by the angles whose ``cos``/``sin [..., D/2]`` are given.

    The arithmetic is float32 (``x``, ``cos`` and ``sin`` are cast up first) and
    the result has ``x``'s shape and dtype. ``interleaved`` rotates pairs
    ``(2i, 2i + 1)`` (GPT-J/Meta layout); otherwise ``(i, i + D/2)`` (Hugging
    Face's ``rotate_half`` layout).
    """
    dtype = x.dtype
    xf, cos, sin = xp.to_float32(x), xp.to_float32(cos), xp.to_float32(sin)
    if interleaved:
        re, im = xp.split_interleaved(xf)
    else:
        half = xp.last_dim(xf) // 2
        re, im = xf[..., :half], xf[..., half:]
    out_re, out_im = re * cos - im * sin, re * sin + im * cos
    out = xp.join_interleaved(out_re, out_im, xf) if interleaved else xp.concat_last([out_re, out_im])
    return xp.cast(out, dtype)
