"""Quantized projections that write the paged KV cache: float8, NVFP4 and MXFP8 fused QKV, float8 K.

Each checks its arguments as MAX does (dtype, rank, device, and ``layer_idx``
as a host uint32 scalar), dequantizes through the float8 / block-scaled
kernels, and hands the bfloat16 product to the same tail as
`fused_qkv_ragged_matmul`: K and V rows go to the cache, Q is returned.

Example:
    >>> from maxfx.nn import kernels
    >>> kernels._fused_qkv_ragged_matmul_scaled_float8 is kernels.fused_qkv_ragged_matmul_scaled_float8
    True
"""

from __future__ import annotations

from typing import Any

from lowering.dtypes import DType
from maxfx.graph import ops
from maxfx.nn.float8_config import (
    Float8InputScaleSpec,
    Float8ScaleGranularity,
    Float8ScaleOrigin,
    Float8WeightScaleSpec,
)
from maxfx.nn.kernels._attention import _collection, _index, _params, _qkv_to_cache, _write_kv
from maxfx.nn.kernels._block_scaled import _dequantize, _sf_size, _tensor_sf, check_layer_idx_on_cpu, check_same_device
from maxfx.nn.kernels._scaled_matmul import _scales_for_specs

__all__ = [
    "fused_qkv_ragged_matmul_scaled_float8",
    "fused_qkv_ragged_matmul_scaled_float4",
    "fused_qkv_ragged_matmul_scaled_mxfp8",
    "matmul_k_cache_ragged_scaled_float8",
]


def _check_ragged(
    where: str,
    input: Any,
    input_row_offsets: Any,
    layer_idx: Any,
    weight: Any,
    names: tuple[str, str] = ("input", "wqkv"),
) -> None:  # noqa: A002
    """MAX's common checks: same dtype, rank-2 input, uint32 row offsets and layer index."""
    x, w = names
    if input.dtype != weight.dtype:
        raise ValueError(
            f"{where}: expected {x} and {w} to have the same dtype, but got {input.dtype} and {weight.dtype}, "
            "respectively."
        )
    if input.rank != 2:
        raise ValueError(f"{where}: expected {x} to have rank 2, was {input.rank}")
    if input_row_offsets.dtype != DType.uint32:
        raise ValueError(f"{where}: expected input_row_offsets to have dtype uint32, was {input_row_offsets.dtype}")
    if layer_idx.dtype != DType.uint32:
        raise ValueError(f"{where}: expected layer_idx to have dtype uint32, was {layer_idx.dtype}")


def _matrix_scale(s: Any) -> Any:
    """A per-tensor scale given as ``[]`` or ``[1]`` viewed as ``[1, 1]``."""
    return s.reshape([1, 1]) if s.rank < 2 and all(int(d) == 1 for d in s.shape) else s


def _inferred_specs(
    where: str, input_scale: Any, weight_scale: Any
) -> tuple[Float8InputScaleSpec, Float8WeightScaleSpec]:
    """MAX's inference without a float8 config: ``[1, 1]`` scales are per tensor, ``[1, M]`` x ``[N, 1]`` per
    token/channel.
    """
    if input_scale.rank == 2 and weight_scale.rank == 2:
        if all(int(d) == 1 for d in (*input_scale.shape, *weight_scale.shape)):
            return Float8InputScaleSpec(
                Float8ScaleGranularity.TENSOR, Float8ScaleOrigin.STATIC, input_scale.dtype
            ), Float8WeightScaleSpec(Float8ScaleGranularity.TENSOR, weight_scale.dtype)
        if int(input_scale.shape[0]) == 1 and int(weight_scale.shape[1]) == 1:
            return Float8InputScaleSpec(
                Float8ScaleGranularity.COLWISE, Float8ScaleOrigin.DYNAMIC, input_scale.dtype
            ), Float8WeightScaleSpec(Float8ScaleGranularity.ROWWISE, weight_scale.dtype)
    raise ValueError(
        f"{where}: Can not infer the quantization config from the input tensor shapes {list(input_scale.shape)} and "
        f"{list(weight_scale.shape)}; please provide a float8_config"
    )


