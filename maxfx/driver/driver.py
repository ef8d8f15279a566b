"""Device queries shared by MAX's driver tools: `calculate_virtual_device_count` (and its CLI form),
`enable_all_peer_access`.

``max.driver.driver`` is the module these helpers live in, so a test may patch
``max.driver.driver.accelerator_count`` to fake the number of GPUs.

Example:
    >>> calculate_virtual_device_count_from_cli("gpu:0,3")
    4
"""

from __future__ import annotations

from collections.abc import Sequence

import jax

from maxfx.driver._device import DeviceSpec, accelerator_count

__all__ = [
    "accelerator_count",
    "calculate_virtual_device_count",
    "calculate_virtual_device_count_from_cli",
    "enable_all_peer_access",
]


def calculate_virtual_device_count(*device_spec_lists: Sequence[DeviceSpec]) -> int:
    """The fewest virtual devices that hold every GPU named in ``device_spec_lists``: the highest GPU id + 1, at least
    1.

    Args:
        *device_spec_lists: lists of `DeviceSpec` (e.g. a model's main devices and its draft model's).

    Raises:
        TypeError: an entry is not a `DeviceSpec`.

    Example:
        >>> calculate_virtual_device_count([DeviceSpec.accelerator(0), DeviceSpec.accelerator(3)], [DeviceSpec.cpu()])
        4
        >>> calculate_virtual_device_count([DeviceSpec.cpu()])
        1
    """
    ids = []
    for specs in device_spec_lists:
        for spec in specs:
            if not isinstance(spec, DeviceSpec):
                raise TypeError(
                    f"calculate_virtual_device_count: expected lists of DeviceSpec, got {type(spec).__name__} {spec!r}"
                )
            if spec.device_type == "gpu":
                ids.append(spec.id)
    return max(ids, default=-1) + 1 or 1


def enable_all_peer_access() -> None:
    """Let every pair of GPUs read each other's memory (MAX's ``cuDeviceEnablePeerAccess`` for all pairs).

    XLA's GPU runtime sets up peer access between the devices of a process
    itself when it creates them, so maxfx has nothing to switch on: the call
    makes sure the devices are initialized and returns. On a machine without
    GPUs it does nothing.

    Example:
        >>> enable_all_peer_access()
    """
    jax.devices()  # device creation is where XLA enables peer access


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
        raise TypeError(
            "calculate_virtual_device_count_from_cli: expected a string such as 'gpu:0,1', got "
            f"{type(devices).__name__}"
        )
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
                    f"calculate_virtual_device_count_from_cli: invalid GPU id {part!r} in {devices!r}; expected "
                    "'gpu:all' or 'gpu:<id>,<id>,...' with non-negative integer ids"
                )
            ids.append(int(part))
    else:
        raise ValueError(
            f"calculate_virtual_device_count_from_cli: unrecognised devices value {devices!r}; expected 'cpu', "
            "'default', 'gpu', 'gpu:all' or 'gpu:<id>,<id>,...'"
        )
    return calculate_virtual_device_count([DeviceSpec.accelerator(i) for i in ids])
