"""``max.experimental.nn.dropout``: `Dropout`.

As in MAX, ``Dropout(p)(x)`` is ``x`` unchanged: inference, MAX's use, needs
no dropout. maxfx also trains, so a call given a JAX PRNG key
(``layer(x, key=key)``) drops each element with probability ``p`` and scales
the kept ones by ``1 / (1 - p)`` — the same key gives the same mask, under
``jax.jit`` and ``jax.grad`` too (Equinox's convention: randomness is an
argument, not module state).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from maxfx.experimental.functional import where
from maxfx.experimental.nn.module import Module
from maxfx.experimental.tensor import Tensor

__all__ = ["Dropout"]


class Dropout(Module):
    """Zero elements with probability ``p`` when called with a PRNG ``key``; the identity otherwise.

    Args:
        p: probability of zeroing an element, in ``[0, 1)``.

    Raises:
        ValueError: ``p`` is outside ``[0, 1)``.

    Example:
        >>> import jax
        >>> from maxfx.experimental.tensor import Tensor
        >>> layer = Dropout(0.5)
        >>> x = Tensor.ones([2, 4])
        >>> layer(x).to_numpy().tolist()                        # inference: unchanged
        [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
        >>> sorted(set(layer(x, key=jax.random.key(0)).to_numpy().ravel().tolist()))  # training: 0 or 1/(1-p)
        [0.0, 2.0]
    """

    def __init__(self, p: float = 0.5) -> None:
        if isinstance(p, bool) or not isinstance(p, (int, float, np.floating)) or not 0.0 <= float(p) < 1.0:
            raise ValueError(f"Dropout: p must be a probability in [0, 1), got {p!r}")
        self.p = float(p)

    def forward(self, x: Tensor, *, key: Any = None) -> Tensor:
        """``x`` unchanged without ``key`` (MAX); with a JAX PRNG ``key``, inverted dropout."""
        if key is None or self.p == 0.0:
            return x
        keep = jax.random.bernoulli(key, 1.0 - self.p, tuple(int(d) for d in x.shape))
        return where(keep, x * (1.0 / (1.0 - self.p)), 0.0)  # a JAX array (or tracer) is typed eager data
