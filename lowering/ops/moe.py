"""Mixture-of-experts ops: grouped (ragged) matmuls, plain and float8-scaled, and the routing indices.

Ragged groups (``expert_start_indices``) are prefix sums starting at row 0;
rows after the last group produce zeros. Scales follow `lowering.ops.float8`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering.context import bind
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.ops.float8 import check_scales, dequant_scaled
from lowering.registry import OpDef, OpError, front, register
from lowering.types import TensorType

__all__ = ["grouped_matmul_ragged", "grouped_scaled_matmul_ragged", "moe_create_indices"]

_EMPTY_EXPERT = np.uint32(0xFFFFFFFF)  # expert_ids padding: "no expert in this slot"


# ─── grouped (MoE) matmul ─────────────────────────────────────────────────


def _grouped_rule_common(op: str, h: Any, w: Any, starts: Any, ids: Any, stats: Any) -> tuple[TensorType, TensorType]:
    h = R.require_tensor(op, h, "hidden_states", rank=2)
    w = R.require_tensor(op, w, "weight", rank=3)
    starts = R.require_tensor(op, starts, "expert_start_indices", rank=1, kind=R.INT)
    ids = R.require_tensor(op, ids, "expert_ids", rank=1, kind=R.INT)
    stats = R.require_tensor(op, stats, "expert_usage_stats", rank=1, kind=R.INT)
    shapes = (
        f"hidden_states {R.fmt(h)}, weight {R.fmt(w)}, expert_ids {R.fmt(ids)}, expert_start_indices {R.fmt(starts)}"
    )
    if w.shape[2] != h.shape[1]:
        raise OpError(f"{op}: weight must be [num_experts, N, {h.shape[1]}] (transposed per expert): {shapes}")
    if starts.shape[0] != ids.shape[0] + 1:
        raise OpError(f"{op}: expert_start_indices must have one more entry than expert_ids: {shapes}")
    if stats.shape[0] != 2:
        raise OpError(
            f"{op}: expert_usage_stats must be [2] (max tokens per expert, active experts), got {R.fmt(stats)}"
        )
    return h, w


def _grouped_rule(h, w, starts, ids, stats) -> TensorType:
    op = "grouped_matmul_ragged"
    h, w = _grouped_rule_common(op, h, w, starts, ids, stats)
    if not h.dtype.is_float() or w.dtype is not h.dtype:
        raise OpError(f"{op}: hidden_states and weight must share a float dtype, got {R.fmt(h)} and {R.fmt(w)}")
    return TensorType(h.dtype, [h.shape[0], w.shape[1]], R.input_device(h, w))


def _group_sizes(starts, ids, stats, rows: int):
    starts = jnp.clip(starts.astype(jnp.int32), 0, rows)
    sizes = starts[1:] - starts[:-1]
    active = jnp.arange(ids.shape[0]) < stats[1].astype(jnp.int32)
    return jnp.where(active, sizes, 0)


def ragged_matmul(h, w_per_group, sizes):
    """Rows of ``h`` in consecutive groups times each group's ``[N, K]`` matrix; float32 result."""
    rhs = jnp.swapaxes(w_per_group, 1, 2).astype(jnp.float32)
    return lax.ragged_dot(h.astype(jnp.float32), rhs, sizes, precision=lax.Precision.HIGHEST)


def _grouped_impl(h, w, starts, ids, stats):
    safe = jnp.clip(ids.astype(jnp.int64), 0, w.shape[0] - 1)
    return ragged_matmul(h, w[safe], _group_sizes(starts, ids, stats, h.shape[0])).astype(h.dtype)


# MAX reads the usage stats on the host (``expert_usage_stats_host``): they may stay on the CPU.
grouped_matmul_ragged_p = register(
    OpDef("grouped_matmul_ragged", rule=_grouped_rule, impl=_grouped_impl, differentiable=False, host_inputs=(4,))
)


