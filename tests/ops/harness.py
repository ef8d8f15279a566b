"""Helpers for the op test table: run one graph op on numpy inputs.

``run_op(fn, *arrays, **kwargs)`` builds a Graph whose inputs have the arrays'
types, applies ``fn`` to the input values (plus ``kwargs``), compiles it with an
`InferenceSession` and returns the outputs as numpy arrays. Tests compare those
against numpy, never against maxfx itself.

Each registered op has a record in ``tests/ops/op_table.py`` naming the
module here that tests it; ``tests/ops/test_registry_coverage.py`` fails on an
op without one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import Graph, TensorType
from tests.graph_run import execute

_SESSION = None


def session() -> InferenceSession:
    global _SESSION
    if _SESSION is None:
        _SESSION = InferenceSession()
    return _SESSION


def tensor_type(a: np.ndarray, symbolic: Sequence[str | None] | None = None) -> TensorType:
    """The TensorType of ``a``; ``symbolic[i]`` names dim i symbolically."""
    dims = list(a.shape) if symbolic is None else [s if s else d for s, d in zip(symbolic, a.shape)]
    return TensorType(DType.from_numpy(a.dtype), dims)


def build(
    fn: Callable[..., Any],
    *arrays: np.ndarray,
    symbolic: Sequence[Sequence[str | None] | None] | None = None,
    **kwargs: Any,
) -> Graph:
    """A graph with one input per array whose output is ``fn(*inputs, **kwargs)``."""
    types = [tensor_type(a, symbolic[i] if symbolic else None) for i, a in enumerate(arrays)]
    with Graph(getattr(fn, "__name__", "op"), input_types=types) as g:
        out = fn(*[v.tensor if hasattr(v, "tensor") else v for v in g.inputs], **kwargs)
        if isinstance(out, (list, tuple)):
            g.output(*out)
        else:
            g.output(out)
    return g


def _contiguous(a: Any) -> Any:
    """``a`` as a C-contiguous array (rank 0 kept: ``np.ascontiguousarray`` would make it rank 1)."""
    return np.ascontiguousarray(a) if isinstance(a, np.ndarray) and not a.flags.c_contiguous else a


def run_op(fn: Callable[..., Any], *arrays: np.ndarray, symbolic=None, **kwargs: Any) -> Any:
    """Outputs of ``fn`` applied in a compiled graph: one array, or a list for several outputs."""
    g = build(fn, *arrays, symbolic=symbolic, **kwargs)
    # Models refuse strided inputs, as MAX's do; the op tests build them with transposes.
    outs = execute(g, *[_contiguous(a) for a in arrays])
    return outs[0] if len(outs) == 1 else outs


def rand(
    rng: np.random.Generator, shape: Sequence[int], dtype: Any = np.float32, low: float = -3, high: float = 3
) -> np.ndarray:
    """Random test data of ``dtype`` (ints in [low, high), bools 50/50)."""
    dt = np.dtype(DType.to_numpy(dtype) if isinstance(dtype, DType) else dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        lo = max(int(low), 0) if dt.kind == "u" else int(low)
        return rng.integers(lo, max(int(high), lo + 1), size=shape).astype(dt)
    return rng.uniform(low, high, size=shape).astype(dt)
