"""`finfo`: the limits of a floating-point `DType` (``max.dtype.finfo``, also ``DType.finfo``).

The numbers come from numpy's ``finfo`` of the dtype's numpy type; for the
types numpy lacks (bfloat16, the float8 and float4 formats) that type is the
``ml_dtypes`` one, whose limits are the IEEE 754 / OCP MX values MAX lists.
"""

from __future__ import annotations

import ml_dtypes

from lowering.dtypes import DType

__all__ = ["finfo"]


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
        return f"finfo(dtype={self.dtype.name}, bits={self.bits}, eps={self.eps}, max={self.max}, min={self.min}, tiny={self.tiny})"


DType.finfo = finfo  # MAX: DType.finfo(DType.bfloat16)