@front(grouped_matmul_ragged_p)
def grouped_matmul_ragged(hidden_states, weight, expert_start_indices, expert_ids, expert_usage_stats):
    """Rows ``[starts[i], starts[i+1])`` of ``hidden_states`` times ``weight[expert_ids[i]].T``.

    Only the first ``expert_usage_stats[1]`` groups are active; other rows give zeros.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> h = Tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])  # rows grouped by expert
        >>> w = Tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]]])  # [experts=3, N=1, K=2]
        >>> starts = Tensor(np.array([0, 2, 4], np.uint32))  # rows 0-1, then rows 2-3
        >>> ids = Tensor(np.array([2, 0], np.uint32))  # their experts
        >>> stats = Tensor(np.array([2, 2], np.uint32))  # [max rows per expert, active experts]
        >>> ops.grouped_matmul_ragged(h, w, starts, ids, stats)
        TensorType(dtype=float32, shape=[Dim(4), Dim(1)], device=cpu:0): [3.0, 7.0, 5.0, 7.0]
    """
    return bind(grouped_matmul_ragged_p, hidden_states, weight, expert_start_indices, expert_ids, expert_usage_stats)


def _grouped_scaled_rule(h, w, a_scales, b_scales, starts, ids, stats, *, out_dtype: DType) -> TensorType:
    op = "grouped_dynamic_scaled_fp8_matmul"
    h, w = _grouped_rule_common(op, h, w, starts, ids, stats)
    for t, name in ((h, "hidden_states"), (w, "weight")):
        R.require_tensor(op, t, name, kind=R.FLOAT8)
    if h.dtype is not w.dtype:
        raise OpError(f"{op}: hidden_states and weight must share a float8 dtype, got {R.fmt(h)} and {R.fmt(w)}")
    check_scales(op, h, R.require_tensor(op, a_scales, "a_scales", kind=R.FLOAT), "hidden_states", "a_scales")
    check_scales(op, w, R.require_tensor(op, b_scales, "b_scales", kind=R.FLOAT), "weight", "b_scales")
    return TensorType(out_dtype, [h.shape[0], w.shape[1]], R.input_device(h, w))


def _grouped_scaled_impl(h, w, a_scales, b_scales, starts, ids, stats, *, out_dtype: DType):
    safe = jnp.clip(ids.astype(jnp.int64), 0, w.shape[0] - 1)
    out = ragged_matmul(
        dequant_scaled(h, a_scales), dequant_scaled(w, b_scales)[safe], _group_sizes(starts, ids, stats, h.shape[0])
    )
    return out.astype(out_dtype.to_numpy())


grouped_scaled_matmul_ragged_p = register(
    OpDef(
        "grouped_scaled_matmul_ragged",
        rule=_grouped_scaled_rule,
        impl=_grouped_scaled_impl,
        differentiable=False,
        host_inputs=(6,),
    )
)


@front(grouped_scaled_matmul_ragged_p)
def grouped_scaled_matmul_ragged(
    hidden_states,
    weight,
    a_scales,
    b_scales,
    expert_start_indices,
    expert_ids,
    expert_usage_stats,
    out_dtype=DType.bfloat16,
):
    """`grouped_matmul_ragged` over float8 operands dequantized by their scales.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> f8 = DType.float8_e4m3fn
        >>> h = ops.cast(Tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]), f8)
        >>> w = ops.cast(Tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]]]), f8)
        >>> h_scales = Tensor([[1.0], [1.0], [2.0], [2.0]])  # per row
        >>> w_scales = Tensor(np.ones((3, 1, 1), np.float32))  # per expert
        >>> starts = Tensor(np.array([0, 2, 4], np.uint32))
        >>> ids = Tensor(np.array([2, 0], np.uint32))
        >>> stats = Tensor(np.array([2, 2], np.uint32))
        >>> ops.grouped_scaled_matmul_ragged(h, w, h_scales, w_scales, starts, ids, stats, out_dtype=DType.float32)
        TensorType(dtype=float32, shape=[Dim(4), Dim(1)], device=cpu:0): [3.0, 7.0, 10.0, 14.0]
    """
    return bind(
        grouped_scaled_matmul_ragged_p,
        hidden_states,
        weight,
        a_scales,
        b_scales,
        expert_start_indices,
        expert_ids,
        expert_usage_stats,
        out_dtype=DType(out_dtype),
    )