def fused_qkv_ragged_matmul_scaled_float8(
    kv_params: Any,
    input: Any,
    input_row_offsets: Any,
    wqkv: Any,
    kv_collection: Any,
    layer_idx: Any,
    n_heads: int,  # noqa: A002
    input_scale: Any,
    weight_scale: Any,
    bias: Any = None,
    float8_config: Any = None,
    _output_dim: int | None = None,
) -> Any:
    """`fused_qkv_ragged_matmul` for float8 ``input [M, K]`` and ``wqkv [(n_heads + 2 * n_kv_heads) * head_dim, K]``.

    Scales as MAX takes them: per tensor (``[]``, ``[1]`` or ``[1, 1]``), per token ``[1, M]`` with per
    channel ``[N, 1]``, or as ``float8_config``'s specs say (see `dynamic_scaled_matmul`).
    The product is bfloat16; K/V rows go to the cache, Q ``[M, n_heads * head_dim]`` is returned.

    Raises:
        ValueError: on dtypes, ranks or devices that are invalid for the kernel.

    Example:
        >>> xq = fused_qkv_ragged_matmul_scaled_float8(kv_params, xq8, offsets, wqkv8, kv, layer_idx, 32, x_scale,
        ...     w_scale)  # doctest: +SKIP
    """
    where = "fused_qkv_ragged_matmul_scaled_float8"
    _check_ragged(where, input, input_row_offsets, layer_idx, wqkv)
    named = [
        (wqkv, "wqkv"),
        (input_row_offsets, "input_row_offsets"),
        (input_scale, "input_scale"),
        (weight_scale, "weight_scale"),
    ]
    check_same_device(where, input, named + ([(bias, "bias")] if bias is not None else []))
    check_layer_idx_on_cpu(where, layer_idx)
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    sa, sb = _matrix_scale(input_scale), _matrix_scale(weight_scale)
    if float8_config is not None:
        in_spec, w_spec = float8_config.input_scale, float8_config.weight_scale
    else:
        in_spec, w_spec = _inferred_specs(where, sa, sb)
    sa, sb = _scales_for_specs(where, input, sa, sb, in_spec, w_spec)
    qkv = ops.scaled_matmul(input, wqkv, sa, sb, DType.bfloat16)
    bias = bias.cast(DType.bfloat16) if bias is not None else None
    return _qkv_tail(where, p, kv, qkv, bias, n_heads, layer_idx, input_row_offsets, _output_dim)


def _qkv_tail(
    where: str, p: Any, kv: Any, qkv: Any, bias: Any, n_heads: int, layer_idx: Any, offsets: Any, output_dim: int | None
) -> Any:
    q = _qkv_to_cache(where, p, kv, qkv, bias, n_heads, _index(layer_idx, qkv.device), offsets)
    if output_dim is not None and int(output_dim) != int(q.shape[1]):
        raise ValueError(
            f"{where}: _output_dim {output_dim} differs from the Q width n_heads * head_dim = {q.shape[1]}"
        )
    return q


def fused_qkv_ragged_matmul_scaled_float4(
    kv_params: Any,
    input: Any,
    input_row_offsets: Any,
    wqkv: Any,
    kv_collection: Any,
    layer_idx: Any,
    n_heads: int,  # noqa: A002
    input_scale: Any,
    weight_scale: Any,
    tensor_sf: Any,
    kv_scales: Any = None,
    sf_vector_size: int = 16,
    _output_dim: int | None = None,
) -> Any:
    """`fused_qkv_ragged_matmul` for NVFP4: packed uint8 ``input [M, K/2]`` and ``wqkv [N, K/2]`` with float8_e4m3fn
    block scales.

    The product is ``deq(input) @ deq(wqkv).T * tensor_sf`` in bfloat16 (``tensor_sf`` =
    ``input_scale * weight_scale_2``, non-inverted). ``kv_scales`` belongs to MAX's NVFP4
    KV cache; maxfx caches store plain values and do not read it.

    Example:
        >>> xq = fused_qkv_ragged_matmul_scaled_float4(kv_params, x4, offsets, w4, kv, layer_idx, 32, xs, ws,
        ...     alpha)  # doctest: +SKIP
    """
    where = "fused_qkv_ragged_matmul_scaled_float4"
    _check_ragged(where, input, input_row_offsets, layer_idx, wqkv)
    check_same_device(
        where,
        input,
        [
            (wqkv, "wqkv"),
            (input_row_offsets, "input_row_offsets"),
            (input_scale, "input_scale"),
            (weight_scale, "weight_scale"),
        ],
    )
    check_layer_idx_on_cpu(where, layer_idx)
    if input.dtype != DType.uint8:
        raise ValueError(f"{where}: expected input to be uint8 (packed fp4-e2m1fn pairs), was {input.dtype}")
    if not isinstance(tensor_sf, (int, float)) and not hasattr(tensor_sf, "dtype"):
        raise ValueError(f"{where}: tensor_sf must be either float or a float32 CPU tensor of rank 0.")
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    sf = _sf_size(where, input_scale.dtype, sf_vector_size)
    qkv = _dequantize(where, "input", input, input_scale, sf) @ _dequantize(where, "wqkv", wqkv, weight_scale, sf).T
    qkv = (qkv * _tensor_sf(tensor_sf, input.device)).cast(DType.bfloat16)
    return _qkv_tail(where, p, kv, qkv, None, n_heads, layer_idx, input_row_offsets, _output_dim)


