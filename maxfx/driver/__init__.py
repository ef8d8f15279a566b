"""Devices and device buffers (``max.driver``), on JAX devices.

``CPU()`` and ``Accelerator(id)`` wrap ``jax.devices()``; `Tensor` (also named
`Buffer`) is a buffer on one of them: numpy memory on the host, a ``jax.Array``
on an accelerator. A graph ``DeviceRef`` names one of these devices
(``DeviceRef.GPU(0).to_device() == Accelerator(0)``).

Example:
    >>> from maxfx import driver
    >>> from maxfx.dtype import DType
    >>> device = driver.CPU() if driver.accelerator_count() == 0 else driver.Accelerator()
    >>> t = driver.Tensor.zeros((2, 3), DType.float32, device)
    >>> t.shape, t.device == device
    ((2, 3), True)
"""

from maxfx.driver._device import (
    CPU,
    Accelerator,
    Device,
    DeviceSpec,
    DeviceStream,
    DLPackArray,
    accelerator_api,
    accelerator_architecture_name,
    accelerator_count,
    devices_exist,
    load_devices,
    scan_available_devices,
)
from maxfx.driver._tensor import Buffer, Tensor

__all__ = [
    "Accelerator",
    "Buffer",
    "CPU",
    "DLPackArray",
    "Device",
    "DeviceSpec",
    "DeviceStream",
    "Tensor",
    "accelerator_api",
    "accelerator_architecture_name",
    "accelerator_count",
    "devices_exist",
    "load_devices",
    "scan_available_devices",
]
