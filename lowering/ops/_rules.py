"""The vocabulary of shape/dtype rules, with MAX-style error messages.

Every op family writes its rules with these helpers, so one kind of mistake
gets one message everywhere. Every error names the op and shows the offending
types as ``float32[2, 3]`` (symbolic dims by name), so the user sees what went
wrong at the call line.

- dtype classes: `Kind` (`ANY`, `BOOL`, `NUMERIC`, `INT`, `FLOAT`, `FLOAT8`),
  checked by `require_kind` (a group of inputs) or `require_tensor`;
- one input: `require_tensor` (optionally of a rank and kind),
  `require_tensor_of`, `require_dtype`, `require_rank`, `static_int`;
- several inputs: `input_device`, `broadcast_shapes`, `require_same_dim`;
- parameters: `normalize_axis`, `int_param`, `int_params`, `enum_param`;
- whole rules: `unary`, `binary`, `elementwise`.

Example (the rule of a float-only unary op)::

    >>> from lowering.dtypes import DType
    >>> from lowering.ops import _rules as R
    >>> from lowering.types import DeviceRef, TensorType
    >>> rule = R.unary("exp", R.FLOAT)
    >>> rule(TensorType(DType.float32, [2, 3], DeviceRef.CPU())).shape
    [Dim(2), Dim(3)]
    >>> rule(TensorType(DType.int32, [2], DeviceRef.CPU()))  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    lowering.registry.OpError: exp: expected a floating-point dtype for input, got int32[2];
    cast it first, e.g. x.cast(DType.float32)
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.dims import Dim, Shape, StaticDim
from lowering.dtypes import DType
from lowering.registry import OpError
from lowering.types import BufferType, DeviceRef, TensorType, Type

__all__ = [
    "OpError",
    "AxisError",
    "Kind",
    "ANY",
    "BOOL",
    "NUMERIC",
    "INT",
    "FLOAT",
    "FLOAT8",
    "fmt",
    "fmt_all",
    "broadcast_shapes",
    "normalize_axis",
    "input_device",
    "require_tensor",
    "require_tensor_of",
    "require_kind",
    "require_dtype",
    "require_rank",
    "require_same_dim",
    "static_int",
    "int_param",
    "int_params",
    "enum_param",
    "elementwise",
    "unary",
    "binary",
]


# ─── dtype classes ────────────────────────────────────────────────────────


def is_numeric(d: DType) -> bool:
    """Not bool."""
    return d is not DType.bool


def is_float(d: DType) -> bool:
    """Any floating-point dtype."""
    return d.is_float()


def is_int(d: DType) -> bool:
    """Signed or unsigned integer dtype."""
    return d.is_integral()


def is_bool(d: DType) -> bool:
    """The bool dtype."""
    return d is DType.bool


def is_float8(d: DType) -> bool:
    """Any float8 dtype."""
    return d.is_float8()


@dataclass(frozen=True, eq=False)
class Kind:
    """A class of dtypes an input may have, and how error messages name it.

    Attributes:
        accepts: ``accepts(dtype)`` is true for the dtypes of the class.
        noun: ``"floating-point"`` in ``"a rank-2 floating-point tensor"``.
        expected: ``"a floating-point"`` in ``"must have a floating-point dtype"``.
        hint: how to fix a wrong input, appended to `require_kind`'s message.
    """

    accepts: Callable[[DType], bool]
    noun: str
    expected: str
    hint: str = ""


ANY = Kind(lambda d: True, "any", "any")
BOOL = Kind(is_bool, "bool", "a bool", "; compare to get a bool tensor (e.g. x != 0) or cast with x.cast(DType.bool)")
NUMERIC = Kind(is_numeric, "numeric", "a numeric (int or float)", "; cast bool inputs to a numeric dtype first")
INT = Kind(is_int, "integer", "an integer")
FLOAT = Kind(is_float, "floating-point", "a floating-point", "; cast it first, e.g. x.cast(DType.float32)")
FLOAT8 = Kind(is_float8, "float8", "a float8")


# ─── types and inputs ─────────────────────────────────────────────────────


def fmt(t: Any) -> str:
    """``float32[2, batch]`` for a type; ``repr`` for anything else."""
    if isinstance(t, (TensorType, BufferType)):
        prefix = "buffer " if isinstance(t, BufferType) else ""
        return f"{prefix}{t.dtype.name}[{', '.join(str(d) for d in t.shape)}]"
    return repr(t)


def fmt_all(types: Iterable[Any]) -> str:
    """Comma-separated `fmt` of several types."""
    return ", ".join(fmt(t) for t in types)


def broadcast_shapes(op: str, *shapes: Sequence[Dim]) -> Shape:
    """Numpy broadcasting of (possibly symbolic) shapes.

    Raises:
        OpError: ``"add: shapes [2, 3] and [4] cannot be broadcast (dim -1: 3 vs 4)"``.
    """
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(-rank, 0):
        dim: Dim | None = None
        for s in shapes:
            if -i > len(s):
                continue
            d = s[i]
            if dim is None or dim == 1:
                dim = d
            elif d == 1 or d == dim:
                continue
            else:
                listed = " and ".join("[" + ", ".join(str(x) for x in s2) + "]" for s2 in shapes)
                raise OpError(f"{op}: shapes {listed} cannot be broadcast together (dim {i}: {dim} vs {d})")
        out.append(dim if dim is not None else StaticDim(1))
    return Shape(out)


class AxisError(OpError, IndexError):
    """An axis outside ``[-rank, rank)``: an `OpError` (a ValueError) and an IndexError, as MAX raises for axes."""


def normalize_axis(op: str, axis: int, rank: int, *, new_axis: bool = False, name: str = "axis") -> int:
    """A non-negative axis in ``[0, rank)`` (``[0, rank]`` if ``new_axis``).

    Raises:
        AxisError: ``"sum: axis 3 is out of range for rank 2 (expected -2 <= axis < 2)"``.
    """
    if isinstance(axis, bool) or not isinstance(axis, (int,)) and not hasattr(axis, "__index__"):
        raise TypeError(f"{op}: {name} must be an int, got {type(axis).__name__}")
    axis = int(axis)
    n = rank + 1 if new_axis else rank
    if not -n <= axis < n:
        raise AxisError(f"{op}: {name} {axis} is out of range for rank {rank} (expected {-n} <= {name} < {n})")
    return axis + n if axis < 0 else axis


def input_device(*types: Type) -> DeviceRef:
    """The device of an op's inputs, where its result lives.

    The bind plan has already checked that they agree (`lowering.plan.check_devices`, the one same-device rule, with
    its exemptions for host inputs and cross-device ops), so a rule only reads it.
    """
    return next((t.device for t in types if hasattr(t, "device")), DeviceRef.CPU())


def require_tensor(
    op: str, t: Type, name: str = "input", *, rank: int | tuple[int, ...] | None = None, kind: Kind | None = None
) -> TensorType:
    """``t`` as a TensorType (buffers must be loaded first); of rank ``rank`` (or one of several) and of ``kind`` if
    given.

    Raises:
        OpError: ``"sgmv: lora_ids must have rank 1, got int32[2, 2]"``,
            ``"scaled_matmul: a must have a float8 dtype, got float32[2, 4]"``.
    """
    if isinstance(t, BufferType):
        raise OpError(f"{op}: {name} is a buffer ({fmt(t)}); load it with ops.buffer_load first")
    if not isinstance(t, TensorType):
        raise OpError(f"{op}: {name} must be a tensor, got {t!r}")
    ranks = (rank,) if isinstance(rank, int) else rank
    if ranks is not None and t.rank not in ranks:
        raise OpError(f"{op}: {name} must have rank {' or '.join(map(str, ranks))}, got {fmt(t)}")
    if kind is not None and not kind.accepts(t.dtype):
        raise OpError(f"{op}: {name} must have {kind.expected} dtype, got {fmt(t)}")
    return t


def require_tensor_of(op: str, t: Type, name: str, *, rank: int, kind: Kind) -> TensorType:
    """``t`` as a rank-``rank`` TensorType of ``kind``, one message naming both.

    For arguments whose role fixes both (attention's ``q [batch, seq, heads, dim]``).

    Raises:
        OpError: ``"attention: q must be a rank-4 floating-point tensor, got float32[2, 4]"``.
    """
    t = require_tensor(op, t, name)
    if not kind.accepts(t.dtype) or t.rank != rank:
        raise OpError(f"{op}: {name} must be a rank-{rank} {kind.noun} tensor, got {fmt(t)}")
    return t


def require_kind(op: str, kind: Kind, types: Sequence[TensorType]) -> None:
    """Raise unless every one of ``types`` has a dtype of ``kind`` (one message for the group).

    Raises:
        OpError: ``"exp: expected a floating-point dtype for input, got int32[3]; cast it first, ..."``.
    """
    if not all(kind.accepts(t.dtype) for t in types):
        what = "input" if len(types) == 1 else "inputs"
        raise OpError(f"{op}: expected {kind.expected} dtype for {what}, got {fmt_all(types)}{kind.hint}")


def require_dtype(op: str, t: TensorType, pred: Callable[[DType], bool], expected: str, name: str = "input") -> None:
    """Raise if ``pred(t.dtype)`` is false, saying what was ``expected``."""
    if not pred(t.dtype):
        raise OpError(f"{op}: {name} must have {expected} dtype, got {fmt(t)}")


def require_rank(op: str, t: TensorType, ok: Callable[[int], bool], expected: str, name: str = "input") -> None:
    """Raise if ``ok(t.rank)`` is false, saying what rank was ``expected``."""
    if not ok(t.rank):
        raise OpError(f"{op}: {name} must have rank {expected}, got {fmt(t)}")


def static_int(op: str, d: Dim, what: str) -> int:
    """The int value of a dim that must be static."""
    if not isinstance(d, StaticDim):
        raise OpError(f"{op}: {what} must be static, got symbolic dim {d}")
    return d.dim


def require_same_dim(op: str, what: str, a: Dim, b: Dim, ta: Type, tb: Type) -> None:
    """Raise if dims ``a`` (of ``ta``) and ``b`` (of ``tb``) provably differ.

    Symbolic dims may be bound to equal sizes at run time: only a provable
    mismatch is an error here.

    Raises:
        OpError: ``"attention: query and key head dims differ: 8 vs 4 (float32[1, 3, 2, 8] and float32[1, 3, 1, 4])"``.
    """
    if a != b and (
        isinstance(a, StaticDim)
        and isinstance(b, StaticDim)
        or not isinstance(a, StaticDim)
        and not isinstance(b, StaticDim)
        and str(a) == str(b)
    ):
        raise OpError(f"{op}: {what} differ: {a} vs {b} ({fmt(ta)} and {fmt(tb)})")


# ─── parameters ───────────────────────────────────────────────────────────


def int_param(op: str, v: Any, name: str, minimum: int) -> int:
    """``v`` (an int, a static dim) as an int ``>= minimum``.

    Raises:
        TypeError: ``"conv2d: stride must be ints, got float 1.5"``.
        OpError: ``"conv2d: stride must be >= 1, got 0"``.
    """
    if isinstance(v, StaticDim):
        v = v.dim
    if isinstance(v, (bool, np.bool_)) or not hasattr(v, "__index__"):
        raise TypeError(f"{op}: {name} must be ints, got {type(v).__name__} {v!r}")
    v = int(v)
    if v < minimum:
        raise OpError(f"{op}: {name} must be >= {minimum}, got {v}")
    return v


def int_params(op: str, value: Any, n: int, name: str, *, minimum: int = 0, scalar_ok: bool = True) -> tuple[int, ...]:
    """``n`` ints from a sequence of ``n`` (or one int replicated, if ``scalar_ok``), each checked by `int_param`.

    Raises:
        OpError: ``"conv2d: padding must have 4 values, got 2: (1, 1)"``.
    """
    if scalar_ok and not isinstance(value, (str, bytes)) and not isinstance(value, Iterable):
        return (int_param(op, value, name, minimum),) * n
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{op}: {name} must be a sequence of {n} ints, got {type(value).__name__} {value!r}")
    vals = tuple(value)
    if len(vals) != n:
        raise OpError(f"{op}: {name} must have {n} values, got {len(vals)}: {value!r}")
    return tuple(int_param(op, v, name, minimum) for v in vals)


def enum_param(op: str, value: Any, cls: type[enum.Enum], name: str) -> enum.Enum:
    """``value`` as a member of ``cls``: a member, or its value or name as a string (any case).

    Raises:
        OpError: ``"conv2d: input_layout must be a ConvInputLayout (NCHW, NHWC), got 'NWC'"``.
    """
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        for member in cls:
            if value.lower() in (member.value.lower(), member.name.lower()):
                return member
    options = ", ".join(m.name for m in cls)
    raise OpError(f"{op}: {name} must be a {cls.__name__} ({options}), got {value!r}")


# ─── whole rules ──────────────────────────────────────────────────────────


def _elementwise_type(
    name: str, kind: Kind, out_dtype: DType | Callable[[DType], DType] | None, ts: Sequence[TensorType]
) -> TensorType:
    if len({t.dtype for t in ts}) > 1:
        # Only reachable by binding without promotion: bind promotes an op's `promote` inputs first.
        raise OpError(f"{name}: inputs must have the same dtype, got {fmt_all(ts)}")
    require_kind(name, kind, ts)
    device = input_device(*ts)
    shape = broadcast_shapes(name, *(t.shape for t in ts)) if len(ts) > 1 else ts[0].shape
    dt = ts[0].dtype
    out = dt if out_dtype is None else (out_dtype if isinstance(out_dtype, DType) else out_dtype(dt))
    return TensorType(out, shape, device)


def _named(rule: Callable[..., TensorType], name: str) -> Callable[..., TensorType]:
    rule.__name__ = rule.__qualname__ = f"{name}_rule"
    return rule


def unary(name: str, kind: Kind = ANY, *, out_dtype: DType | None = None) -> Callable[..., TensorType]:
    """Rule of a unary elementwise op: ``rule(x)`` accepts a tensor of ``kind``, keeps its shape.

    Args:
        name: op name for error messages.
        kind: accepted input dtypes.
        out_dtype: result dtype; default: the input dtype.
    """

    def rule(x: Type) -> TensorType:
        return _elementwise_type(name, kind, out_dtype, [require_tensor(name, x)])

    return _named(rule, name)


def binary(
    name: str, kind: Kind = ANY, *, out_dtype: DType | Callable[[DType], DType] | None = None
) -> Callable[..., TensorType]:
    """Rule of a binary elementwise op: ``rule(lhs, rhs)``, one dtype of ``kind``, broadcast shape out.

    The op's inputs are promoted to one dtype before the rule runs (``OpDef(promote=(0, 1))``).

    Args:
        name: op name for error messages.
        kind: accepted input dtypes.
        out_dtype: result dtype (fixed, or a function of the input dtype); default:
            the input dtype.
    """

    def rule(lhs: Type, rhs: Type) -> TensorType:
        return _elementwise_type(
            name, kind, out_dtype, [require_tensor(name, lhs, "lhs"), require_tensor(name, rhs, "rhs")]
        )

    return _named(rule, name)


def elementwise(
    name: str, kind: Kind = ANY, *, out_dtype: DType | Callable[[DType], DType] | None = None
) -> Callable[..., TensorType]:
    """Rule of an n-ary elementwise op (inputs named ``input 0``, ``input 1``...): `binary` for any arity."""

    def rule(*types: Type) -> TensorType:
        return _elementwise_type(
            name, kind, out_dtype, [require_tensor(name, t, f"input {i}") for i, t in enumerate(types)]
        )

    return _named(rule, name)
