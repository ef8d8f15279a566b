"""``max.graph.ops.complex``: complex numbers held as interleaved ``[..., 2]`` (real, imag) pairs.

`mul` is the complex product (defined in `lowering.ops.elementwise` as
``complex_mul``); ``ops.as_interleaved_complex`` makes such pairs.
"""

from lowering.ops.elementwise import complex_mul as mul

__all__ = ["mul"]
