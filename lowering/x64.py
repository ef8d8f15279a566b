"""Scoped 64-bit mode.

MAX has int64/uint64/float64 tensors (argmax results, token ids, ``int / int``);
JAX only keeps them with ``jax_enable_x64``. maxfx turns it on around its own
tracing, compiling and executing instead of flipping the user's global config.
"""

from __future__ import annotations

import jax

__all__ = ["x64"]


def x64():
    """Context manager enabling 64-bit types for the enclosed JAX work."""
    return jax.enable_x64(True)
