"""MAX element types and MAX's dtype-promotion rules.

`DType` is the enum users see as ``maxfx.dtype.DType``. It lives here because
every shape/dtype rule of the op registry needs it, and ``lowering`` never
imports ``maxfx``.

MAX promotes differently from JAX (API_INVENTORY §3.3): two typed ("strong")
operands promote to one of the two input dtypes and only when the other one is
exactly representable in it (``int32 + float32`` is an error, not ``float32``);
a Python scalar ("weak") takes the strong operand's dtype and must fit in it.

Example:
    >>> from lowering.dtypes import DType, promote_strong
    >>> promote_strong(DType.float16, DType.float32)
    <DType.float32: 81>
"""

from __future__ import annotations

import enum
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["DType", "finfo", "promote_strong", "promote_weak", "result_dtype_for_python_scalar"]


class DType(enum.Enum):
    """Element type of a tensor, with MAX's numeric enum values.

    Example:
        >>> DType.float32.size_in_bytes
        4
        >>> str(DType.bfloat16)
        'DType.bfloat16'
    """

    bool = 1
    float4_e2m1fn = 64
    float8_e8m0fnu = 73
    float8_e4m3fn = 75
    float8_e4m3fnuz = 76
    float8_e5m2 = 77
    float8_e5m2fnuz = 78
    float16 = 79
    bfloat16 = 80
    float32 = 81
    float64 = 82
    uint8 = 134
    int8 = 135
    uint16 = 136
    int16 = 137
    uint32 = 138
    int32 = 139
    uint64 = 140
    int64 = 141

    def __str__(self) -> str:
        return f"DType.{self.name}"

    # Members are singletons compared by identity; the C-level hash keeps the
    # type-keyed memos of the eager path cheap (Enum's own hash is Python code).
    __hash__ = object.__hash__

    # -- classification ---------------------------------------------------
    def is_float(self) -> bool:
        """True for every floating-point type (float4/8/16/32/64, bfloat16)."""
        return self in _FLOATS

    def is_float8(self) -> bool:
        """True for the float8 variants."""
        return self.name.startswith("float8")

    def is_half(self) -> bool:
        """True for float16 and bfloat16."""
        return self in (DType.float16, DType.bfloat16)

    def is_integral(self) -> bool:
        """True for signed and unsigned integer types (not bool)."""
        return self.is_signed_integral() or self.is_unsigned_integral()

    def is_signed_integral(self) -> bool:
        """True for int8/16/32/64."""
        return self in (DType.int8, DType.int16, DType.int32, DType.int64)

    def is_unsigned_integral(self) -> bool:
        """True for uint8/16/32/64."""
        return self in (DType.uint8, DType.uint16, DType.uint32, DType.uint64)

    # -- sizes ------------------------------------------------------------
    @property
    def size_in_bits(self) -> int:
        """Bits per element (bool counts 8, float4_e2m1fn counts 4)."""
        return _SIZE_BITS[self]

    @property
    def size_in_bytes(self) -> int:
        """Bytes per element, rounded up (float4 reports 1)."""
        return max(1, self.size_in_bits // 8)

    @property
    def align(self) -> int:
        """Required alignment in bytes (the element size)."""
        return self.size_in_bytes

    # -- conversions ------------------------------------------------------
    def to_numpy(self) -> np.dtype:
        """The numpy dtype (bfloat16/float8/float4 come from ``ml_dtypes``).

        Example:
            >>> DType.int32.to_numpy()
            dtype('int32')
        """
        return np.dtype(_TO_NUMPY[self])

    @staticmethod
    def from_numpy(dtype: Any) -> DType:
        """Map a numpy dtype (or anything ``np.dtype`` accepts) to a DType.

        Raises:
            ValueError: if numpy's type has no MAX equivalent (e.g. complex64).
        """
        try:
            key = np.dtype(dtype)
        except TypeError as e:
            raise ValueError(f"DType.from_numpy: {dtype!r} is not a numpy dtype") from e
        try:
            return _FROM_NUMPY[key]
        except KeyError:
            raise ValueError(f"DType.from_numpy: numpy dtype {key} has no MAX DType equivalent") from None

    def to_torch(self, _error: Exception | None = None) -> Any:
        """The matching ``torch.dtype`` (needs torch installed)."""
        torch = _import_torch("DType.to_torch", _error)
        name = {"bool": "bool"}.get(self.name, self.name)
        try:
            return getattr(torch, name)
        except AttributeError:
            raise ValueError(f"DType.to_torch: torch has no dtype for {self}") from None

    @staticmethod
    def from_torch(dtype: Any, _error: Exception | None = None) -> DType:
        """Map a ``torch.dtype`` to a DType (needs torch installed)."""
        _import_torch("DType.from_torch", _error)
        name = str(dtype).removeprefix("torch.")
        try:
            return DType[name]
        except KeyError:
            raise ValueError(f"DType.from_torch: torch dtype {dtype} has no MAX DType equivalent") from None

    # -- JAX helpers ------------------------------------------------------
    @property
    def _category(self) -> int:
        if self is DType.bool:
            return 0
        if self.is_unsigned_integral():
            return 1
        if self.is_signed_integral():
            return 2
        return 3


def _import_torch(where: str, error: Exception | None):
    try:
        import torch  # noqa: PLC0415 - optional dependency
    except ImportError as e:
        raise (error or ImportError(f"{where} needs torch, which is not installed")) from e
    return torch


_FLOATS = frozenset(
    {
        DType.float4_e2m1fn,
        DType.float8_e8m0fnu,
        DType.float8_e4m3fn,
        DType.float8_e4m3fnuz,
        DType.float8_e5m2,
        DType.float8_e5m2fnuz,
        DType.float16,
        DType.bfloat16,
        DType.float32,
        DType.float64,
    }
)

_TO_NUMPY: dict[DType, Any] = {
    DType.bool: np.bool_,
    DType.float4_e2m1fn: ml_dtypes.float4_e2m1fn,
    DType.float8_e8m0fnu: ml_dtypes.float8_e8m0fnu,
    DType.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
    DType.float8_e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
    DType.float8_e5m2: ml_dtypes.float8_e5m2,
    DType.float8_e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
    DType.float16: np.float16,
    DType.bfloat16: ml_dtypes.bfloat16,
    DType.float32: np.float32,
    DType.float64: np.float64,
    DType.uint8: np.uint8,
    DType.int8: np.int8,
    DType.uint16: np.uint16,
    DType.int16: np.int16,
    DType.uint32: np.uint32,
    DType.int32: np.int32,
    DType.uint64: np.uint64,
    DType.int64: np.int64,
}
_FROM_NUMPY: dict[np.dtype, DType] = {np.dtype(v): k for k, v in _TO_NUMPY.items()}
_SIZE_BITS = {d: (4 if d is DType.float4_e2m1fn else np.dtype(_TO_NUMPY[d]).itemsize * 8) for d in DType}

# Significand bits (incl. the implicit one) and exponent range, for exact-representability checks.
_FLOAT_FORMAT = {d: ml_dtypes.finfo(_TO_NUMPY[d]) for d in _FLOATS}


def _full_precision_range(d: DType) -> tuple[int, int]:
    """The integers ``d`` holds without loss: all of them for ints, ``+-2**(mantissa bits + 1)`` for floats."""
    if d is DType.bool:
        return 0, 1
    if d.is_float():
        bound = 2 ** (_FLOAT_FORMAT[d].nmant + 1)
        return -bound, bound
    info = np.iinfo(_TO_NUMPY[d])
    return int(info.min), int(info.max)


# MAX's table (max.graph.dtype_promotion): the range in which a Python int promotes to each dtype.
_DTYPE_MIN_AND_MAX_FULL_PRECISION: dict[DType, tuple[int, int]] = {d: _full_precision_range(d) for d in DType}


def _int_magnitude_bits(d: DType) -> int:
    if d is DType.bool:
        return 1
    return d.size_in_bits - (1 if d.is_signed_integral() else 0)


def _exactly_representable(src: DType, dst: DType) -> bool:
    """Every value of ``src`` is exactly a value of ``dst``."""
    if src is dst or src is DType.bool:
        return True
    if dst is DType.bool:
        return False
    if dst.is_float():
        fd = _FLOAT_FORMAT[dst]
        if src.is_float():
            fs = _FLOAT_FORMAT[src]
            return fs.nmant <= fd.nmant and fs.maxexp <= fd.maxexp and fs.minexp >= fd.minexp
        return _int_magnitude_bits(src) <= fd.nmant + 1
    if src.is_float():
        return False
    if dst.is_unsigned_integral():
        return src.is_unsigned_integral() and src.size_in_bits <= dst.size_in_bits
    # dst signed
    return _int_magnitude_bits(src) <= _int_magnitude_bits(dst)


def promote_strong(a: DType, b: DType) -> DType:
    """MAX promotion of two typed operands.

    The result is the input dtype of the higher category (bool < unsigned <
    signed < float), then the wider one; the other must convert exactly.

    Raises:
        ValueError: when no input dtype holds both exactly
            (``int32`` with ``float32``, ``uint8`` with ``int8``, ``bfloat16``
            with ``float16``).
    """
    if a is b:
        return a
    hi, lo = (a, b) if (a._category, a.size_in_bits) >= (b._category, b.size_in_bits) else (b, a)
    if _exactly_representable(lo, hi):
        return hi
    target = _promotion_candidate(lo, hi)
    raise ValueError(
        f"Failed to resolve valid dtype: Unsafe cast from {_short_name(lo)} to {_short_name(target)}. "
        f"Insert an explicit cast op if this conversion is wanted ({lo} and {hi}: no dtype of the "
        f"operands holds both exactly; cast one explicitly, e.g. x.cast({hi}))"
    )


def _promotion_candidate(lo: DType, hi: DType) -> DType:
    """The dtype MAX tries for a mixed pair: ``hi``'s kind at the wider of the two widths.

    MAX names it in its error (int32 with float16 tries float32, which cannot
    hold every int32 either).
    """
    width = max(lo.size_in_bits, hi.size_in_bits)
    if width == hi.size_in_bits:
        return hi
    kind = "float" if hi.is_float() else ("uint" if hi.is_unsigned_integral() else "int")
    return DType[f"{kind}{width}"]


# MLIR's spelling of each dtype, which MAX's promotion errors use (si32, f32, bf16...).
_SHORT_NAMES = {
    DType.bool: "bool",
    DType.float16: "f16",
    DType.bfloat16: "bf16",
    DType.float32: "f32",
    DType.float64: "f64",
    DType.float4_e2m1fn: "f4E2M1FN",
    DType.float8_e8m0fnu: "f8E8M0FNU",
    DType.float8_e4m3fn: "f8E4M3FN",
    DType.float8_e4m3fnuz: "f8E4M3FNUZ",
    DType.float8_e5m2: "f8E5M2",
    DType.float8_e5m2fnuz: "f8E5M2FNUZ",
}


def _short_name(d: DType) -> str:
    if d in _SHORT_NAMES:
        return _SHORT_NAMES[d]
    return ("ui" if d.is_unsigned_integral() else "si") + str(d.size_in_bits)


def promote_weak(strong: DType, value: Any) -> DType:
    """Check that a Python/numpy scalar promotes to ``strong`` (MAX's rule); return ``strong``.

    A float promotes to any float dtype (rounding, possibly to inf, as MAX
    does) and to no integer dtype; an int promotes when it lies in the dtype's
    full-precision range (`_DTYPE_MIN_AND_MAX_FULL_PRECISION`: the whole range
    of an int dtype, ``+-2**24`` for float32...).

    Raises:
        ValueError: "Unsafe cast: Can't promote python float to dtype(DType.int32)"
            and the like.
    """
    if isinstance(value, (bool, np.bool_)):
        return strong
    if isinstance(value, (float, np.floating)):
        if strong.is_float():
            return strong
        raise ValueError(f"Unsafe cast: Can't promote python float to dtype({strong})")
    if isinstance(value, (int, np.integer)):
        v = int(value)
        lo, hi = _DTYPE_MIN_AND_MAX_FULL_PRECISION[strong]
        if lo <= v <= hi:
            return strong
        raise ValueError(
            f"Unsafe cast: python int {v} is out of the range [{lo}, {hi}] that dtype({strong}) holds exactly"
        )
    raise TypeError(f"promote_weak: unsupported scalar {value!r} of type {type(value).__name__}")


def check_weak_array(dtype: DType, arr: Any) -> DType:
    """Check that weak array data ``arr`` (numpy) promotes to ``dtype`` (MAX's rule, element by element); return
    ``dtype``.

    Float data goes only into float dtypes; int data must lie in the dtype's
    full-precision range (`_DTYPE_MIN_AND_MAX_FULL_PRECISION`), so
    ``np.array([1000, 1])`` does not go into int8 (it would wrap to ``[-24, 1]``).
    The one check for eager and graph ops (`lowering.plan.weak_array`) and
    ``max.graph.dtype_promotion`` (`maxfx.graph.dtype_promotion`).

    Raises:
        ValueError: "Unsafe cast: ..." naming the offending value and the range.

    Example:
        >>> check_weak_array(DType.int8, np.array([100, -3]))
        <DType.int8: 135>
        >>> check_weak_array(DType.int8, np.array([1000, 1]))
        Traceback (most recent call last):
        ValueError: Unsafe cast: array value 1000 is out of the range [-128, 127] that dtype(DType.int8) holds exactly
    """
    arr = np.asarray(arr)
    if arr.dtype.kind == "f":
        if not dtype.is_float():
            raise ValueError(f"Unsafe cast: can't promote a float array ({arr.dtype}) to dtype({dtype})")
        return dtype
    if arr.dtype.kind in "iu" and arr.size:
        lo, hi = _DTYPE_MIN_AND_MAX_FULL_PRECISION[dtype]
        for v in (int(arr.min()), int(arr.max())):
            if not lo <= v <= hi:
                raise ValueError(
                    f"Unsafe cast: array value {v} is out of the range [{lo}, {hi}] that dtype({dtype}) holds exactly"
                )
    return dtype


def result_dtype_for_python_scalar(value: Any) -> DType:
    """Default dtype of a bare Python scalar: bool, int64 or float32."""
    if isinstance(value, (bool, np.bool_)):
        return DType.bool
    if isinstance(value, (int, np.integer)):
        return DType.int64
    return DType.float32


# ─── finfo: the limits of a float DType (max.dtype.finfo, also DType.finfo) ───
# numpy's finfo of the dtype's numpy type; for the types numpy lacks (bfloat16, float8,
# float4) that type is ml_dtypes', whose limits are the IEEE 754 / OCP MX values MAX lists.


class finfo:  # noqa: N801 - MAX's (and torch's, numpy's) name
    """Numerical properties of a floating-point `DType`, modeled after ``torch.finfo``.

    Attributes:
        bits: bits in one value.
        eps: the smallest ``x`` with ``1.0 + x != 1.0``.
        max: the largest finite value.
        min: the most negative finite value (``float8_e8m0fnu`` has no sign
            bit: its smallest positive value).
        tiny: the smallest positive normal value (also ``smallest_normal``).
        dtype: the `DType` described.

    Raises:
        TypeError: ``dtype`` is not a floating-point `DType`.

    Example:
        >>> from maxfx.dtype import DType, finfo
        >>> info = finfo(DType.bfloat16)
        >>> info.bits, info.eps, info.max
        (16, 0.0078125, 3.3895313892515355e+38)
        >>> finfo(DType.float8_e4m3fn).max, DType.finfo(DType.float16).tiny
        (448.0, 6.103515625e-05)
    """

    bits: int
    eps: float
    max: float
    min: float
    tiny: float
    dtype: DType

    def __init__(self, dtype: DType):
        if not isinstance(dtype, DType):
            raise TypeError(f"finfo: expected a DType, got {type(dtype).__name__}")
        if not dtype.is_float():
            raise TypeError(f"finfo only supports floating-point types, got {dtype.name}")
        info = ml_dtypes.finfo(dtype.to_numpy())  # numpy's finfo for numpy's own float types
        self.bits = int(info.bits)
        self.eps = float(info.eps)
        self.max = float(info.max)
        self.min = float(info.min)
        self.tiny = float(info.tiny)
        self.dtype = dtype

    @property
    def smallest_normal(self) -> float:
        """Alias of ``tiny`` (``torch.finfo``'s name)."""
        return self.tiny

    def __repr__(self) -> str:
        return (
            f"finfo(dtype={self.dtype.name}, bits={self.bits}, eps={self.eps}, max={self.max}, min={self.min}, "
            f"tiny={self.tiny})"
        )


DType.finfo = finfo  # MAX: DType.finfo(DType.bfloat16)
