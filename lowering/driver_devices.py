"""The driver devices a `DeviceRef` names: `CPU`, `Accelerator` and their `DeviceStream`.

Every `Device` wraps one ``jax.Device`` (attribute ``jax_device``):
``CPU()`` is ``jax.devices("cpu")[0]`` and ``Accelerator(i)`` is
``jax.devices("gpu")[i]``. JAX gives each device a single in-order work queue
and orders work across devices by data dependencies, so a `DeviceStream` is a
handle on that one queue: ``synchronize`` blocks until the device is idle and
``wait_for`` can only be honoured by waiting on the host.

They live in the engine, below `lowering.types`, so that ``DeviceRef.to_device()``
returns them without being told how; ``maxfx.driver`` re-exports them.

Example:
    >>> from lowering.driver_devices import CPU, Accelerator, accelerators
    >>> device = CPU() if not accelerators() else Accelerator()
    >>> device.label in ("cpu", "gpu")
    True
"""

from __future__ import annotations

import functools
import re
from typing import Any, ClassVar

import jax

__all__ = ["Accelerator", "CPU", "Device", "DeviceStream", "accelerators"]


@functools.cache
def accelerators() -> tuple[jax.Device, ...]:
    """The GPUs JAX can see (empty on a CPU-only machine)."""
    try:
        return tuple(jax.devices("gpu"))
    except RuntimeError:
        return ()


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
        >>> if accelerators():
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
