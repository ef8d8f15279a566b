"""Element types (``max.dtype``).

`DType` is defined in ``lowering.dtypes`` (the op registry's dtype rules need it
and ``lowering`` never imports ``maxfx``); this module is its public home.

Example:
    >>> from maxfx.dtype import DType
    >>> str(DType.bfloat16), DType.bfloat16.size_in_bits
    ('DType.bfloat16', 16)
"""

from lowering.dtypes import DType

__all__ = ["DType"]
