"""Graph value types: `TensorType`, `BufferType`, `DeviceRef` and layouts.

These are the avals of the IR: every op's shape/dtype rule maps input types to
output types. Reprs follow MAX exactly, e.g.
``TensorType(dtype=float32, shape=[Dim(5)], device=cpu:0)``.

Example:
    >>> from lowering.types import TensorType
    >>> from lowering.dtypes import DType
    >>> TensorType(DType.float32, ["batch", 3])
    TensorType(dtype=float32, shape=[Dim('batch'), Dim(3)], device=cpu:0)
"""

from __future__ import annotations

import enum
import math
import types
from typing import Any

from lowering import mlir_interop
from lowering.dims import Dim, Shape, ShapeLike, StaticDim, SymbolicDim
from lowering.driver_devices import CPU, Accelerator, Device
from lowering.dtypes import DType

__all__ = [
    "DevicePlacementPolicy",
    "DeviceKind",
    "DeviceRef",
    "Type",
    "TensorType",
    "BufferType",
    "OpaqueType",
    "ConvInputLayout",
    "FilterLayout",
    "InterpolationMode",
]


class DeviceKind(str, enum.Enum):
    """Kind of device a value lives on."""

    CPU = "cpu"
    GPU = "gpu"

    def __str__(self) -> str:
        return self.value

    @staticmethod
    def from_string(txt: str) -> DeviceKind:
        """``"cpu"``/``"gpu"`` (any case) to a DeviceKind."""
        try:
            return DeviceKind(txt.lower())
        except ValueError:
            raise ValueError(f"DeviceKind.from_string: unknown device kind {txt!r}; expected 'cpu' or 'gpu'") from None


_named_by: dict[Any, Any] = {}  # GPU DeviceRef -> the last driver device it was made from (see DeviceRef.to_device)


class DeviceRef:
    """A device in a graph type: kind and index. ``str(DeviceRef.GPU()) == 'gpu:0'``."""

    __slots__ = ("device_type", "id", "_hash")

    def __init__(self, device_type: DeviceKind | str, id: int = 0):
        self.device_type = device_type if isinstance(device_type, DeviceKind) else DeviceKind.from_string(device_type)
        self.id = int(id)
        self._hash = hash((self.device_type.value, self.id))

    @staticmethod
    def CPU(id: int = 0) -> DeviceRef:  # noqa: N802 - MAX's name
        """A CPU device reference."""
        return DeviceRef(DeviceKind.CPU, id)

    @staticmethod
    def GPU(id: int = 0) -> DeviceRef:  # noqa: N802 - MAX's name
        """A GPU device reference."""
        return DeviceRef(DeviceKind.GPU, id)

    def is_cpu(self) -> bool:
        """True for CPU devices."""
        return self.device_type is DeviceKind.CPU

    def is_gpu(self) -> bool:
        """True for GPU devices."""
        return self.device_type is DeviceKind.GPU

    @staticmethod
    def from_device(device: Any) -> DeviceRef:
        """A DeviceRef for a driver ``Device`` (or a DeviceRef, returned as is)."""
        if isinstance(device, DeviceRef):
            return device
        label = getattr(device, "label", None)
        if label is None:
            raise TypeError(f"DeviceRef.from_device: expected a Device or DeviceRef, got {type(device).__name__}")
        ref = DeviceRef(DeviceKind.from_string(label), 0 if label == "cpu" else getattr(device, "id", 0))
        if label != "cpu" and not isinstance(device, Accelerator):
            _named_by[ref] = device  # a device described elsewhere (not one of this machine's, real or virtual)
        return ref

    def to_device(self) -> Device:
        """The driver ``Device`` this reference names (``CPU()`` for every CPU id, as in MAX).

        Raises:
            ValueError: a GPU reference on a machine without that GPU.

        Example:
            >>> DeviceRef.CPU().to_device()
            CPU()
        """
        if self.is_cpu():
            return CPU()
        try:
            return Accelerator(self.id)
        except ValueError:
            # No such GPU here: the device object this reference was made from, if any (a device
            # described elsewhere; MAX's tests trace layers on stand-ins for GPUs).
            named = _named_by.get(self)
            if named is None:
                raise
            return named

    def to_mlir(self):
        """This device as an MLIR string attribute (``"cpu:0"``)."""
        return mlir_interop.string_attr(str(self))

    @staticmethod
    def from_mlir(attr) -> DeviceRef:
        """Inverse of `to_mlir`."""
        kind, _, idx = mlir_interop.attr_to_string(attr).partition(":")
        return DeviceRef(kind, int(idx or 0))

    def __eq__(self, other):
        if not isinstance(other, DeviceRef):
            return NotImplemented
        return self.device_type is other.device_type and self.id == other.id

    def __hash__(self):
        return self._hash

    def __str__(self) -> str:
        return f"{self.device_type.value}:{self.id}"

    def __repr__(self) -> str:
        return f"DeviceRef({self.device_type.value!r}, {self.id})"

    def __reduce__(self):
        return (DeviceRef, (self.device_type.value, self.id))


