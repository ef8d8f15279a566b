"""Shared timing helpers for the benchmarks: interleaved runs, medians, ratios.

The machines are shared and noisy, so every benchmark times the candidates
side by side in one process, alternating them call by call, and reports
medians and their ratio rather than absolute times.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def interleaved(candidates: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 20) -> dict[str, float]:
    """Median seconds per call of each candidate, measured alternately.

    Each round runs the candidates in a fresh (seeded) random order: what ran just
    before a call can change its time by several per cent (a CPU prefill right
    after the plain-JAX decode loop ran ~5 % slower than right after maxfx's,
    whichever side it was), so no candidate may always follow the same other one.
    """
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    clock = time.perf_counter
    order = list(candidates.items())
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        shuffle(order)
        for name, fn in order:
            t = clock()
            fn()
            samples[name].append(clock() - t)
    return {name: statistics.median(s) for name, s in samples.items()}


def sig(x: float, digits: int = 3) -> float:
    """Round to significant digits, so tiny interpret-mode rates stay non-zero (0.0004, not 0.0)."""
    return float(f"{x:.{digits}g}")


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


def small_run(asked: bool, flag: str) -> tuple[bool, bool]:
    """``(gpu, small)``: whether JAX runs on a GPU, and whether the tiny interpret-mode configuration runs
    (asked for with ``flag``, or forced, with a note, when there is no GPU)."""
    import jax  # noqa: PLC0415

    gpu = jax.default_backend() == "gpu"
    if not gpu and not asked:
        print(f"no GPU: running the {flag} configuration (interpret mode)", flush=True)
    return gpu, asked or not gpu


def run_header() -> dict[str, object]:
    """The ``machine`` and ``device`` entries every benchmark result starts with."""
    import jax  # noqa: PLC0415

    return {"machine": machine(), "device": str(jax.devices()[0])}


def results_file(out: str | None, name: str, payload: dict) -> tuple[Path, Callable[[], None]]:
    """The result path (``out`` or tests/bench/results/<name>.json, folder created) and a ``save()`` that rewrites
    ``payload`` there.
    """
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        path.write_text(json.dumps(payload, indent=2, default=str))

    return path, save
