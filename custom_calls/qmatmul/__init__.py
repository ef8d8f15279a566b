"""Quantized matmul and dequantisation of packed weights (GGUF blocks, GPTQ int4, int8 per channel).

The functions exported here are what ``lowering`` calls. ``qmatmul``,
``gptq_qmatmul`` and ``int8_qmatmul`` go through `custom_calls.qmatmul.dispatch`:
the Pallas kernels (``pallas_gguf``: Q4_0/Q8_0/Q4_K/Q5_K/Q6_K, ``pallas_gptq``: GPTQ
int4 and int8 per channel) on GPU or with ``MAXFX_PALLAS_INTERPRET=1``, the
plain-jnp reference (`custom_calls.qmatmul.reference`) elsewhere. The
dequantisation functions are the reference.

Example:
    >>> import numpy as np
    >>> from custom_calls import qmatmul as q
    >>> x = np.ones((2, 32), np.float32)
    >>> w = np.zeros((3, 18), np.uint8)             # 3 output rows, one Q4_0 block each
    >>> q.qmatmul("Q4_0", x, w).shape
    (2, 3)
"""

from custom_calls.qmatmul.dispatch import (
    gptq_qmatmul,
    int8_qmatmul,
    prepare,
    q8_0_matmul,
    qmatmul,
    qmatmul_prepared,
)
from custom_calls.qmatmul.reference import (
    GGUF_BLOCKS,
    block_shape,
    dequantize,
    dequantize_blocks,
    gptq_dequantize,
    gptq_dequantize_packed,
    gptq_pack,
    gptq_packed_k,
    gptq_unpack_int4,
    int8_dequantize,
)

__all__ = [
    "GGUF_BLOCKS",
    "block_shape",
    "dequantize",
    "dequantize_blocks",
    "qmatmul",
    "q8_0_matmul",
    "gptq_packed_k",
    "gptq_unpack_int4",
    "gptq_dequantize",
    "gptq_dequantize_packed",
    "gptq_qmatmul",
    "gptq_pack",
    "int8_dequantize",
    "int8_qmatmul",
    "prepare",
    "qmatmul_prepared",
]
