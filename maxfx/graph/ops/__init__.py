"""Graph ops: every op of the registry, with MAX's signatures.

Each function records a node into the graph that owns its inputs (or the
active ``Graph``) and returns `TensorValue`s. The functions are the fronts
registered in ``lowering.registry``; nothing here defines op math.

Example:
    >>> from maxfx.graph import Graph, TensorType, ops
    >>> from maxfx.dtype import DType
    >>> with Graph("g", input_types=[TensorType(DType.float32, [3])]) as g:
    ...     g.output(ops.relu(g.inputs[0]))
"""

from collections.abc import Callable  # noqa: F401  (documented as ops.Callable)

import lowering.ops as _families  # noqa: F401  (registers every op)
from lowering.registry import fronts as _fronts
from lowering.types import DeviceRef, InterpolationMode, TensorType  # noqa: F401  (documented re-exports)

globals().update(_fronts())

__all__ = sorted(_fronts()) + ["Callable", "DeviceRef", "TensorType", "InterpolationMode"]