# ─── MoE routing indices ──────────────────────────────────────────────────


def _moe_indices_rule(topk_ids, *, num_experts: int):
    op = "moe_create_indices"
    t = R.require_tensor(op, topk_ids, "topk_ids", rank=1, kind=R.INT)
    if num_experts <= 0:
        raise OpError(f"{op}: num_local_experts must be positive, got {num_experts}")
    u32 = lambda shape: TensorType(DType.uint32, shape, t.device)  # noqa: E731
    return u32([t.shape[0]]), u32([num_experts + 1]), u32([t.shape[0]]), u32([num_experts]), u32([2])


def _moe_indices_impl(topk_ids, *, num_experts: int):
    ids = jnp.minimum(topk_ids.astype(jnp.int64), num_experts)  # non-local experts sort last
    n = ids.shape[0]
    order = jnp.argsort(ids, stable=True)
    restore = jnp.zeros(n, jnp.int64).at[order].set(jnp.arange(n))
    counts = jnp.bincount(ids, length=num_experts + 1)[:num_experts]
    active = counts > 0
    n_active = jnp.sum(active)
    slots = jnp.argsort(~active, stable=True)  # active experts first, in id order
    in_use = jnp.arange(num_experts) < n_active
    sizes = jnp.where(in_use, counts[slots], 0)
    starts = jnp.concatenate([jnp.zeros(1, sizes.dtype), jnp.cumsum(sizes)])
    expert_ids = jnp.where(in_use, slots.astype(jnp.uint32), _EMPTY_EXPERT)
    stats = jnp.stack([jnp.max(counts), n_active])
    u32 = lambda v: v.astype(jnp.uint32)  # noqa: E731
    return u32(order), u32(starts), u32(restore), expert_ids, u32(stats)


moe_create_indices_p = register(
    OpDef(
        "moe_create_indices",
        rule=_moe_indices_rule,
        impl=_moe_indices_impl,
        multiple_results=True,
        differentiable=False,
    )
)


@front(moe_create_indices_p)
def moe_create_indices(topk_ids, num_local_experts: int):
    """Group the flattened router choices by expert.

    Returns ``(token_expert_order, expert_start_indices, restore_token_order,
    expert_ids, expert_usage_stats)`` (all uint32): the stable order that sorts
    ``topk_ids`` by expert; the start of each active expert's run (active experts
    in increasing id order, padded with the total); the inverse permutation; the
    active expert ids (padded with 0xFFFFFFFF); and ``[max tokens per expert,
    active experts]``. Ids ``>= num_local_experts`` (other devices' experts)
    sort last and belong to no group.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> topk = Tensor(np.array([3, 1, 3, 0, 1, 3, 7], np.uint32))  # 7: another device's expert
        >>> order, starts, restore, ids, stats = ops.moe_create_indices(topk, 4)
        >>> order  # tokens sorted by expert: 0 | 1 1 | 3 3 3 | 7
        TensorType(dtype=uint32, shape=[Dim(7)], device=cpu:0): [3, 1, 4, 0, 2, 5, 6]
        >>> starts  # runs of experts 0, 1, 3, padded with the total
        TensorType(dtype=uint32, shape=[Dim(5)], device=cpu:0): [0, 1, 3, 6, 6]
        >>> ids  # active experts, padded with 0xFFFFFFFF
        TensorType(dtype=uint32, shape=[Dim(4)], device=cpu:0): [0, 1, 3, 4294967295]
        >>> stats  # [max tokens per expert, active experts]
        TensorType(dtype=uint32, shape=[Dim(2)], device=cpu:0): [3, 3]
        >>> restore  # the inverse permutation (this order is its own inverse)
        TensorType(dtype=uint32, shape=[Dim(7)], device=cpu:0): [3, 1, 4, 0, 2, 5, 6]
    """
    return bind(moe_create_indices_p, topk_ids, num_experts=int(num_local_experts))
