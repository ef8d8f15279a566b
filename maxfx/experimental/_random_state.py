"""The process-wide random stream: a seed and a draw counter, folded into one key per draw.

Kept apart from `maxfx.experimental.random` so that `Tensor.randn` and the
random module draw from the same stream without importing each other.

Example:
    >>> from maxfx.experimental import _random_state as state
    >>> state.seed(7)
    >>> state.next_key().tolist(), state.next_key().tolist()
    ([7, 0], [7, 1])
"""

from __future__ import annotations

import itertools
import threading

import numpy as np

__all__ = ["seed", "next_key"]

_lock = threading.Lock()
_seed = 0
_counter = itertools.count()


def seed(value: int) -> None:
    """Restart the stream from ``value``: the n-th draw after ``seed(s)`` is always the same.

    Raises:
        ValueError: a seed outside ``[0, 2**32)``.
    """
    global _seed, _counter
    value = int(value)
    if not 0 <= value < 2**32:
        raise ValueError(f"random.seed: seed must be in [0, 2**32), got {value}")
    with _lock:
        _seed = value
        _counter = itertools.count()


def next_key() -> np.ndarray:
    """The key of the next draw: ``[seed, counter]`` as uint32."""
    with _lock:
        n = next(_counter)
    return np.array([_seed, n % 2**32], np.uint32)
