"""Driver devices: `CPU`, `Accelerator`, `DeviceStream`, `DeviceSpec` and device queries.

Every driver `Device` wraps one ``jax.Device`` (attribute ``jax_device``):
``CPU()`` is ``jax.devices("cpu")[0]`` and ``Accelerator(i)`` is
``jax.devices("gpu")[i]``. JAX gives each device a single in-order work queue
and orders work across devices by data dependencies, so a `DeviceStream` is a
handle on that one queue: ``synchronize`` blocks until the device is idle and
``wait_for`` can only be honoured by waiting on the host.

Example:
    >>> from maxfx import driver
    >>> device = driver.CPU() if driver.accelerator_count() == 0 else driver.Accelerator()
    >>> device.label in ("cpu", "gpu")
    True
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import jax

from lowering.devices import accelerators
from lowering.types import DeviceRef, set_device_resolver

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


@functools.cache
def _host_jax_device() -> jax.Device:
    return jax.devices("cpu")[0]


class Device:
    """A device tensors live on and programs run on: `CPU` or `Accelerator`.

    Devices compare and hash by ``(label, id)``; ``repr`` is ``CPU()`` or
    ``Accelerator(id=N)``.

    Example:
        >>> cpu = CPU()
        >>> (cpu.label, cpu.id, cpu.is_host, cpu.api)
        ('cpu', 0, True, 'cpu')
    """

    label: ClassVar[str]
    jax_device: jax.Device
    _id: int

    def __new__(cls, *args: Any, **kwargs: Any) -> Device:
        if cls is Device:
            raise TypeError("Device cannot be constructed directly; use CPU() or Accelerator(id)")
        return super().__new__(cls)

    def _setup(self, jax_device: jax.Device, id: int) -> None:
        self.jax_device = jax_device
        self._id = id
        # MAX creates the default stream together with the device.
        self._default_stream = DeviceStream(self)

    @staticmethod
    def cpu(id: int = -1) -> CPU:
        """The host device (``id`` is accepted and ignored, as in MAX).

        Example:
            >>> Device.cpu()
            CPU()
        """
        return CPU(id)

    @property
    def id(self) -> int:
        """Zero-based index among devices of this label (always 0 for the CPU)."""
        return self._id

    @property
    def is_host(self) -> bool:
        """True for the CPU."""
        return self.label == "cpu"

    @property
    def api(self) -> str:
        """``'cpu'``, ``'cuda'`` (NVIDIA) or ``'hip'`` (AMD)."""
        if self.is_host:
            return "cpu"
        info = f"{getattr(self.jax_device.client, 'platform_version', '')} {self.jax_device.device_kind}".lower()
        return "hip" if ("rocm" in info or "hip" in info or "amd" in info) else "cuda"

    @property
    def architecture_name(self) -> str:
        """GPU architecture: ``'sm_90'`` style for NVIDIA, ``'gfx942'`` style for AMD.

        Raises:
            ValueError: on the CPU, which has no accelerator architecture.
        """
        if self.is_host:
            raise ValueError("Device.architecture_name: CPU devices have no accelerator architecture; use an Accelerator()")
        cc = str(getattr(self.jax_device, "compute_capability", "") or "")
        if cc.startswith("gfx"):
            return cc
        m = re.fullmatch(r"(\d+)\.(\d+)", cc)
        if m:
            return f"sm_{m.group(1)}{m.group(2)}"
        raise ValueError(f"Device.architecture_name: JAX reports no compute capability for {self!r} ({self.jax_device.device_kind})")

    @property
    def is_compatible(self) -> bool:
        """Whether maxfx can run programs on this device (every device JAX exposes can)."""
        return True

    @property
    def stats(self) -> dict[str, Any]:
        """Utilisation data: JAX's ``memory_stats()`` (bytes in use, limits, ...) plus the device kind.

        Example:
            >>> isinstance(CPU().stats, dict)
            True
        """
        stats: dict[str, Any] = {"device_kind": self.jax_device.device_kind, "platform": self.jax_device.platform}
        try:
            stats.update(self.jax_device.memory_stats() or {})
        except Exception:  # noqa: BLE001 - some PJRT clients do not implement memory stats
            pass
        return stats

    @property
    def default_stream(self) -> DeviceStream:
        """The stream created with this device (JAX's single queue on it)."""
        return self._default_stream

    def can_access(self, other: Device) -> bool:
        """Whether this device can read ``other``'s memory directly.

        True for the same device and between GPUs of this process (XLA copies
        between them device-to-device); False between host and GPU memory.

        Raises:
            TypeError: if ``other`` is not a Device.
        """
        if not isinstance(other, Device):
            raise TypeError(f"Device.can_access: expected a Device, got {type(other).__name__}")
        if self == other:
            return True
        return not self.is_host and not other.is_host and self.jax_device.client is other.jax_device.client

    def synchronize(self) -> None:
        """Block until all work queued on this device has finished.

        Raises:
            ValueError: if queued work failed.
        """
        _block_on_device(self.jax_device, f"{self!r}.synchronize")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Device):
            return NotImplemented
        return (self.label, self.id) == (other.label, other.id)

    def __hash__(self) -> int:
        return hash((self.label, self.id))

    # Devices are process-wide handles: copies are the same device.
    def __copy__(self) -> Device:
        return self

    def __deepcopy__(self, memo: dict) -> Device:
        return self


