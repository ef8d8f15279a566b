"""``max.nn.attention.mask_config``: attention mask and positional-encoding variants.

Example:
    >>> from maxfx.nn.attention.mask_config import MHAMaskVariant
    >>> MHAMaskVariant.CAUSAL_MASK.value
    '0'
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["AttentionMaskVariant", "MHAMaskConfig", "MHAMaskVariant", "PositionalEncodingVariant"]


class AttentionMaskVariant(str, enum.Enum):
    """Which keys a query sees (``TENSOR_MASK``: an explicit mask tensor decides)."""

    CAUSAL_MASK = "causal"
    CHUNKED_CAUSAL_MASK = "chunked_causal"
    NULL_MASK = "null"
    SLIDING_WINDOW_CAUSAL_MASK = "sliding_window_causal"
    TENSOR_MASK = "tensor_mask"


class PositionalEncodingVariant(str, enum.Enum):
    """Position bias added inside attention: none, or ALiBi."""

    ALIBI_POS = "alibi_pos"
    NO_POS = "no_pos"


class MHAMaskVariant(str, enum.Enum):
    """Mask of the attention kernels (``local_window_size`` sizes the chunked/sliding ones)."""

    CAUSAL_MASK = "0"
    CAUSAL_ALIBI_MASK = "1"
    NULL_MASK = "2"
    CHUNKED_CAUSAL_MASK = "3"
    SLIDING_WINDOW_CAUSAL_MASK = "4"


@dataclass
class MHAMaskConfig:
    """A mask variant plus a positional encoding (ALiBi or none).

    Example:
        >>> MHAMaskConfig(AttentionMaskVariant.CAUSAL_MASK,
        ...     PositionalEncodingVariant.ALIBI_POS).attention_mask_variant.value
        'causal'
    """

    attention_mask_variant: AttentionMaskVariant
    positional_encoding_variant: PositionalEncodingVariant
