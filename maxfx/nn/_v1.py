"""MAX's deprecated value-holding layers (``LinearV1``, ``MLPV1``, ``QLinearV1``, ``GPTQLinearV1``,
``EmbeddingV1``, ``LayerNormV1``, ``RMSNormV1``) plus ``ConstantLayerNorm`` and ``GroupNorm``.

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
from maxfx.graph._weight import Weight
from maxfx.graph.quantization import QuantizationConfig, QuantizationEncoding
from maxfx.nn._graph_util import on_device as _on
from maxfx.nn._layer import Layer, Module

__all__ = ["LinearV1", "QLinearV1", "GPTQLinearV1", "MLPV1", "EmbeddingV1", "LayerNormV1", "RMSNormV1", "ConstantLayerNorm", "GroupNorm"]


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
    def create(cls, dtype: DType, quantization_encoding: QuantizationEncoding | None, in_features: int, out_features: int, weights: Any, bias: Any = None, quantization_config: QuantizationConfig | None = None) -> LinearV1:
        """A V1 linear layer whose weight is allocated from ``weights`` (a `Weights` node).

        Float weights give a `LinearV1`, GGUF encodings a `QLinearV1`, GPTQ a `GPTQLinearV1`.
        """
        if quantization_encoding is None:
            w = weights.weight.allocate(dtype, [out_features, in_features])
            b = weights.bias.allocate(dtype, [out_features]) if bias else None
            return LinearV1(w, b)
        if quantization_encoding is QuantizationEncoding.GPTQ:
            w = weights.qweight.allocate(DType.uint8, None, quantization_encoding)
            perm = weights.perm_idx.allocate(DType.int32, [in_features]) if quantization_config is not None and quantization_config.desc_act else None
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
        b = _value(self.bias, x) if self.bias is not None else ops.broadcast_to(ops.constant(0.0, w.dtype, w.device), w.shape)
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


class ConstantLayerNorm(Module):
    """Layer norm with constant ``gamma = 1`` and ``beta = 0`` (numpy arrays, no weights).

    Example:
        >>> norm = ConstantLayerNorm(8, DeviceRef.CPU(), DType.float32)
        >>> norm.state_dict()
        {}
    """

    def __init__(self, dims: int | tuple[int, ...], device: Any, dtype: DType, eps: float = 1e-5):
        super().__init__()
        shape = (dims,) if isinstance(dims, int) else tuple(dims)
        self.device = DeviceRef.from_device(device)
        self.dtype = dtype
        self.eps = eps
        self.gamma = np.ones(shape, dtype.to_numpy())
        self.beta = np.zeros(shape, dtype.to_numpy())

    def __call__(self, x: Any) -> Any:
        gamma = ops.constant(self.gamma, self.dtype, x.device)
        beta = ops.constant(self.beta, self.dtype, x.device)
        return ops.layer_norm(x.cast(self.dtype), gamma, beta, self.eps).cast(x.dtype)


class GroupNorm(Module):
    """PyTorch ``group_norm``: normalise each of ``num_groups`` channel groups of ``[N, C, *]`` input.

    ``device`` defaults to ``gpu:0`` as documented; it only says where the
    weights live — the computation follows the input's device.

    Example:
        >>> gn = GroupNorm(2, 4, device=DeviceRef.CPU())
        >>> sorted(gn.state_dict())
        ['bias', 'weight']
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device: Any = DeviceRef.GPU()):  # noqa: B008 - MAX's documented default
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")

        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.device = DeviceRef.from_device(device)
        if affine:
            self.weight = Weight("weight", DType.float32, [num_channels], DeviceRef.CPU())
            self.bias = Weight("bias", DType.float32, [num_channels], DeviceRef.CPU())

    def __call__(self, x: Any) -> Any:
        if x.rank < 2 or int(x.shape[1]) != self.num_channels:
            raise ValueError(f"GroupNorm: expected input [N, {self.num_channels}, ...], got {list(x.shape)}")
        if self.affine:
            gamma, beta = _on(self.weight, x.device), _on(self.bias, x.device)
        else:
            gamma, beta = (ops.constant(np.full(self.num_channels, v, np.float32), DType.float32, x.device) for v in (1.0, 0.0))
        return ops.group_norm(x, gamma, beta, self.num_groups, self.eps)
