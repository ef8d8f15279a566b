"""The float8 path of `Linear`: float8_e4m3fn weights with scales, float8 activations.

A float8 `Linear` stores ``weight`` as float8_e4m3fn ``[out_dim, in_dim]`` and
``weight_scale`` by the config's weight granularity (``[]`` per tensor,
``[out_dim, 1]`` row-wise, ``[1, in_dim]`` column-wise, ``[ceil(out/bn),
ceil(in/bk)]`` per block); a static input scale is a scalar ``input_scale``.
The call quantizes the activations (statically with ``input_scale``, or
dynamically per tensor, token or block) and runs one scaled matmul in float32,
returning the input dtype.
"""

from __future__ import annotations

import math
from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph._weight import Weight
from maxfx.nn.float8_config import Float8Config

__all__ = ["float8_weights", "float8_matmul", "scaled_linear", "Float8ConfigTypeError"]


class Float8ConfigTypeError(TypeError, ValueError):
    """``float8_config`` is not a `Float8Config` (a TypeError; also a ValueError, as maxfx
    raised for any float8_config before float8 layers existed)."""


def _weight_scale_shape(config: Float8Config, out_dim: int, in_dim: int) -> list[int]:
    spec = config.weight_scale
    if spec.is_tensor:
        return []
    if spec.is_rowwise:
        return [out_dim, 1]
    if spec.is_colwise:
        return [1, in_dim]
    bn, bk = spec.block_size  # type: ignore[misc]
    return [math.ceil(out_dim / bn), math.ceil(in_dim / bk)]


def float8_weights(
    config: Any, in_dim: int, out_dim: int, prefix: str, weight_dtype: DType = DType.float8_e4m3fn
) -> tuple[Weight, Weight, Weight | None]:
    """``(weight, weight_scale, input_scale)`` Weights of a float8 Linear (input_scale only when static).

    ``weight_dtype`` is the stored weight's type: float8_e4m3fn for ``float8_config``;
    MAX's ``quant_config`` keeps the layer's ``dtype`` (the checkpoint's), as MAX does.
    """
    if not isinstance(config, Float8Config):
        raise Float8ConfigTypeError(f"Linear: float8_config must be a Float8Config, got {type(config).__name__}")
    spec = config.input_scale
    if config.is_static and not spec.is_tensor:
        raise ValueError(f"Linear: static float8 input scales must be per tensor, got {spec.granularity}")
    if config.is_dynamic and spec.is_rowwise:
        raise ValueError(
            "Linear: dynamic row-wise (per input channel) activation scales are not supported; use COLWISE (per "
            "token), TENSOR or BLOCK"
        )
    cpu = DeviceRef.CPU()
    weight = Weight(prefix + "weight", weight_dtype, [out_dim, in_dim], cpu)
    weight_scale = Weight(
        prefix + "weight_scale", config.weight_scale.dtype, _weight_scale_shape(config, out_dim, in_dim), cpu
    )
    input_scale = Weight(prefix + "input_scale", spec.dtype, [], cpu) if config.is_static else None
    return weight, weight_scale, input_scale


def _as_matrix(scale: Any) -> Any:
    return scale.reshape([1, 1]) if scale.rank == 0 else scale


def _quantize_input(config: Float8Config, x2: Any, input_scale: Any) -> tuple[Any, Any]:
    spec = config.input_scale
    if config.is_static:
        return ops.quantize_static_float8(x2, input_scale, False), _as_matrix(input_scale)
    ub = spec.activation_scale_ub if spec.activation_scale_ub is not None else float("inf")
    scales_dtype = spec.dtype if spec.dtype.is_float() and spec.dtype.size_in_bytes >= 2 else DType.float32
    if spec.is_tensor:
        flat = x2.reshape([1, -1])
        q, s = ops.quantize_dynamic_float8(flat, -1, ub, DType.float8_e4m3fn, scales_dtype)
        return q.reshape([-1, x2.shape[1]]), s
    group = spec.block_size[1] if spec.is_block else -1  # type: ignore[index]
    return ops.quantize_dynamic_float8(x2, group, ub, DType.float8_e4m3fn, scales_dtype)


def float8_matmul(layer: Any, x: Any, weight: Any, weight_scale: Any, input_scale: Any) -> Any:
    """``x @ dequant(weight).T`` with ``x`` quantized as the layer's float8 config says."""
    return scaled_linear(
        x, weight, weight_scale, input_scale, layer.float8_config, layer.in_dim, layer.out_dim, "Linear"
    )


def scaled_linear(
    x: Any,
    weight: Any,
    weight_scale: Any,
    input_scale: Any,
    config: Float8Config,
    in_dim: int,
    out_dim: int,
    owner: str,
) -> Any:
    """``x @ (weight * weight_scale).T`` for a float8 ``weight [out_dim, in_dim]``, ``x``
    quantized per ``config`` (statically with ``input_scale``, or dynamically)."""
    if not x.dtype.is_float():
        raise ValueError(f"{owner}: float8 layers take float inputs, got {x.dtype.name}{list(x.shape)}")
    if weight.dtype is not DType.float8_e4m3fn:
        raise ValueError(
            f"{owner}: a float8 layer multiplies float8_e4m3fn weights, but its weight is {weight.dtype.name}; build "
            "it with dtype=DType.float8_e4m3fn (quant_config keeps the dtype given)"
        )
    if x.shape[-1] != in_dim:
        raise ValueError(f"{owner}: input last dim {x.shape[-1]} must equal in_dim {in_dim}")
    lead = list(x.shape[:-1])
    xq, xs = _quantize_input(config, x.reshape([-1, in_dim]), input_scale)
    out = ops.scaled_matmul(xq, weight, xs, _as_matrix(weight_scale), x.dtype)
    return out.reshape([*lead, out_dim]) if len(lead) != 1 else out
