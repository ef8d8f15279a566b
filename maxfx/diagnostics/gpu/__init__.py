"""``max.diagnostics.gpu``: memory and utilization of the machine's GPUs.

`GPUDiagContext` reads them now; `BackgroundRecorder` samples them once a second
on a background thread. NVIDIA GPUs are read through NVML when the optional
``nvidia-ml-py`` package (``pynvml``) is installed; without it, or without a GPU,
``GPUDiagContext().get_stats()`` is ``{}`` and every recorder sample is ``{}``.

Example:
    >>> from maxfx.diagnostics.gpu import GPUDiagContext
    >>> with GPUDiagContext() as ctx:
    ...     used = {gpu: s.memory.used_bytes for gpu, s in ctx.get_stats().items()}
    >>> isinstance(used, dict)
    True
"""

from maxfx.diagnostics.gpu._context import GPUDiagContext
from maxfx.diagnostics.gpu._recorder import BackgroundRecorder
from maxfx.diagnostics.gpu._types import GPUStats, MemoryStats, UtilizationStats

__all__ = ["BackgroundRecorder", "GPUDiagContext", "GPUStats", "MemoryStats", "UtilizationStats"]
