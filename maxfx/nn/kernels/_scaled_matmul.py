"""The dynamic float8 scaled matmuls of ``max.nn.kernels``: plain, batched and grouped (MoE).

Each checks its arguments as MAX does (same error types and wording), brings
the scales from MAX's layouts to the registry's and runs ``ops.scaled_matmul``
/ ``ops.grouped_scaled_matmul_ragged`` (dequantize, then matmul in float32).

MAX's scale layouts (``a`` is ``[M, K]``, ``b`` transposed ``[N, K]``):

============================  =============================  =======================
specs (input / weight)         ``a_scales``                   ``b_scales``
============================  =============================  =======================
TENSOR / TENSOR                ``[1, 1]``                     ``[1, 1]``
COLWISE / ROWWISE              ``[1, M]`` (per token)         ``[N, 1]`` (per channel)
BLOCK / BLOCK                  ``[ceil(K / bk), M_padded]``   ``[ceil(N / bn), ceil(K / bk)]``
============================  =============================  =======================

Activation scales are K-major (transposed); MAX pads their token dim for its
TMA loads, and only the first ``M`` columns are read. maxfx also takes per-token
scales as ``[M, 1]`` (what ``quantize_dynamic_scaled_float8`` returns), and the
batched/grouped forms accept the per-token/per-channel specs as an extension
(MAX's GPU kernels there are blockwise only).

Example:
    >>> from maxfx.nn.kernels import _scaled_matmul
    >>> sorted(_scaled_matmul.__all__)
    ['batched_dynamic_scaled_fp8_matmul', 'dynamic_scaled_matmul', 'grouped_dynamic_scaled_fp8_matmul']
"""

from __future__ import annotations

from typing import Any

from lowering.dtypes import DType
from maxfx.graph import ops
from maxfx.nn.float8_config import Float8InputScaleSpec, Float8WeightScaleSpec

__all__ = ["dynamic_scaled_matmul", "batched_dynamic_scaled_fp8_matmul", "grouped_dynamic_scaled_fp8_matmul"]


def _specs(kernel: str, input_scale_spec: Any, weight_scale_spec: Any) -> None:
    if not isinstance(input_scale_spec, Float8InputScaleSpec):
        raise TypeError(
            f"{kernel}: input_scale_spec must be a Float8InputScaleSpec, got {type(input_scale_spec).__name__}"
        )
    if not isinstance(weight_scale_spec, Float8WeightScaleSpec):
        raise TypeError(
            f"{kernel}: weight_scale_spec must be a Float8WeightScaleSpec, got {type(weight_scale_spec).__name__}"
        )


def _swap_last(x: Any) -> Any:
    return x.transpose(-1, -2)


def _token_scales(kernel: str, s: Any, m: Any) -> Any:
    """Per-token activation scales ``[..., 1, M]`` (MAX) or ``[..., M, 1]`` / ``[..., 1, 1]`` as ``[..., M or 1,
    1]``.
    """
    rows, cols = s.shape[-2], s.shape[-1]
    if cols == 1 and (rows == m or rows == 1):
        return s
    if rows == 1 and cols == m:
        return _swap_last(s)
    raise ValueError(
        f"{kernel}: only per-token scaling is supported for a: a_scales must be [1, M={m}] (or [M, 1]), got "
        f"{list(s.shape)}"
    )


