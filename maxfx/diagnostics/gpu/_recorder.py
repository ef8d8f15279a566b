"""`BackgroundRecorder`: GPU stats sampled on a background thread while a ``with`` block runs."""

from __future__ import annotations

import threading
from types import TracebackType

from maxfx.diagnostics.gpu._context import GPUDiagContext
from maxfx.diagnostics.gpu._types import GPUStats

__all__ = ["BackgroundRecorder"]


class BackgroundRecorder:
    """Sample every GPU's stats once per ``interval`` seconds (1 by default) while inside the ``with`` block.

    Sampling runs on a daemon thread (MAX uses a side process; NVML calls release
    the GIL either way). The first sample is taken on entry, the last at exit;
    `stats` is the time series, readable once the block has exited (also after an
    exception in it). Without a readable GPU each sample is an empty dict.

    Example:
        >>> with BackgroundRecorder(interval=0.01) as recorder:
        ...     pass
        >>> len(recorder.stats) >= 1 and all(isinstance(s, dict) for s in recorder.stats)
        True
    """

    def __init__(self, *, interval: float = 1.0) -> None:
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 0:
            raise ValueError(f"BackgroundRecorder: interval must be a number of seconds >= 0, got {interval!r}")
        self._interval = float(interval)
        self._samples: list[dict[str, GPUStats]] = []
        self._stats: list[dict[str, GPUStats]] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._context: GPUDiagContext | None = None

    @property
    def stats(self) -> list[dict[str, GPUStats]]:
        """The samples taken, oldest first: each maps ``nv0``... to that GPU's `GPUStats`.

        Raises:
            RuntimeError: the recorder has not finished (read it after the ``with`` block).
        """
        if self._stats is None:
            raise RuntimeError(
                "BackgroundRecorder.stats: the recorder has not finished yet; read stats after its with block exits"
            )
        return self._stats

    def __enter__(self) -> BackgroundRecorder:
        if self._thread is not None:
            raise RuntimeError("BackgroundRecorder: already running")
        if self._stats is not None:
            raise RuntimeError("BackgroundRecorder: already used once; make a new one")
        self._context = GPUDiagContext().__enter__()
        self._samples.append(self._context.get_stats())
        self._thread = threading.Thread(target=self._run, name="maxfx-gpu-recorder", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._samples.append(self._context.get_stats())

    def __exit__(
        self, exc_type: type[BaseException] | None, exc_value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        try:
            self._samples.append(self._context.get_stats())
        finally:
            self._context.__exit__(None, None, None)
            self._thread = None
            self._context = None
            self._stats = list(self._samples)
