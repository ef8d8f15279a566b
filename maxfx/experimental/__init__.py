"""Eager tensors, the functional API, random tensors and (later) Modules.

Submodules load on first use: ``maxfx.experimental.tensor``, ``.functional``,
``.random``, ``.nn``, ``.sharding``; ``Tensor`` is re-exported here.

Example:
    >>> from maxfx.experimental import Tensor, functional as F
    >>> print(F.relu(Tensor([-1.0, 2.0])))
    TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [0.0, 2.0]
"""

from __future__ import annotations

import importlib
from typing import Any

from maxfx.experimental._tensor import Tensor

_SUBMODULES = ("tensor", "functional", "random", "nn", "sharding")

__all__ = ["Tensor", *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"maxfx.experimental.{name}")
    raise AttributeError(f"module 'maxfx.experimental' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
