"""Device queries shared by MAX's driver tools: `calculate_virtual_device_count_from_cli`.

``max.driver.driver`` is the module these helpers live in, so a test may patch
``max.driver.driver.accelerator_count`` to fake the number of GPUs.

Example:
    >>> calculate_virtual_device_count_from_cli("gpu:0,3")
    4
"""

from __future__ import annotations

from maxfx.driver._device import accelerator_count

__all__ = ["accelerator_count", "calculate_virtual_device_count_from_cli"]


def calculate_virtual_device_count_from_cli(devices: str) -> int:
    """How many device slots a ``--devices`` CLI value addresses: the highest GPU id + 1, at least 1.

    Accepted values: ``'cpu'``, ``'default'`` or ``''`` (no GPU: 1 slot),
    ``'gpu'`` (GPU 0), ``'gpu:all'`` (every GPU this machine has, by
    `accelerator_count`) and ``'gpu:<id>,<id>,...'``. The result is at least 1
    even when no GPU is named or visible; it counts slots, not physical GPUs.

    Raises:
        TypeError: if ``devices`` is not a string.
        ValueError: for any other value, or a GPU id that is not a
            non-negative integer.

    Example:
        >>> calculate_virtual_device_count_from_cli("gpu:2"), calculate_virtual_device_count_from_cli("cpu")
        (3, 1)
    """
    if not isinstance(devices, str):
        raise TypeError(f"calculate_virtual_device_count_from_cli: expected a string such as 'gpu:0,1', got {type(devices).__name__}")
    spec = devices.strip().lower()
    ids: list[int] = []
    if spec in ("", "cpu", "default"):
        pass
    elif spec == "gpu":
        ids = [0]
    elif spec == "gpu:all":
        ids = list(range(accelerator_count()))
    elif spec.startswith("gpu:"):
        for part in spec[4:].split(","):
            part = part.strip()
            if not part.isdigit():
                raise ValueError(
                    f"calculate_virtual_device_count_from_cli: invalid GPU id {part!r} in {devices!r}; expected 'gpu:all' or 'gpu:<id>,<id>,...' with non-negative integer ids"
                )
            ids.append(int(part))
    else:
        raise ValueError(
            f"calculate_virtual_device_count_from_cli: unrecognised devices value {devices!r}; expected 'cpu', 'default', 'gpu', 'gpu:all' or 'gpu:<id>,<id>,...'"
        )
    max_gpu_id = max(ids, default=-1)
    return max(1, max_gpu_id + 1)
