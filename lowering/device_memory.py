"""Refuse eager results larger than the device's memory before XLA allocates them.

XLA reports a failed allocation on the CPU client by aborting the process
(``Check failed: buffer_.IsConcrete()``) when the buffer is first read; plain
JAX on a GPU raises ``RESOURCE_EXHAUSTED``. Eager ops know their output types
before they run, so an output that cannot fit in the whole device's memory is
refused first, with a Python error naming the op, shape, dtype and size.

The check runs where an eager program is compiled (a new op, shapes or graph
structure), not on every call: a program's output shapes are fixed by its
cache key.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from lowering.driver_devices import _host_memory

__all__ = ["DeviceOutOfMemoryError", "device_memory_bytes", "check_fits_device"]


class DeviceOutOfMemoryError(MemoryError):
    """A result is larger than its device's memory (XLA's ``RESOURCE_EXHAUSTED``)."""


@functools.cache
def device_memory_bytes(device: Any) -> int | None:
    """Total memory of a JAX ``device`` in bytes: XLA's pool limit, or the host's RAM for a CPU; None if unknown.

    Example:
        >>> import jax
        >>> device_memory_bytes(jax.devices("cpu")[0]) > 0
        True
    """
    try:
        limit = (device.memory_stats() or {}).get("bytes_limit")
    except Exception:  # noqa: BLE001 - some PJRT clients do not implement memory stats
        limit = None
    if limit:
        return int(limit)
    if device.platform == "cpu":
        total = _host_memory()[0]
        return total or None
    return None


def check_fits_device(op: str, types: Sequence[Any], device: Any) -> None:
    """Raise `DeviceOutOfMemoryError` if one of the tensor ``types`` is larger than ``device``'s memory.

    Example:
        >>> import jax
        >>> from lowering.dtypes import DType
        >>> from lowering.types import TensorType
        >>> try:
        ...     check_fits_device("random_normal", [TensorType(DType.float32, [2**60])], jax.devices("cpu")[0])
        ... except MemoryError as e:
        ...     print(str(e).split(" (")[0])
        RESOURCE_EXHAUSTED: random_normal: the result float32[1152921504606846976] needs 4611686018427387904 bytes
    """
    limit = device_memory_bytes(device)
    if limit is None:
        return
    for t in types:
        shape = getattr(t, "shape", None)
        if shape is None:
            continue
        nbytes = math.prod(int(d) for d in shape) * t.dtype.size_in_bytes
        if nbytes > limit:
            dims = ", ".join(str(int(d)) for d in shape)
            raise DeviceOutOfMemoryError(
                f"RESOURCE_EXHAUSTED: {op}: the result {t.dtype.name}[{dims}] needs {nbytes} bytes "
                f"({nbytes / 2**30:.1f} GiB), "
                f"more than the {limit} bytes ({limit / 2**30:.1f} GiB) of memory on {device}"
            )
