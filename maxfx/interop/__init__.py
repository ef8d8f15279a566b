"""Interoperability with other JAX libraries.

``maxfx.interop.flax`` moves parameters between maxfx ``experimental.nn``
Modules and ``flax.nnx`` modules or states. Submodules load on first use, so
importing ``maxfx.interop`` does not import flax.

Example:
    >>> import maxfx
    >>> maxfx.interop.flax.to_flax  # doctest: +ELLIPSIS
    <function to_flax at ...>
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBMODULES = ("flax",)

__all__ = list(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"maxfx.interop.{name}")
    raise AttributeError(f"module 'maxfx.interop' has no attribute {name!r}")
