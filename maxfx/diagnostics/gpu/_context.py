"""`GPUDiagContext`: stats of every GPU the vendor libraries can see."""

from __future__ import annotations

from types import TracebackType

from maxfx.diagnostics.gpu._nvml import NVMLReader
from maxfx.diagnostics.gpu._types import GPUStats

__all__ = ["GPUDiagContext"]


class GPUDiagContext:
    """A context manager that opens the GPU vendor libraries and reads every GPU's stats.

    NVIDIA GPUs are read through NVML (the optional ``nvidia-ml-py`` package);
    maxfx has no ROCm-SMI reader, so AMD GPUs are not listed. Without a readable
    GPU (no NVML, no driver, or `get_stats` called outside the ``with`` block)
    `get_stats` returns an empty dict; `errors` tells why.

    Example:
        >>> with GPUDiagContext() as ctx:
        ...     stats = ctx.get_stats()
        >>> isinstance(stats, dict) and all(k.startswith("nv") for k in stats)
        True
        >>> GPUDiagContext().get_stats()
        {}
    """

    def __init__(self) -> None:
        self._nvml: NVMLReader | None = None
        self._entered = False
        self._errors: list[tuple[str, Exception]] = []

    def __enter__(self) -> GPUDiagContext:
        if self._entered:
            raise RuntimeError("GPUDiagContext: already entered; use one context per with block")
        self._entered = True
        try:
            self._nvml = NVMLReader()
        except Exception as err:  # no pynvml, no driver, no GPU: stats stay empty, the reason is kept
            self._errors.append(("nv", err))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc_value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._nvml is not None:
            self._nvml.close()
        self._nvml = None
        self._entered = False

    @property
    def errors(self) -> list[tuple[str, Exception]]:
        """(vendor prefix, exception) for each vendor library that could not be opened."""
        return list(self._errors)

    def get_stats(self) -> dict[str, GPUStats]:
        """Current stats of every GPU, keyed ``nv0``, ``nv1``... ({} without a readable GPU)."""
        if self._nvml is None:
            return {}
        return {f"nv{index}": stats for index, stats in self._nvml.get_stats().items()}
