"""Mapping graph `DeviceRef`s onto JAX devices and back.

Unlike ``DeviceRef.to_device()`` (MAX's driver device, one ``CPU()`` for every
CPU id), `jax_device` keeps CPU ids apart, so ``DeviceRef.CPU(3)`` is the
fourth of ``--xla_force_host_platform_device_count`` host devices.

Example:
    >>> from lowering.types import DeviceRef
    >>> jax_device(DeviceRef.CPU()).platform
    'cpu'
"""

from __future__ import annotations

import jax

from lowering.driver_devices import accelerators
from lowering.types import DeviceKind, DeviceRef

__all__ = ["jax_device", "has_hardware", "accelerators", "device_ref_of", "array_device_ref"]


_resolved: dict[DeviceRef, jax.Device] = {}


def jax_device(ref: DeviceRef) -> jax.Device:
    """The JAX device a `DeviceRef` names.

    Raises:
        ValueError: for a GPU reference on a machine without that GPU.
    """
    dev = _resolved.get(ref)
    if dev is None:
        dev = _resolved[ref] = _lookup(ref)
    return dev


def has_hardware(ref: DeviceRef) -> bool:
    """Whether a JAX device of this machine backs ``ref`` (False for a virtual or absent GPU).

    Inside ``F.lazy()`` eager tensors may live on such devices: ops are
    recorded for them (shapes, dtypes, devices are all known) and only running
    the work needs the device.

    Example:
        >>> has_hardware(DeviceRef.CPU()), has_hardware(DeviceRef.GPU(63))
        (True, False)
    """
    if ref in _resolved:
        return True
    try:
        jax_device(ref)
    except ValueError:
        return False
    return True


def _lookup(ref: DeviceRef) -> jax.Device:
    if ref.device_type is DeviceKind.CPU:
        cpus = jax.local_devices(backend="cpu")  # this process's: a DeviceRef names a device the process can write to
        return cpus[ref.id] if 0 <= ref.id < len(cpus) else cpus[0]
    gpus = accelerators()
    if not 0 <= ref.id < len(gpus):
        raise ValueError(f"device {ref} does not exist: this machine has {len(gpus)} accelerator(s)")
    return gpus[ref.id]


def device_ref_of(device: jax.Device) -> DeviceRef:
    """The `DeviceRef` of a JAX device."""
    if device.platform == "cpu":
        cpus = jax.local_devices(backend="cpu")
        # The index among this process's CPUs, as _lookup reads it (JAX numbers process 1's CPUs from 2048).
        return DeviceRef.CPU(cpus.index(device) if device in cpus else device.id)
    return DeviceRef.GPU(accelerators().index(device) if device in accelerators() else device.id)


def array_device_ref(array: object) -> DeviceRef:
    """The `DeviceRef` of the device holding a JAX array (``CPU()`` for a tracer or an abstract value).

    The one place eager ops (`lowering.eager`) and ``Tensor.from_dlpack`` /
    ``Tensor`` leaves (`maxfx.experimental._tensor`) decide where an array
    lives, so a ``jax.Array`` on host device 3 is ``cpu:3`` for both.

    Example:
        >>> import jax.numpy as jnp
        >>> array_device_ref(jnp.zeros(2))
        DeviceRef('cpu', 0)
    """
    # A tracer has no device. Asking one anyway makes JAX build an error message that
    # walks the whole jaxpr traced so far: tracing a model became quadratic in its
    # depth (39 s of the 41 s it took to trace a 30-layer model).
    if isinstance(array, jax.core.Tracer):
        return DeviceRef.CPU()
    try:
        dev = next(iter(array.devices()))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - abstract values (and non-arrays) have no device
        return DeviceRef.CPU()
    return device_ref_of(dev)
