"""The eager `Tensor`: lazily recorded ops, realized when observed.

A `Tensor` is a handle on one var of the eager graph (`lowering.eager`):
operators and ``maxfx.functional`` ops record nodes (checking shapes and dtypes
at the call), and reading values (``print``, ``item``, numpy/DLPack,
``bool``, ``realize``, ``driver_tensor``) realizes everything the tensor
depends on as one fused XLA program. Inside ``jax.jit``/``grad``/``vmap`` a
Tensor holds a tracer and ops apply directly. While ``Module.compile`` traces,
a Tensor wraps a graph value (`Tensor.from_graph_value`) and ops record into
that graph.

Example:
    >>> from maxfx.experimental.tensor import Tensor
    >>> x = Tensor([1.0, -2.0, 3.0])
    >>> print(x * 2 + 1)
    TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [3.0, -3.0, 7.0]
"""

from __future__ import annotations

import collections.abc
import operator
import warnings
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from lowering.context import Context, GraphBuilder, current_context, use_context
from lowering.devices import array_device_ref, has_hardware
from lowering.dims import Dim, Shape, StaticDim
from lowering.dtypes import DType
from lowering.eager import EagerContext, LazyVar, is_lazy, pending_block, placed_leaf, realize, write_lock
from lowering.ops import advanced_indexing
from lowering.ops.core import to_constant_array
from lowering.types import DeviceRef, TensorType
from lowering.x64 import to_device
from maxfx import driver
from maxfx._addressable import check_readable, describe
from maxfx.driver._device import as_device
from maxfx.experimental import _random_state
from maxfx.experimental._defaults import defaults
from maxfx.graph import ops
from maxfx.graph._graph import Graph
from maxfx.graph._value import TensorOperators, TensorValue, Value, wrap_var

__all__ = ["Tensor", "ComputeGraph", "driver_tensor_type"]


# ─── Construction helpers ─────────────────────────────────────────────────


def _new(var: LazyVar) -> Tensor:
    t = object.__new__(Tensor)
    t._var = var
    t._gv = None
    t.__lowering_context__ = EAGER
    var.owner = weakref.ref(t)
    return t


EAGER = EagerContext(wrap=_new)
"""The eager context of `Tensor`: ops on eager tensors record here and come back as Tensors."""


def _device_ref(device: driver.Device) -> DeviceRef:
    return DeviceRef.from_device(device)


def _put(array: Any, device: driver.Device) -> jax.Array:
    """``array`` (host data or a jax array) on ``device``, 64-bit dtypes kept (`lowering.x64.to_device`)."""
    return to_device(array, device.jax_device)


def _placed(array: np.ndarray, dtype: DType, device: driver.Device) -> Tensor:
    """A tensor of host data ``array`` on ``device``.

    Inside ``F.lazy()`` a GPU this machine lacks (a virtual device, or one a test
    mocks) gets a pending transfer instead, so layers can be traced for devices
    that are not here (`lowering.eager.placed_leaf`).
    """
    ref = _device_ref(device)
    if ref.is_gpu() and is_lazy() and not has_hardware(ref):
        return _new(placed_leaf(np.asarray(array), dtype, ref))
    return _leaf(_put(array, device), dtype, device)


def _leaf(array: Any, dtype: DType | None = None, device: driver.Device | None = None) -> Tensor:
    """A realized tensor holding the JAX array ``array`` (or tracer)."""
    if dtype is None:
        dtype = DType.from_numpy(array.dtype)
    ref = _device_ref(device) if device is not None else array_device_ref(array)
    return _new(LazyVar(TensorType(dtype, array.shape, ref), array=array))


def _host_value(array: Any, where: str) -> np.ndarray:
    """``np.asarray(array)``; a global array this process holds only part of raises `NotAddressableError` naming
    ``where``.
    """
    try:
        return np.asarray(array)
    except RuntimeError:
        check_readable(array, where)  # JAX's own error names neither the Tensor API nor maxfx.distributed.gather
        raise


def _is_array_like(x: Any) -> bool:
    return isinstance(x, (np.ndarray, jax.Array)) or (hasattr(x, "__dlpack__") and not isinstance(x, Tensor))


