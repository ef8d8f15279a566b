"""MAX's deprecated value-holding layers (``LinearV1``, ``MLPV1``, ``QLinearV1``, ``GPTQLinearV1``,
``EmbeddingV1``, ``LayerNormV1``, ``RMSNormV1``).

V1 layers are dataclasses holding the weight *values* (Weights, graph values or
arrays) instead of creating Weights; they compute with the same graph ops as
the current layers (`maxfx.nn._basic`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph.quantization import QuantizationConfig, QuantizationEncoding
from maxfx.nn._layer import Layer

__all__ = ["LinearV1", "QLinearV1", "GPTQLinearV1", "MLPV1", "EmbeddingV1", "LayerNormV1", "RMSNormV1"]


def _value(x: Any, like: Any = None) -> Any:
    """A graph value for a Weight, graph value or array (arrays become constants)."""
    if hasattr(x, "type"):
        return x
    arr = np.asarray(x)
    return ops.constant(arr, DType.from_numpy(arr.dtype), getattr(like, "device", None) or DeviceRef.CPU())


@dataclass
class LinearV1(Layer):
    """``x @ weight.T + bias`` with explicit values (deprecated; use `Linear`).

    Example:
        >>> layer = LinearV1(weight=w, bias=b)  # doctest: +SKIP
    """

    weight: Any
    bias: Any = None

    def __call__(self, x: Any) -> Any:
        out = x @ _value(self.weight, x).T
        return out + _value(self.bias, x) if self.bias is not None else out

    @classmethod
    def create(
        cls,
        dtype: DType,
        quantization_encoding: QuantizationEncoding | None,
        in_features: int,
        out_features: int,
        weights: Any,
        bias: Any = None,
        quantization_config: QuantizationConfig | None = None,
    ) -> LinearV1:
        """A V1 linear layer whose weight is allocated from ``weights`` (a `Weights` node).

        Float weights give a `LinearV1`, GGUF encodings a `QLinearV1`, GPTQ a `GPTQLinearV1`.
        """
        if quantization_encoding is None:
            w = weights.weight.allocate(dtype, [out_features, in_features])
            b = weights.bias.allocate(dtype, [out_features]) if bias else None
            return LinearV1(w, b)
        if quantization_encoding is QuantizationEncoding.GPTQ:
            w = weights.qweight.allocate(DType.uint8, None, quantization_encoding)
            perm = (
                weights.perm_idx.allocate(DType.int32, [in_features])
                if quantization_config is not None and quantization_config.desc_act
                else None
            )
            return GPTQLinearV1(w, None, quantization_encoding, quantization_config, perm)
        w = weights.weight.allocate(DType.uint8, None, quantization_encoding)
        return QLinearV1(w, None, quantization_encoding)


@dataclass
class QLinearV1(LinearV1):
    """``qmatmul`` with a GGUF-packed (transposed) weight (deprecated; use `Linear(quantization_encoding=...)`)."""

    quantization_encoding: QuantizationEncoding | None = None

    def __call__(self, x: Any) -> Any:
        out = ops.qmatmul(self.quantization_encoding, None, x, _value(self.weight, x))
        return out + _value(self.bias, x) if self.bias is not None else out


@dataclass
class GPTQLinearV1(QLinearV1):
    """GPTQ int4 ``qmatmul`` (act-order via ``perm_idx``) (deprecated)."""

    quantization_config: QuantizationConfig | None = None
    perm_idx: Any = None

    def __call__(self, x: Any) -> Any:
        if self.quantization_config is None:
            raise ValueError("GPTQLinearV1: quantization_config is required")
        rhs = [_value(self.weight, x)]
        if self.perm_idx is not None:
            perm = _value(self.perm_idx, x)
            x = ops.gather(x, perm, axis=-1)
            rhs.append(perm)
        out = ops.qmatmul(QuantizationEncoding.GPTQ, self.quantization_config, x, *rhs)
        return out + _value(self.bias, x) if self.bias is not None else out


@dataclass
class MLPV1(Layer):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` over three `LinearV1` (deprecated; use `MLP`)."""

    gate_proj: LinearV1
    down_proj: LinearV1
    up_proj: LinearV1

    def __call__(self, x: Any) -> Any:
        return self.down_proj(ops.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class EmbeddingV1(Layer):
    """Row lookup in explicit ``weights`` (deprecated; use `Embedding`)."""

    weights: Any
    device: DeviceRef

    def __call__(self, indices: Any) -> Any:
        w = _value(self.weights, indices)
        if w.device != self.device:
            w = w.to(self.device)
        return ops.gather(w, indices, axis=0)


@dataclass
class LayerNormV1(Layer):
    """``layer_norm`` with explicit ``weight``/``bias`` values (deprecated; use `LayerNorm`)."""

    weight: Any
    bias: Any = None
    eps: float = 1e-6

    def __call__(self, x: Any) -> Any:
        w = _value(self.weight, x)
        b = (
            _value(self.bias, x)
            if self.bias is not None
            else ops.broadcast_to(ops.constant(0.0, w.dtype, w.device), w.shape)
        )
        return ops.layer_norm(x, w, b, self.eps)


@dataclass
class RMSNormV1(Layer):
    """RMS normalisation with an explicit ``weight`` value (deprecated; use `RMSNorm`)."""

    weight: Any
    eps: float = 1e-6
    weight_offset: float = 0.0
    multiply_before_cast: bool = True

    def __call__(self, x: Any) -> Any:
        return ops.rms_norm(x, _value(self.weight, x), self.eps, self.weight_offset, self.multiply_before_cast)
