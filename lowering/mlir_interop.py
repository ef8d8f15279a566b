"""MAX's ``to_mlir``/``from_mlir`` methods, mapped onto the MLIR bindings JAX ships.

MAX builds its graphs in its own MLIR dialect; maxfx lowers to StableHLO, so
types map to builtin MLIR types (``tensor<?x3xf32>``) and dims, shapes,
devices and layouts to builtin attributes. Static dims are ``i64`` integer
attributes; symbolic and algebraic dims are string attributes holding their
text (``"batch"``, ``"batch * 2"``), so they round-trip exactly. Tensor and
buffer types become ranked tensor types with ``?`` for symbolic dims; what
that cannot say (dim names, a non-CPU device, buffer vs tensor) is kept in the
type's encoding attribute, so ``type_from_mlir(type_to_mlir(t)) == t``. A ``?``
with no name (a type made elsewhere) comes back as ``d0``, ``d1``... by position.

Example:
    >>> from lowering.dims import Dim
    >>> str(Dim("batch").to_mlir())
    '"batch"'
"""

from __future__ import annotations

import functools
from typing import Any

from lowering.dims import Dim, StaticDim, SymbolicDim
from lowering.dtypes import DType

__all__ = [
    "dim_to_attr",
    "dim_from_attr",
    "shape_to_attr",
    "shape_from_attr",
    "string_attr",
    "attr_to_string",
    "type_to_mlir",
    "type_from_mlir",
]


@functools.cache
def _ir():
    from jax._src.lib.mlir import ir  # noqa: PLC0415 - MLIR loads only when asked for

    return ir


@functools.cache
def _context():
    ir = _ir()
    ctx = ir.Context()
    ctx.allow_unregistered_dialects = True
    return ctx


class _Scope:
    """Enter the shared MLIR context and an unknown location."""

    def __enter__(self):
        ir = _ir()
        self._ctx = _context()
        self._ctx.__enter__()
        self._loc = ir.Location.unknown()
        self._loc.__enter__()

    def __exit__(self, *exc):
        self._loc.__exit__(*exc)
        self._ctx.__exit__(*exc)


def string_attr(s: str) -> Any:
    """An MLIR ``StringAttr``."""
    with _Scope():
        return _ir().StringAttr.get(s)


def attr_to_string(attr: Any) -> str:
    """The text of a ``StringAttr`` (or a plain str)."""
    if isinstance(attr, str):
        return attr
    return _ir().StringAttr(attr).value


def dim_to_attr(dim: Dim) -> Any:
    """Static dims → ``i64`` attribute; symbolic/algebraic dims → their text."""
    ir = _ir()
    with _Scope():
        if isinstance(dim, StaticDim):
            return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dim.dim)
        return ir.StringAttr.get(str(dim))


def dim_from_attr(attr: Any) -> Dim:
    """Inverse of `dim_to_attr`."""
    ir = _ir()
    try:
        return StaticDim(ir.IntegerAttr(attr).value)
    except (ValueError, TypeError):
        pass
    text = attr_to_string(attr)
    return _parse_dim(text)


def _parse_dim(text: str) -> Dim:
    """Evaluate dim text (``"batch * 2 + 1"``) with symbols as `SymbolicDim`s."""
    import ast  # noqa: PLC0415

    tree = ast.parse(text, mode="eval")
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Load, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.USub)
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise ValueError(f"dim_from_attr: {text!r} is not a dimension expression")
    return Dim(eval(compile(tree, "<dim>", "eval"), {"__builtins__": {}}, {n: SymbolicDim(n) for n in names}))  # noqa: S307 - AST checked above


def shape_to_attr(shape: Any) -> Any:
    """An ``ArrayAttr`` of dim attributes."""
    attrs = [dim_to_attr(Dim(d)) for d in shape]
    with _Scope():
        return _ir().ArrayAttr.get(attrs)


def shape_from_attr(attr: Any) -> list[Dim]:
    """Inverse of `shape_to_attr`."""
    return [dim_from_attr(a) for a in _ir().ArrayAttr(attr)]