def _as_device_ref(device: Any) -> DeviceRef:
    if device is None:
        return DeviceRef.CPU()
    return DeviceRef.from_device(device)


class Type:
    """Base of every graph value type (``Type[Any]`` is allowed in annotations, as in MAX)."""

    __slots__ = ()
    __class_getitem__ = classmethod(types.GenericAlias)

    def to_mlir(self):
        """This type as an MLIR type."""
        raise TypeError(f"{type(self).__name__}.to_mlir: only tensor and buffer types have an MLIR type")

    @staticmethod
    def from_mlir(t) -> Type:
        """A graph type from an MLIR ranked tensor type (a `BufferType` if `BufferType.to_mlir` made it).

        A ``?`` without a name in the encoding comes back as ``d0``, ``d1``... by
        position; a type without maxfx's encoding is on the CPU.
        """
        dtype, sizes, encoding = mlir_interop.ranked_tensor_parts(t, "Type.from_mlir")
        dims: list[Any] = [f"d{i}" if s is None else s for i, s in enumerate(sizes)]
        entries = mlir_interop.dict_items(encoding) if encoding is not None else None
        entries = entries or {}  # someone else's encoding (sparsity, bounds) holds nothing of ours
        if "dims" in entries:
            named = Shape.from_mlir(entries["dims"])
            if len(named) != len(dims):
                raise ValueError(f"Type.from_mlir: {t} names {len(named)} dims for rank {len(dims)}")
            dims = named
        device = DeviceRef.from_mlir(entries["device"]) if "device" in entries else DeviceRef.CPU()
        is_buffer = "kind" in entries and mlir_interop.attr_to_string(entries["kind"]) == "buffer"
        return (BufferType if is_buffer else TensorType)(dtype, dims, device)


class _ShapedType(Type):
    __slots__ = ("dtype", "shape", "device", "_layout", "_key", "_hash")
    _name = ""

    def __init__(self, dtype: DType, shape: ShapeLike, device: Any = None, _layout: Any = None):
        if not isinstance(dtype, DType):
            raise TypeError(f"{self._name}: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
        self.dtype = dtype
        self.shape = shape if isinstance(shape, Shape) else Shape(shape)
        for d in self.shape:
            if isinstance(d, StaticDim) and d.dim < 0:
                raise TypeError(
                    f"{self._name}: dimensions must be non-negative, got shape {[str(x) for x in self.shape]}"
                )
        self.device = _as_device_ref(device)
        self._layout = _layout
        self._key = None
        self._hash = None

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def key(self) -> tuple:
        """A hashable identity (dtype, dims, device)."""
        if self._key is None:
            self._key = (self._name, self.dtype, tuple(self.shape), self.device)
        return self._key

    def is_static(self) -> bool:
        """True when every dim is static."""
        return all(isinstance(d, StaticDim) for d in self.shape)

    def num_elements(self) -> int:
        """How many elements a value of this type holds (MAX: a `RuntimeError` for symbolic dims).

        Example:
            >>> TensorType(DType.int8, [2, 3]).num_elements()
            6
        """
        if not self.is_static():
            raise RuntimeError(
                f"{self._name}.num_elements: can't find num elements since tensor has symbolic dims (shape "
                f"{list(self.shape)})"
            )
        return math.prod(d.dim for d in self.shape)

    @property
    def parameters(self) -> list[SymbolicDim]:
        """The symbolic dims this type depends on.

        Example:
            >>> TensorType(DType.float32, ["batch", 3]).parameters
            [Dim('batch')]
        """
        return list(self.shape.parameters)

    def cast(self, dtype: DType) -> _ShapedType:
        """The same type (tensor or buffer) with element type ``dtype``.

        Example:
            >>> TensorType(DType.float32, [2, "n"]).cast(DType.int64)
            TensorType(dtype=int64, shape=[Dim(2), Dim('n')], device=cpu:0)
        """
        return type(self)(dtype, self.shape, self.device)

    def __eq__(self, other):
        if not isinstance(other, _ShapedType):
            return NotImplemented
        return self.key() == other.key()

    def __hash__(self):
        # Types key the rule and eager-plan memos: hash once.
        if self._hash is None:
            self._hash = hash(self.key())
        return self._hash

    def __repr__(self) -> str:
        return f"{self._name}(dtype={self.dtype.name}, shape={list(self.shape)!r}, device={self.device})"

    def __reduce__(self):
        return (type(self), (self.dtype, list(self.shape), self.device))

    def to_mlir(self):
        """This type as an MLIR ranked tensor type, ``?`` for symbolic dims.

        What the plain type would lose (dim names, a non-CPU device, that it is a
        buffer) goes into its encoding, so ``Type.from_mlir(t.to_mlir()) == t``:
        ``tensor<?x3xf32, {dims = ["batch", 3]}>``.
        """
        encoding = {}
        if not self.is_static():
            encoding["dims"] = self.shape.to_mlir()
        if self.device != DeviceRef.CPU():
            encoding["device"] = self.device.to_mlir()
        if isinstance(self, BufferType):
            encoding["kind"] = mlir_interop.string_attr("buffer")
        sizes = [d.dim if isinstance(d, StaticDim) else None for d in self.shape]
        return mlir_interop.ranked_tensor_type(
            sizes, self.dtype, mlir_interop.dict_attr(encoding) if encoding else None, f"{self._name}.to_mlir"
        )


class TensorType(_ShapedType):
    """Type of an immutable tensor value: dtype, shape (dims may be symbolic) and device.

    ``device`` defaults to the CPU (MAX's signature requires it, but most examples omit it).
    """

    __slots__ = ()
    _name = "TensorType"

    def as_buffer(self) -> BufferType:
        """The mutable buffer type with the same dtype, shape and device."""
        return BufferType(self.dtype, self.shape, self.device)


class BufferType(_ShapedType):
    """Type of a mutable buffer value (graph input or `ops.buffer_create`)."""

    __slots__ = ()
    _name = "BufferType"

    def as_tensor(self) -> TensorType:
        """The immutable tensor type with the same dtype, shape and device."""
        return TensorType(self.dtype, self.shape, self.device)


class OpaqueType(Type):
    """An opaque, named value type (e.g. a KV-cache handle) carrying Python metadata."""

    __slots__ = ("name", "parameters")

    def __init__(self, name: str, parameters: dict | None = None):
        self.name = name
        self.parameters = dict(parameters or {})

    def key(self) -> tuple:
        return ("OpaqueType", self.name, tuple(sorted((k, repr(v)) for k, v in self.parameters.items())))

    def __eq__(self, other):
        return isinstance(other, OpaqueType) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self) -> str:
        return f"OpaqueType({self.name!r})"


