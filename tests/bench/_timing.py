"""Shared timing helpers for the benchmarks: interleaved runs, medians, ratios.

The machines are shared and noisy, so every benchmark times the candidates
side by side in one process, alternating them call by call, and reports
medians and their ratio rather than absolute times.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def interleaved(candidates: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 20) -> dict[str, float]:
    """Median seconds per call of each candidate, measured alternately."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    clock = time.perf_counter
    for _ in range(repeats):
        for name, fn in candidates.items():
            t = clock()
            fn()
            samples[name].append(clock() - t)
    return {name: statistics.median(s) for name, s in samples.items()}


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:8.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:8.2f} ms"
    return f"{seconds:8.2f} s "


def save(name: str, payload: dict) -> Path:
    """Write ``payload`` as JSON to tests/bench/results/<name>.json (git-ignored)."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str))
    return path


def machine() -> dict[str, object]:
    import jax  # noqa: PLC0415

    return {"jax": jax.__version__, "backend": jax.default_backend(), "cpus": os.cpu_count()}
