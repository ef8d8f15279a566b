"""float8 kernels of ``max.nn.kernels``: quantization, scaled matmuls, AMD FNUZ conversion.

Quantization scales follow ``lowering/ops/float8.py``: per tensor ``[1, 1]``,
per row ``[rows, 1]``, per block ``[ceil(rows / block_rows), ceil(cols /
block_cols)]``. The dynamic scaled matmuls (in ``_scaled_matmul``) take MAX's
scale layouts, described there.

Example:
    >>> from maxfx.nn import kernels
    >>> kernels.needs_fp8_fnuz_conversion()  # True only on AMD CDNA3 GPUs
    False
"""

from __future__ import annotations

from typing import Any

from lowering.devices import accelerators
from lowering.dtypes import DType
from maxfx.graph import ops
from maxfx.nn.float8_config import Float8InputScaleSpec, Float8WeightScaleSpec
from maxfx.nn.kernels._scaled_matmul import _specs

__all__ = [
    "quantize_static_scaled_float8",
    "quantize_dynamic_scaled_float8",
    "batched_quantize_dynamic_scaled_float8",
    "matmul_static_scaled_float8",
    "convert_weights_to_fp8_fnuz_if_needed",
    "needs_fp8_fnuz_conversion",
    "normalize_e4m3fn_to_e4m3fnuz",
]


def _rank(kernel: str, x: Any, name: str, rank: int) -> None:
    if x.rank != rank:
        raise ValueError(f"{kernel}: {name} must have rank {rank}, got {x.dtype.name}{list(x.shape)}")


def _group_size(input_scale_spec: Float8InputScaleSpec, group_size_or_per_token: int) -> int:
    if group_size_or_per_token == -1 and input_scale_spec.is_block:
        return input_scale_spec.block_size[1]  # type: ignore[index]
    return group_size_or_per_token


def _quantize_dynamic(
    kernel: str,
    rank: int,
    input: Any,
    input_scale_spec: Any,
    weight_scale_spec: Any,
    scale_ub: float,
    group_size_or_per_token: int,
    out_type: DType,
    scales_type: DType,
) -> tuple[Any, Any]:  # noqa: A002
    """The checks and op shared by the plain (rank 2) and batched (rank 3) dynamic quantizations."""
    _specs(kernel, input_scale_spec, weight_scale_spec)
    _rank(kernel, input, "input", rank)
    return ops.quantize_dynamic_float8(
        input, _group_size(input_scale_spec, group_size_or_per_token), scale_ub, out_type, scales_type
    )


def quantize_static_scaled_float8(
    x: Any, scale: Any, scale_is_inverted: bool = True, out_type: DType = DType.float8_e4m3fn
) -> Any:
    """``x`` quantized with one static scale: ``x * scale`` if ``scale_is_inverted`` else ``x / scale``.

    Example:
        >>> q = quantize_static_scaled_float8(x, scale)  # doctest: +SKIP
    """
    _rank("quantize_static_scaled_float8", x, "x", 2)
    return ops.quantize_static_float8(x, scale, scale_is_inverted, out_type)


def quantize_dynamic_scaled_float8(
    input: Any,  # noqa: A002 - MAX's name
    input_scale_spec: Float8InputScaleSpec,
    weight_scale_spec: Float8WeightScaleSpec,
    scale_ub: float = 1200.0,
    group_size_or_per_token: int = -1,
    out_type: DType = DType.float8_e4m3fn,
    scales_type: DType = DType.bfloat16,
) -> tuple[Any, Any]:
    """Dynamic float8 quantization of ``input [M, K]``: ``(q, scales [M, K / group])``.

    The group is ``group_size_or_per_token`` (-1: one scale per row/token, or
    the input spec's block width for BLOCK specs); ``scale = min(amax, scale_ub) / 448``.

    Example:
        >>> q, s = quantize_dynamic_scaled_float8(x, in_spec, w_spec)  # doctest: +SKIP
    """
    return _quantize_dynamic(
        "quantize_dynamic_scaled_float8",
        2,
        input,
        input_scale_spec,
        weight_scale_spec,
        scale_ub,
        group_size_or_per_token,
        out_type,
        scales_type,
    )