@functools.cache
def _element_types() -> dict[DType, Any]:
    ir = _ir()
    with _Scope():
        table = {
            DType.bool: ir.IntegerType.get_signless(1),
            DType.int8: ir.IntegerType.get_signless(8),
            DType.int16: ir.IntegerType.get_signless(16),
            DType.int32: ir.IntegerType.get_signless(32),
            DType.int64: ir.IntegerType.get_signless(64),
            DType.uint8: ir.IntegerType.get_unsigned(8),
            DType.uint16: ir.IntegerType.get_unsigned(16),
            DType.uint32: ir.IntegerType.get_unsigned(32),
            DType.uint64: ir.IntegerType.get_unsigned(64),
            DType.float16: ir.F16Type.get(),
            DType.bfloat16: ir.BF16Type.get(),
            DType.float32: ir.F32Type.get(),
            DType.float64: ir.F64Type.get(),
        }
        # Float8/float4 types exist only in newer bindings.
        for dtype, name in [
            (DType.float8_e4m3fn, "Float8E4M3FNType"),
            (DType.float8_e4m3fnuz, "Float8E4M3FNUZType"),
            (DType.float8_e5m2, "Float8E5M2Type"),
            (DType.float8_e5m2fnuz, "Float8E5M2FNUZType"),
            (DType.float4_e2m1fn, "Float4E2M1FNType"),
        ]:
            if hasattr(ir, name):
                table[dtype] = getattr(ir, name).get()
    return table


@functools.cache
def _dtypes_by_text() -> dict[str, DType]:
    return {str(t): d for d, t in _element_types().items()}


def _encoding(t: Any) -> Any:
    """What ``tensor<?x3xf32>`` cannot say (dim names, device, buffer-ness), or None."""
    from lowering.types import BufferType, DeviceRef  # noqa: PLC0415 - lowering.types imports this module lazily

    ir = _ir()
    entries = {}
    if not all(isinstance(d, StaticDim) for d in t.shape):
        entries["dims"] = shape_to_attr(t.shape)
    if t.device != DeviceRef.CPU():
        entries["device"] = string_attr(str(t.device))
    if isinstance(t, BufferType):
        entries["kind"] = string_attr("buffer")
    if not entries:
        return None
    with _Scope():
        return ir.DictAttr.get(entries)


def type_to_mlir(t: Any) -> Any:
    """A `TensorType`/`BufferType` as an MLIR ranked tensor type.

    Symbolic dims are ``?``. When the plain type would lose something (dim
    names, a non-CPU device, or that it is a buffer), that goes into the
    type's encoding: ``tensor<?x3xf32, {dims = ["batch", 3]}>``.
    """
    ir = _ir()
    elem = _element_types().get(t.dtype)
    if elem is None:
        raise ValueError(f"type_to_mlir: {t.dtype.name} has no MLIR element type in these MLIR bindings")
    sizes = [d.dim if isinstance(d, StaticDim) else ir.ShapedType.get_dynamic_size() for d in t.shape]
    encoding = _encoding(t)
    with _Scope():
        return ir.RankedTensorType.get(sizes, elem, encoding)


def type_from_mlir(mlir_type: Any) -> Any:
    """Inverse of `type_to_mlir`: a `TensorType` (a `BufferType` if encoded as one).

    A ``?`` without a name in the encoding comes back as ``d0``, ``d1``... by
    position; a type without our encoding is on the CPU.
    """
    from lowering.types import BufferType, DeviceRef, TensorType  # noqa: PLC0415

    ir = _ir()
    try:
        rt = ir.RankedTensorType(mlir_type)
    except (ValueError, TypeError):
        raise ValueError(f"type_from_mlir: expected a ranked tensor type, got {mlir_type}") from None
    dtype = _dtypes_by_text().get(str(rt.element_type))
    if dtype is None:
        raise ValueError(f"type_from_mlir: element type {rt.element_type} has no MAX DType")
    dims: list[Any] = [s if s >= 0 else f"d{i}" for i, s in enumerate(rt.shape)]
    device, cls = DeviceRef.CPU(), TensorType
    encoding = rt.encoding
    if encoding is not None:
        try:
            entries = ir.DictAttr(encoding)
        except (ValueError, TypeError):
            entries = None  # someone else's encoding (sparsity, bounds): nothing of ours in it
        if entries is not None:
            if "dims" in entries:
                named = shape_from_attr(entries["dims"])
                if len(named) != len(dims):
                    raise ValueError(f"type_from_mlir: {mlir_type} names {len(named)} dims for rank {len(dims)}")
                dims = named
            if "device" in entries:
                device = DeviceRef.from_mlir(entries["device"])
            if "kind" in entries and attr_to_string(entries["kind"]) == "buffer":
                cls = BufferType
    return cls(dtype, dims, device)
