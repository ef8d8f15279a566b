"""What the GPU diagnostics return: per-GPU memory and utilization snapshots."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPUStats", "MemoryStats", "UtilizationStats"]


@dataclass(frozen=True)
class MemoryStats:
    """A GPU's memory, in bytes (``reserved_bytes``: held by the driver, None when the vendor does not say).

    Example:
        >>> MemoryStats(total_bytes=8, free_bytes=6, used_bytes=2, reserved_bytes=None).used_bytes
        2
    """

    total_bytes: int
    free_bytes: int
    used_bytes: int
    reserved_bytes: int | None = None


@dataclass(frozen=True)
class UtilizationStats:
    """How busy a GPU is, in percent: compute, and the memory controller (None when the vendor does not say).

    Example:
        >>> UtilizationStats(gpu_usage_percent=40, memory_activity_percent=12).gpu_usage_percent
        40
    """

    gpu_usage_percent: int
    memory_activity_percent: int | None = None


@dataclass(frozen=True)
class GPUStats:
    """One GPU at one moment: its `MemoryStats` and `UtilizationStats`.

    Example:
        >>> s = GPUStats(MemoryStats(8, 6, 2), UtilizationStats(40))
        >>> s.memory.free_bytes, s.utilization.memory_activity_percent
        (6, None)
    """

    memory: MemoryStats
    utilization: UtilizationStats
