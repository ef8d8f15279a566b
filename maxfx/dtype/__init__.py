"""Element types (``max.dtype``).

`DType` is defined in ``lowering.dtypes`` (the op registry's dtype rules need it
and ``lowering`` never imports ``maxfx``); this module is its public home.

Example:
    >>> from maxfx.dtype import DType
    >>> str(DType.bfloat16), DType.bfloat16.size_in_bits
    ('DType.bfloat16', 16)
    >>> from maxfx.dtype import finfo
    >>> finfo(DType.bfloat16).eps
    0.0078125
"""

from lowering.dtypes import DType, finfo

__all__ = ["DType", "finfo"]
