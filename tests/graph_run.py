"""Build a graph, load it in an `InferenceSession`, execute it: the one helper the graph-API tests share.

``run_graph(fn, *arrays)`` is the common case: a graph whose inputs have the
arrays' types (or ``types``) and whose outputs are ``fn(*inputs)``, run on the
arrays. ``execute(graph, *inputs)`` runs a graph a test built itself. Both
return every output as a numpy array, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, Graph, TensorType


def tensor_types(*arrays: np.ndarray, device: Any = None) -> list[TensorType]:
    """One TensorType per array: its dtype and static shape (on ``device``, default the CPU)."""
    return [TensorType(DType.from_numpy(a.dtype), list(a.shape), device) for a in arrays]


def execute(graph: Graph, *inputs: Any, weights: Mapping[str, Any] | None = None) -> list[np.ndarray]:
    """The outputs of ``graph`` run on ``inputs``, with ``weights`` as its weights registry."""
    model = InferenceSession().load(graph, weights_registry=weights)
    return [o.to_numpy() for o in model.execute(*inputs)]


def run_graph(
    fn: Callable[..., Any],
    *arrays: Any,
    types: Sequence[TensorType | BufferType] | None = None,
    weights: Mapping[str, Any] | None = None,
    name: str = "graph",
) -> list[np.ndarray]:
    """The outputs of ``fn`` applied to a graph's inputs (buffer values for `BufferType` inputs), run on ``arrays``.

    ``fn`` returns one value or a list/tuple of them; ``types`` defaults to the arrays' own.
    """
    types = list(tensor_types(*arrays) if types is None else types)
    with Graph(name, input_types=types) as g:
        out = fn(*[v.buffer if isinstance(t, BufferType) else v.tensor for v, t in zip(g.inputs, types)])
        g.output(*(out if isinstance(out, (list, tuple)) else [out]))
    return execute(g, *arrays, weights=weights)
