"""``max.nn.quant_config``: MAX 26.5's names for a checkpoint's quantization settings.

MAX 26.5 renamed the float8 configuration: `QuantConfig` (was ``Float8Config``)
with a `QuantFormat`, `InputScaleSpec` / `WeightScaleSpec` (were
``Float8InputScaleSpec`` / ``Float8WeightScaleSpec``), `ScaleGranularity`
and `ScaleOrigin`. The scale specs and enums are the same classes as
`maxfx.nn.float8_config`'s; a `QuantConfig` is a ``Float8Config`` (every layer
taking a float8 config takes it) whose layer sets are named
``mlp_quantized_layers`` / ``attn_quantized_layers``.

Example:
    >>> from maxfx.dtype import DType
    >>> cfg = QuantConfig(
    ...     format=QuantFormat.COMPRESSED_TENSORS_FP8,
    ...     weight_scale=WeightScaleSpec(dtype=DType.float32, granularity=ScaleGranularity.ROWWISE),
    ...     input_scale=InputScaleSpec(dtype=DType.float32, granularity=ScaleGranularity.TENSOR,
    ...     origin=ScaleOrigin.STATIC),
    ...     mlp_quantized_layers={0, 1}, attn_quantized_layers=set())
    >>> cfg.is_static, cfg.weight_scale.is_rowwise, sorted(cfg.mlp_quantized_layers), cfg.format.value
    (True, True, [0, 1], 'compressed-tensors-fp8')
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from lowering.dtypes import DType
from maxfx.nn.float8_config import (
    Float8Config,
    Float8InputScaleSpec,
    Float8ScaleGranularity,
    Float8ScaleOrigin,
    Float8WeightScaleSpec,
)

__all__ = ["InputScaleSpec", "QuantConfig", "QuantFormat", "ScaleGranularity", "ScaleOrigin", "WeightScaleSpec"]

InputScaleSpec = Float8InputScaleSpec
"""How activations are scaled (MAX 26.5 name of ``Float8InputScaleSpec``)."""

WeightScaleSpec = Float8WeightScaleSpec
"""How weights are scaled (MAX 26.5 name of ``Float8WeightScaleSpec``)."""

ScaleGranularity = Float8ScaleGranularity
"""What one scale covers (MAX 26.5 name of ``Float8ScaleGranularity``)."""

ScaleOrigin = Float8ScaleOrigin
"""Static or dynamic scales (MAX 26.5 name of ``Float8ScaleOrigin``)."""


class QuantFormat(enum.Enum):
    """The quantization format of a checkpoint (MAX's values)."""

    BLOCKSCALED_FP8 = "blockscaled-fp8"
    COMPRESSED_TENSORS_FP8 = "compressed-tensors-fp8"
    FBGEMM_FP8 = "fbgemm-fp8"
    MXFP4 = "mxfp4"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"


class QuantConfig(Float8Config):
    """A checkpoint's quantization: ``format``, input/weight scale specs and the quantized layers.

    Raises:
        ValueError: if ``format`` is not a `QuantFormat` value.
    """

    def __init__(
        self,
        input_scale: Float8InputScaleSpec,
        weight_scale: Float8WeightScaleSpec,
        mlp_quantized_layers: Iterable[int] = (),
        attn_quantized_layers: Iterable[int] = (),
        embedding_output_dtype: DType | None = None,
        format: QuantFormat | str | None = None,  # noqa: A002 - MAX's keyword
    ):
        fmt = None if format is None else QuantFormat(format)
        super().__init__(
            input_scale=input_scale,
            weight_scale=weight_scale,
            mlp_in_float8=set(mlp_quantized_layers),
            attn_qkv_in_float8=set(attn_quantized_layers),
            embedding_output_dtype=embedding_output_dtype,
            quant_method=None if fmt is None else fmt.value,
        )
        self.format = fmt

    @property
    def mlp_quantized_layers(self) -> set[int]:
        """Layer indices whose MLP is quantized."""
        return self.mlp_in_float8

    @property
    def attn_quantized_layers(self) -> set[int]:
        """Layer indices whose attention QKV projections are quantized."""
        return self.attn_qkv_in_float8
