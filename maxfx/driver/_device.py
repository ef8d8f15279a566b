"""Driver devices: `CPU`, `Accelerator`, `DeviceStream`, `DeviceSpec` and device queries.

The device classes themselves live in `lowering.driver_devices` (a graph
``DeviceRef.to_device()`` returns them); this module re-exports them beside
MAX's device queries and the coercions the rest of maxfx uses.

Example:
    >>> from maxfx import driver
    >>> device = driver.CPU() if driver.accelerator_count() == 0 else driver.Accelerator()
    >>> device.label in ("cpu", "gpu")
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import jax

from lowering.driver_devices import CPU, Accelerator, Device, DeviceStream, accelerators
from lowering.types import DeviceRef
from lowering.virtual_devices import get_virtual_device_count, is_virtual_device_mode

__all__ = [
    "Accelerator",
    "CPU",
    "DLPackArray",
    "Device",
    "DeviceSpec",
    "DeviceStream",
    "accelerator_api",
    "accelerator_architecture_name",
    "accelerator_count",
    "as_device",
    "device_of_jax",
    "devices_exist",
    "load_devices",
    "scan_available_devices",
]


@runtime_checkable
class DLPackArray(Protocol):
    """Anything that speaks DLPack: numpy/JAX/torch arrays and driver Tensors.

    Example:
        >>> import numpy as np
        >>> isinstance(np.zeros(2), DLPackArray)
        True
    """

    def __dlpack__(self, *, stream: Any = None) -> Any:
        """Export the array as a DLPack capsule."""
        ...

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)`` as DLPack numbers them."""
        ...


@dataclass(frozen=True)
class DeviceSpec:
    """A device to load: ``id`` and ``device_type`` (``'cpu'`` or ``'gpu'``).

    Example:
        >>> DeviceSpec.accelerator(1)
        DeviceSpec(id=1, device_type='gpu')
    """

    id: int
    device_type: Literal["cpu", "gpu"] = "cpu"

    def __post_init__(self) -> None:
        if self.device_type not in ("cpu", "gpu"):
            raise ValueError(f"DeviceSpec: device_type must be 'cpu' or 'gpu', got {self.device_type!r}")
        if self.device_type == "gpu" and self.id < 0:
            raise ValueError(f"DeviceSpec: accelerator id must be >= 0, got {self.id}")

    @staticmethod
    def cpu(id: int = -1) -> DeviceSpec:
        """The host CPU."""
        return DeviceSpec(id, "cpu")

    @staticmethod
    def accelerator(id: int = 0) -> DeviceSpec:
        """GPU number ``id``."""
        return DeviceSpec(id, "gpu")


def accelerator_count() -> int:
    """Number of GPUs JAX can see (0 on a CPU-only machine); in virtual-device mode, the virtual count.

    Example:
        >>> accelerator_count() >= 0
        True
    """
    if is_virtual_device_mode():  # as MAX: virtual devices stand in for the hardware ones
        return get_virtual_device_count()
    return len(accelerators())


def accelerator_api() -> str:
    """``'cuda'`` or ``'hip'`` for the first GPU; ``'cpu'`` when there is none."""
    return (Accelerator() if accelerator_count() else CPU()).api


def accelerator_architecture_name() -> str:
    """Architecture of the first GPU (e.g. ``'sm_90'``).

    Raises:
        ValueError: when there is no accelerator.
    """
    return (Accelerator() if accelerator_count() else CPU()).architecture_name


def scan_available_devices() -> list[DeviceSpec]:
    """Every GPU as a DeviceSpec, or ``[DeviceSpec.cpu()]`` when there is none.

    Example:
        >>> scan_available_devices()[0].device_type in ("cpu", "gpu")
        True
    """
    n = accelerator_count()
    return [DeviceSpec.accelerator(i) for i in range(n)] if n else [DeviceSpec.cpu()]


def devices_exist(devices: Sequence[DeviceSpec]) -> bool:
    """True if every spec names a device of this machine (the CPU always exists).

    Example:
        >>> devices_exist([DeviceSpec.cpu()])
        True
    """
    n = accelerator_count()
    return all(spec.device_type == "cpu" or 0 <= spec.id < n for spec in devices)


def load_devices(device_specs: Sequence[DeviceSpec]) -> list[Device]:
    """The Device of each spec.

    Raises:
        ValueError: if a GPU spec names a GPU this machine does not have.

    Example:
        >>> load_devices([DeviceSpec.cpu()])
        [CPU()]
    """
    out: list[Device] = []
    n = accelerator_count()
    for spec in device_specs:
        if not isinstance(spec, DeviceSpec):
            raise TypeError(f"load_devices: expected DeviceSpec items, got {type(spec).__name__}")
        if spec.device_type == "cpu":
            out.append(CPU(spec.id))
        elif spec.id >= n:
            raise ValueError(
                f"load_devices: accelerator {spec.id} was requested but this machine has {n} accelerator(s)"
            )
        else:
            out.append(Accelerator(spec.id))
    return out


def device_of_jax(jax_device: jax.Device) -> Device:
    """The driver Device for a ``jax.Device`` (the host, or the GPU's index among JAX's GPUs)."""
    if jax_device.platform == "cpu":
        return CPU()
    gpus = accelerators()
    if jax_device in gpus:
        return Accelerator(gpus.index(jax_device))
    raise ValueError(f"device_of_jax: {jax_device} is not one of JAX's local devices")


def as_device(device: Any, where: str) -> Device:
    """Coerce ``device`` (a Device, ``None`` → CPU, a graph DeviceRef or a jax.Device) to a Device."""
    if device is None:
        return CPU()
    if isinstance(device, Device):
        return device
    if isinstance(device, DeviceRef):
        return device.to_device()
    if isinstance(device, jax.Device):
        return device_of_jax(device)
    raise TypeError(f"{where}: expected a Device (CPU() or Accelerator(id)), got {type(device).__name__}")
