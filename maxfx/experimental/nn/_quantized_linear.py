"""`QuantizedLinear`: an eager Module layer over packed GGUF weights.

Like the other layers they only call ``maxfx.functional`` ops, so they run
eagerly, under ``jax.jit`` and inside `Module.compile`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lowering.dims import Dim, StaticDim
from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding
from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn.module import Module, _Verbatim

__all__ = ["QuantizedLinear"]


def _encoding(encoding: Any) -> QuantizationEncoding:
    if isinstance(encoding, QuantizationEncoding) and encoding.is_gguf:
        return encoding
    if isinstance(encoding, str):
        for member in QuantizationEncoding:
            if member.is_gguf and member.value == encoding.upper():
                return member
    supported = ", ".join(m.value for m in QuantizationEncoding if m.is_gguf)
    raise ValueError(
        f"QuantizedLinear: unsupported encoding {encoding!r}; expected a GGUF QuantizationEncoding ({supported})"
    )


class QuantizedLinear(Module):
    """``y = x @ dequantize(weight).T (+ bias)`` with ``weight`` kept packed as GGUF blocks.

    ``weight`` is uint8 ``[out_dim, in_dim / elements_per_block * block_size]``
    (a row of blocks per output feature, as GGUF stores a Linear); the product
    runs through ``ops.qmatmul`` so the weight is never dequantized as a whole
    outside the kernel.

    Args:
        weight: the packed uint8 Tensor.
        encoding: its `QuantizationEncoding` (Q4_0, Q4_K, Q5_K or Q6_K).
        bias: optional float ``[out_dim]``.

    Example:
        >>> import numpy as np
        >>> packed = Tensor(np.zeros((3, 18), np.uint8))  # 3 rows of one Q4_0 block
        >>> QuantizedLinear(packed, "Q4_0")(Tensor.ones([2, 32])).shape
        [Dim(2), Dim(3)]
    """

    def __init__(self, weight: Tensor, encoding: QuantizationEncoding | str, bias: Tensor | None = None):
        enc = _encoding(encoding)
        if weight.dtype is not DType.uint8 or weight.rank != 2:
            raise ValueError(f"QuantizedLinear: weight must be a uint8 matrix of {enc.value} blocks, got {weight.type}")
        if int(weight.shape[1]) % enc.block_size:
            raise ValueError(
                f"QuantizedLinear: weight rows of {int(weight.shape[1])} bytes are not whole {enc.value} blocks of "
                f"{enc.block_size} bytes"
            )
        self.weight = weight
        self.bias = 0 if bias is None else bias
        self.encoding = enc

    @property
    def in_dim(self) -> Dim:
        return StaticDim(int(self.weight.shape[1]) // self.encoding.block_size * self.encoding.elements_per_block)

    @property
    def out_dim(self) -> Dim:
        return StaticDim(int(self.weight.shape[0]))

    def forward(self, x: Tensor) -> Tensor:
        y = F.qmatmul(self.encoding, None, x, self.weight)
        return y if isinstance(self.bias, int) else y + self.bias

    def dequantized_weight(self) -> Tensor:
        """The float32 ``[out_dim, in_dim]`` weight (for inspection; the forward never builds it)."""
        return F.dequantize(self.encoding, self.weight)

    def __rich_repr__(self) -> Iterator[tuple[str, Any]]:
        """``in_dim`` and ``out_dim`` (as `Linear`), then the encoding's name (maxfx's layer: MAX has none)."""
        yield "in_dim", self.in_dim
        yield "out_dim", self.out_dim
        yield "encoding", _Verbatim(self.encoding.value)
