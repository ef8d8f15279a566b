"""maxfx: the Modular MAX Python API on JAX.

Submodules load on first use so that ``import maxfx`` stays cheap:
``maxfx.dtype``, ``maxfx.driver``, ``maxfx.graph``, ``maxfx.engine``, ...

Example:
    >>> import maxfx
    >>> maxfx.dtype.DType.float32
    <DType.float32: 81>
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBMODULES = ("dtype", "driver", "graph", "engine", "experimental", "tensor", "functional", "random", "nn")

__all__ = list(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"maxfx.{name}")
    raise AttributeError(f"module 'maxfx' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBMODULES))
