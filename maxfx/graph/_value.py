"""Symbolic graph values: `Value`, `TensorValue`, `BufferValue`.

A value is a handle on one IR var of a graph being built. Its operators and
methods call the ops in `maxfx.graph.ops` (generated from the registry), so
``x + 1`` records the same ``add`` node as ``ops.add(x, 1)``.
"""

from __future__ import annotations

from typing import Any

from lowering.context import GraphBuilder, current_context
from lowering.dims import Dim, Shape
from lowering.dtypes import DType
from lowering.eager import is_lazy
from lowering.ir import Var
from lowering.ops import advanced_indexing
from lowering.types import BufferType, DeviceRef, OpaqueType, TensorType, Type
from maxfx.graph import ops

__all__ = ["Value", "TensorValue", "BufferValue", "TensorOperators", "BINARY_OPERATORS", "wrap_var"]


class Value:
    """A symbolic value of a `Graph`. Downcast with `.tensor`, `.buffer`, `.opaque`."""

    __slots__ = ("_builder", "_var", "__weakref__")

    def __init__(self, value: Any):
        if not isinstance(value, Value):
            raise TypeError(f"{type(self).__name__}: expected a graph Value, got {type(value).__name__}")
        self._builder = value._builder
        self._var = value._var

    @classmethod
    def _make(cls, builder: GraphBuilder, var: Var) -> Value:
        v = object.__new__(cls)
        v._builder = builder
        v._var = var
        return v

    @property
    def __lowering_context__(self) -> GraphBuilder:
        return self._builder

    @property
    def type(self) -> Type:
        """The value's graph type."""
        return self._var.type

    @property
    def tensor(self) -> TensorValue:
        """This value as a `TensorValue` (TypeError if it is not a tensor)."""
        if not isinstance(self.type, TensorType):
            raise TypeError(f"value of type {self.type!r} is not a tensor")
        return self if isinstance(self, TensorValue) else TensorValue._make(self._builder, self._var)

    @property
    def buffer(self) -> BufferValue:
        """This value as a `BufferValue` (TypeError if it is not a buffer)."""
        if not isinstance(self.type, BufferType):
            raise TypeError(f"value of type {self.type!r} is not a buffer")
        return self if isinstance(self, BufferValue) else BufferValue._make(self._builder, self._var)

    @property
    def opaque(self) -> Value:
        """This value as an opaque value (TypeError if it is not opaque)."""
        if not isinstance(self.type, OpaqueType):
            raise TypeError(f"value of type {self.type!r} is not opaque")
        return self

    def to_mlir(self):
        """The value's type as an MLIR type (values themselves have no MLIR handle in maxfx)."""
        return self.type.to_mlir()

    @classmethod
    def from_mlir(cls, value: Any) -> Value:
        """Wrap an existing graph value (maxfx keeps no MLIR values; accepts maxfx values)."""
        if isinstance(value, Value):
            return wrap_var(value._builder, value._var)
        raise TypeError(f"{cls.__name__}.from_mlir: expected a maxfx graph Value, got {type(value).__name__}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_type_fields(self.type)})"


def _type_fields(t: Type) -> str:
    if isinstance(t, (TensorType, BufferType)):
        return f"dtype={t.dtype.name}, shape={list(t.shape)!r}, device={t.device}"
    return repr(t)


class _Shaped(Value):
    __slots__ = ()

    @property
    def dtype(self) -> DType:
        """Element type."""
        return self._var.type.dtype

    @property
    def shape(self) -> Shape:
        """Shape as a list of `Dim`s."""
        return self._var.type.shape

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self._var.type.shape)

    @property
    def device(self) -> DeviceRef:
        """The device the value lives on."""
        return self._var.type.device

    def print(self, label: str = "debug_tensor") -> None:
        """Print the value at run time, prefixed by ``label``."""
        ops.print(self, label=label)


