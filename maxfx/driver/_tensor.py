"""`Tensor` (alias `Buffer`): a buffer on a device, as ``max.driver.Tensor``.

Host tensors are numpy memory: slicing returns strided views, ``to_numpy`` and
``from_numpy`` share memory, ``mmap`` maps files. Accelerator tensors hold a
``jax.Array``; their views are recipes over it (see `_storage`). Results of
XLA executions are wrapped without copying and copied only when written to.

Example:
    >>> import numpy as np
    >>> from maxfx.driver import Tensor
    >>> t = Tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> t[1, ::2]
    Tensor(dtype=float32, shape=(2,), device=CPU())
    >>> t[1, 2] = 10.0
    >>> t.to_numpy()[1]
    array([ 3.,  4., 10.], dtype=float32)
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.dtypes import DType
from lowering.x64 import run, to_device
from maxfx.driver._device import CPU, Device, DeviceStream, as_device, device_of_jax
from maxfx.driver._storage import (
    DeviceStorage,
    HostStorage,
    _scratch,
    apply_jax,
    apply_np,
    device_zeros,
    is_strided_contiguous,
    np_view,
    shadow_of,
    write_back_jax,
)

__all__ = ["Tensor", "Buffer", "DevicePinnedBuffer", "as_array"]

_DLPACK_CPU, _DLPACK_CUDA_HOST = 1, 3


def _as_dtype(dtype: Any, where: str) -> DType:
    if isinstance(dtype, DType):
        return dtype
    try:
        return DType.from_numpy(dtype)
    except ValueError:
        raise TypeError(f"{where}: expected a DType, got {dtype!r}") from None


def _as_shape(shape: Any, where: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"{where}: shape must be a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"{where}: shape dims must be >= 0, got {list(dims)}")
    return dims


def _normalize_key(key: Any, where: str) -> tuple:
    """A basic-indexing key as a tuple ending in Ellipsis (so numpy returns a view, never a scalar)."""
    key = key if isinstance(key, tuple) else (key,)
    for k in key:
        if not (
            k is None
            or k is Ellipsis
            or isinstance(k, slice)
            or isinstance(k, (int, np.integer))
            and not isinstance(k, bool)
        ):
            raise TypeError(
                f"{where}: only basic indexing (ints, slices, ..., None) makes views; got {type(k).__name__} {k!r}. "
                "Gather with numpy on t.to_numpy() instead"
            )
    return key if any(k is Ellipsis for k in key) else (*key, Ellipsis)


def _is_jax_array(x: Any) -> bool:
    return isinstance(x, jax.Array)


def _device_put(data: Any, device: Device) -> jax.Array:
    return to_device(data, device.jax_device)  # keeps 64-bit dtypes when the user's JAX config has x64 off


def _broadcast_value(value: Any, dtype: np.dtype, shape: tuple[int, ...]) -> jax.Array:
    """``value`` as ``dtype`` broadcast to ``shape`` (for `Tensor.__setitem__`; run with 64-bit types)."""
    val = jnp.asarray(value, dtype=dtype)
    try:
        return jnp.broadcast_to(val, shape)
    except ValueError:
        raise ValueError(
            f"Tensor.__setitem__: value of shape {val.shape} does not fit the indexed shape {shape}"
        ) from None


class Tensor:
    """A device buffer of ``dtype`` elements with ``shape``.

    Overloads:
        ``Tensor(dtype, shape, device=None, pinned=False)``: uninitialised
        memory (zeros on accelerators) on ``device`` (default CPU);
        ``Tensor(dtype, shape, stream, pinned=False)``: on ``stream.device``;
        ``Tensor(array, device)``: a copy of a numpy array on ``device``.

    ``pinned=True`` with an accelerator makes a host-memory buffer associated
    with it (readable with ``to_numpy``; ``.to(device)`` uploads it).

    Example:
        >>> from maxfx.dtype import DType
        >>> Tensor(shape=[2, 3], dtype=DType.float32)
        Tensor(dtype=float32, shape=(2, 3), device=CPU())
    """

    __slots__ = (
        "_storage",
        "_steps",
        "_shape",
        "_dtype",
        "_device",
        "_stream",
        "_pinned",
        "_shadow",
        "_cache",
        "__weakref__",
    )

    def __init__(
        self,
        dtype: Any = None,
        shape: Any = None,
        device: Any = None,
        pinned: bool = False,
        *,
        stream: DeviceStream | None = None,
    ):
        if isinstance(dtype, np.ndarray) or isinstance(shape, np.ndarray) and dtype is None:
            # Tensor(array, device): MAX names the array argument "shape".
            arr = dtype if isinstance(dtype, np.ndarray) else shape
            dev = (
                shape
                if isinstance(dtype, np.ndarray) and not isinstance(shape, np.ndarray) and shape is not None
                else device
            )
            self._init_from(Tensor.from_numpy(arr).copy(as_device(dev, "Tensor")))
            return
        if isinstance(device, DeviceStream):
            device, stream = None, device
        if not isinstance(dtype, DType) and isinstance(shape, DType):
            dtype, shape = shape, dtype  # Tensor([2, 3], DType.float32)
        if dtype is None or shape is None:
            raise TypeError(
                "Tensor: expected Tensor(dtype, shape, device=None, pinned=False), Tensor(dtype, shape, stream) or "
                "Tensor(array, device)"
            )
        dt = _as_dtype(dtype, "Tensor")
        dims = _as_shape(shape, "Tensor")
        if stream is not None:
            if not isinstance(stream, DeviceStream):
                raise TypeError(f"Tensor: stream must be a DeviceStream, got {type(stream).__name__}")
            dev = stream.device
        else:
            dev = as_device(device, "Tensor")
        if dev.is_host or pinned:
            storage: HostStorage | DeviceStorage = HostStorage(np.empty(dims, dt.to_numpy()))
        else:
            # XLA has no uninitialised allocation: device buffers start zeroed.
            storage = DeviceStorage(device_zeros(dims, dt.to_numpy(), dev.jax_device))
        self._setup(storage, (), dims, dt, dev, bool(pinned), stream)

    # -- construction helpers ---------------------------------------------
    def _setup(self, storage, steps, shape, dtype, device, pinned, stream, shadow=None) -> None:
        self._storage = storage
        self._steps = steps
        self._shape = shape
        self._dtype = dtype
        self._device = device
        self._pinned = pinned
        self._stream = stream
        self._shadow = shadow
        self._cache: tuple[int, Any] | None = None

    def _init_from(self, other: Tensor) -> None:
        self._setup(
            other._storage,
            other._steps,
            other._shape,
            other._dtype,
            other._device,
            other._pinned,
            other._stream,
            other._shadow,
        )

    @classmethod
    def _new(cls, storage, shape, dtype, device, pinned=False, stream=None, steps=(), shadow=None) -> Tensor:
        t = cls.__new__(cls)
        t._setup(storage, steps, tuple(shape), dtype, device, pinned, stream, shadow)
        return t

    @classmethod
    def _host(cls, arr: np.ndarray, device: Device | None = None, pinned: bool = False) -> Tensor:
        return cls._new(HostStorage(arr), arr.shape, DType.from_numpy(arr.dtype), device or CPU(), pinned)

    @classmethod
    def _on_device(cls, arr: jax.Array, device: Device) -> Tensor:
        return cls._new(DeviceStorage(arr), arr.shape, DType.from_numpy(arr.dtype), device)

    @classmethod
    def _from_array(cls, array: Any) -> Tensor:
        """Wrap a numpy array or a jax.Array (an XLA result) without copying.

        A jax.Array on the CPU becomes a host tensor whose numpy view is made on
        first read and copied on first write; on a GPU it stays device memory.
        """
        if isinstance(array, Tensor):
            return array
        if isinstance(array, np.generic):
            array = np.asarray(array)
        if isinstance(array, np.ndarray):
            return cls._host(array)
        if not _is_jax_array(array):
            array = as_array(array)
            if isinstance(array, np.ndarray):
                return cls._host(array)
        try:
            dtype = DType.from_numpy(array.dtype)
        except ValueError as e:
            raise ValueError(f"Tensor._from_array: {e}") from None
        devices = array.devices()
        if all(d.platform == "cpu" for d in devices):
            return cls._new(HostStorage(array), array.shape, dtype, CPU())
        # A sharded result is reported on its lowest-numbered device.
        first = min(devices, key=lambda d: d.id)
        return cls._new(DeviceStorage(array), array.shape, dtype, device_of_jax(first))

    # -- memory access ----------------------------------------------------
    @property
    def _is_host_memory(self) -> bool:
        return isinstance(self._storage, HostStorage)

    def _host_read(self) -> np.ndarray:
        """This tensor's numpy view (read-only if its memory is)."""
        st = self._storage
        if self._cache is not None and self._cache[0] == st.version:
            return self._cache[1]
        arr = apply_np(st.read(), self._steps)
        self._cache = (st.version, arr)
        return arr

    def _host_write(self) -> np.ndarray:
        """This tensor's numpy view, writable (copy-on-write of read-only memory)."""
        self._storage.writable()
        return self._host_read()

    def _device_read(self) -> jax.Array:
        st = self._storage
        if not self._steps:
            return st.data
        if self._cache is not None and self._cache[0] == st.version:
            return self._cache[1]
        arr = apply_jax(st.data, self._steps)
        self._cache = (st.version, arr)
        return arr

    def _device_write(self, leaf: Any, key: tuple | None = None) -> None:
        """Replace this view's contents (or ``self[key]``) on the device."""
        st = self._storage
        steps = self._steps if key is None else (*self._steps, ("index", key))
        st.replace(write_back_jax(st.data, steps, leaf))

    def _host_numpy(self) -> np.ndarray:
        """The contents as numpy (zero-copy for host memory, a transfer otherwise)."""
        if self._is_host_memory:
            return self._host_read()
        return np.asarray(self._device_read())

    def _jax_input(self) -> np.ndarray | jax.Array:
        """What JAX consumes for this tensor, without copying."""
        if self._is_host_memory:
            if not self._steps and self._storage.jax_array is not None:
                return self._storage.jax_array
            return self._host_read()
        return self._device_read()

    def _assign(self, array: Any) -> None:
        """Replace the contents with ``array`` (same shape and dtype); used for mutated buffer inputs."""
        if tuple(array.shape) != self._shape or np.dtype(array.dtype) != self._dtype.to_numpy():
            raise ValueError(
                f"Tensor._assign: expected shape {self._shape} and dtype {self._dtype.name}, got shape "
                f"{tuple(array.shape)} and dtype {array.dtype}"
            )
        if self._is_host_memory:
            if not self._steps:
                self._storage.replace(array)
            else:
                np.copyto(self._host_write(), np.asarray(array))
        else:
            data = (
                array
                if _is_jax_array(array) and self._device.jax_device in array.devices()
                else _device_put(array, self._device)
            )
            if not self._steps:
                self._storage.replace(data)
            else:
                self._device_write(data)

    def _layout(self) -> np.ndarray:
        """Shadow array with this tensor's shape and strides (no data)."""
        if self._shadow is None:
            st = self._storage
            root_np = st._np if isinstance(st, HostStorage) else None
            strides = root_np.strides if root_np is not None else None
            self._shadow = shadow_of(self._shape, self._dtype.to_numpy(), strides)
        return self._shadow

    def _derived(self, steps: tuple, shadow: np.ndarray, dtype: DType) -> Tensor:
        return Tensor._new(
            self._storage, shadow.shape, dtype, self._device, self._pinned, self._stream, (*self._steps, *steps), shadow
        )

    # -- properties -------------------------------------------------------
    @property
    def device(self) -> Device:
        """Device the tensor is resident on."""
        return self._device

    @property
    def dtype(self) -> DType:
        """Element type."""
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape as a tuple of ints."""
        return self._shape

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    @property
    def num_elements(self) -> int:
        """Number of elements (1 for rank 0)."""
        return math.prod(self._shape)

    @property
    def element_size(self) -> int:
        """Bytes per element."""
        return self._dtype.size_in_bytes

    @property
    def is_host(self) -> bool:
        """Whether the tensor lives on the CPU."""
        return self._device.is_host

    @property
    def pinned(self) -> bool:
        """Whether the memory was requested page-locked (host memory paired with an accelerator)."""
        return self._pinned

    @property
    def stream(self) -> DeviceStream:
        """Stream the tensor is bound to (the device's default stream unless one was given)."""
        return self._stream if self._stream is not None else self._device.default_stream

    @property
    def is_contiguous(self) -> bool:
        """False for strided slices, including any with negative steps.

        Example:
            >>> import numpy as np
            >>> t = Tensor.from_numpy(np.zeros((4, 4), np.float32))
            >>> t.is_contiguous, t[1:3].is_contiguous, t[:, ::2].is_contiguous, t[::-1].is_contiguous
            (True, True, False, False)
        """
        if not self._steps and not self._is_host_memory:
            return True
        return is_strided_contiguous(self._layout())

    # -- constructors -----------------------------------------------------
    @classmethod
    def zeros(cls, shape: Sequence[int], dtype: DType, device: Device | None = None, pinned: bool = False) -> Tensor:
        """A zero-filled tensor.

        Example:
            >>> from maxfx.dtype import DType
            >>> Tensor.zeros((2,), DType.int32).to_numpy()
            array([0, 0], dtype=int32)
        """
        dt = _as_dtype(dtype, "Tensor.zeros")
        dims = _as_shape(shape, "Tensor.zeros")
        dev = as_device(device, "Tensor.zeros")
        if dev.is_host or pinned:
            return cls._host(np.zeros(dims, dt.to_numpy()), dev, bool(pinned))
        return cls._on_device(device_zeros(dims, dt.to_numpy(), dev.jax_device), dev)

    @classmethod
    def scalar(cls, value: Any, dtype: DType, device: Device | None = None) -> Tensor:
        """A rank-0 tensor holding ``value``.

        Example:
            >>> from maxfx.dtype import DType
            >>> Tensor.scalar(3, DType.float32).item()
            3.0
        """
        dt = _as_dtype(dtype, "Tensor.scalar")
        dev = as_device(device, "Tensor.scalar")
        try:
            arr = np.array(value, dtype=dt.to_numpy())
        except (OverflowError, ValueError, TypeError) as e:
            raise ValueError(f"Tensor.scalar: cannot represent {value!r} as {dt.name}: {e}") from None
        if arr.ndim != 0:
            raise ValueError(f"Tensor.scalar: expected a single value, got shape {arr.shape}")
        t = cls._host(arr)
        return t if dev.is_host else t.to(dev)

    @classmethod
    def from_numpy(cls, arr: np.ndarray) -> Tensor:
        """A host tensor sharing ``arr``'s memory (a contiguous copy if ``arr`` is strided).

        Raises:
            TypeError: if ``arr`` is not a numpy array.
            ValueError: if its dtype has no MAX equivalent.

        Example:
            >>> import numpy as np
            >>> a = np.zeros(3, np.int32)
            >>> Tensor.from_numpy(a)[0] = 7
            >>> a
            array([7, 0, 0], dtype=int32)
        """
        if isinstance(arr, np.generic):
            arr = np.asarray(arr)
        if not isinstance(arr, np.ndarray):
            raise TypeError(
                f"Tensor.from_numpy: expected a numpy array, got {type(arr).__name__}; use Tensor.from_dlpack for "
                "other arrays"
            )
        try:
            DType.from_numpy(arr.dtype)
        except ValueError as e:
            raise ValueError(f"Tensor.from_numpy: {e}") from None
        if not is_strided_contiguous(arr):
            arr = arr.copy(order="C")
        return cls._host(arr)

    @classmethod
    def from_dlpack(cls, array: Any, *, copy: bool | None = None) -> Tensor:
        """A tensor over any DLPack array (numpy, JAX, torch, Tensor), usually zero-copy.

        Host arrays become CPU tensors, GPU arrays accelerator tensors. With
        ``copy=True`` the result owns its memory.

        Raises:
            TypeError: if ``array`` does not implement DLPack.
            ValueError: if ``array`` is not contiguous (a transposed or
                strided view), as in MAX: make it contiguous first.

        Example:
            >>> import jax.numpy as jnp
            >>> Tensor.from_dlpack(jnp.arange(3)).to_numpy()
            array([0, 1, 2], dtype=int32)
        """
        if isinstance(array, Tensor):
            return array.copy() if copy else array
        if isinstance(array, np.ndarray):
            if not is_strided_contiguous(array):
                raise ValueError(
                    f"Tensor.from_dlpack: from_dlpack only accepts contiguous arrays. First call np.ascontiguousarray "
                    f"(got a numpy array of shape {array.shape} with strides {array.strides})"
                )
            return cls._host(array.copy() if copy else array)
        if _is_jax_array(array):
            # jax.Arrays are immutable, so sharing one is indistinguishable from a copy.
            return cls._from_array(array)
        if not (hasattr(array, "__dlpack__") and hasattr(array, "__dlpack_device__")):
            raise TypeError(
                f"Tensor.from_dlpack: {type(array).__name__} does not implement __dlpack__/__dlpack_device__"
            )
        is_contiguous = getattr(array, "is_contiguous", None)  # torch.Tensor
        if callable(is_contiguous) and not is_contiguous():
            raise ValueError(
                f"Tensor.from_dlpack: from_dlpack only accepts contiguous tensors. First call .contiguous() "
                f"(got a {type(array).__name__} of shape {tuple(getattr(array, 'shape', ()))})"
            )
        dev_type = int(array.__dlpack_device__()[0])
        if dev_type in (_DLPACK_CPU, _DLPACK_CUDA_HOST):
            try:
                host = np.from_dlpack(array, copy=copy)
            except (BufferError, TypeError, RuntimeError):
                pass  # numpy lacks e.g. bfloat16 in DLPack; JAX reads it
            else:
                if not is_strided_contiguous(host):
                    raise ValueError(
                        "Tensor.from_dlpack: from_dlpack only accepts contiguous tensors (got a "
                        f"{type(array).__name__} of shape {host.shape} "
                        f"with strides {host.strides}); make it contiguous first"
                    )
                return cls._host(host)
        arr = run(jax.dlpack.from_dlpack, array, copy=copy)  # run: 64-bit dtypes arrive as they are
        return cls._from_array(arr)

    @classmethod
    def mmap(
        cls,
        filename: str | os.PathLike,
        dtype: DType,
        shape: Sequence[int] | int,
        mode: str = "copyonwrite",
        offset: int = 0,
    ) -> Tensor:
        """A host tensor over a file, mapped with ``np.memmap`` semantics.

        ``mode='copyonwrite'`` keeps writes in memory, ``'r+'`` writes them to
        the file, ``'r'`` is read-only (writes through the tensor copy it first).

        Example:
            >>> import numpy as np, tempfile, os
            >>> from maxfx.dtype import DType
            >>> path = os.path.join(tempfile.mkdtemp(), "w.bin")
            >>> np.arange(4, dtype=np.int16).tofile(path)
            >>> Tensor.mmap(path, DType.int16, (2, 2)).to_numpy()
            memmap([[0, 1],
                    [2, 3]], dtype=int16)
        """
        dt = _as_dtype(dtype, "Tensor.mmap")
        dims = _as_shape(shape, "Tensor.mmap")
        # np.memmap reads shape () as "the whole file": map one element and drop the axis.
        arr = np.memmap(filename, dtype=dt.to_numpy(), mode=mode, offset=offset, shape=dims or (1,), order="C")
        return cls._host(arr if dims else arr.reshape(()))

    # -- copies and transfers ---------------------------------------------
    def _copy_to(self, device: Device, stream: DeviceStream | None, pinned: bool) -> Tensor:
        if device.is_host or pinned:
            src = self._host_numpy()
            return Tensor._new(
                HostStorage(np.array(src, order="C", copy=True)), self._shape, self._dtype, device, pinned, stream
            )
        src = self._jax_input()
        if _is_jax_array(src) and src.devices() == {device.jax_device}:
            data = src  # immutable: sharing it is a copy
        else:
            data = _device_put(src, device)
        return Tensor._new(DeviceStorage(data), self._shape, self._dtype, device, False, stream)

    def copy(self, device: Device | DeviceStream | None = None) -> Tensor:
        """A deep copy on ``device`` (a Device or DeviceStream; default: the same device).

        Example:
            >>> import numpy as np
            >>> a = Tensor.from_numpy(np.ones(2, np.float32))
            >>> b = a.copy(); b[0] = 5.0
            >>> a.to_numpy()
            array([1., 1.], dtype=float32)
        """
        if isinstance(device, DeviceStream):
            return self._copy_to(device.device, device, False)
        if device is None:
            return self._copy_to(self._device, self._stream, self._pinned)
        return self._copy_to(as_device(device, "Tensor.copy"), None, False)

    def contiguous(self) -> Tensor:
        """A contiguous copy on the same device."""
        return self._copy_to(self._device, self._stream, self._pinned)

    def to(self, target: Any) -> Tensor | list[Tensor]:
        """This tensor on ``target``: a Device, a DeviceStream, or a sequence of either (→ list).

        Copies only when the device differs.

        Example:
            >>> import numpy as np
            >>> t = Tensor.from_numpy(np.zeros(2, np.float32))
            >>> t.to(CPU()) is t
            True
        """
        if isinstance(target, (list, tuple)):
            return [self.to(x) for x in target]
        if isinstance(target, DeviceStream):
            if target.device == self._device and not self._needs_upload(target.device):
                return Tensor._new(
                    self._storage,
                    self._shape,
                    self._dtype,
                    self._device,
                    self._pinned,
                    target,
                    self._steps,
                    self._shadow,
                )
            return self._copy_to(target.device, target, False)
        device = as_device(target, "Tensor.to")
        if device == self._device and not self._needs_upload(device):
            return self
        return self._copy_to(device, None, False)

    def _needs_upload(self, device: Device) -> bool:
        # Pinned host memory tied to an accelerator moves into device memory on .to(accelerator).
        return self._is_host_memory and not device.is_host

    def inplace_copy_from(self, src: Tensor) -> None:
        """Copy ``src`` (any device) into this tensor; both contiguous, same dtype and element count.

        Raises:
            ValueError: on a non-contiguous tensor, or a dtype/size mismatch.

        Example:
            >>> import numpy as np
            >>> dst = Tensor.zeros((2, 2), np.float32)
            >>> dst.inplace_copy_from(Tensor.from_numpy(np.arange(4, dtype=np.float32)))
            >>> dst.to_numpy()
            array([[0., 1.],
                   [2., 3.]], dtype=float32)
        """
        if not isinstance(src, Tensor):
            src = Tensor.from_dlpack(src) if hasattr(src, "__dlpack__") else Tensor.from_numpy(np.asarray(src))
        if src is self or (src._storage is self._storage and src._steps == self._steps and src._dtype is self._dtype):
            return  # copying a tensor onto itself changes nothing (even when it is not contiguous)
        if not self.is_contiguous:
            raise ValueError(
                f"Tensor.inplace_copy_from: destination (shape {self._shape}) is not contiguous; copy into a "
                "contiguous tensor"
            )
        if not src.is_contiguous:
            raise ValueError(
                f"Tensor.inplace_copy_from: source (shape {src.shape}) is not contiguous; call src.contiguous() first"
            )
        if src.dtype is not self._dtype:
            raise ValueError(
                f"Tensor.inplace_copy_from: dtype mismatch: destination {self._dtype.name}, source {src.dtype.name}"
            )
        if src.num_elements != self.num_elements:
            raise ValueError(
                f"Tensor.inplace_copy_from: size mismatch: destination shape {self._shape} ({self.num_elements} "
                "elements), "
                f"source shape {src.shape} ({src.num_elements} elements)"
            )
        if self._is_host_memory:
            np.copyto(self._host_write(), src._host_numpy().reshape(self._shape))
        else:
            data = src._jax_input()
            data = _device_put(data, self._device).reshape(self._shape)
            self._device_write(data)

    # -- numpy / scalar access --------------------------------------------
    def to_numpy(self) -> np.ndarray:
        """The host memory as a numpy array, shared, never copied.

        The array is read-only when the memory is (an execution result, an
        ``mmap`` opened ``'r'``); writes through the Tensor copy it first.

        Raises:
            RuntimeError: for accelerator tensors; call ``.to(CPU())`` first.
        """
        if not self._is_host_memory:
            raise RuntimeError(
                f"Tensor.to_numpy: tensor of shape {self._shape} is on {self._device!r}; move it to the host with "
                ".to(CPU()) first"
            )
        return self._host_read()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        arr = self.to_numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def item(self) -> Any:
        """The value of a single-element tensor (any rank, e.g. shape ``()`` or ``(1, 1)``) as a Python scalar.

        Raises:
            ValueError: if the tensor does not hold exactly one element.

        Example:
            >>> import numpy as np
            >>> Tensor.from_numpy(np.arange(6).reshape(2, 3))[1, 2].item()
            5
            >>> Tensor.from_numpy(np.array([[7]], np.int32)).item()
            7
        """
        if self.num_elements != 1:
            raise ValueError(
                f"Tensor.item: calling `item` on a tensor with {self.num_elements} items but expected only 1 "
                f"(shape {self._shape}); index it down first (t[i, j].item())"
            )
        value = self._host_numpy().reshape(()).item()
        if self._dtype.is_float():
            return float(value)
        return bool(value) if self._dtype is DType.bool else int(value)

    def view(self, dtype: DType, shape: Sequence[int] | None = None) -> Tensor:
        """The same bytes as ``dtype`` (and ``shape``); memory is shared.

        Without ``shape`` only the last axis changes size.

        Raises:
            ValueError: if the shape cannot be deduced or the bytes do not fit.

        Example:
            >>> import numpy as np
            >>> from maxfx.dtype import DType
            >>> Tensor.from_numpy(np.zeros((2, 4), np.uint8)).view(DType.int32).shape
            (2, 1)
        """
        dt = _as_dtype(dtype, "Tensor.view")
        np_dt = dt.to_numpy()
        old_size = self._dtype.to_numpy().itemsize
        if shape is None:
            if not self._shape:
                if np_dt.itemsize != old_size:
                    raise ValueError(
                        f"Tensor.view: cannot deduce a shape to view a rank-0 {self._dtype.name} tensor as {dt.name}; "
                        "pass shape="
                    )
                dims: tuple[int, ...] = ()
            else:
                last_bytes = self._shape[-1] * old_size
                if last_bytes % np_dt.itemsize:
                    raise ValueError(
                        f"Tensor.view: cannot deduce a shape: the last axis of shape {self._shape} holds {last_bytes} "
                        "bytes "
                        f"({self._dtype.name}), not a multiple of {dt.name}'s {np_dt.itemsize}; pass shape="
                    )
                dims = (*self._shape[:-1], last_bytes // np_dt.itemsize)
        else:
            dims = _as_shape(shape, "Tensor.view")
        if math.prod(dims) * np_dt.itemsize != self.num_elements * old_size:
            raise ValueError(
                f"Tensor.view: shape {dims} of {dt.name} needs {math.prod(dims) * np_dt.itemsize} bytes, "
                f"but shape {self._shape} of {self._dtype.name} holds {self.num_elements * old_size}"
            )
        if (
            not self._is_host_memory
            and (dt is DType.float4_e2m1fn or self._dtype is DType.float4_e2m1fn)
            and dt is not self._dtype
        ):
            raise ValueError("Tensor.view: reinterpreting float4_e2m1fn accelerator memory is not supported")
        try:
            shadow = np_view(self._layout(), np_dt, dims)
        except (ValueError, AttributeError) as e:
            raise ValueError(
                f"Tensor.view: cannot view the non-contiguous tensor of shape {self._shape} as {dt.name}{list(dims)} "
                f"without a copy ({e}); call .contiguous() first"
            ) from None
        return self._derived((("view", np_dt, dims),), shadow, dt)

    def _data_address(self) -> int:
        """Address of this tensor's first element."""
        if self._is_host_memory:
            return int(self._host_read().ctypes.data)
        # Device views: the root buffer's address plus the view's byte offset,
        # read off the shadow (laid out over a scratch element like the root).
        root = self._storage.data
        offset = 0
        if self._steps:
            root_shadow = _scratch_address(np.dtype(root.dtype))
            offset = int(self._layout().ctypes.data) - root_shadow
        return int(root.unsafe_buffer_pointer()) + offset

    def _aligned(self, alignment: int | None = None) -> bool:
        """Whether the first element's address is a multiple of ``alignment`` bytes (default: the dtype's alignment).

        Example:
            >>> import numpy as np
            >>> from maxfx.dtype import DType
            >>> t = Tensor.zeros((4,), DType.int32)
            >>> t._aligned(), t.view(DType.uint8)[1:]._aligned(DType.int32.align)
            (True, False)
        """
        align = self._dtype.align if alignment is None else int(alignment)
        if align <= 0:
            raise ValueError(f"Tensor._aligned: alignment must be a positive number of bytes, got {align}")
        return self._data_address() % align == 0

    # -- indexing ---------------------------------------------------------
    def __getitem__(self, key: Any) -> Tensor:
        """A strided view (numpy basic indexing); all-integer keys give rank-0 tensors."""
        key = _normalize_key(key, "Tensor.__getitem__")
        try:
            shadow = self._layout()[key]
        except IndexError as e:
            raise IndexError(f"Tensor.__getitem__: {e} (tensor shape {self._shape})") from None
        return self._derived((("index", key),), shadow, self._dtype)

    def __setitem__(self, key: Any, value: Any) -> None:
        """Write ``value`` at ``key`` (an element, or a broadcastable block for slices).

        Example:
            >>> import numpy as np
            >>> t = Tensor.zeros((2, 2), np.int32)
            >>> t[0, 1] = 3
            >>> t.to_numpy().tolist()
            [[0, 3], [0, 0]]
        """
        raw = key if isinstance(key, tuple) else (key,)
        if all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in raw) and not isinstance(
            value, (Tensor, np.ndarray, list, tuple)
        ):
            # An element write: MAX requires one index per axis (a rank-0 tensor takes [0]).
            if not self._shape and raw in ((), (0,)):
                key = ()
            elif len(raw) != len(self._shape):
                raise ValueError(
                    f"Tensor.__setitem__: writing a single element needs {len(self._shape)} indices for a tensor of "
                    f"shape {self._shape}, got {len(raw)}: {list(raw)}"
                )
        key = _normalize_key(key, "Tensor.__setitem__")
        try:
            target_shape = self._layout()[key].shape
        except IndexError as e:
            raise IndexError(f"Tensor.__setitem__: {e} (tensor shape {self._shape})") from None
        if isinstance(value, Tensor):
            value = value._host_numpy() if self._is_host_memory else value._jax_input()
        if self._is_host_memory:
            val = np.asarray(value)
            try:
                np.broadcast_shapes(val.shape, target_shape)
            except ValueError:
                raise ValueError(
                    f"Tensor.__setitem__: value of shape {val.shape} does not fit the indexed shape {target_shape}"
                ) from None
            with np.errstate(
                over="ignore"
            ):  # a float past the dtype's range stores inf (IEEE), as MAX does, without numpy's warning
                self._host_write()[key] = val
        else:
            val = run(_broadcast_value, value, self._dtype.to_numpy(), target_shape)
            self._device_write(_device_put(val, self._device), key)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a rank-0 Tensor")
        return self._shape[0]

    # -- DLPack -----------------------------------------------------------
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        """Export as a DLPack capsule (zero-copy where the dtype allows)."""
        kwargs = {"stream": stream, "max_version": max_version, "dl_device": dl_device, "copy": copy}
        if self._is_host_memory:
            if not self._steps and self._storage.jax_array is not None:
                return self._storage.jax_array.__dlpack__(**kwargs)
            arr = self._host_read()
            try:
                return arr.__dlpack__(**{k: v for k, v in kwargs.items() if k != "stream" or v is not None})
            except (BufferError, TypeError):
                # numpy cannot export bfloat16/float8; JAX can.
                return _device_put(arr, CPU()).__dlpack__(**kwargs)
        return self._device_read().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)`` in DLPack numbering."""
        if self._is_host_memory:
            return (_DLPACK_CPU, 0)
        root = self._storage.data
        return tuple(int(v) for v in root.__dlpack_device__())

    # -- Python protocol --------------------------------------------------
    def __repr__(self) -> str:
        return f"Tensor(dtype={self._dtype.name}, shape={self._shape}, device={self._device!r})"

    def __copy__(self) -> Tensor:
        return Tensor._new(
            self._storage, self._shape, self._dtype, self._device, self._pinned, self._stream, self._steps, self._shadow
        )

    def __deepcopy__(self, memo: dict) -> Tensor:
        return self.copy()

    def __reduce__(self) -> tuple:
        return (_rebuild, (np.array(self._host_numpy(), copy=True, order="C"), self._device, self._pinned))


def _rebuild(arr: np.ndarray, device: Device, pinned: bool) -> Tensor:
    t = Tensor._host(arr, CPU())
    return t._copy_to(device, None, pinned) if not device.is_host or pinned else t


Buffer = Tensor
"""`max.driver.Buffer` (MAX ≥ 26 name of `Tensor`): the same class."""


def _scratch_address(dtype: np.dtype) -> int:
    return int(_scratch(dtype).ctypes.data)


class DevicePinnedBuffer(Tensor):
    """Page-locked host memory paired with an accelerator (MAX's ``max.driver.DevicePinnedBuffer``).

    The buffer lives in host memory (``to_numpy`` reads it) but belongs to
    ``device``: ``.to(device)`` uploads it and ``inplace_copy_from`` downloads
    into it. ``pinned`` is True. XLA stages its own host transfers, so the
    memory is ordinary host memory marked pinned.

    Raises:
        ValueError: if ``device`` is the host: pinned memory exists for
            transfers to and from an accelerator.

    Example:
        >>> from maxfx.driver import CPU
        >>> from maxfx.dtype import DType
        >>> try:
        ...     DevicePinnedBuffer(DType.float32, [4], device=CPU())
        ... except ValueError as e:
        ...     print(str(e).split(":")[0])
        DevicePinnedBuffer requires a non-host device
    """

    __slots__ = ()

    def __init__(self, dtype: Any = None, shape: Any = None, device: Any = None):
        dev = _pinned_device(device, "DevicePinnedBuffer")
        super().__init__(dtype, shape, dev, pinned=True)

    @classmethod
    def zeros(
        cls, shape: Sequence[int], dtype: DType, device: Device | None = None, pinned: bool = True
    ) -> DevicePinnedBuffer:
        """A zero-filled pinned buffer for ``device``.

        Raises:
            ValueError: if ``device`` is the host.
        """
        dev = _pinned_device(device, "DevicePinnedBuffer.zeros")
        dt = _as_dtype(dtype, "DevicePinnedBuffer.zeros")
        dims = _as_shape(shape, "DevicePinnedBuffer.zeros")
        return cls._host(np.zeros(dims, dt.to_numpy()), dev, True)


def _pinned_device(device: Any, where: str) -> Device:
    dev = as_device(device, where)
    if dev.is_host:
        raise ValueError(
            f"DevicePinnedBuffer requires a non-host device: {where} got {dev!r}; pass an Accelerator(), or use Buffer "
            "for host memory"
        )
    return dev


def as_array(x: Any) -> np.ndarray | jax.Array:
    """Something JAX can consume for ``x``, without copying where possible.

    Accepts driver Tensors, numpy and JAX arrays, any DLPack object, Python and
    numpy scalars and nested lists.

    Example:
        >>> import numpy as np
        >>> a = np.ones(3)
        >>> as_array(Tensor.from_numpy(a)) is a
        True
    """
    if isinstance(x, Tensor):
        return x._jax_input()
    if isinstance(x, np.ndarray) or _is_jax_array(x):
        return x
    if isinstance(x, (bool, int, float, np.generic)):
        return np.asarray(x)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return Tensor.from_dlpack(x)._jax_input()
    if isinstance(x, (list, tuple)):
        return np.asarray(x)
    raise TypeError(
        f"as_array: cannot turn {type(x).__name__} into an array; pass a Tensor, numpy/JAX array, DLPack object or "
        "scalar"
    )