class _GraphTensors(Context):
    """Binds ops on Tensors that wrap values of a graph being built; results are Tensors again."""

    def __init__(self, builder: Context):
        self.builder = builder
        self.parent = builder

    def recording_builder(self) -> Context:
        return self.builder

    @property
    def closed_graph(self) -> str | None:
        return getattr(self.builder, "closed_graph", None)  # Tensors of a closed Graph's values raise as its values do

    def nested(self, child: Context) -> Context:
        return _graph_context(child)  # branch and loop-body code sees Tensors too

    def present(self, value: Any) -> Any:
        return Tensor.from_graph_value(value)

    def is_ancestor_of(self, other: Context | None) -> bool:
        return self.builder.is_ancestor_of(other)  # a nested block's context descends from the graph's

    def bind(self, op, inputs, params):
        values = [x._gv if isinstance(x, Tensor) else x for x in inputs]
        out = self.builder.bind(op, values, params)
        if isinstance(out, tuple):
            return tuple(Tensor.from_graph_value(v) for v in out)
        return None if out is None else Tensor.from_graph_value(out)


def _graph_being_built() -> GraphBuilder | None:
    """The builder the current context records into (a Graph, a compile trace, a nested block), if any."""
    ctx = current_context()
    return None if ctx is None else ctx.recording_builder()


def _graph_context(builder: Context) -> _GraphTensors:
    ctx = getattr(builder, "_tensor_context", None)
    if ctx is None:
        ctx = builder._tensor_context = _GraphTensors(builder)
    return ctx


# ─── Tensor ───────────────────────────────────────────────────────────────