class TensorOperators:
    """Numpy-style operators and methods shared by `TensorValue` and the eager `Tensor`.

    Every method calls an op front (``maxfx.graph.ops``); the front binds the op in
    the context that owns ``self`` (a graph being built, the eager realization
    context, or a JAX trace), so the same code serves all three.
    """

    __slots__ = ()

    # -- methods ---------------------------------------------------------
    def cast(self, dtype: DType) -> TensorValue:
        """Elementwise conversion to ``dtype``; the value itself when it already has that dtype (as in MAX)."""
        if dtype is self.dtype:
            return self
        return ops.cast(self, dtype)

    def reshape(self, shape) -> TensorValue:
        """Same data, new shape (one ``-1`` allowed)."""
        return ops.reshape(self, shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> TensorValue:
        """Merge dims ``start_dim..end_dim`` (inclusive) into one."""
        return ops.flatten(self, start_dim, end_dim)

    def broadcast_to(self, shape) -> TensorValue:
        """Broadcast to ``shape``."""
        return ops.broadcast_to(self, shape)

    def permute(self, dims) -> TensorValue:
        """Reorder dims by the permutation ``dims``."""
        return ops.permute(self, dims)

    def transpose(self, dim_1: int, dim_2: int) -> TensorValue:
        """Swap two dims."""
        return ops.transpose(self, dim_1, dim_2)

    @property
    def T(self) -> TensorValue:  # noqa: N802 - MAX's name
        """Transpose of the last two dims."""
        return ops.transpose(self, -1, -2)

    def argmax(self, axis: int = -1) -> TensorValue:
        """Index of the maximum along ``axis`` (kept as size 1), int64."""
        return ops.argmax(self, axis)

    def max(self, axis: int = -1) -> TensorValue:
        """Maximum along ``axis`` (kept as size 1)."""
        return ops.max(self, axis=axis)

    def min(self, axis: int = -1) -> TensorValue:
        """Minimum along ``axis`` (kept as size 1)."""
        return ops.min(self, axis=axis)

    def mean(self, axis: int = -1) -> TensorValue:
        """Mean along ``axis`` (kept as size 1)."""
        return ops.mean(self, axis)

    def var(self, axis: int = -1) -> TensorValue:
        """Population variance along ``axis`` (kept as size 1); TypeError for bool, as in MAX."""
        if self.dtype is DType.bool:
            raise TypeError(f"var: not defined for bool tensors, got {self.type}; cast to a numeric dtype first")
        centered = self - ops.mean(self, axis)
        return ops.mean(centered * centered, axis)

    def stdev(self, axis: int = -1) -> TensorValue:
        """Population standard deviation along ``axis`` (kept as size 1); integer for integer inputs, TypeError for
        bool.
        """
        return ops.sqrt(self.var(axis))

    # -- operators -------------------------------------------------------
    def __getitem__(self, index) -> TensorValue:
        """``x[index]``: numpy basic indexing (``slice_tensor``), or advanced indexing with index arrays and boolean
        masks.
        """
        return advanced_indexing.getitem(self, index)

    def __neg__(self):
        return ops.negate(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return ops.abs(self)

    def __invert__(self):
        return ops.logical_not(self)

    __hash__ = object.__hash__


# Binary operator → (registry op, operands swapped). ``x < y`` is ``greater(y, x)``:
# MAX has no ``less`` op. Reflected forms (``2 * x``) swap too.
BINARY_OPERATORS: dict[str, tuple[str, bool]] = {
    "__add__": ("add", False),
    "__radd__": ("add", True),
    "__sub__": ("sub", False),
    "__rsub__": ("sub", True),
    "__mul__": ("mul", False),
    "__rmul__": ("mul", True),
    "__truediv__": ("div", False),
    "__rtruediv__": ("div", True),
    "__floordiv__": ("floor_div", False),
    "__rfloordiv__": ("floor_div", True),
    "__mod__": ("mod", False),
    "__rmod__": ("mod", True),
    "__pow__": ("pow", False),
    "__rpow__": ("pow", True),
    "__matmul__": ("matmul", False),
    "__rmatmul__": ("matmul", True),
    "__and__": ("logical_and", False),
    "__rand__": ("logical_and", True),
    "__or__": ("logical_or", False),
    "__ror__": ("logical_or", True),
    "__xor__": ("logical_xor", False),
    "__rxor__": ("logical_xor", True),
    "__eq__": ("equal", False),
    "__ne__": ("not_equal", False),
    "__lt__": ("greater", True),
    "__le__": ("greater_equal", True),
    "__gt__": ("greater", False),
    "__ge__": ("greater_equal", False),
}


def _binary_operator(name: str, op_name: str, swapped: bool):
    front = getattr(ops, op_name)
    if swapped:

        def method(self, other):
            return front(other, self)
    else:

        def method(self, other):
            return front(self, other)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"``ops.{op_name}`` with {'swapped ' if swapped else ''}operands."
    return method


for _name, (_op_name, _swapped) in BINARY_OPERATORS.items():
    setattr(TensorOperators, _name, _binary_operator(_name, _op_name, _swapped))
TensorOperators.__hash__ = object.__hash__  # __eq__ is elementwise; identity hashing keeps values usable as dict keys


class TensorValue(TensorOperators, _Shaped):
    """An immutable tensor inside a graph, with numpy-like operators.

    ``TensorValue(value)`` takes a tensor value of a graph, an object with
    ``__tensorvalue__()`` (MAX's ``HasTensorValue``; an eager `Tensor` inside a
    graph being built becomes a constant of it), a `Shape` (its dims as an int64
    vector, as ``ops.shape_to_tensor``) or a `Dim` (an int64 scalar).

    Example:
        >>> with Graph("g", input_types=[TensorType(DType.float32, [2, 3])]) as g:  # doctest: +SKIP
        ...     x = g.inputs[0].tensor
        ...     g.output((x * 2 + 1).mean(axis=1))
    """

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any):
        # Outside a graph an eager tensor is its own value (MAX: inside F.lazy() tensors are values of its lazy graph).
        if cls is TensorValue and len(args) == 1 and not kwargs and _is_eager_outside_graph(args[0]):
            return args[0]
        return super().__new__(cls)

    def __init__(self, value: Any):
        v = _tensor_value_of(value)
        self._builder = v._builder
        self._var = v._var

    def rebind(self, shape, message: str = "") -> TensorValue:
        """Assert at run time that the value has ``shape`` (names symbolic dims)."""
        return ops.rebind(self, shape, message)

    def to(self, device) -> TensorValue:
        """Transfer to ``device`` (a DeviceRef or driver Device)."""
        return ops.transfer_to(self, device)

    def __bool__(self):
        raise TypeError(
            "the truth value of a symbolic TensorValue is unknown while building a graph; use ops.cond or ops.where"
        )

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a rank-0 TensorValue")
        return int(self.shape[0])

    def __iter__(self):
        raise TypeError("TensorValue is not iterable; index it or use ops.split")

    def __contains__(self, item: Any) -> bool:
        raise TypeError(
            "TensorValue is not a container: membership of a symbolic value is unknown while building a graph; compare "
            "with ops.equal and reduce"
        )


class BufferValue(_Shaped):
    """A mutable buffer inside a graph: read with `ops.buffer_load`, write with `ops.buffer_store`.

    Outside a graph ``BufferValue(t)`` of an eager tensor is ``t`` itself (an
    eager tensor is its own buffer: ``ops.buffer_store(t, v)`` writes it).
    Inside ``F.lazy()`` it then counts as pending, as in MAX, since ops recorded
    later may write it: ``t.real`` is false until it is realized.
    """

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any):
        if cls is BufferValue and len(args) == 1 and not kwargs and _is_eager_outside_graph(args[0]):
            if is_lazy():
                ops.buffer_store(args[0], args[0])  # recorded: the tensor's value now comes from the pending graph
            return args[0]
        return super().__new__(cls)

    def __init__(self, value: Any):
        if not isinstance(value, Value) or not isinstance(value.type, BufferType):
            got = f"a value of type {value.type!r}" if isinstance(value, Value) else type(value).__name__
            raise TypeError(f"BufferValue: expected a buffer value of a graph (BufferType), got {got}")
        self._builder = value._builder
        self._var = value._var

    def __getitem__(self, index) -> TensorValue:
        return advanced_indexing.getitem(ops.buffer_load(self), index)

    def __setitem__(self, index, value) -> None:
        if advanced_indexing.is_advanced(index):
            advanced_indexing.setitem_inplace(self, index, value)
        else:
            ops.buffer_store_slice(self, value, index if isinstance(index, tuple) else (index,))


