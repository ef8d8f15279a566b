"""Where model-building time goes: graph building, compiling and initializing (MAX's compilation stats).

`collect_compilation_stats` gathers, for the ``with`` block, the seconds spent in
`InferenceSession.compile` (``compile_seconds``), `InferenceSession.init`
(``init_seconds``) and in graph building marked by a `CompilationTimer`
(``build_seconds``). The collectors nest: an inner block's time also counts in
the outer ones.

Example:
    >>> from maxfx.engine import InferenceSession
    >>> from maxfx.engine._compilation_stats import collect_compilation_stats
    >>> from maxfx.graph import Graph, TensorType, ops
    >>> from maxfx.dtype import DType
    >>> with Graph("relu", input_types=[TensorType(DType.float32, [2])]) as g:
    ...     g.output(ops.relu(g.inputs[0]))
    >>> with collect_compilation_stats() as stats:
    ...     _ = InferenceSession().load(g)
    >>> stats.compile_seconds > 0 and stats.init_seconds > 0
    True
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import time
from collections.abc import Iterator

__all__ = ["CompilationStats", "collect_compilation_stats", "timed_phase"]


@dataclasses.dataclass
class CompilationStats:
    """Seconds spent per phase while a `collect_compilation_stats` block was open."""

    build_seconds: float = 0.0
    compile_seconds: float = 0.0
    init_seconds: float = 0.0
    num_phases: int = 0


_active: contextvars.ContextVar[tuple[CompilationStats, ...]] = contextvars.ContextVar(
    "maxfx_compilation_stats", default=()
)


@contextlib.contextmanager
def collect_compilation_stats() -> Iterator[CompilationStats]:
    """Collect the build/compile/init seconds of everything done in the block."""
    stats = CompilationStats()
    token = _active.set((*_active.get(), stats))
    try:
        yield stats
    finally:
        _active.reset(token)


def record(phase: str, seconds: float) -> None:
    """Add ``seconds`` to ``phase`` (``"build"``, ``"compile"``, ``"init"``) of every open collector."""
    for stats in _active.get():
        setattr(stats, f"{phase}_seconds", getattr(stats, f"{phase}_seconds") + seconds)


def count_phase() -> None:
    """Count one timed model-building phase (a `CompilationTimer`) in every open collector."""
    for stats in _active.get():
        stats.num_phases += 1


@contextlib.contextmanager
def timed_phase(phase: str) -> Iterator[None]:
    """Time the block into ``phase`` of the open collectors (cheap when none is open)."""
    if not _active.get():
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        record(phase, time.perf_counter() - start)