def _k_major_block_scales(kernel: str, s: Any, m: Any, k: Any, block_k: int) -> Any:
    """MAX's K-major activation block scales ``[..., ceil(K / bk), M_padded]`` as ``[..., M, ceil(K / bk)]``."""
    k_blocks = -(-int(k) // block_k)
    if int(s.shape[-2]) != k_blocks:
        raise ValueError(
            f"{kernel}: a_scales must be [ceil(K / {block_k}) = {k_blocks}, M (padded)] for K = {k}, got "
            f"{list(s.shape)}"
        )
    t = _swap_last(s)
    if t.shape[-2] == m:
        return t
    if int(t.shape[-2]) < int(m):
        raise ValueError(
            f"{kernel}: a_scales covers {t.shape[-2]} rows, fewer than the {m} rows of a: got {list(s.shape)}"
        )
    return t[..., : int(m), :]


def _block_sizes(
    kernel: str, input_scale_spec: Float8InputScaleSpec, weight_scale_spec: Float8WeightScaleSpec
) -> tuple[int, int, int]:
    """``(bm, bn, bk)`` of two BLOCK specs."""
    if input_scale_spec.block_size is None or weight_scale_spec.block_size is None:
        raise ValueError(f"{kernel}: both input and weight block size must be set for blockwise scaling")
    if not (input_scale_spec.is_block and weight_scale_spec.is_block):
        raise ValueError(f"{kernel}: both input and weight must be blockwise scaled for blockwise scaling")
    bm, bk_in = (int(v) for v in input_scale_spec.block_size)
    bn, bk = (int(v) for v in weight_scale_spec.block_size)
    if bk_in != bk:
        raise ValueError(f"{kernel}: input and weight blocks must span the same K ({bk_in} vs {bk})")
    return bm, bn, bk


def _scales_for_specs(
    kernel: str,
    a: Any,
    a_scales: Any,
    b_scales: Any,
    input_scale_spec: Float8InputScaleSpec,
    weight_scale_spec: Float8WeightScaleSpec,
) -> tuple[Any, Any]:
    """``(a_scales, b_scales)`` in the registry's layout (rows of ``a`` / of ``b`` first), checked against the specs."""
    m, k = a.shape[-2], a.shape[-1]
    if input_scale_spec.is_tensor and weight_scale_spec.is_tensor:
        if any(s.shape[-2] != 1 or s.shape[-1] != 1 for s in (a_scales, b_scales)):
            raise ValueError(
                f"{kernel}: scaler tensors must be of shape [1, 1] for tensor scaling, got {list(a_scales.shape)} and "
                f"{list(b_scales.shape)}"
            )
        return a_scales, b_scales
    if input_scale_spec.is_colwise and weight_scale_spec.is_rowwise:
        if b_scales.shape[-1] != 1:
            raise ValueError(
                f"{kernel}: only channel-wise scaling is supported for b: b_scales must be [N, 1], got "
                f"{list(b_scales.shape)}"
            )
        return _token_scales(kernel, a_scales, m), b_scales
    if input_scale_spec.is_block or weight_scale_spec.is_block:
        bm, _, bk = _block_sizes(kernel, input_scale_spec, weight_scale_spec)
        if a_scales.dtype is not DType.float32 or b_scales.dtype is not DType.float32:
            raise TypeError(
                f"{kernel}: a_scales and b_scales dtypes must be float32, but got {a_scales.dtype}, {b_scales.dtype}"
            )
        if a_scales.shape[-2] != b_scales.shape[-1]:
            raise ValueError(
                f"{kernel}: both a_scales and b_scales must have the same shape on the K dimension. got "
                f"a_scales.shape={list(a_scales.shape)} and b_scales.shape={list(b_scales.shape)}"
            )
        rows = m if bm == 1 else -(-int(m) // bm)
        return _k_major_block_scales(kernel, a_scales, rows, k, bk), b_scales
    raise ValueError(
        f"{kernel}: unsupported FP8 scaling granularity (input {input_scale_spec.granularity}, weight "
        f"{weight_scale_spec.granularity})"
    )


def dynamic_scaled_matmul(
    a: Any,
    b: Any,
    a_scales: Any,
    b_scales: Any,
    input_scale_spec: Float8InputScaleSpec,
    weight_scale_spec: Float8WeightScaleSpec,
    out_type: DType = DType.bfloat16,
) -> Any:
    """``(a * a_scales) @ (b * b_scales).T`` for float8 ``a [M, K]`` and transposed ``b [N, K]`` (scale layouts: module
    notes).

    Raises:
        TypeError: the specs are not float8 specs, or ``a``/``b`` (or their scales) differ in dtype.
        ValueError: ranks, K or scale shapes do not fit the specs.

    Example:
        >>> y = dynamic_scaled_matmul(xq, wq, x_scales_1xM, w_scales_Nx1, colwise_in, rowwise_w)  # doctest: +SKIP
    """
    kernel = "dynamic_scaled_matmul"
    _specs(kernel, input_scale_spec, weight_scale_spec)
    if any(t.rank != 2 for t in (a, b, a_scales, b_scales)):
        raise ValueError(
            f"{kernel}: All arguments must be rank 2 tensors, got a {list(a.shape)}, b {list(b.shape)}, a_scales "
            f"{list(a_scales.shape)}, b_scales {list(b_scales.shape)}"
        )
    if a.shape[1] != b.shape[1]:
        raise ValueError(
            f"{kernel}: The second dimension of b must match the second dimension of a: a {list(a.shape)}, b "
            f"{list(b.shape)}"
        )
    if a.dtype != b.dtype or a_scales.dtype != b_scales.dtype:
        raise TypeError(
            f"{kernel}: a and b dtypes {a.dtype}, {b.dtype} must match, as do a and b scales dtypes {a_scales.dtype}, "
            f"{b_scales.dtype}"
        )
    sa, sb = _scales_for_specs(kernel, a, a_scales, b_scales, input_scale_spec, weight_scale_spec)
    return ops.scaled_matmul(a, b, sa, sb, out_type)


def batched_dynamic_scaled_fp8_matmul(
    a: Any,
    b: Any,
    a_scales: Any,
    b_scales: Any,
    input_scale_spec: Float8InputScaleSpec,
    weight_scale_spec: Float8WeightScaleSpec,
    out_type: DType = DType.bfloat16,
) -> Any:
    """`dynamic_scaled_matmul` per batch: ``a [B, M, K]``, ``b [B, N, K]``, float32 scales of rank 3 (``[B, ...]``).

    Example:
        >>> y = batched_dynamic_scaled_fp8_matmul(aq, bq, as_, bs, block_in, block_w)  # doctest: +SKIP
    """
    kernel = "batched_dynamic_scaled_fp8_matmul"
    _specs(kernel, input_scale_spec, weight_scale_spec)
    if a.dtype != b.dtype:
        raise TypeError(f"{kernel}: a and b dtypes must match, but got {a.dtype}, {b.dtype}")
    if a_scales.dtype != b_scales.dtype or a_scales.dtype != DType.float32:
        raise TypeError(
            f"{kernel}: a_scales and b_scales dtypes must be float32, but got {a_scales.dtype}, {b_scales.dtype}"
        )
    if a.rank != 3 or b.rank != 3:
        raise ValueError(f"{kernel}: A and B must be rank 3 tensors, got {list(a.shape)} and {list(b.shape)}")
    if a_scales.rank != 3 or b_scales.rank != 3:
        raise ValueError(
            f"{kernel}: A_scales and B_scales must be rank 3 tensors, got {list(a_scales.shape)} and "
            f"{list(b_scales.shape)}"
        )
    if a.shape[0] != b.shape[0] or a_scales.shape[0] != a.shape[0] or b_scales.shape[0] != a.shape[0]:
        raise ValueError(
            f"{kernel}: The batch dimension of b (and of both scales) must match the batch dimension of a: a "
            f"{list(a.shape)}, b {list(b.shape)}"
        )
    if a.shape[2] != b.shape[2]:
        raise ValueError(f"{kernel}: A and B K dimension does not match: a {list(a.shape)}, b {list(b.shape)}")
    if a.dtype != DType.float8_e4m3fn:
        raise TypeError(f"{kernel}: a and b dtypes must be float8_e4m3fn, but got {a.dtype}, {b.dtype}")
    sa, sb = _scales_for_specs(kernel, a, a_scales, b_scales, input_scale_spec, weight_scale_spec)
    return ops.scaled_matmul(a, b, sa, sb, out_type)


def _full_starts(kernel: str, starts: Any, n_groups: int) -> Any:
    """``expert_start_indices`` with one entry per group boundary.

    MAX sizes it ``[num_experts + 1]`` as an upper bound and its kernel reads the
    first ``active + 1`` entries; a shorter vector describes fewer groups, so the
    missing boundaries repeat the last one (those groups are empty).
    """
    have = int(starts.shape[0])
    if have == 0:
        raise ValueError(f"{kernel}: expert_start_indices must have at least one entry")
    if have >= n_groups + 1:
        return starts
    pad = ops.broadcast_to(starts[have - 1 : have], [n_groups + 1 - have])
    return ops.concat([starts, pad], axis=0)


def grouped_dynamic_scaled_fp8_matmul(
    hidden_states: Any,
    weight: Any,
    a_scales: Any,
    b_scales: Any,
    expert_start_indices: Any,
    expert_ids: Any,
    expert_usage_stats_host: Any,
    input_scale_spec: Float8InputScaleSpec,
    weight_scale_spec: Float8WeightScaleSpec,
    out_type: DType = DType.bfloat16,
    tokens_padded_per_expert: bool = False,
) -> Any:
    """MoE grouped matmul over float8 tokens ``[T, K]`` and experts ``[E, N, K]``.

    Rows ``[starts[i], starts[i+1])`` use expert ``expert_ids[i]``; block scales are
    ``a_scales [ceil(K / bk), T_padded]`` and ``b_scales [E, ceil(N / bn), ceil(K / bk)]``.
    ``tokens_padded_per_expert`` is a GPU-kernel alignment promise with no effect here.

    Example:
        >>> y = grouped_dynamic_scaled_fp8_matmul(hq, wq, hs, ws, starts, ids, stats, block_in,
        ...     block_w)  # doctest: +SKIP
    """
    kernel = "grouped_dynamic_scaled_fp8_matmul"
    _specs(kernel, input_scale_spec, weight_scale_spec)
    if weight.rank != 3:
        raise ValueError(f"{kernel}: expected weight of rank 3 but got {weight.rank}")
    if hidden_states.rank != 2:
        raise ValueError(f"{kernel}: expected hidden_states of rank 2 but got {hidden_states.rank}")
    if expert_ids.rank != 1 or expert_start_indices.rank != 1:
        raise ValueError(
            f"{kernel}: expected expert_ids and expert_start_indices of rank 1 but got {expert_ids.rank} and "
            f"{expert_start_indices.rank}"
        )
    if weight.shape[2] != hidden_states.shape[1] or weight.shape[0] != expert_ids.shape[0]:
        raise ValueError(
            f"{kernel}: expected weight is of shape [num_experts={expert_ids.shape[0]}, *, {hidden_states.shape[1]}] "
            f"but got {list(weight.shape)}"
        )
    if hidden_states.dtype != weight.dtype or hidden_states.dtype != DType.float8_e4m3fn:
        raise TypeError(
            f"{kernel}: hidden_states and weight dtypes must be float8_e4m3fn, but got {hidden_states.dtype}, "
            f"{weight.dtype}"
        )
    if a_scales.dtype != b_scales.dtype or a_scales.dtype not in (DType.float32, DType.bfloat16):
        raise TypeError(
            f"{kernel}: a_scales and b_scales dtypes must be float32 or bfloat16 and match, but got {a_scales.dtype}, "
            f"{b_scales.dtype}"
        )
    if expert_ids.dtype not in (DType.int32, DType.uint32):
        raise TypeError(f"{kernel}: expert_ids dtype must be int32 (or uint32), but got {expert_ids.dtype}")
    if expert_start_indices.dtype != DType.uint32:
        raise TypeError(f"{kernel}: expert_start_indices dtype must be uint32, but got {expert_start_indices.dtype}")
    if a_scales.rank != 2 or b_scales.rank != 3:
        raise ValueError(
            f"{kernel}: expected a_scales of rank 2 and b_scales of rank 3 but got {a_scales.rank} and {b_scales.rank}"
        )
    if input_scale_spec.is_block or weight_scale_spec.is_block:
        _, _, bk = _block_sizes(kernel, input_scale_spec, weight_scale_spec)
        sa = _k_major_block_scales(kernel, a_scales, hidden_states.shape[0], hidden_states.shape[1], bk)
    elif input_scale_spec.is_colwise and weight_scale_spec.is_rowwise:
        sa = _token_scales(kernel, a_scales, hidden_states.shape[0])
    else:
        raise ValueError(
            f"{kernel}: grouped FP8 matmul supports blockwise (or per-token / per-channel) scaling, got input "
            f"{input_scale_spec.granularity}, weight {weight_scale_spec.granularity}"
        )
    starts = _full_starts(kernel, expert_start_indices, int(expert_ids.shape[0]))
    return ops.grouped_scaled_matmul_ragged(
        hidden_states, weight, sa, b_scales, starts, expert_ids, expert_usage_stats_host, out_type
    )
