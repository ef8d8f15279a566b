"""Virtual devices (MAX's compile-only mode): compile for GPUs, or a CPU, this machine does not have.

The settings are process-wide and live in `lowering.virtual_devices` (the
engine's ``Accelerator`` consults them); this module gives them their
``max.driver`` names. While ``set_virtual_device_count(n)`` is above 0,
``accelerator_count()`` is ``n`` and ``Accelerator(i)`` is a `VirtualAccelerator`:
``InferenceSession.compile`` lowers graphs placed on it for its platform
(StableHLO via ``jax.export``), and anything that needs the hardware
(memory, ``init``, execution) raises a RuntimeError saying so.

Example:
    >>> from maxfx import driver
    >>> driver.set_virtual_device_api("cuda")
    >>> driver.set_virtual_device_target_arch("sm_80")
    >>> driver.set_virtual_device_count(1)
    >>> driver.accelerator_count(), driver.Accelerator().architecture_name
    (1, 'sm_80')
    >>> driver.set_virtual_device_count(0)
"""

from lowering.driver_devices import VirtualAccelerator
from lowering.virtual_devices import (
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

__all__ = [
    "VirtualAccelerator",
    "get_virtual_cpu_target",
    "get_virtual_device_api",
    "get_virtual_device_count",
    "get_virtual_device_target_arch",
    "is_virtual_device_mode",
    "set_virtual_cpu_target",
    "set_virtual_device_api",
    "set_virtual_device_count",
    "set_virtual_device_target_arch",
]
