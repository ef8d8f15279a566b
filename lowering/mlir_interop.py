"""Typed access to the MLIR bindings JAX ships, for MAX's ``to_mlir``/``from_mlir`` methods.

MAX builds its graphs in its own MLIR dialect; maxfx lowers to StableHLO, so
types map to builtin MLIR types (``tensor<?x3xf32>``) and dims, shapes,
devices and layouts to builtin attributes. This module speaks only Python
values (ints, strings, lists, dicts, `DType`s); the classes that own the
meaning (`lowering.dims.Dim`, `lowering.types.TensorType`, ...) build their
own ``to_mlir``/``from_mlir`` on it, so it imports none of them.

Example:
    >>> from lowering.mlir_interop import attr_value, int_attr, string_attr
    >>> str(int_attr(5)), attr_value(int_attr(5)), attr_value(string_attr("batch"))
    ('5 : i64', 5, 'batch')
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from lowering.dtypes import DType

__all__ = [
    "string_attr",
    "attr_to_string",
    "int_attr",
    "attr_value",
    "array_attr",
    "array_items",
    "dict_attr",
    "dict_items",
    "ranked_tensor_type",
    "ranked_tensor_parts",
]


@functools.cache
def _ir():
    from jax._src.lib.mlir import ir  # noqa: PLC0415 - loads all of JAX: MLIR only when a to_mlir/from_mlir asks

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


def int_attr(n: int) -> Any:
    """An ``i64`` ``IntegerAttr``."""
    ir = _ir()
    with _Scope():
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), n)


def attr_value(attr: Any) -> int | str:
    """The int of an ``IntegerAttr``, else the text of a ``StringAttr``."""
    try:
        return _ir().IntegerAttr(attr).value
    except (ValueError, TypeError):
        return attr_to_string(attr)


def array_attr(items: Sequence[Any]) -> Any:
    """An ``ArrayAttr`` of MLIR attributes."""
    with _Scope():
        return _ir().ArrayAttr.get(list(items))


def array_items(attr: Any) -> list[Any]:
    """The attributes of an ``ArrayAttr``."""
    return list(_ir().ArrayAttr(attr))


def dict_attr(entries: Mapping[str, Any]) -> Any:
    """A ``DictAttr`` of MLIR attributes."""
    with _Scope():
        return _ir().DictAttr.get(dict(entries))


def dict_items(attr: Any) -> dict[str, Any] | None:
    """The entries of a ``DictAttr``; None for any other attribute."""
    try:
        entries = _ir().DictAttr(attr)
    except (ValueError, TypeError):
        return None
    return {entries[i].name: entries[i].attr for i in range(len(entries))}


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
            (DType.float8_e8m0fnu, "Float8E8M0FNUType"),
        ]:
            if hasattr(ir, name):
                table[dtype] = getattr(ir, name).get()
    return table


@functools.cache
def _dtypes_by_text() -> dict[str, DType]:
    return {str(t): d for d, t in _element_types().items()}


def ranked_tensor_type(
    sizes: Sequence[int | None], dtype: DType, encoding: Any = None, where: str = "TensorType.to_mlir"
) -> Any:
    """``tensor<2x?xf32, encoding>``: a ranked tensor type, None for a dynamic size.

    Raises:
        ValueError: ``dtype`` has no element type in these MLIR bindings.
    """
    ir = _ir()
    elem = _element_types().get(dtype)
    if elem is None:
        raise ValueError(f"{where}: {dtype.name} has no MLIR element type in these MLIR bindings")
    dims = [ir.ShapedType.get_dynamic_size() if s is None else s for s in sizes]
    with _Scope():
        return ir.RankedTensorType.get(dims, elem, encoding)


def ranked_tensor_parts(mlir_type: Any, where: str = "Type.from_mlir") -> tuple[DType, list[int | None], Any]:
    """Inverse of `ranked_tensor_type`: ``(dtype, sizes with None for ?, encoding or None)``.

    Raises:
        ValueError: not a ranked tensor type, or an element type with no MAX `DType`.
    """
    ir = _ir()
    try:
        rt = ir.RankedTensorType(mlir_type)
    except (ValueError, TypeError):
        raise ValueError(f"{where}: expected a ranked tensor type, got {mlir_type}") from None
    dtype = _dtypes_by_text().get(str(rt.element_type))
    if dtype is None:
        raise ValueError(f"{where}: element type {rt.element_type} has no MAX DType")
    return dtype, [s if s >= 0 else None for s in rt.shape], rt.encoding