class DevicePlacementPolicy(enum.Enum):
    """What a graph does when ``ops.constant`` is given data that lives on an
    accelerator (a graph constant is embedded from host memory, so the data is
    copied to the host first).

    Attributes:
        Ignore: copy silently.
        Warn: copy and emit a ``UserWarning`` naming ``ops.constant`` (the default).
        Error: raise ``ValueError``; move the data to the CPU yourself, or pass it
            as a graph input.
    """

    Ignore = "ignore"
    Warn = "warn"
    Error = "error"


class _ChainType(Type):
    """The type of a device chain (MAX's ``!mo.chain``): a token that orders the
    side effects (prints, buffer writes, collectives) on one device.

    maxfx runs effects in node order; ``Graph.device_chains`` gives the chain
    values, which change each time an effect is recorded on their device.
    """

    __slots__ = ()

    def __eq__(self, other):
        return isinstance(other, _ChainType)

    def __hash__(self):
        return hash("_ChainType")

    def __repr__(self) -> str:
        return "_ChainType()"


class ConvInputLayout(enum.Enum):
    """Activation layout of convolution inputs."""

    NHWC = "NHWC"
    NCHW = "NCHW"

    def to_mlir(self):
        """As an MLIR string attribute."""
        return mlir_interop.string_attr(self.value)

    @staticmethod
    def from_mlir(attr) -> ConvInputLayout:
        """Inverse of `to_mlir`."""
        return ConvInputLayout(mlir_interop.attr_to_string(attr))


class FilterLayout(enum.Enum):
    """Layout of convolution filters (R,S = spatial, C = in channels, F = out channels)."""

    RSCF = "RSCF"
    QRSCF = "QRSCF"
    FCRS = "FCRS"
    FCQRS = "FCQRS"
    CFRS = "CFRS"

    def to_mlir(self):
        """As an MLIR string attribute."""
        return mlir_interop.string_attr(self.value)

    @staticmethod
    def from_mlir(attr) -> FilterLayout:
        """Inverse of `to_mlir`."""
        return FilterLayout(mlir_interop.attr_to_string(attr))


def dims_repr(dims) -> str:
    return "[" + ", ".join(repr(Dim(d)) for d in dims) + "]"


class InterpolationMode(enum.Enum):
    """Interpolation of ``ops.resize``."""

    BICUBIC = "bicubic"
    BILINEAR = "bilinear"
    NEAREST = "nearest"
