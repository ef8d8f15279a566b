"""`subgraphable` modules: each call inside a graph becomes a call of one shared subgraph.

A module marked with ``subgraphable`` (MAX's ``max.experimental.nn.subgraphable``)
is traced once per distinct structure into a subgraph of the graph being built;
every later call with the same structure (same class, static fields, parameter
and input types, static arguments) or the same ``name`` calls that subgraph
again. The module's parameters are passed to the subgraph as arguments, so
blocks with different weights share it, and the compiled graph builds one
executable for the subgraph (``lowering.piecewise``): compile time stops
growing with the number of blocks. Kernel fusion does not cross the boundary.
"""

from __future__ import annotations

from typing import Any

import jax

from maxfx.experimental._tensor import Tensor
from maxfx.graph import Graph, ops

__all__ = ["call_as_subgraph", "in_graph_call"]


def in_graph_call(args: tuple, kwargs: dict) -> bool:
    """Whether a call's Tensor arguments are values of a graph being built (not eager data)."""
    return any(isinstance(a, Tensor) and a._gv is not None for a in (*args, *kwargs.values()))


def _static_key(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return ("repr", repr(value))
    return value


def call_as_subgraph(module: Any, name: str | None, args: tuple, kwargs: dict) -> Any:
    """``module(*args, **kwargs)`` as a call of the shared subgraph for its structure (or ``name``)."""
    graph = Graph.current
    keys = sorted(kwargs)
    values = [*args, *(kwargs[k] for k in keys)]
    slots = [i for i, v in enumerate(values) if isinstance(v, Tensor)]
    statics = tuple((i, _static_key(v)) for i, v in enumerate(values) if not isinstance(v, Tensor))
    params = list(module.parameters)
    input_types = [values[i]._gv.type if values[i]._gv is not None else values[i].type for i in slots]
    param_types = [t.type if t._gv is None else t._gv.type for _, t in params]
    structure = (type(module), jax.tree_util.tree_structure(module)) if name is None else ("name", name)
    key = (
        structure,
        len(args),
        tuple(keys),
        statics,
        tuple(map(str, input_types)),
        tuple((n, str(t)) for (n, _), t in zip(params, param_types)),
    )
    cache = graph.__dict__.setdefault("_subgraphable_calls", {})
    entry = cache.get(key)
    if entry is None:
        label = name or type(module).__name__
        sub = graph.add_subgraph(f"{label}_{len(cache)}", input_types=[*input_types, *param_types])
        with sub:
            inner = [Tensor.from_graph_value(v) for v in sub.inputs]
            bound = list(values)
            for i, t in zip(slots, inner):
                bound[i] = t
            weights = dict(zip((n for n, _ in params), inner[len(slots) :]))
            body = module.map_parameters(lambda n, _: weights[n])
            out = body.forward(*bound[: len(args)], **dict(zip(keys, bound[len(args) :])))
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            if not all(isinstance(o, Tensor) and o._gv is not None for o in outs):
                raise TypeError(
                    f"subgraphable {label}: forward must return a graph Tensor or a tuple of them, got "
                    f"{type(out).__name__}"
                )
            sub.output(*[o._gv for o in outs])
        entry = cache[key] = (sub, isinstance(out, (tuple, list)), type(out))
    sub, is_seq, seq_type = entry
    results = [Tensor.from_graph_value(v) for v in ops.call(sub, *[values[i] for i in slots], *[t for _, t in params])]
    return (tuple(results) if seq_type is tuple else list(results)) if is_seq else results[0]