def fused_qkv_ragged_matmul_scaled_mxfp8(
    kv_params: Any,
    input: Any,
    input_row_offsets: Any,
    wqkv: Any,
    kv_collection: Any,
    layer_idx: Any,
    n_heads: int,  # noqa: A002
    input_scale: Any,
    weight_scale: Any,
    bias: Any = None,
    _output_dim: int | None = None,
) -> Any:
    """`fused_qkv_ragged_matmul` for MXFP8: float8_e4m3fn ``input [M, K]`` and ``wqkv [N, K]`` with float8_e8m0fnu
    scales per 32.

    Scales are ``[rows, K / 32]`` or interleaved 5-D (`block_scales_interleave`).

    Example:
        >>> xq = fused_qkv_ragged_matmul_scaled_mxfp8(kv_params, x8, offsets, w8, kv, layer_idx, 32, xs,
        ...     ws)  # doctest: +SKIP
    """
    where = "fused_qkv_ragged_matmul_scaled_mxfp8"
    named = [
        (wqkv, "wqkv"),
        (input_row_offsets, "input_row_offsets"),
        (input_scale, "input_scale"),
        (weight_scale, "weight_scale"),
    ]
    check_same_device(where, input, named + ([(bias, "bias")] if bias is not None else []))
    _check_ragged(where, input, input_row_offsets, layer_idx, wqkv)
    check_layer_idx_on_cpu(where, layer_idx)
    if input.dtype != DType.float8_e4m3fn:
        raise ValueError(f"{where}: expected input and wqkv to be float8_e4m3fn, was {input.dtype}")
    for s, name in ((input_scale, "input_scale"), (weight_scale, "weight_scale")):
        if s.dtype != DType.float8_e8m0fnu:
            raise TypeError(f"{where}: expected {name} to be float8_e8m0fnu, was {s.dtype}")
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    qkv = (
        _dequantize(where, "input", input, input_scale, 32) @ _dequantize(where, "wqkv", wqkv, weight_scale, 32).T
    ).cast(DType.bfloat16)
    bias = bias.cast(DType.bfloat16) if bias is not None else None
    return _qkv_tail(where, p, kv, qkv, bias, n_heads, layer_idx, input_row_offsets, _output_dim)


def matmul_k_cache_ragged_scaled_float8(
    kv_params: Any,
    hidden_states: Any,
    input_row_offsets: Any,
    weight: Any,
    input_scale: Any,
    weight_scale: Any,
    kv_collection: Any,
    scales_granularity_mnk: Any,
    layer_idx: Any,
) -> None:
    """`matmul_k_cache_ragged` for float8 inputs with block scales: ``hidden_states [M, K] @ weight [N, K].T`` → K rows.

    ``scales_granularity_mnk`` = ``(bm, bn, bk)``; ``input_scale`` is K-major
    ``[ceil(K / bk), ceil(M / bm)]`` and ``weight_scale`` ``[ceil(N / bn), ceil(K / bk)]`` (MAX's layouts).

    Raises:
        ValueError: on dtypes, ranks or scale shapes that are invalid for the kernel.

    Example:
        >>> matmul_k_cache_ragged_scaled_float8(kv_params, h8, offsets, wk8, hs, ws, kv, (1, 128, 128),
        ...     layer_idx)  # doctest: +SKIP
    """
    where = "matmul_k_cache_ragged_scaled_float8"
    _check_ragged(where, hidden_states, input_row_offsets, layer_idx, weight, ("hidden_states", "weight"))
    p, kv = _params(where, kv_params), _collection(where, kv_collection)
    bm, bn, bk = (int(v) for v in scales_granularity_mnk)
    in_spec = Float8InputScaleSpec(
        Float8ScaleGranularity.BLOCK, Float8ScaleOrigin.DYNAMIC, input_scale.dtype, block_size=(bm, bk)
    )
    w_spec = Float8WeightScaleSpec(Float8ScaleGranularity.BLOCK, weight_scale.dtype, block_size=(bn, bk))
    sa, sb = _scales_for_specs(where, hidden_states, input_scale, weight_scale, in_spec, w_spec)
    out = ops.scaled_matmul(hidden_states, weight, sa, sb, DType.bfloat16)
    _write_kv(where, p, kv, out, None, _index(layer_idx, hidden_states.device), input_row_offsets)
