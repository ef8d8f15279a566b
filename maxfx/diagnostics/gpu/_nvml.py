"""Reading NVIDIA GPUs through NVML (``pynvml``, from the ``nvidia-ml-py`` package, which is optional)."""

from __future__ import annotations

from typing import Any

from maxfx.diagnostics.gpu._types import GPUStats, MemoryStats, UtilizationStats

__all__ = ["NVMLReader"]


class NVMLReader:
    """NVML, opened: `get_stats` reads every NVIDIA GPU; `close` shuts NVML down.

    Raises:
        ImportError: ``pynvml`` is not installed (``pip install nvidia-ml-py``).
        pynvml.NVMLError: NVML cannot start (no NVIDIA driver or GPU).
    """

    def __init__(self) -> None:
        import pynvml  # noqa: PLC0415 - optional dependency (nvidia-ml-py), only for NVIDIA GPUs

        pynvml.nvmlInit()
        self._nvml: Any = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def get_stats(self) -> dict[int, GPUStats]:
        """GPU index -> its current `GPUStats`."""
        return {i: GPUStats(self._memory(handle), self._utilization(handle)) for i, handle in enumerate(self._handles)}

    def _memory(self, handle: Any) -> MemoryStats:
        nvml = self._nvml
        try:  # the v2 query also reports the driver's reserved memory
            info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
            reserved = int(info.reserved)
        except (AttributeError, TypeError, nvml.NVMLError):
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            reserved = None
        return MemoryStats(
            total_bytes=int(info.total), free_bytes=int(info.free), used_bytes=int(info.used), reserved_bytes=reserved
        )

    def _utilization(self, handle: Any) -> UtilizationStats:
        rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
        return UtilizationStats(gpu_usage_percent=int(rates.gpu), memory_activity_percent=int(rates.memory))

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self._handles is not None:
            self._handles = None
            self._nvml.nvmlShutdown()