def _block_on_device(jax_device: jax.Device, where: str) -> None:
    try:
        jax.effects_barrier()
        for arr in jax.live_arrays():
            if not arr.is_deleted() and jax_device in arr.devices():
                arr.block_until_ready()
    except RuntimeError as e:  # XlaRuntimeError: an asynchronous computation failed
        raise ValueError(f"{where}: queued work failed: {e}") from e


class CPU(Device):
    """The host device. ``id`` is accepted for compatibility; ``CPU().id`` is always 0.

    Example:
        >>> CPU(), CPU().id, CPU() == CPU(3)
        (CPU(), 0, True)
    """

    label: ClassVar[str] = "cpu"
    _instance: ClassVar[CPU | None] = None

    def __new__(cls, id: int = -1) -> CPU:
        if CPU._instance is None:
            inst = super().__new__(cls)
            inst._setup(_host_jax_device(), 0)
            CPU._instance = inst
        return CPU._instance

    def __repr__(self) -> str:
        return "CPU()"

    __str__ = __repr__

    def __reduce__(self) -> tuple:
        return (CPU, ())


class Accelerator(Device):
    """A GPU visible to JAX. ``id=-1`` picks the first one.

    Constructing the same id again returns the first instance (its
    ``device_memory_limit`` wins, as in MAX). XLA sizes its GPU memory pool at
    start-up (``XLA_PYTHON_CLIENT_MEM_FRACTION``), so the limit is recorded in
    ``device_memory_limit`` but not enforced.

    Raises:
        ValueError: when the machine has no such GPU (the message says how
            many accelerators JAX sees).

    Example:
        >>> if accelerator_count():
        ...     assert Accelerator() is Accelerator(id=0)
    """

    label: ClassVar[str] = "gpu"
    _instances: ClassVar[dict[int, Accelerator]] = {}

    def __new__(cls, id: int = -1, device_memory_limit: int = -1) -> Accelerator:
        index = 0 if id == -1 else int(id)
        inst = Accelerator._instances.get(index)
        if inst is not None:
            return inst
        gpus = accelerators()
        if not 0 <= index < len(gpus):
            where = f"Accelerator(id={id})"
            if not gpus:
                raise ValueError(
                    f"{where}: no accelerator available (JAX sees 0 GPUs; jax.devices('gpu') is empty). "
                    "Use CPU(), or install a GPU build of jaxlib and unset JAX_PLATFORMS=cpu"
                )
            raise ValueError(f"{where}: this machine has {len(gpus)} accelerator(s), valid ids are 0..{len(gpus) - 1} (or -1 for the first)")
        inst = super().__new__(cls)
        inst._setup(gpus[index], index)
        inst.device_memory_limit = int(device_memory_limit)
        Accelerator._instances[index] = inst
        return inst

    @classmethod
    def _from_jax_device(cls, jax_device: jax.Device, id: int) -> Accelerator:
        """An unregistered Accelerator over any JAX device (tests emulate a GPU with a CPU device)."""
        inst = Device.__new__(cls)
        inst._setup(jax_device, id)
        inst.device_memory_limit = -1
        return inst

    def __repr__(self) -> str:
        return f"Accelerator(id={self.id})"

    __str__ = __repr__

    def __reduce__(self) -> tuple:
        return (Accelerator, (self.id,))


class DeviceStream:
    """An ordered queue of work on a device.

    JAX runs each device's work in one implicit in-order queue, so every
    DeviceStream of a device is a handle on that queue.

    Example:
        >>> stream = DeviceStream(CPU())
        >>> stream.device, stream.synchronize()
        (CPU(), None)
    """

    __slots__ = ("_device",)

    def __init__(self, device: Device):
        if not isinstance(device, Device):
            raise TypeError(f"DeviceStream: expected a Device, got {type(device).__name__}")
        self._device = device

    @property
    def device(self) -> Device:
        """The device this stream runs on."""
        return self._device

    def synchronize(self) -> None:
        """Block until every operation queued on this stream has finished.

        Raises:
            ValueError: if queued work failed.
        """
        _block_on_device(self._device.jax_device, f"{self!r}.synchronize")

    def wait_for(self, other: DeviceStream | Device) -> None:
        """Order later work on this stream after ``other`` (a stream, or a device's default stream).

        Work on one device is already in order. JAX has no cross-device stream
        events, so waiting for another device blocks the host until it is idle.

        Raises:
            TypeError: if ``other`` is neither a DeviceStream nor a Device.
        """
        if isinstance(other, Device):
            other = other.default_stream
        if not isinstance(other, DeviceStream):
            raise TypeError(f"DeviceStream.wait_for: expected a DeviceStream or Device, got {type(other).__name__}")
        if other.device != self._device:
            other.synchronize()

    def __repr__(self) -> str:
        return f"DeviceStream(device={self._device!r})"


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
    """Number of GPUs JAX can see (0 on a CPU-only machine).

    Example:
        >>> accelerator_count() >= 0
        True
    """
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
            raise ValueError(f"load_devices: accelerator {spec.id} was requested but this machine has {n} accelerator(s)")
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


def _resolve_device_ref(ref: DeviceRef) -> Device:
    return CPU() if ref.is_cpu() else Accelerator(ref.id)


# Lets graph code turn DeviceRef into driver devices without importing maxfx.
set_device_resolver(_resolve_device_ref)