def batched_quantize_dynamic_scaled_float8(
    input: Any,  # noqa: A002 - MAX's name
    input_scale_spec: Float8InputScaleSpec,
    weight_scale_spec: Float8WeightScaleSpec,
    scale_ub: float = 1200.0,
    group_size_or_per_token: int = -1,
    out_type: DType = DType.float8_e4m3fn,
    scales_type: DType = DType.bfloat16,
) -> tuple[Any, Any]:
    """`quantize_dynamic_scaled_float8` over ``input [batch, seq, hidden]``; scales ``[batch, seq, hidden / group]``.

    Example:
        >>> q, s = batched_quantize_dynamic_scaled_float8(x3, in_spec, w_spec)  # doctest: +SKIP
    """
    return _quantize_dynamic(
        "batched_quantize_dynamic_scaled_float8",
        3,
        input,
        input_scale_spec,
        weight_scale_spec,
        scale_ub,
        group_size_or_per_token,
        out_type,
        scales_type,
    )


def _scalar(kernel: str, s: Any, name: str) -> Any:
    if any(int(d) != 1 for d in s.shape):
        raise ValueError(f"{kernel}: {name} must be a scalar (shape [] or [1]), got {s.dtype.name}{list(s.shape)}")
    return s.reshape([1, 1])


def matmul_static_scaled_float8(input: Any, weight: Any, input_scale: Any, weight_scale: Any) -> Any:  # noqa: A002
    """``(input * input_scale) @ (weight * weight_scale).T`` in bfloat16, with scalar scales.

    Example:
        >>> y = matmul_static_scaled_float8(xq, wq, x_scale, w_scale)  # doctest: +SKIP
    """
    kernel = "matmul_static_scaled_float8"
    _rank(kernel, input, "input", 2)
    _rank(kernel, weight, "weight", 2)
    for t, name in ((input, "input"), (weight, "weight")):
        if t.dtype is not DType.float8_e4m3fn:
            raise ValueError(f"{kernel}: {name} must be float8_e4m3fn, got {t.dtype.name}")
    return ops.scaled_matmul(
        input,
        weight,
        _scalar(kernel, input_scale, "input_scale"),
        _scalar(kernel, weight_scale, "weight_scale"),
        DType.bfloat16,
    )


def needs_fp8_fnuz_conversion() -> bool:
    """True when float8 weights must be E4M3FNUZ: running on an AMD (ROCm) GPU.

    Example:
        >>> needs_fp8_fnuz_conversion()  # doctest: +SKIP
        False
    """
    return any(d.platform == "rocm" or "gfx9" in str(getattr(d, "device_kind", "")) for d in accelerators())


def normalize_e4m3fn_to_e4m3fnuz(weight: Any, weight_scale: Any) -> tuple[Any, Any]:
    """E4M3FN weights as E4M3FNUZ with the scale doubled (same dequantized values).

    An E4M3FNUZ bit pattern means half the E4M3FN value and has no negative
    zero, so the converted weight holds ``w / 2`` (exact) and the scale ``2 * s``.

    Example:
        >>> w2, s2 = normalize_e4m3fn_to_e4m3fnuz(w, s)  # doctest: +SKIP
    """
    if weight.dtype is not DType.float8_e4m3fn:
        raise ValueError(f"normalize_e4m3fn_to_e4m3fnuz: weight must be float8_e4m3fn, got {weight.dtype.name}")
    halved = (weight.cast(DType.float32) * 0.5).cast(DType.float8_e4m3fnuz)
    return halved, weight_scale * 2.0


def convert_weights_to_fp8_fnuz_if_needed(weight: Any, weight_scale: Any) -> tuple[Any, Any]:
    """`normalize_e4m3fn_to_e4m3fnuz` on AMD GPUs, ``(weight, weight_scale)`` unchanged elsewhere.

    Example:
        >>> w, s = convert_weights_to_fp8_fnuz_if_needed(w, s)  # doctest: +SKIP
    """
    if needs_fp8_fnuz_conversion() and weight.dtype is DType.float8_e4m3fn:
        return normalize_e4m3fn_to_e4m3fnuz(weight, weight_scale)
    return weight, weight_scale
