"""Building blocks of shape/dtype rules, with MAX-style error messages.

Every error names the op and shows the offending types as ``float32[2, 3]``
(symbolic dims by name), so the user sees what went wrong at the call line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from lowering.dims import Dim, Shape, StaticDim
from lowering.dtypes import DType
from lowering.registry import OpError
from lowering.types import BufferType, DeviceRef, TensorType, Type

__all__ = [
    "OpError",
    "fmt",
    "fmt_all",
    "broadcast_shapes",
    "normalize_axis",
    "same_device",
    "require_tensor",
    "require_dtype",
    "require_rank",
    "elementwise",
    "unary",
    "static_int",
]


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


def normalize_axis(op: str, axis: int, rank: int, *, new_axis: bool = False, name: str = "axis") -> int:
    """A non-negative axis in ``[0, rank)`` (``[0, rank]`` if ``new_axis``).

    Raises:
        OpError: ``"sum: axis 3 is out of range for rank 2 (expected -2 <= axis < 2)"``.
    """
    if isinstance(axis, bool) or not isinstance(axis, (int,)) and not hasattr(axis, "__index__"):
        raise TypeError(f"{op}: {name} must be an int, got {type(axis).__name__}")
    axis = int(axis)
    n = rank + 1 if new_axis else rank
    if not -n <= axis < n:
        raise OpError(f"{op}: {name} {axis} is out of range for rank {rank} (expected {-n} <= {name} < {n})")
    return axis + n if axis < 0 else axis


def same_device(op: str, *types: Type) -> DeviceRef:
    """The common device of ``types``; error if they differ."""
    devices = {t.device for t in types if hasattr(t, "device")}
    if len(devices) > 1:
        raise OpError(f"{op}: inputs are on different devices ({', '.join(sorted(str(d) for d in devices))}); transfer them first")
    return next(iter(devices), DeviceRef.CPU())


def require_tensor(op: str, t: Type, name: str = "input") -> TensorType:
    """``t`` as a TensorType (buffers must be loaded first)."""
    if isinstance(t, TensorType):
        return t
    if isinstance(t, BufferType):
        raise OpError(f"{op}: {name} is a buffer ({fmt(t)}); load it with ops.buffer_load first")
    raise OpError(f"{op}: {name} must be a tensor, got {t!r}")


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


def elementwise(
    name: str,
    *,
    dtypes: Callable[[DType], bool] | None = None,
    expected: str = "",
    out_dtype: DType | Callable[[DType], DType] | None = None,
) -> Callable[..., TensorType]:
    """Rule of an n-ary elementwise op: same dtype in, broadcast shape out.

    Args:
        name: op name for error messages.
        dtypes: accepted input dtypes (predicate), with ``expected`` describing them.
        out_dtype: result dtype (fixed, or a function of the input dtype); default:
            the input dtype.
    """

    def rule(*types: Type) -> TensorType:
        ts = [require_tensor(name, t, f"input {i}") for i, t in enumerate(types)]
        dts = {t.dtype for t in ts}
        if len(dts) > 1:
            raise OpError(f"{name}: inputs must have the same dtype, got {fmt_all(ts)}")
        dt = ts[0].dtype
        if dtypes is not None and not dtypes(dt):
            raise OpError(f"{name}: expected {expected} inputs, got {fmt_all(ts)}")
        device = same_device(name, *ts)
        shape = broadcast_shapes(name, *(t.shape for t in ts)) if len(ts) > 1 else ts[0].shape
        out = dt if out_dtype is None else (out_dtype if isinstance(out_dtype, DType) else out_dtype(dt))
        return TensorType(out, shape, device)

    return rule


def unary(name: str, **kwargs: Any) -> Callable[..., TensorType]:
    """`elementwise` for one input."""
    return elementwise(name, **kwargs)


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
