"""Quantized matmul and dequantisation of packed weights (GGUF blocks, GPTQ int4).

The functions exported here are what ``lowering`` calls. Today they are the
plain-jnp reference (`custom_calls.qmatmul.reference`); the Pallas kernels will
plug in behind the same names through a ``dispatch.py`` that picks kernel or
reference per platform and shape, without changing any caller.

Example:
    >>> import numpy as np
    >>> from custom_calls import qmatmul as q
    >>> x = np.ones((2, 32), np.float32)
    >>> w = np.zeros((3, 18), np.uint8)             # 3 output rows, one Q4_0 block each
    >>> q.qmatmul("Q4_0", x, w).shape
    (2, 3)
"""

from custom_calls.qmatmul.reference import (
    GGUF_BLOCKS,
    block_shape,
    dequantize,
    dequantize_blocks,
    gptq_dequantize,
    gptq_dequantize_packed,
    gptq_pack,
    gptq_packed_k,
    gptq_qmatmul,
    gptq_unpack_int4,
    qmatmul,
)

__all__ = [
    "GGUF_BLOCKS",
    "block_shape",
    "dequantize",
    "dequantize_blocks",
    "qmatmul",
    "gptq_packed_k",
    "gptq_unpack_int4",
    "gptq_dequantize",
    "gptq_dequantize_packed",
    "gptq_qmatmul",
    "gptq_pack",
]
