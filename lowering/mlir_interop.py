"""MAX's ``to_mlir``/``from_mlir`` methods, mapped onto the MLIR bindings JAX ships.

MAX builds its graphs in its own MLIR dialect; maxfx lowers to StableHLO, so
types map to builtin MLIR types (``tensor<?x3xf32>``) and dims, shapes,
devices and layouts to builtin attributes. Static dims are ``i64`` integer
attributes; symbolic and algebraic dims are string attributes holding their
text (``"batch"``, ``"batch * 2"``), so they round-trip exactly. Tensor types
lose symbolic names (MLIR only has ``?``); ``type_from_mlir`` names them
``d0``, ``d1``... unless the type was produced by ``type_to_mlir`` in this
process, in which case the original names come back.

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


def _element_types() -> dict[DType, Any]:
    ir = _ir()
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
        DType.float8_e4m3fn: ir.Float8E4M3FNType.get(),
        DType.float8_e4m3fnuz: ir.Float8E4M3FNUZType.get(),
        DType.float8_e5m2: ir.Float8E5M2Type.get(),
        DType.float8_e5m2fnuz: ir.Float8E5M2FNUZType.get(),
    }
    if hasattr(ir, "Float4E2M1FNType"):
        table[DType.float4_e2m1fn] = ir.Float4E2M1FNType.get()
    return table


# Symbolic names of tensor types made here, keyed by the MLIR type's text.
_symbolic_names: dict[str, tuple[Any, ...]] = {}


def type_to_mlir(t: Any) -> Any:
    """A `TensorType`/`BufferType` as a ranked tensor type (``?`` for symbolic dims)."""
    ir = _ir()
    with _Scope():
        elem = _element_types()[t.dtype]
        sizes = [d.dim if isinstance(d, StaticDim) else ir.ShapedType.get_dynamic_size() for d in t.shape]
        out = ir.RankedTensorType.get(sizes, elem)
    _symbolic_names[str(out)] = (type(t), tuple(t.shape), t.device)
    return out


def type_from_mlir(mlir_type: Any) -> Any:
    """Inverse of `type_to_mlir` (symbolic dims come back by name when known)."""
    from lowering.types import TensorType  # noqa: PLC0415

    known = _symbolic_names.get(str(mlir_type))
    ir = _ir()
    rt = ir.RankedTensorType(mlir_type)
    elem = str(rt.element_type)
    with _Scope():
        dtype = next((d for d, e in _element_types().items() if str(e) == elem), None)
    if dtype is None:
        raise ValueError(f"type_from_mlir: element type {elem} has no MAX DType")
    if known is not None:
        cls, dims, device = known
        return cls(dtype, list(dims), device)
    dims = [s if s >= 0 else f"d{i}" for i, s in enumerate(rt.shape)]
    return TensorType(dtype, dims)
