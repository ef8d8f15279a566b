"""Debug runs: the node-by-node interpreter behind ``nan_check``/``op_log_level``, and source locations.

The options themselves (MAX's ``DebugConfig``, one process-wide `DEBUG`) live
in `lowering.debug_options` and are re-exported here.

Example:
    >>> cfg = DebugConfig(env="nan-check")
    >>> cfg.compile_options()
    (True, False)
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from lowering.debug_options import DEBUG, DebugConfig, GraphDebugConfig, PrintStyle
from lowering.interpret import Interpreter
from lowering.ir import Node

__all__ = ["DebugConfig", "DEBUG", "DebugInterpreter", "GraphDebugConfig", "PrintStyle", "source_location"]

_INTERNAL = tuple(
    str(Path(p).resolve())
    for p in (
        Path(__file__).parent,
        Path(__file__).parent.parent / "maxfx",
        Path(__file__).parent.parent / "custom_calls",
    )
)


@functools.cache
def _is_internal(filename: str) -> bool:
    """A frame of maxfx itself, JAX or contextlib (resolved once per file: graphs record a location per node)."""
    path = str(Path(filename).resolve())
    return path.startswith(_INTERNAL) or f"{os.sep}jax{os.sep}" in path or path.endswith(f"{os.sep}contextlib.py")


def source_location() -> str | None:
    """``file:line`` of the innermost caller outside maxfx (and outside JAX and the standard library's contextlib)."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _is_internal(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


_op_ids = itertools.count(1)


class DebugInterpreter(Interpreter):
    """The interpreter of debug runs: logs, NaN-checks and syncs around every node.

    Args:
        weights: as for `Interpreter`.
        nan_check: raise ``FloatingPointError`` when a node's floating-point
            result holds NaN or Inf.
        log_ops: write ``[OP] LAUNCH``/``[OP] COMPLETE`` lines to stderr (see `DebugConfig.compile_options`).
        sync: wait for each node's results before the next node.
    """

    def __init__(self, weights: Mapping[str, Any] | None = None, *, nan_check: bool, log_ops: bool, sync: bool):
        super().__init__(weights)
        self.nan_check, self.log, self.sync = nan_check, log_ops, sync

    def run_node(self, node: Node, env: dict[int, Any]) -> None:
        op_id = next(_op_ids)
        target = (
            str(node.outputs[0].type.device) if node.outputs and hasattr(node.outputs[0].type, "device") else "cpu:0"
        )
        if self.log:
            print(f"[OP] LAUNCH {node.op} [id={op_id}] target={target}", file=sys.stderr, flush=True)
        super().run_node(node, env)
        results = [env[v.id] for v in node.outputs if v.id in env]
        if self.sync:
            jax.block_until_ready(results)
        if self.log:
            print(f"[OP] COMPLETE {node.op} [id={op_id}] target={target}", file=sys.stderr, flush=True)
        if self.nan_check:
            _check_finite(node, results)


def _check_finite(node: Node, results: list[Any]) -> None:
    for i, value in enumerate(results):
        dtype = np.dtype(getattr(value, "dtype", np.float32))
        if dtype.kind not in "fc" or isinstance(value, jax.core.Tracer):
            continue
        arr = np.asarray(value)
        nans, infs = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
        if nans or infs:
            where = (
                f", created at {node.location}"
                if getattr(node, "location", None)
                else " (set Graph.debug.source_tracebacks = True before building the graph to see where it was created)"
            )
            raise FloatingPointError(
                f"nan_check: op {node.op!r} output {i} ({value.shape} {dtype}) holds {nans} NaN and {infs} Inf "
                f"values{where}"
            )
