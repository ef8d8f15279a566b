"""Quantization encodings of packed weights (GGUF block formats and GPTQ).

Block sizes follow llama.cpp's layouts (verified against the ``gguf`` package
in ``custom_calls/qmatmul``): Q4_0 packs 32 elements in 18 bytes, Q4_K 256 in
144, Q5_K 256 in 176, Q6_K 256 in 210.

Example:
    >>> QuantizationEncoding.Q4_K.block_size, QuantizationEncoding.Q4_K.elements_per_block
    (144, 256)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["BlockParameters", "QuantizationConfig", "QuantizationEncoding"]


@dataclass(frozen=True)
class BlockParameters:
    """Elements per block and bytes per encoded block."""

    elements_per_block: int
    block_size: int


@dataclass
class QuantizationConfig:
    """GPTQ-style quantization settings.

    Attributes:
        quant_method: e.g. ``"gptq"``.
        bits: bits per weight (4 for GPTQ int4).
        group_size: input channels sharing one scale/zero point.
        desc_act: act-order: rows were quantized in ``perm_idx`` order.
        sym: symmetric quantization (no zero points).
    """

    quant_method: str
    bits: int
    group_size: int
    desc_act: bool = False
    sym: bool = False


class QuantizationEncoding(enum.Enum):
    """Supported packed-weight encodings."""

    Q4_0 = "Q4_0"
    Q4_K = "Q4_K"
    Q5_K = "Q5_K"
    Q6_K = "Q6_K"
    GPTQ = "GPTQ"

    @property
    def block_parameters(self) -> BlockParameters:
        """Elements and bytes per block (GGUF encodings only)."""
        try:
            return _BLOCKS[self]
        except KeyError:
            raise ValueError(
                f"{self.value} has no fixed block layout (GPTQ packing depends on QuantizationConfig)"
            ) from None

    @property
    def block_size(self) -> int:
        """Bytes per encoded block."""
        return self.block_parameters.block_size

    @property
    def elements_per_block(self) -> int:
        """Elements per encoded block."""
        return self.block_parameters.elements_per_block

    @property
    def is_gguf(self) -> bool:
        """True for the llama.cpp block formats."""
        return self in _BLOCKS

    @property
    def name(self) -> str:  # type: ignore[override]
        """Lowercase name (``"q4_k"``)."""
        return self.value.lower()

    def __str__(self) -> str:
        return f"QuantizationEncoding.{self.value}"


_BLOCKS = {
    QuantizationEncoding.Q4_0: BlockParameters(32, 18),
    QuantizationEncoding.Q4_K: BlockParameters(256, 144),
    QuantizationEncoding.Q5_K: BlockParameters(256, 176),
    QuantizationEncoding.Q6_K: BlockParameters(256, 210),
}
