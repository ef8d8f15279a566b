"""Pallas, imported when a kernel is first traced instead of when maxfx loads.

``jax.experimental.pallas`` and its Triton backend take about a quarter of a
second to import (they load the Triton and Mosaic MLIR dialects), and a CPU
program never traces a Pallas kernel. The kernel modules therefore bind these
stand-ins: the first attribute read (inside a kernel body, at trace time)
imports the real module, and every read after that is forwarded to it.

Example:
    >>> from custom_calls._pallas import pl
    >>> pl.cdiv(10, 4)  # imports jax.experimental.pallas here
    3
"""

from __future__ import annotations

import importlib
import types
from typing import Any

__all__ = ["pl", "pltriton"]


class _Deferred(types.ModuleType):
    """Stands for module ``name`` and imports it on first attribute access."""

    def __init__(self, name: str):
        super().__init__(name)
        self._module: types.ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        module = self.__dict__.get("_module")
        if module is None:
            module = importlib.import_module(self.__name__)
            self.__dict__["_module"] = module
        return getattr(module, attr)


pl: Any = _Deferred("jax.experimental.pallas")
pltriton: Any = _Deferred("jax.experimental.pallas.triton")
