"""Devices and device buffers (``max.driver``), on JAX devices.

``CPU()`` and ``Accelerator(id)`` wrap ``jax.devices()``; `Tensor` (also named
`Buffer`) is a buffer on one of them: numpy memory on the host, a ``jax.Array``
on an accelerator. A graph ``DeviceRef`` names one of these devices
(``DeviceRef.GPU(0).to_device() == Accelerator(0)``). Virtual-device mode
(``set_virtual_device_count``) compiles for GPUs the machine does not have.

Example:
    >>> from maxfx import driver
    >>> from maxfx.dtype import DType
    >>> device = driver.CPU() if driver.accelerator_count() == 0 else driver.Accelerator()
    >>> t = driver.Tensor.zeros((2, 3), DType.float32, device)
    >>> t.shape, t.device == device
    ((2, 3), True)
"""

from lowering.driver_devices import DeviceEvent
from maxfx import __version__ as __version__
from maxfx.driver import driver as driver  # MAX's max.driver.driver module
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
from maxfx.driver._dump import load_max_buffer
from maxfx.driver._tensor import Buffer, DevicePinnedBuffer, Tensor
from maxfx.driver._virtual import (
    VirtualAccelerator,
    get_virtual_cpu_target,
    get_virtual_device_api,
    get_virtual_device_count,
    get_virtual_device_target_arch,
    is_virtual_device_mode,
    set_virtual_cpu_target,
    set_virtual_device_api,
    set_virtual_device_count,
    set_virtual_device_target_arch,
)
from maxfx.driver.driver import (
    calculate_virtual_device_count,
    calculate_virtual_device_count_from_cli,
    enable_all_peer_access,
)

__all__ = [
    "Accelerator",
    "Buffer",
    "CPU",
    "DLPackArray",
    "Device",
    "DeviceEvent",
    "DevicePinnedBuffer",
    "DeviceSpec",
    "DeviceStream",
    "Tensor",
    "VirtualAccelerator",
    "accelerator_api",
    "accelerator_architecture_name",
    "accelerator_count",
    "calculate_virtual_device_count",
    "calculate_virtual_device_count_from_cli",
    "devices_exist",
    "enable_all_peer_access",
    "get_virtual_cpu_target",
    "get_virtual_device_api",
    "get_virtual_device_count",
    "get_virtual_device_target_arch",
    "is_virtual_device_mode",
    "load_devices",
    "load_max_buffer",
    "scan_available_devices",
    "set_virtual_cpu_target",
    "set_virtual_device_api",
    "set_virtual_device_count",
    "set_virtual_device_target_arch",
]
