"""The driver devices a `DeviceRef` names: `CPU`, `Accelerator` and their `DeviceStream`.

Every `Device` wraps one ``jax.Device`` (attribute ``jax_device``):
``CPU()`` is ``jax.local_devices(backend="cpu")[0]`` and ``Accelerator(i)`` is
``jax.local_devices(backend="gpu")[i]``: this process's devices, which in a
multi-process job (``jax.distributed``) are not all of ``jax.devices()``. JAX gives each device a single in-order work
queue
and orders work across devices by data dependencies, so a `DeviceStream` is a
handle on that one queue: ``synchronize`` blocks until the device is idle and
``wait_for`` can only be honoured by waiting on the host.

A `DeviceEvent` marks a point in that queue: recording one notes the arrays
still being computed on the device, and the event is complete when they are.
Events and host callbacks (``Accelerator.__unsafe_enqueue_py_host_func``) are
completed in record order by one host thread per device, which waits on those
arrays; so callbacks run after the work queued before them, and timing events
read the host clock when the device reached them.

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
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

import jax

from lowering import virtual_devices

__all__ = ["Accelerator", "CPU", "Device", "DeviceEvent", "DeviceStream", "VirtualAccelerator", "accelerators"]


@functools.cache
def accelerators() -> tuple[jax.Device, ...]:
    """This process's GPUs (empty on a CPU-only machine); other processes' GPUs are not Accelerators here."""
    try:
        return tuple(jax.local_devices(backend="gpu"))
    except RuntimeError:
        return ()


@functools.cache
def _host_jax_device() -> jax.Device:
    # Local: in a multi-process job jax.devices("cpu")[0] belongs to process 0, which only process 0 can write to.
    return jax.local_devices(backend="cpu")[0]


class Device:
    """A device tensors live on and programs run on: `CPU` or `Accelerator`.

    Devices compare and hash by ``(label, id)``; ``repr`` is ``CPU()`` or
    ``Accelerator(id=N)`` and so is ``str``: the docs print a device as
    ``CPU()`` (MAX 26.x prints ``Device(type=cpu,id=0)``; the docs win).

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
        self._host_queue: ThreadPoolExecutor | None = None
        self._host_queue_lock = threading.Lock()
        self._host_pending: list[Future] = []

    def _enqueue_host_task(self, pending: list[jax.Array], task: Callable[[], None]) -> Future:
        """Run ``task`` on this device's host thread once ``pending`` arrays are computed (FIFO)."""

        def run() -> None:
            for arr in pending:
                try:
                    arr.block_until_ready()
                except Exception:  # noqa: BLE001 - a failed computation still reached this point of the queue
                    pass
            task()

        with self._host_queue_lock:
            if self._host_queue is None:
                self._host_queue = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"maxfx-{self.label}{self._id}-host"
                )
            self._host_pending = [f for f in self._host_pending if not f.done()]
            fut = self._host_queue.submit(run)
            self._host_pending.append(fut)
        return fut

    def _drain_host_queue(self) -> None:
        with self._host_queue_lock:
            pending = list(self._host_pending)
        for fut in pending:
            fut.result()

    def _pending_arrays(self) -> list[jax.Array]:
        """Arrays on this device whose computation may not have finished (the queue's current tail)."""
        out = []
        for arr in jax.live_arrays():
            try:
                if not arr.is_deleted() and self.jax_device in arr.devices() and not arr.is_ready():
                    out.append(arr)
            except RuntimeError:
                continue
        return out

    def _unsafe_enqueue_py_host_func(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the host once the work queued on this accelerator so far has finished.

        MAX's ``Device.__unsafe_enqueue_py_host_func``: the call returns at
        once; ``fn`` runs on a host thread, in enqueue order. An exception it
        raises is printed to stderr (``synchronize`` does not raise it).

        Raises:
            RuntimeError: on the CPU, which has no device queue to enqueue on
                (MAX supports host functions on CUDA/HIP accelerators only).
            TypeError: if ``fn`` is not callable.
        """
        if self.is_host:
            raise RuntimeError(
                f"{self!r}.__unsafe_enqueue_py_host_func: host functions can only be enqueued on a CUDA/HIP "
                "accelerator, not the CPU; call the function directly"
            )
        if not callable(fn):
            raise TypeError(f"{self!r}.__unsafe_enqueue_py_host_func: expected a callable, got {type(fn).__name__}")

        def call() -> None:
            try:
                fn()
            except BaseException:  # noqa: BLE001 - MAX prints the callback's exception and carries on
                traceback.print_exc(file=sys.stderr)

        self._enqueue_host_task(self._pending_arrays(), call)

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
            raise ValueError(
                "Device.architecture_name: failed to get device architecture name: CPU devices have no accelerator "
                "architecture; use an Accelerator()"
            )
        cc = str(getattr(self.jax_device, "compute_capability", "") or "")
        if cc.startswith("gfx"):
            return cc
        m = re.fullmatch(r"(\d+)\.(\d+)", cc)
        if m:
            return f"sm_{m.group(1)}{m.group(2)}"
        raise ValueError(
            f"Device.architecture_name: JAX reports no compute capability for {self!r} ({self.jax_device.device_kind})"
        )

    @property
    def is_compatible(self) -> bool:
        """Whether maxfx can run programs on this device (every device JAX exposes can)."""
        return True

    @property
    def stats(self) -> dict[str, Any]:
        """Utilisation data: ``free_memory`` and ``total_memory`` in bytes (as MAX), plus JAX's ``memory_stats()`` and
        the device kind.

        For the CPU the memory figures are the machine's physical and
        available RAM; for an accelerator they are XLA's pool limit
        (``bytes_limit``) and what it has not handed out (limit minus ``bytes_in_use``).

        Example:
            >>> s = CPU().stats
            >>> 0 <= s["free_memory"] <= s["total_memory"]
            True
        """
        stats: dict[str, Any] = {"device_kind": self.jax_device.device_kind, "platform": self.jax_device.platform}
        try:
            stats.update(self.jax_device.memory_stats() or {})
        except Exception:  # noqa: BLE001 - some PJRT clients do not implement memory stats
            pass
        total, free = _host_memory() if self.is_host else (None, None)
        if "bytes_limit" in stats:
            total = int(stats["bytes_limit"])
            free = max(0, total - int(stats.get("bytes_in_use", 0)))
        if total is not None:
            stats["total_memory"], stats["free_memory"] = total, min(free, total)
        return stats

    @property
    def max_single_alloc_size(self) -> int:
        """The largest single allocation this device can make, in bytes: its total memory.

        Raises:
            RuntimeError: if the device reports no memory size.

        Example:
            >>> CPU().max_single_alloc_size > 0
            True
        """
        total = self.stats.get("total_memory")
        if total is None:
            raise RuntimeError(
                f"{self!r}.max_single_alloc_size: the device reports no total memory (JAX's memory_stats() has no "
                "bytes_limit)"
            )
        return int(total)

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
        """Block until all work queued on this device has finished, host functions and events included.

        Raises:
            ValueError: if queued work failed.
        """
        _block_on_device(self.jax_device, f"{self!r}.synchronize")
        self._drain_host_queue()

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


# A dunder-prefixed name written in a class body would be mangled; MAX's is literal.
setattr(Device, "__unsafe_enqueue_py_host_func", Device._unsafe_enqueue_py_host_func)


def _host_memory() -> tuple[int, int]:
    """(total, available) physical memory of this machine in bytes."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        free = os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        return 0, 0
    try:  # MemAvailable counts reclaimable caches, as free memory means to a program
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    return int(total), int(free)


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

    In virtual-device mode (`lowering.virtual_devices`, ``max.driver.set_virtual_device_count``)
    it returns a `VirtualAccelerator` instead, whatever GPUs the machine has.

    Raises:
        ValueError: when the machine has no such GPU (the message says how
            many accelerators JAX sees), or no such virtual device.

    Example:
        >>> if accelerators():
        ...     assert Accelerator() is Accelerator(id=0)
    """

    label: ClassVar[str] = "gpu"
    _instances: ClassVar[dict[int, Accelerator]] = {}

    def __new__(cls, id: int = -1, device_memory_limit: int = -1) -> Accelerator:
        index = 0 if id == -1 else int(id)
        if virtual_devices.is_virtual_device_mode():  # MAX: virtual devices replace the hardware ones
            return VirtualAccelerator._get(index, id)
        inst = Accelerator._instances.get(index)
        if inst is not None:
            return inst
        gpus = accelerators()
        if not 0 <= index < len(gpus):
            where = f"Accelerator(id={id})"
            if not gpus:
                raise ValueError(
                    f"{where}: no accelerator available (JAX sees 0 GPUs; jax.devices('gpu') is empty). Use CPU(), or "
                    "install a GPU build of jaxlib and unset JAX_PLATFORMS=cpu"
                )
            raise ValueError(
                f"{where}: this machine has {len(gpus)} accelerator(s), valid ids are 0..{len(gpus) - 1} (or -1 for "
                "the first)"
            )
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


class VirtualAccelerator(Accelerator):
    """A GPU to compile for, in virtual-device mode (``set_virtual_device_count``); no hardware behind it.

    ``Accelerator(id)`` returns one while the mode is on. It reports the API and
    architecture set with ``set_virtual_device_api`` / ``set_virtual_device_target_arch``,
    and a graph placed on it can be compiled (lowered for its platform), but it
    holds no memory and runs nothing: what needs the device (``jax_device``,
    memory, execution) raises a RuntimeError that says so.

    Example:
        >>> from lowering import virtual_devices as vd
        >>> vd.set_virtual_device_api("cuda"); vd.set_virtual_device_target_arch("sm_80")
        >>> vd.set_virtual_device_count(1)
        >>> gpu = Accelerator()
        >>> isinstance(gpu, VirtualAccelerator), gpu.api, gpu.architecture_name
        (True, 'cuda', 'sm_80')
        >>> vd.set_virtual_device_count(0)
    """

    _virtual: ClassVar[dict[tuple[str, str, int], VirtualAccelerator]] = {}

    def __new__(cls, id: int = -1, device_memory_limit: int = -1) -> VirtualAccelerator:
        return cls._get(0 if id == -1 else int(id), id)

    @classmethod
    def _get(cls, index: int, id: int) -> VirtualAccelerator:
        count = virtual_devices.get_virtual_device_count()
        if not 0 <= index < count:
            raise ValueError(
                f"Accelerator(id={id}): virtual-device mode has {count} virtual accelerator(s), valid ids are "
                f"0..{count - 1} (or -1 for the first)"
            )
        api, arch = virtual_devices.get_virtual_device_api(), virtual_devices.get_virtual_device_target_arch()
        key = (api, arch, index)  # one instance per target, so changing the target gives new devices
        inst = cls._virtual.get(key)
        if inst is None:
            inst = Device.__new__(cls)
            inst._id = index
            inst._target = (api, arch)
            inst.device_memory_limit = -1
            inst._default_stream = DeviceStream(inst)
            inst._host_queue = None
            inst._host_queue_lock = threading.Lock()
            inst._host_pending = []
            cls._virtual[key] = inst
        return inst

    def _no_hardware(self, what: str) -> RuntimeError:
        api, arch = self._target
        return RuntimeError(
            f"{self!r} is a virtual {api} {arch} device (max.driver.set_virtual_device_count): it can be compiled for, "
            f"but {what} needs a real GPU; run on a machine with one, after set_virtual_device_count(0)"
        )

    @property
    def jax_device(self) -> jax.Device:
        """There is none: raises RuntimeError (a virtual device has no hardware)."""
        raise self._no_hardware("placing data or running programs on it")

    @property
    def api(self) -> str:
        """The virtual-device API (``'cuda'``, ``'hip'`` or ``'metal'``)."""
        return self._target[0]

    @property
    def architecture_name(self) -> str:
        """The virtual-device architecture (``'sm_80'``...)."""
        return self._target[1]

    @property
    def is_compatible(self) -> bool:
        """False: maxfx cannot run programs on a virtual device."""
        return False

    @property
    def stats(self) -> dict[str, Any]:
        """Raises RuntimeError: a virtual device has no memory to report."""
        raise self._no_hardware("reading its memory statistics")

    def can_access(self, other: Device) -> bool:
        """Only itself: a virtual device shares memory with nothing."""
        if not isinstance(other, Device):
            raise TypeError(f"Device.can_access: expected a Device, got {type(other).__name__}")
        return self == other

    def synchronize(self) -> None:
        """Returns at once: nothing can be queued on a virtual device."""

    def _unsafe_enqueue_py_host_func(self, fn: Callable[[], Any]) -> None:
        raise self._no_hardware("enqueueing host functions")

    def __reduce__(self) -> tuple:
        return (Accelerator, (self.id,))


setattr(VirtualAccelerator, "__unsafe_enqueue_py_host_func", VirtualAccelerator._unsafe_enqueue_py_host_func)


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
        self._device._drain_host_queue()

    def record_event(self, event: DeviceEvent | None = None) -> DeviceEvent:
        """Record ``event`` (a new one if None) at the current end of this stream and return it.

        The event completes when the work queued on the device so far has.

        Raises:
            TypeError: if ``event`` is not a DeviceEvent.
            ValueError: if ``event`` belongs to another device.

        Example:
            >>> event = CPU().default_stream.record_event()
            >>> event.synchronize(); event.is_ready()
            True
        """
        if event is None:
            event = DeviceEvent(self._device)
        if not isinstance(event, DeviceEvent):
            raise TypeError(f"DeviceStream.record_event: expected a DeviceEvent, got {type(event).__name__}")
        if event.device != self._device:
            raise ValueError(
                f"DeviceStream.record_event: the event belongs to {event.device!r}, this stream to {self._device!r}"
            )
        event._record()
        return event

    def wait_for(self, other: DeviceStream | Device | DeviceEvent) -> None:
        """Order later work on this stream after ``other`` (a stream, a device's default stream, or a recorded event).

        Work on one device is already in order. JAX has no cross-device stream
        events, so waiting for another device (or an event of another device)
        blocks the host until that work is done.

        Raises:
            TypeError: if ``other`` is not a DeviceStream, Device or DeviceEvent.
        """
        if isinstance(other, DeviceEvent):
            if other.device != self._device:
                other.synchronize()
            return
        if isinstance(other, Device):
            other = other.default_stream
        if not isinstance(other, DeviceStream):
            raise TypeError(
                f"DeviceStream.wait_for: expected a DeviceStream, Device or DeviceEvent, got {type(other).__name__}"
            )
        if other.device != self._device:
            other.synchronize()

    def __repr__(self) -> str:
        return f"DeviceStream(device={self._device!r})"


class DeviceEvent:
    """A marker in a device's work queue (MAX's ``max.driver.DeviceEvent``).

    ``stream.record_event(event)`` places it after the work queued so far;
    ``synchronize`` blocks until the device has reached it and ``is_ready``
    asks without blocking. With ``enable_timing=True`` the time the device
    reached it is kept, and ``start.elapsed_time(end)`` gives milliseconds.
    ``str`` is ``{api}[{device id}]:event@{address}``. An event never recorded
    is ready. ``blocking_sync`` is accepted for MAX's signature; waiting is
    always a blocking host wait here.

    Example:
        >>> start = DeviceEvent(CPU(), enable_timing=True)
        >>> end = DeviceEvent(CPU(), enable_timing=True)
        >>> stream = CPU().default_stream
        >>> _ = stream.record_event(start); _ = stream.record_event(end)
        >>> end.synchronize()
        >>> start.elapsed_time(end) >= 0.0
        True
    """

    __slots__ = ("_device", "_enable_timing", "_blocking_sync", "_future", "_time", "__weakref__")

    def __init__(self, device: Device, blocking_sync: bool = False, enable_timing: bool = False):
        if not isinstance(device, Device):
            raise TypeError(f"DeviceEvent: expected a Device, got {type(device).__name__}")
        self._device = device
        self._blocking_sync = bool(blocking_sync)
        self._enable_timing = bool(enable_timing)
        self._future: Future | None = None
        self._time: float | None = None

    @property
    def device(self) -> Device:
        """The device whose queue this event marks."""
        return self._device

    def _record(self) -> None:
        self._time = None
        pending = self._device._pending_arrays()

        def reached() -> None:
            self._time = time.perf_counter()

        self._future = self._device._enqueue_host_task(pending, reached)

    def synchronize(self) -> None:
        """Block until the device has done the work queued before this event was recorded."""
        if self._future is not None:
            self._future.result()

    def is_ready(self) -> bool:
        """Whether the work before this event has finished (True for an event never recorded)."""
        return self._future is None or self._future.done()

    def elapsed_time(self, end: DeviceEvent) -> float:
        """Milliseconds between this event and ``end``, both recorded with ``enable_timing=True``.

        Waits for both events to complete.

        Raises:
            RuntimeError: if either event was created without ``enable_timing=True``
                or has not been recorded.
            TypeError: if ``end`` is not a DeviceEvent.
        """
        if not isinstance(end, DeviceEvent):
            raise TypeError(f"DeviceEvent.elapsed_time: expected a DeviceEvent, got {type(end).__name__}")
        for name, ev in (("start", self), ("end", end)):
            if not ev._enable_timing:
                raise RuntimeError(
                    f"DeviceEvent.elapsed_time: the {name} event {ev} was created without enable_timing=True"
                )
            if ev._future is None:
                raise RuntimeError(f"DeviceEvent.elapsed_time: the {name} event {ev} has not been recorded on a stream")
        self.synchronize()
        end.synchronize()
        assert self._time is not None and end._time is not None
        return (end._time - self._time) * 1000.0

    def __str__(self) -> str:
        return f"{self._device.api}[{self._device.id}]:event@{id(self):#x}"

    __repr__ = __str__
