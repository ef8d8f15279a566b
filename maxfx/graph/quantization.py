"""Quantization encodings (``max.graph.quantization``)."""

from lowering.quantization import BlockParameters, QuantizationConfig, QuantizationEncoding

__all__ = ["BlockParameters", "QuantizationConfig", "QuantizationEncoding"]
