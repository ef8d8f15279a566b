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

_SUBMODULES = (
    "dtype",
    "driver",
    "graph",
    "engine",
    "experimental",
    "tensor",
    "functional",
    "random",
    "nn",
    "models",
    "distributed",
)

# Transformations and training helpers (issue 6): name -> module defining it, loaded on first use.
_LAZY = {
    name: "maxfx._transforms" for name in ("jit", "grad", "value_and_grad", "vmap", "checkpoint", "remat", "scan")
} | {"optim": "maxfx.optim"}
# Export, sharding and interop (issue 6).
_LAZY |= {
    "export": "maxfx._export",
    "load_exported": "maxfx._artifact",
    "ArtifactError": "maxfx._artifact",
    "shard": "maxfx._sharding",
    "make_mesh": "maxfx._sharding",
    "interop": "maxfx.interop",
}

# Checkpoints through Orbax (issue 18).
_LAZY |= {"save": "maxfx._checkpoint", "restore": "maxfx._checkpoint"}

# Scalar losses and all-axis reductions (issue 18).
_LAZY |= {"losses": "maxfx.losses"}

# The errors ops raise (issue 35): catch them as ``maxfx.OpError`` & co. without reaching into lowering.
_LAZY |= {
    "OpError": "lowering.registry",  # an op rejected its inputs (a ValueError)
    "AxisError": "lowering.ops._rules",  # an axis out of range (an OpError and an IndexError)
    "IndexOpError": "lowering.ops._indexing_util",  # a bad index (an OpError and an IndexError)
    "DataDependentShapeError": "lowering.ops.advanced_indexing",  # a shape that depends on values (an IndexOpError)
}

__all__ = list(_SUBMODULES) + list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"maxfx.{name}")
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        return module if module.__name__ == f"maxfx.{name}" else getattr(module, name)
    raise AttributeError(f"module 'maxfx' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBMODULES) | set(_LAZY))
