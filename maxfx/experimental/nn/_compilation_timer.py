"""`CompilationTimer`: time building a model's graph, then its compile and init, as one phase.

Example:
    >>> from maxfx.engine import InferenceSession
    >>> from maxfx.engine._compilation_stats import collect_compilation_stats
    >>> from maxfx.experimental.nn._compilation_timer import CompilationTimer
    >>> from maxfx.graph import Graph, TensorType, ops
    >>> from maxfx.dtype import DType
    >>> with collect_compilation_stats() as stats:
    ...     with CompilationTimer("relu") as timer:
    ...         with Graph("relu", input_types=[TensorType(DType.float32, [2])]) as g:
    ...             g.output(ops.relu(g.inputs[0]))
    ...         timer.mark_build_complete()
    ...         _ = InferenceSession().load(g)
    >>> stats.num_phases, stats.build_seconds > 0
    (1, True)
"""

from __future__ import annotations

import logging
import time
from typing import Any

from maxfx.engine._compilation_stats import count_phase, record

__all__ = ["CompilationTimer"]

logger = logging.getLogger("maxfx")


class CompilationTimer:
    """Times one model-building phase: graph building (until `mark_build_complete`), then the rest.

    The build time goes to the open ``collect_compilation_stats`` collectors;
    compile and init time are recorded by the session itself. The total is logged
    at INFO on the ``maxfx`` logger.
    """

    def __init__(self, name: str):
        self.name = name
        self._start = 0.0
        self._built: float | None = None

    def __enter__(self) -> CompilationTimer:
        self._start = time.perf_counter()
        count_phase()
        return self

    def mark_build_complete(self) -> None:
        """End the graph-building part of the phase."""
        self._built = time.perf_counter()
        record("build", self._built - self._start)

    def __exit__(self, *exc: Any) -> None:
        end = time.perf_counter()
        if self._built is None:
            record("build", end - self._start)
        logger.info("%s: built and compiled in %.3f s", self.name, end - self._start)