class Tensor(TensorOperators):
    """A lazily evaluated tensor with numpy-style operators.

    Args:
        data: a scalar, nested list, numpy/JAX/DLPack array or Tensor.
        dtype: element type (default: the array's dtype, else `defaults()`).
        device: a driver ``Device`` (default: `defaults()`).
        storage: a realized ``driver.Tensor`` to wrap instead of ``data``.
        value: a graph ``TensorValue`` to wrap (see `from_graph_value`).

    Example:
        >>> t = Tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> t.shape, t.dtype
        ([Dim(2), Dim(2)], <DType.float32: 81>)
        >>> (t @ t)[0, 0].item()
        7.0
    """

    # How ops on this tensor are bound: the eager context, or the one of the graph value it wraps (`_gv`). A slot
    # rather than a property: every op reads it (`find_context`), and a slot is read without a Python call.
    __slots__ = ("_var", "_gv", "__lowering_context__", "__weakref__")

    def __init__(
        self,
        data: Any = None,
        dtype: DType | None = None,
        device: Any = None,
        *,
        storage: Any = None,
        value: Any = None,
    ):
        if value is not None:
            src = Tensor.from_graph_value(value)
        elif storage is not None:
            src = Tensor._from_driver(storage)
        elif data is not None:
            given = getattr(data, "dtype", None) if _is_array_like(data) else None
            if dtype is not None and given is not None and DType.from_numpy(np.dtype(given)) is not dtype:
                # MAX: the constructor keeps an array's dtype and never casts it silently.
                raise ValueError(
                    f"Tensor: DType must match the array's dtype: dtype={dtype.name} given for a "
                    f"{np.dtype(given).name} array; cast the array (or use .cast) first"
                )
            src = Tensor._constant(data, dtype=dtype, device=device)
        else:
            raise TypeError(
                "Tensor() needs data (a scalar, list or array), storage= (a driver.Tensor) or value= (a graph value)"
            )
        self._var = src._var
        self._gv = src._gv
        self.__lowering_context__ = src.__lowering_context__
        if self._var is not None:
            self._var.owner = weakref.ref(self)

    # -- constructors ------------------------------------------------------
    @classmethod
    def constant(cls, value: Any, *, dtype: DType | None = None, device: Any = None) -> Tensor:
        """A tensor holding ``value`` (scalar, nested list or DLPack array).

        Deprecated, as in MAX: use ``Tensor(value, dtype=..., device=...)``.
        Python data gets the default dtype (`defaults`); arrays keep theirs
        unless ``dtype`` is given (then they are cast).

        Example:
            >>> import warnings
            >>> with warnings.catch_warnings():
            ...     warnings.simplefilter("ignore", DeprecationWarning)
            ...     Tensor.constant([1, 2, 3]).dtype
            <DType.float32: 81>
        """
        warnings.warn(
            "Tensor.constant is deprecated: use Tensor(value, dtype=..., device=...)", DeprecationWarning, stacklevel=2
        )
        return cls._constant(value, dtype=dtype, device=device)

    @classmethod
    def _constant(cls, value: Any, *, dtype: DType | None = None, device: Any = None) -> Tensor:
        # `constant` without the deprecation warning: the library's own constructor path.
        if isinstance(value, Tensor):
            out = value if dtype is None or value.dtype is dtype else value.cast(dtype)
            return out if device is None else out.to(device)
        if isinstance(value, driver.Tensor):
            out = cls._from_driver(value)
            return cls._constant(out, dtype=dtype, device=device) if dtype is not None or device is not None else out
        keep_dtype = dtype is None and (_is_array_like(value) or isinstance(value, np.generic) or _is_bool_data(value))
        requested, dev = defaults(dtype, device)
        arr, dtype = to_constant_array(value, None if keep_dtype else requested, op="Tensor.constant")
        return _placed(arr, dtype, dev)

    @classmethod
    def _from_driver(cls, storage: driver.Tensor) -> Tensor:
        if not isinstance(storage, driver.Tensor):
            raise TypeError(f"Tensor(storage=...): expected a driver.Tensor, got {type(storage).__name__}")
        array = storage._jax_input()
        if isinstance(array, np.ndarray):
            array = _put(np.array(array), storage.device)  # copy: the driver tensor stays mutable
        return _leaf(array, storage.dtype, storage.device)

    @classmethod
    def from_dlpack(cls, array: Any) -> Tensor:
        """Wrap a DLPack array (numpy, JAX, torch...) without copying where the device allows."""
        if isinstance(array, Tensor):
            return array
        if isinstance(array, jax.Array):
            return _leaf(array)
        return cls._from_driver(driver.Tensor.from_dlpack(array))

    @classmethod
    def from_graph_value(cls, value: Any) -> Tensor:
        """A Tensor wrapping a graph value (used while ``Module.compile`` traces)."""
        if isinstance(value, Tensor):
            return value
        if not isinstance(value, Value):
            raise TypeError(f"Tensor.from_graph_value: expected a graph TensorValue, got {type(value).__name__}")
        t = object.__new__(cls)
        t._var = None
        t._gv = value.tensor
        t.__lowering_context__ = _graph_context(t._gv.__lowering_context__)
        return t

    @classmethod
    def from_dim(cls, dim: Any) -> Tensor:
        """A rank-0 int64 CPU tensor holding the value of dimension ``dim``.

        The way to branch at run time on a symbolic dim (``int(dim)`` fails for
        one): compare the tensor and pass the result to ``F.cond``. A static dim
        works anywhere; a symbolic or algebraic one needs a graph being built
        (inside ``Module.compile``, ``F.functional`` under a Graph, ...).

        Raises:
            ValueError: a symbolic dim outside a graph (it has no value there).

        Example:
            >>> Tensor.from_dim(5).item()
            5
        """
        d = Dim(dim)
        if isinstance(d, StaticDim):
            return cls(int(d), dtype=DType.int64, device=driver.CPU())
        builder = _graph_being_built()
        if builder is None:
            raise ValueError(
                f"Tensor.from_dim({d}): a symbolic dimension has no value in eager mode. Use a static dimension, or "
                "call this while building a graph (e.g. inside Module.compile)"
            )
        with use_context(builder):
            value = ops.reshape(ops.shape_to_tensor([d]), [])
        return cls.from_graph_value(value)

    @classmethod
    def _filled(cls, shape: Any, value: Any, dtype: DType | None, device: Any, where: str) -> Tensor:
        if _is_layout(device):  # MAX: device= a DeviceMesh or DeviceMapping makes a distributed tensor
            return DISTRIBUTED["filled"](shape, value, defaults(dtype, None)[0], device, where)
        dtype, dev = defaults(dtype, device)
        dims = _creation_shape(shape, where)
        arr, _ = to_constant_array(value, dtype, op=where)
        if is_lazy():  # as in MAX, a creation inside F.lazy() is pending too: a recorded broadcast of the value
            return ops.broadcast_to(_placed(np.asarray(arr), dtype, dev), dims)
        array = _put(np.broadcast_to(arr, dims), dev)
        return _leaf(array, dtype, dev)

    @classmethod
    def full(cls, shape: Any, value: Any, *, dtype: DType | None = None, device: Any = None) -> Tensor:
        """A tensor of ``shape`` filled with ``value``.

        Example:
            >>> Tensor.full([2], 7.0)[0].item()
            7.0
        """
        return cls._filled(shape, value, dtype, device, "Tensor.full")

    @classmethod
    def zeros(cls, shape: Any, *, dtype: DType | None = None, device: Any = None) -> Tensor:
        """A tensor of zeros."""
        return cls._filled(shape, 0, dtype, device, "Tensor.zeros")

    @classmethod
    def ones(cls, shape: Any, *, dtype: DType | None = None, device: Any = None) -> Tensor:
        """A tensor of ones."""
        return cls._filled(shape, 1, dtype, device, "Tensor.ones")

    @classmethod
    def full_like(cls, type: Any, value: Any) -> Tensor:
        """A tensor with ``type``'s dtype, shape and device (a TensorType or Tensor), filled with ``value``."""
        dtype, shape, device = _type_parts(type, "Tensor.full_like")
        return cls._filled(shape, value, dtype, device, "Tensor.full_like")

    @classmethod
    def zeros_like(cls, type: Any) -> Tensor:
        """Zeros with ``type``'s dtype, shape and device."""
        return cls.full_like(type, 0)

    @classmethod
    def ones_like(cls, type: Any) -> Tensor:
        """Ones with ``type``'s dtype, shape and device."""
        return cls.full_like(type, 1)

    @classmethod
    def arange(
        cls, start: Any = 0, stop: Any = None, step: Any = 1, *, dtype: DType | None = None, device: Any = None
    ) -> Tensor:
        """Evenly spaced values in ``[start, stop)``, like Python's ``range``.

        Example:
            >>> Tensor.arange(4).shape
            [Dim(4)]
        """
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError("Tensor.arange: step must not be zero")
        dtype, dev = defaults(dtype, device)
        arr = np.arange(start, stop, step).astype(dtype.to_numpy())  # numpy: no JAX config involved
        return _placed(arr, dtype, dev)

    range = arange

    @classmethod
    def range_like(cls, type: Any) -> Tensor:
        """``0..n-1`` along the last dim of ``type`` (TensorType or Tensor), broadcast to its shape."""
        dtype, shape, device = _type_parts(type, "Tensor.range_like")
        if not shape:
            raise ValueError("Tensor.range_like: type must have rank >= 1")
        arr = np.broadcast_to(np.arange(shape[-1]).astype(dtype.to_numpy()), shape)
        return _placed(np.ascontiguousarray(arr), dtype, device)

    @classmethod
    def randn(cls, shape: Any, *, dtype: DType | None = None, device: Any = None) -> Tensor:
        """Standard-normal samples, drawn from the same stream as ``maxfx.random.normal``.

        Example:
            >>> Tensor.randn([4, 128]).shape
            [Dim(4), Dim(128)]
        """
        dtype, dev = defaults(dtype, device)
        key = Tensor._constant(_random_state.next_key(), device=dev)
        return ops.random_normal(key, shape, dtype, DeviceRef.from_device(dev), 0.0, 1.0)

    # -- properties --------------------------------------------------------
    @property
    def type(self) -> TensorType:
        """``TensorType(dtype, shape, device)`` of the tensor."""
        return self._gv.type if self._gv is not None else self._var.type

    @property
    def dtype(self) -> DType:
        """Element type."""
        return self.type.dtype

    @property
    def shape(self) -> Shape:
        """Shape as a list of `Dim` (equal to a list or tuple of ints)."""
        return self.type.shape

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.type.shape)

    @property
    def device(self) -> driver.Device:
        """The driver device holding the tensor."""
        return self.type.device.to_device()

    @property
    def real(self) -> bool:
        """True when the values exist (realized), False while work is pending."""
        return self._gv is None and self._var.node is None

    @property
    def realize(self) -> _Done:
        """Compute this tensor now (a property, as in MAX); returns an awaitable of the tensor.

        MAX's ``realize`` is awaited (``asyncio.run(t.realize)``); maxfx computes
        on access, so awaiting is optional and returns the tensor at once.

        Example:
            >>> import asyncio
            >>> from maxfx.experimental import functional as F
            >>> with F.lazy():
            ...     y = Tensor([1.0, 2.0]) * 3
            >>> asyncio.run(y.realize) is y, y.real
            (True, True)
        """
        self._array()
        return _Done(self)

    @property
    def storage(self) -> driver.Tensor | None:
        """The driver tensor holding the values, or None while unrealized."""
        if not self.real:
            return None
        return driver.Tensor._from_array(self._var.array)

    @property
    def driver_tensor(self) -> driver.Tensor:
        """The values as a ``driver.Tensor`` (realizes the tensor)."""
        return driver.Tensor._from_array(self._array())

    def num_elements(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    # -- realization -------------------------------------------------------
    def _array(self) -> Any:
        """The realized value (a JAX array, or a tracer under a JAX transform)."""
        if self._gv is not None:
            raise TypeError(
                "this Tensor is a symbolic graph value (inside Module.compile or a Graph); its values exist only when "
                "the graph runs"
            )
        var = self._var
        if var.node is not None:
            realize([var])
        return var.array

    def _numpy(self, where: str = "reading a Tensor's values") -> np.ndarray:
        array = self._array()
        if isinstance(array, jax.core.Tracer):
            raise jax.errors.ConcretizationTypeError(array, "reading a Tensor's values inside a JAX transformation")
        return _host_value(array, where)

    def to_numpy(self) -> np.ndarray:
        """The values as a numpy array (realizes; copies off accelerators).

        Raises:
            NotAddressableError: in a multi-process job, the Tensor holds a global
                array split over processes (`maxfx.distributed.gather` reads it whole).
        """
        return self._numpy("Tensor.to_numpy")

    def item(self) -> Any:
        """The single value as a Python scalar.

        Raises:
            TypeError: the tensor does not have exactly one element (as MAX 26.7's
                ``Tensor.item``; the driver's ``Buffer.item`` raises a ValueError, as MAX's does).
            NotAddressableError: in a multi-process job, the one element lives on another process's device.
        """
        if self._gv is not None:
            self._array()  # raises: symbolic values have no Python value
        n = self.num_elements()
        if n != 1:
            raise TypeError(
                "Tensor.item: only tensors with exactly one element can be converted to a Python scalar; this one has "
                f"shape {list(map(int, self.shape))} ({n} elements)"
            )
        return self._numpy("Tensor.item").reshape(()).item()

    def to(self, device: Any) -> Tensor:
        """A copy on ``device`` (a driver Device or DeviceRef)."""
        if self._gv is not None:
            return ops.transfer_to(self, device)
        dev = as_device(device, "Tensor.to")
        if dev == self.device:
            return self
        ref = _device_ref(dev)
        if is_lazy() and not (has_hardware(ref) and has_hardware(self.type.device)):
            return ops.transfer_to(self, ref)  # recorded: one end is a device this machine lacks (see _placed)
        array = self._array()
        moved = _put(array, dev)
        return _leaf(moved, self.dtype, dev)

    def __tensorvalue__(self) -> TensorValue:
        """This tensor as a value of the graph being built (MAX's ``HasTensorValue``).

        Inside ``with Graph(...)`` a tensor with values becomes a constant of that
        graph (what ops do with it implicitly); a tensor wrapping a graph value
        returns that value.

        Raises:
            TypeError: no graph is being built (eager tensors go to ops as they are).

        Example:
            >>> from maxfx.graph import Graph, TensorValue
            >>> with Graph("g"):
            ...     TensorValue(Tensor([1.0, 2.0]))
            TensorValue(dtype=float32, shape=[Dim(2)], device=cpu:0)
        """
        if self._gv is not None:
            return self._gv
        builder = _graph_being_built()
        if builder is None:
            raise TypeError(
                "Tensor.__tensorvalue__: no Graph is being built, so there is no graph for the value; pass the tensor "
                "to maxfx ops as it is, or convert it inside `with Graph(...)`"
            )
        return wrap_var(builder, builder.constant(self._numpy(), self.dtype, self.type.device))

    # -- extra methods (MAX 26.7) -----------------------------------------
    def sum(self, axis: int = -1) -> Tensor:
        """Sum along ``axis`` (kept as size 1)."""
        return ops.sum(self, axis)

    def squeeze(self, axis: int) -> Tensor:
        """Remove the size-1 dim ``axis``."""
        return ops.squeeze(self, axis)

    def unsqueeze(self, axis: int) -> Tensor:
        """Insert a size-1 dim at ``axis``."""
        return ops.unsqueeze(self, axis)

    def split(self, split_sizes: Sequence[int], axis: int = 0) -> list[Tensor]:
        """Split along ``axis`` into pieces of ``split_sizes``."""
        return list(ops.split(self, split_sizes, axis))

    def clip(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 - MAX's names
        """Clamp values into ``[min, max]`` (either bound may be None)."""
        out = self
        if min is not None:
            out = ops.max(out, min)
        if max is not None:
            out = ops.min(out, max)
        return out

    # -- Python protocols --------------------------------------------------
    def __repr__(self) -> str:
        if self._gv is not None:
            return f"Tensor({self._gv.type})"
        array = self._var.array if self.real else self._array()
        if isinstance(array, jax.core.Tracer):
            return f"{self.type}: <traced {type(array).__name__}>"
        split = describe(array)
        if split is not None:  # repr must not raise, and printing is how users meet a global value first
            return f"{self.type}: <{split}; maxfx.distributed.gather(t) reads it on every process>"
        return f"{self.type}: {format_values(np.asarray(array))}"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if spec:
            return format(self.item(), spec)
        return str(self)

    def __bool__(self) -> bool:
        if self.num_elements() != 1:
            raise ValueError(
                f"the truth value of a Tensor with {self.num_elements()} elements is ambiguous; use .item() on a "
                "one-element tensor"
            )
        return bool(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __index__(self) -> int:
        if not self.dtype.is_integral():
            raise TypeError(f"only integer tensors can be used as an index, got {self.dtype.name}")
        return int(self.item())

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a rank-0 Tensor")
        return int(self.shape[0])

    def __iter__(self) -> Iterator[Tensor]:
        for i in range(len(self)):
            yield self[i]

    def __setitem__(self, index: Any, value: Any) -> None:
        """Write ``value`` into ``self[index]`` (numpy indexing, index arrays and masks included); the tensor is rebound
        to the result.

        One op (``advanced_indexing_setitem``) whatever the mode: it runs now on
        eager tensors, is recorded inside ``F.lazy()``, traced under ``jax.jit``.
        """
        with write_lock(self):  # read, modify, rebind: concurrent writers would each drop the others' rows
            out = advanced_indexing.setitem(self, index, value)
            if self._gv is not None:
                self._gv = out._gv
                self.__lowering_context__ = out.__lowering_context__
                return
            self._var = out._var
            self._var.owner = weakref.ref(self)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        var = self._var
        if var is None or var.node is not None:
            arr = _host_value(
                self._array(), "np.asarray(Tensor)"
            )  # realizes (or explains why a graph value cannot be read)
        else:
            arr = _host_value(var.array, "np.asarray(Tensor)")  # the hot path of `np.asarray(t)` on a realized tensor
        if dtype is not None:
            arr = arr.astype(dtype)
        return np.array(arr) if copy else arr

    def __jax_array__(self) -> Any:
        """The value as a JAX array, so ``jnp`` functions accept Tensors (``jnp.sin(t)``)."""
        return self._array()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._array().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array().__dlpack_device__()

    def __getstate__(self) -> dict[str, Any]:
        return {"array": self._numpy(), "dtype": self.dtype, "device": self.device}

    def __setstate__(self, state: dict[str, Any]) -> None:
        src = _leaf(_put(state["array"], state["device"]), state["dtype"], state["device"])
        self._var = src._var
        self._gv = None
        self.__lowering_context__ = EAGER
        self._var.owner = weakref.ref(self)


DISTRIBUTED: dict[str, Any] = {}
"""Constructors of distributed tensors, registered by ``maxfx.experimental.sharding`` when it loads
(it builds on this module, so this module does not import it; a mapping exists only once it is loaded)."""


# ─── Operators: the eager shortcut ───────────────────────────────────────


def _is_layout(device: Any) -> bool:
    """True for a sharding `DeviceMesh` or `DeviceMapping` (duck-typed: sharding imports this module)."""
    return hasattr(device, "to_placements") or (hasattr(device, "mesh_shape") and hasattr(device, "axis_names"))


def _is_bool_data(value: Any) -> bool:
    if not isinstance(value, (bool, list, tuple)):
        return False
    try:
        return np.asarray(value).dtype == np.bool_
    except ValueError:  # a ragged list: `to_constant_array` says where
        return False


def _is_named_dim(d: Any) -> bool:
    """A dim given by name: an identifier string or a symbolic / algebraic `Dim`."""
    return (isinstance(d, str) and d.isidentifier()) or (isinstance(d, Dim) and not isinstance(d, StaticDim))


def _static_shape(shape: Any, where: str, *, named: bool = False) -> tuple[Any, ...]:
    """``shape`` as ints: each dim an int, numpy integer or static `Dim` (``int(2.5)`` would silently be 2).

    With ``named`` (a creation inside ``F.lazy()``), names become symbolic
    `Dim`s too, as in MAX (``Tensor.zeros(["batch", 8])``): ops on such a
    tensor are recorded and checked, and computing its values raises.
    """
    if isinstance(shape, (int, np.integer)) or (named and isinstance(shape, (str, Dim))):
        shape = (shape,)
    try:
        entries = list(shape)
    except TypeError:
        raise TypeError(
            f"{where}: shape must be a sequence of ints{' or dim names' if named else ''}, got {shape!r}"
        ) from None
    dims: list[Any] = []
    for i, d in enumerate(entries):
        if named and _is_named_dim(d):
            dims.append(Dim(d))
            continue
        try:
            if isinstance(d, (bool, np.bool_)):
                raise TypeError
            dims.append(operator.index(d))  # ints, numpy integers and static Dims; not floats or strings
        except TypeError:
            if _is_named_dim(d):
                where_named = (
                    f"{where} needs static sizes"
                    if is_lazy()
                    else "an eager tensor with named dims can only be traced inside F.lazy() "
                    "(or used as a graph input type)"
                )
                raise TypeError(
                    f"{where}: dim {i} of shape {entries!r} is the symbolic dim {d!r}: {where_named}; give an int"
                ) from None
            raise TypeError(
                f"{where}: dim {i} of shape {entries!r} must be an int, got {type(d).__name__} {d!r}"
            ) from None
    for i, d in enumerate(dims):
        if isinstance(d, int) and d < 0:
            raise ValueError(f"{where}: dim {i} of shape {dims} is negative ({d}): a shape must not have negative dims")
    return tuple(dims)


def _creation_shape(shape: Any, where: str) -> tuple[Any, ...]:
    """The shape of a tensor being created: ints, or inside ``F.lazy()`` also named dims."""
    return _static_shape(shape, where, named=is_lazy())


def _type_parts(t: Any, where: str) -> tuple[DType, tuple[int, ...], driver.Device]:
    if isinstance(t, Tensor):
        t = t.type
    if not isinstance(t, TensorType):
        raise TypeError(f"{where}: expected a TensorType or Tensor, got {type(t).__name__}")
    return t.dtype, _static_shape(t.shape, where), t.device.to_device()


# ─── Printing ─────────────────────────────────────────────────────────────

_SUMMARY_THRESHOLD = 1000
_EDGE = 3


def _scalar_text(x: Any) -> str:
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (np.integer, int)):
        return str(int(x))
    if isinstance(x, np.floating) and x.dtype in (np.float32, np.float16):
        return str(x)  # numpy prints the shortest text that round-trips in that dtype
    if isinstance(x, np.complexfloating):
        return str(complex(x))
    return repr(float(x))


def format_values(array: np.ndarray) -> str:
    """Values as one flat list in row-major order, floats always with a decimal point.

    MAX prints every tensor's values flat after its type (the shape is in the
    type): ``TensorType(..., shape=[Dim(2), Dim(2)], ...): [1.0, 2.0, 3.0, 4.0]``.
    Tensors of more than 1000 elements show their first and last 3 values; a
    rank-0 tensor prints its value alone.

    Example:
        >>> format_values(np.array([[1, 2], [3, 4]], np.float32))
        '[1.0, 2.0, 3.0, 4.0]'
    """
    if array.ndim == 0:
        return _scalar_text(array[()])
    flat = array.reshape(-1)
    n = flat.size
    if n > _SUMMARY_THRESHOLD:
        parts = (
            [_scalar_text(flat[i]) for i in range(_EDGE)]
            + ["..."]
            + [_scalar_text(flat[i]) for i in range(n - _EDGE, n)]
        )
    else:
        parts = [_scalar_text(x) for x in flat]
    return "[" + ", ".join(parts) + "]"


# ─── ComputeGraph ────────────────────────────────────────────────────────


class _Done(collections.abc.Coroutine):
    """An awaitable that is already finished, holding ``value``.

    MAX's realization is asynchronous (``await t.realize``, ``asyncio.run(...)``);
    maxfx dispatches at once (JAX's own dispatch is asynchronous), so there is
    nothing left to wait for. A plain class, not a coroutine function, so that
    an access that is never awaited does not warn.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def send(self, _: Any) -> Any:
        raise StopIteration(self.value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        raise typ if val is None else val

    def close(self) -> None:
        pass

    def __await__(self) -> Iterator[Any]:
        return self.value
        yield  # a generator: ``await`` gets ``value`` without suspending


class ComputeGraph:
    """A group of eager tensors realized together (MAX's lazy-evaluation graph).

    ``evaluate`` realizes the requested tensor and every other live
    unrealized tensor added with `add_unrealized`, as one program.

    Example:
        >>> import asyncio
        >>> g = ComputeGraph()
        >>> a = Tensor([1.0]) + 1
        >>> g.add_unrealized(a)
        >>> asyncio.run(g.evaluate(a * 2))
        >>> a.real
        True
    """

    def __init__(self, context: Any = None, sources: Sequence[Tensor] = (), seed: int = 0):
        self.context = context
        self.seed = seed
        self.sources: dict[Any, Tensor] = {}
        self.unrealized: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
        for s in sources:
            self.add_source(s)

    def add_source(self, tensor: Tensor) -> None:
        """Register a realized input tensor (held strongly)."""
        self.sources[tensor._var] = tensor

    def add_unrealized(self, tensor: Tensor) -> None:
        """Register a pending tensor (held weakly) to be realized by the next `evaluate`."""
        self.unrealized[id(tensor)] = tensor

    @property
    def graph(self):
        """The pending work as a `maxfx.graph.Graph` (inputs: realized leaves; outputs: unrealized tensors)."""
        pending = [t._var for t in self.unrealized.values() if not t.real]
        g = Graph("compute_graph")
        if pending:
            block = pending_block(pending)
            g._block.inputs, g._block.nodes, g._block.outputs = block.inputs, block.nodes, block.outputs
        return g

    async def evaluate(self, tensor: Tensor) -> None:
        """Realize ``tensor`` and all other live unrealized tensors of this graph."""
        with use_context(None):
            realize([tensor._var] + [t._var for t in self.unrealized.values() if t._gv is None])


def driver_tensor_type(t: driver.Tensor) -> TensorType:
    """The `TensorType` of a driver tensor.

    Example:
        >>> from maxfx import driver
        >>> from maxfx.dtype import DType
        >>> driver_tensor_type(driver.Tensor.zeros((2,), DType.int32))
        TensorType(dtype=int32, shape=[Dim(2)], device=cpu:0)
    """
    if not isinstance(t, driver.Tensor):
        raise TypeError(f"driver_tensor_type: expected a driver.Tensor, got {type(t).__name__}")
    return TensorType(t.dtype, t.shape, DeviceRef.from_device(t.device))


# ─── JAX pytree ───────────────────────────────────────────────────────────


def _flatten(t: Tensor):
    if t._gv is not None:
        return (t._gv,), "graph"
    return (t._array(),), None


def _unflatten(aux: Any, children: Sequence[Any]) -> Tensor:
    (child,) = children
    if aux == "graph":
        return Tensor.from_graph_value(child)
    if hasattr(child, "shape") and hasattr(child, "dtype"):
        try:
            return _leaf(child)
        except (ValueError, TypeError):
            pass
    # Pytree utilities may unflatten with placeholders (None, sentinels): keep them as-is.
    t = object.__new__(Tensor)
    t._var = LazyVar(None, array=child)
    t._gv = None
    t.__lowering_context__ = EAGER
    return t


jax.tree_util.register_pytree_node(Tensor, _flatten, _unflatten)