def _is_eager_outside_graph(value: Any) -> bool:
    """An eager tensor (concrete data) while no graph is being built."""
    ctx = getattr(value, "__lowering_context__", None)
    return ctx is not None and ctx.concrete and current_context() is None


def _tensor_value_of(value: Any) -> TensorValue:
    """`TensorValue(value)`: a tensor value of a graph, something that converts itself, or a shape."""
    if isinstance(value, Value):
        if not isinstance(value.type, TensorType):
            raise TypeError(f"TensorValue: expected a tensor value, got a value of type {value.type!r}")
        return value.tensor
    if hasattr(type(value), "__tensorvalue__"):
        converted = value.__tensorvalue__()
        if not isinstance(converted, TensorValue):
            raise TypeError(
                f"TensorValue: {type(value).__name__}.__tensorvalue__() returned {type(converted).__name__}, not a "
                "TensorValue"
            )
        return converted
    if isinstance(value, Shape):
        return ops.shape_to_tensor(value)
    if isinstance(value, Dim):  # a dim is a scalar
        return ops.reshape(ops.shape_to_tensor([value]), [])
    raise TypeError(
        "TensorValue: expected a graph value, an object with __tensorvalue__(), a Shape or a Dim; got "
        f"{type(value).__name__} "
        "(make Python numbers and arrays graph constants with ops.constant(value, dtype, device))"
    )


def wrap_var(builder: GraphBuilder, var: Var) -> Value:
    """The user-facing value object for ``var``."""
    t = var.type
    if isinstance(t, TensorType):
        return TensorValue._make(builder, var)
    if isinstance(t, BufferType):
        return BufferValue._make(builder, var)
    return Value._make(builder, var)
