"""Op families. Importing this package registers every op.

One file per family; each op is one `OpDef` + one front (see `lowering.registry`).
"""

from lowering.ops import core  # noqa: F401  (constant, cast, weight)

# Families register on import; keep this list in dependency order.
import importlib as _importlib

for _family in (
    "elementwise",
    "reduction",
    "shape",
    "indexing",
    "creation",
    "linalg",
    "nn",
    "control_flow",
    "buffer",
    "custom",
    "debug",
    "quantized",
    "collective",
):
    try:
        _importlib.import_module(f"lowering.ops.{_family}")
    except ModuleNotFoundError as _e:
        if _e.name != f"lowering.ops.{_family}":
            raise
