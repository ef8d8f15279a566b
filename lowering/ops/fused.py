"""Fused LLM-serving ops: float8 quantize/scaled matmul, MoE routing and grouped
matmul, LoRA (SGMV), fused top-k/top-p sampling, ragged merges and sampling
penalties.

These are the registry ops under ``maxfx.nn.kernels`` (MAX's custom Mojo
kernels). Each is a pure function; kernels that MAX documents as writing a
buffer in place (``apply_penalties_to_logits``, ``update_frequency_data``) are
built in ``maxfx.nn.kernels`` as load → op → ``buffer_store``.

Conventions shared by the ops here:

- float8 values are any of the four float8 dtypes; quantization saturates to
  the dtype's finite range (a plain cast would give NaN above it).
- A *scale tensor* ``s`` of a matrix ``m`` has the matrix's rank; each of its
  last two dims is 1 (one scale for the whole dim), equal to the matrix dim
  (one scale per row/column), or ``ceil(dim / block)`` (one scale per block).
  This covers per-tensor, row-wise, column-wise and block-wise scaling.
- Ragged groups (``expert_start_indices``, ``input_row_offsets``) are prefix
  sums starting at row 0; rows after the last group produce zeros.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering.context import bind
from lowering.dims import Dim, StaticDim
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.registry import OpDef, OpError, front, register
from lowering.types import TensorType

__all__ = [
    "quantize_static_float8",
    "quantize_dynamic_float8",
    "scaled_matmul",
    "grouped_matmul_ragged",
    "grouped_scaled_matmul_ragged",
    "moe_create_indices",
    "sgmv",
    "topk_sampling",
    "merge_ragged_tensors",
    "apply_penalties",
    "update_frequency_data",
    "FLOAT8_DTYPES",
]

FLOAT8_DTYPES = (DType.float8_e4m3fn, DType.float8_e4m3fnuz, DType.float8_e5m2, DType.float8_e5m2fnuz)
_EMPTY_EXPERT = np.uint32(0xFFFFFFFF)  # expert_ids padding: "no expert in this slot"


# ─── scale checks ─────────────────────────────────────────────────────────


def _check_scale_dim(op: str, scale_dim: Dim, dim: Dim, shapes: str, axis: int) -> None:
    """A scale dim is 1, the matrix dim itself, or ceil(dim / block) for some block."""
    if scale_dim == 1 or scale_dim == dim:
        return
    if not (isinstance(scale_dim, StaticDim) and isinstance(dim, StaticDim)):
        raise OpError(f"{op}: scale dim {axis} ({scale_dim}) must be 1 or equal {dim} when either is symbolic: {shapes}")
    s, d = scale_dim.dim, dim.dim
    block = -(-d // s) if s > 0 else 0
    if s <= 0 or s > d or -(-d // block) != s:
        raise OpError(f"{op}: scale dim {axis} has {s} entries, which is not ceil({d} / block) for any block size: {shapes}")


def _check_scales(op: str, m: TensorType, s: TensorType, mname: str, sname: str) -> None:
    shapes = f"{mname} {R.fmt(m)}, {sname} {R.fmt(s)}"
    if s.rank != m.rank:
        raise OpError(f"{op}: {sname} must have the rank of {mname} ({m.rank}), got {shapes}")
    for ax in range(m.rank - 2):
        if s.shape[ax] != m.shape[ax]:
            raise OpError(f"{op}: {sname} batch dim {ax} must equal {mname}'s: {shapes}")
    for ax in (m.rank - 2, m.rank - 1):
        _check_scale_dim(op, s.shape[ax], m.shape[ax], shapes, ax)


def _expand_scales(s, shape: tuple[int, ...]):
    """Scales repeated to the full matrix shape (each entry covers one block)."""
    s = s.astype(jnp.float32)
    for ax in (-2, -1):
        d, n = shape[ax], s.shape[ax]
        block = -(-d // n)
        s = jnp.repeat(s, block, axis=ax, total_repeat_length=block * n)
        s = lax.slice_in_dim(s, 0, d, axis=len(s.shape) + ax)
    return s


def _dequant(m, s):
    return m.astype(jnp.float32) * _expand_scales(s, m.shape)


def _f8_limit(dtype: DType) -> float:
    return float(jnp.finfo(dtype.to_numpy()).max)


# ─── float8 quantization ──────────────────────────────────────────────────


def _quantize_static_rule(x, scale, *, scale_is_inverted: bool, out_dtype: DType) -> TensorType:
    op = "quantize_static_scaled_float8"
    x = R.require_tensor(op, x, "x", kind=R.FLOAT)
    s = R.require_tensor(op, scale, "scale", kind=R.FLOAT)
    if any(d != 1 for d in s.shape):
        raise OpError(f"{op}: scale must be a scalar (shape [] or [1]), got {R.fmt(s)}")
    if out_dtype not in FLOAT8_DTYPES:
        raise OpError(f"{op}: out_type must be a float8 dtype, got {out_dtype}")
    return TensorType(out_dtype, x.shape, x.device)


def _quantize_static_impl(x, scale, *, scale_is_inverted: bool, out_dtype: DType):
    s = scale.astype(jnp.float32).reshape(())
    y = x.astype(jnp.float32) * s if scale_is_inverted else x.astype(jnp.float32) / s
    lim = _f8_limit(out_dtype)
    return jnp.clip(y, -lim, lim).astype(out_dtype.to_numpy())


quantize_static_float8_p = register(
    OpDef("quantize_static_float8", rule=_quantize_static_rule, impl=_quantize_static_impl, differentiable=False)
)


@front(quantize_static_float8_p)
def quantize_static_float8(x, scale, scale_is_inverted: bool = True, out_dtype: DType = DType.float8_e4m3fn):
    """``x * scale`` (``scale_is_inverted``) or ``x / scale``, saturated and cast to float8.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([1.0, -3.0, 1000.0])
        >>> q = ops.quantize_static_float8(x, Tensor(0.5))  # x * 0.5, saturated to float8's +-448
        >>> print(q.dtype)
        DType.float8_e4m3fn
        >>> ops.cast(q, DType.float32)
        TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [0.5, -1.5, 448.0]
    """
    return bind(quantize_static_float8_p, x, scale, scale_is_inverted=bool(scale_is_inverted), out_dtype=DType(out_dtype))


def _quantize_dynamic_rule(x, *, group_size: int, scale_ub: float, out_dtype: DType, scales_dtype: DType):
    op = "quantize_dynamic_scaled_float8"
    x = R.require_tensor(op, x, "input", kind=R.FLOAT)
    R.require_rank(op, x, lambda r: r >= 2, ">= 2", "input")
    k = R.static_int(op, x.shape[-1], "the last dim of input")
    g = k if group_size == -1 else group_size
    if g <= 0 or k % g:
        raise OpError(f"{op}: group_size_or_per_token={group_size} must be -1 or a positive divisor of the last dim {k}: input {R.fmt(x)}")
    if out_dtype not in FLOAT8_DTYPES:
        raise OpError(f"{op}: out_type must be a float8 dtype, got {out_dtype}")
    if not scales_dtype.is_float():
        raise OpError(f"{op}: scales_type must be a float dtype, got {scales_dtype}")
    if not scale_ub > 0:
        raise OpError(f"{op}: scale_ub must be positive, got {scale_ub}")
    return TensorType(out_dtype, x.shape, x.device), TensorType(scales_dtype, [*x.shape[:-1], k // g], x.device)


def _quantize_dynamic_impl(x, *, group_size: int, scale_ub: float, out_dtype: DType, scales_dtype: DType):
    k = x.shape[-1]
    g = k if group_size == -1 else group_size
    xr = x.astype(jnp.float32).reshape(*x.shape[:-1], k // g, g)
    amax = jnp.minimum(jnp.max(jnp.abs(xr), axis=-1), scale_ub)
    lim = _f8_limit(out_dtype)
    # Quantize with the scale as stored (rounded to scales_dtype) so q * scale round-trips.
    scale = (amax / lim).astype(scales_dtype.to_numpy())
    s32 = scale.astype(jnp.float32)
    safe = jnp.where(s32 == 0, 1.0, s32)
    q = jnp.clip(xr / safe[..., None], -lim, lim).astype(out_dtype.to_numpy())
    return q.reshape(x.shape), scale


quantize_dynamic_float8_p = register(
    OpDef(
        "quantize_dynamic_float8",
        rule=_quantize_dynamic_rule,
        impl=_quantize_dynamic_impl,
        multiple_results=True,
        differentiable=False,
    )
)


@front(quantize_dynamic_float8_p)
def quantize_dynamic_float8(x, group_size: int = -1, scale_ub: float = 1200.0, out_dtype: DType = DType.float8_e4m3fn, scales_dtype: DType = DType.bfloat16):
    """Per-group dynamic float8 quantization along the last dim: ``(q, scales)``.

    Each run of ``group_size`` elements (the whole last dim when -1) gets
    ``scale = min(amax, scale_ub) / float8_max``; ``q = x / scale`` saturated.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, -2.0, 0.5, 4.0], [0.1, 0.2, 0.3, 0.4]])
        >>> q, scales = ops.quantize_dynamic_float8(x, group_size=-1)  # one scale per row: amax / 448
        >>> print(q.dtype, scales.dtype)
        DType.float8_e4m3fn DType.bfloat16
        >>> ops.cast(scales, DType.float32)
        TensorType(dtype=float32, shape=[Dim(2), Dim(1)], device=cpu:0): [0.0089..., 0.0008...]
        >>> ops.cast(q, DType.float32) * ops.cast(scales, DType.float32)  # dequantized: close to x
        TensorType(dtype=float32, shape=[Dim(2), Dim(4)], device=cpu:0): [0.9980..., -1.9960..., 0.4990..., 3.9921..., 0.0999..., 0.1999..., 0.3142..., 0.3999...]
    """
    return bind(
        quantize_dynamic_float8_p,
        x,
        group_size=int(group_size),
        scale_ub=float(scale_ub),
        out_dtype=DType(out_dtype),
        scales_dtype=DType(scales_dtype),
    )


# ─── scaled matmul ────────────────────────────────────────────────────────


def _scaled_matmul_rule(a, b, a_scales, b_scales, *, out_dtype: DType) -> TensorType:
    op = "scaled_matmul"
    a = R.require_tensor(op, a, "a", rank=(2, 3), kind=R.FLOAT8)
    b = R.require_tensor(op, b, "b", rank=(2, 3), kind=R.FLOAT8)
    sa = R.require_tensor(op, a_scales, "a_scales", kind=R.FLOAT)
    sb = R.require_tensor(op, b_scales, "b_scales", kind=R.FLOAT)
    shapes = f"a {R.fmt(a)}, b {R.fmt(b)} (b is transposed: [..., N, K])"
    if a.dtype is not b.dtype:
        raise OpError(f"{op}: a and b must have the same float8 dtype, got {shapes}")
    if a.rank != b.rank or (a.rank == 3 and a.shape[0] != b.shape[0]):
        raise OpError(f"{op}: a and b must both be matrices or batches of the same size, got {shapes}")
    if a.shape[-1] != b.shape[-1]:
        raise OpError(f"{op}: contracting dims differ ({a.shape[-1]} vs {b.shape[-1]}): {shapes}")
    _check_scales(op, a, sa, "a", "a_scales")
    _check_scales(op, b, sb, "b", "b_scales")
    if not out_dtype.is_float():
        raise OpError(f"{op}: out_type must be a float dtype, got {out_dtype}")
    device = R.same_device(op, a, b)
    return TensorType(out_dtype, [*a.shape[:-1], b.shape[-2]], device)


def _scaled_matmul_impl(a, b, a_scales, b_scales, *, out_dtype: DType):
    out = jnp.einsum("...mk,...nk->...mn", _dequant(a, a_scales), _dequant(b, b_scales), precision=lax.Precision.HIGHEST)
    return out.astype(out_dtype.to_numpy())


scaled_matmul_p = register(OpDef("scaled_matmul", rule=_scaled_matmul_rule, impl=_scaled_matmul_impl, differentiable=False))


@front(scaled_matmul_p)
def scaled_matmul(a, b, a_scales, b_scales, out_dtype: DType = DType.bfloat16):
    """``(a * a_scales) @ (b * b_scales).T`` for float8 ``a [.., M, K]`` and ``b [.., N, K]``.

    Scales broadcast per tensor, row, column or block (see the module notes);
    the product accumulates in float32 and is cast to ``out_dtype``.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> a = ops.cast(Tensor([[1.0, 2.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]), DType.float8_e4m3fn)  # [M=2, K=4]
        >>> b = ops.cast(Tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]), DType.float8_e4m3fn)  # [N=3, K]
        >>> a_scales = Tensor([[0.5]])  # per tensor
        >>> b_scales = Tensor([[1.0], [2.0], [1.0]])  # per row of b
        >>> ops.scaled_matmul(a, b, a_scales, b_scales, out_dtype=DType.float32)
        TensorType(dtype=float32, shape=[Dim(2), Dim(3)], device=cpu:0): [0.5, 2.0, 2.0, 0.0, 1.0, 1.0]
    """
    return bind(scaled_matmul_p, a, b, a_scales, b_scales, out_dtype=DType(out_dtype))


# ─── grouped (MoE) matmul ─────────────────────────────────────────────────


def _grouped_rule_common(op: str, h: Any, w: Any, starts: Any, ids: Any, stats: Any) -> tuple[TensorType, TensorType]:
    h = R.require_tensor(op, h, "hidden_states", rank=2)
    w = R.require_tensor(op, w, "weight", rank=3)
    starts = R.require_tensor(op, starts, "expert_start_indices", rank=1, kind=R.INT)
    ids = R.require_tensor(op, ids, "expert_ids", rank=1, kind=R.INT)
    stats = R.require_tensor(op, stats, "expert_usage_stats", rank=1, kind=R.INT)
    shapes = f"hidden_states {R.fmt(h)}, weight {R.fmt(w)}, expert_ids {R.fmt(ids)}, expert_start_indices {R.fmt(starts)}"
    if w.shape[2] != h.shape[1]:
        raise OpError(f"{op}: weight must be [num_experts, N, {h.shape[1]}] (transposed per expert): {shapes}")
    if starts.shape[0] != ids.shape[0] + 1:
        raise OpError(f"{op}: expert_start_indices must have one more entry than expert_ids: {shapes}")
    if stats.shape[0] != 2:
        raise OpError(f"{op}: expert_usage_stats must be [2] (max tokens per expert, active experts), got {R.fmt(stats)}")
    return h, w


def _grouped_rule(h, w, starts, ids, stats) -> TensorType:
    op = "grouped_matmul_ragged"
    h, w = _grouped_rule_common(op, h, w, starts, ids, stats)
    if not h.dtype.is_float() or w.dtype is not h.dtype:
        raise OpError(f"{op}: hidden_states and weight must share a float dtype, got {R.fmt(h)} and {R.fmt(w)}")
    return TensorType(h.dtype, [h.shape[0], w.shape[1]], R.same_device(op, h, w))


def _group_sizes(starts, ids, stats, rows: int):
    starts = jnp.clip(starts.astype(jnp.int32), 0, rows)
    sizes = starts[1:] - starts[:-1]
    active = jnp.arange(ids.shape[0]) < stats[1].astype(jnp.int32)
    return jnp.where(active, sizes, 0)


def _ragged_matmul(h, w_per_group, sizes):
    """Rows of ``h`` in consecutive groups times each group's ``[N, K]`` matrix; float32 result."""
    rhs = jnp.swapaxes(w_per_group, 1, 2).astype(jnp.float32)
    return lax.ragged_dot(h.astype(jnp.float32), rhs, sizes, precision=lax.Precision.HIGHEST)


def _grouped_impl(h, w, starts, ids, stats):
    safe = jnp.clip(ids.astype(jnp.int64), 0, w.shape[0] - 1)
    return _ragged_matmul(h, w[safe], _group_sizes(starts, ids, stats, h.shape[0])).astype(h.dtype)


# MAX reads the usage stats on the host (``expert_usage_stats_host``): they may stay on the CPU.
grouped_matmul_ragged_p = register(OpDef("grouped_matmul_ragged", rule=_grouped_rule, impl=_grouped_impl, differentiable=False, host_inputs=(4,)))


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
    _check_scales(op, h, R.require_tensor(op, a_scales, "a_scales", kind=R.FLOAT), "hidden_states", "a_scales")
    _check_scales(op, w, R.require_tensor(op, b_scales, "b_scales", kind=R.FLOAT), "weight", "b_scales")
    return TensorType(out_dtype, [h.shape[0], w.shape[1]], R.same_device(op, h, w))


def _grouped_scaled_impl(h, w, a_scales, b_scales, starts, ids, stats, *, out_dtype: DType):
    safe = jnp.clip(ids.astype(jnp.int64), 0, w.shape[0] - 1)
    out = _ragged_matmul(_dequant(h, a_scales), _dequant(w, b_scales)[safe], _group_sizes(starts, ids, stats, h.shape[0]))
    return out.astype(out_dtype.to_numpy())


grouped_scaled_matmul_ragged_p = register(
    OpDef("grouped_scaled_matmul_ragged", rule=_grouped_scaled_rule, impl=_grouped_scaled_impl, differentiable=False, host_inputs=(6,))
)


@front(grouped_scaled_matmul_ragged_p)
def grouped_scaled_matmul_ragged(hidden_states, weight, a_scales, b_scales, expert_start_indices, expert_ids, expert_usage_stats, out_dtype=DType.bfloat16):
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
    OpDef("moe_create_indices", rule=_moe_indices_rule, impl=_moe_indices_impl, multiple_results=True, differentiable=False)
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


# ─── SGMV (LoRA) ──────────────────────────────────────────────────────────


def _sgmv_rule(x, lora, ids, ranks, offsets, *bias, mask_rank: bool) -> TensorType:
    op = "sgmv"
    x = R.require_tensor(op, x, "input", rank=2, kind=R.FLOAT)
    lo = R.require_tensor(op, lora, "lora", rank=3, kind=R.FLOAT)
    ids = R.require_tensor(op, ids, "lora_ids", rank=1, kind=R.INT)
    ranks = R.require_tensor(op, ranks, "lora_ranks", rank=1, kind=R.INT)
    off = R.require_tensor(op, offsets, "input_row_offsets", rank=1, kind=R.INT)
    shapes = f"input {R.fmt(x)}, lora {R.fmt(lo)}, lora_ids {R.fmt(ids)}, lora_ranks {R.fmt(ranks)}, row offsets {R.fmt(off)}"
    if lo.shape[2] != x.shape[1]:
        raise OpError(f"{op}: lora must be [num_loras, out_dim, {x.shape[1]}]: {shapes}")
    if ranks.shape[0] != ids.shape[0] or off.shape[0] != ids.shape[0] + 1:
        raise OpError(f"{op}: need one lora_id and rank per group and one more row offset than groups: {shapes}")
    if lo.dtype is not x.dtype:
        raise OpError(f"{op}: input and lora must share a dtype: {shapes}")
    if bias:
        b = R.require_tensor(op, bias[0], "bias", rank=2)
        if b.shape[0] != lo.shape[0] or b.shape[1] != lo.shape[1] or b.dtype is not x.dtype:
            raise OpError(f"{op}: bias must be {x.dtype.name}[{lo.shape[0]}, {lo.shape[1]}] (one row per LoRA), got {R.fmt(b)}")
    return TensorType(x.dtype, [x.shape[0], lo.shape[1]], R.same_device(op, x, lo))


def _sgmv_impl(x, lora, ids, ranks, offsets, *bias, mask_rank: bool):
    rows, out_dim = x.shape[0], lora.shape[1]
    ids = ids.astype(jnp.int64)
    valid = (ids >= 0) & (ids < lora.shape[0]) & (ranks > 0)
    safe = jnp.where(valid, ids, 0)
    w = jnp.where(valid[:, None, None], lora[safe], 0)
    if mask_rank:
        w = jnp.where((jnp.arange(out_dim)[None, :] < ranks[:, None].astype(jnp.int64))[:, :, None], w, 0)
    off = jnp.clip(offsets.astype(jnp.int32), 0, rows)
    y = _ragged_matmul(x, w, off[1:] - off[:-1])
    if bias:
        r = jnp.arange(rows)
        group = jnp.clip(jnp.searchsorted(off[1:], r, side="right"), 0, ids.shape[0] - 1)
        row_ok = (r < off[-1]) & valid[group]
        y = y + jnp.where(row_ok[:, None], bias[0][safe[group]].astype(jnp.float32), 0)
    return y.astype(x.dtype)


sgmv_p = register(OpDef("sgmv", rule=_sgmv_rule, impl=_sgmv_impl, differentiable=False))


@front(sgmv_p)
def sgmv(input, lora, lora_ids, lora_ranks, input_row_offsets, bias=None, mask_rank: bool = False):  # noqa: A002
    """Segmented gather matrix-vector product: rows of group ``i`` times ``lora[lora_ids[i]].T``.

    Groups with a negative id or rank 0 (and rows after the last offset) give
    zeros; ``mask_rank`` also zeroes output columns ``>= lora_ranks[i]`` (the
    LoRA-A "shrink" step); ``bias`` adds ``bias[lora_ids[i]]``.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        >>> lora = Tensor([[[9.0, 9.0], [9.0, 9.0]], [[1.0, 0.0], [1.0, 1.0]]])  # [adapters=2, rank=2, K=2]
        >>> ids = Tensor(np.array([1, -1], np.int32))  # rows 0-1 use adapter 1; row 2 none
        >>> ranks = Tensor(np.array([2, 2], np.int32))
        >>> offsets = Tensor(np.array([0, 2, 3], np.uint32))
        >>> ops.sgmv(x, lora, ids, ranks, offsets)
        TensorType(dtype=float32, shape=[Dim(3), Dim(2)], device=cpu:0): [1.0, 3.0, 3.0, 7.0, 0.0, 0.0]
        >>> ranks = Tensor(np.array([1, 2], np.int32))
        >>> ops.sgmv(x, lora, ids, ranks, offsets, mask_rank=True)  # columns >= rank 1 zeroed
        TensorType(dtype=float32, shape=[Dim(3), Dim(2)], device=cpu:0): [1.0, 0.0, 3.0, 0.0, 0.0, 0.0]
    """
    extra = [] if bias is None else [bias]
    return bind(sgmv_p, input, lora, lora_ids, lora_ranks, input_row_offsets, *extra, mask_rank=bool(mask_rank))


# ─── fused top-k / top-p sampling ─────────────────────────────────────────


def _sampling_rule(logits, top_k, temperature, top_p, seed, *, max_k: int, use_top_p: bool) -> TensorType:
    op = "topk_fused_sampling"
    lg = R.require_tensor(op, logits, "logits", rank=2, kind=R.FLOAT)
    for t, name, kind in ((top_k, "top_k", R.INT), (temperature, "temperature", R.FLOAT), (top_p, "top_p", R.FLOAT), (seed, "seed", R.INT)):
        t = R.require_tensor(op, t, name, rank=1, kind=kind)
        if t.shape[0] != lg.shape[0]:
            raise OpError(f"{op}: {name} must have one entry per batch row ({lg.shape[0]}), got {R.fmt(t)}")
    vocab = lg.shape[1]
    if max_k <= 0 or (isinstance(vocab, StaticDim) and max_k > vocab.dim):
        raise OpError(f"{op}: max_k must be in [1, vocab_size={vocab}], got {max_k}")
    return TensorType(DType.int64, [lg.shape[0], 1], lg.device)


def _sample_row(key, vals):
    return jax.random.categorical(key, vals)


def _sampling_impl(logits, top_k, temperature, top_p, seed, *, max_k: int, use_top_p: bool):
    temp = temperature.astype(jnp.float32)
    greedy = temp <= 0  # temperature 0 means greedy decoding
    scaled = logits.astype(jnp.float32) / jnp.where(greedy, 1.0, temp)[:, None]
    vals, idx = lax.top_k(scaled, max_k)
    k = jnp.where(greedy, 1, jnp.clip(top_k.astype(jnp.int64), 1, max_k))
    vals = jnp.where(jnp.arange(max_k)[None, :] < k[:, None], vals, -jnp.inf)
    if use_top_p:
        probs = jax.nn.softmax(vals, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the better-ranked tokens
        vals = jnp.where(before < top_p.astype(jnp.float32)[:, None], vals, -jnp.inf)
    keys = jax.vmap(jax.random.key)(seed.astype(jnp.uint64))
    choice = jax.vmap(_sample_row)(keys, vals)
    return jnp.take_along_axis(idx, choice[:, None], axis=1).astype(jnp.int64)


topk_sampling_p = register(OpDef("topk_sampling", rule=_sampling_rule, impl=_sampling_impl, differentiable=False))


@front(topk_sampling_p)
def topk_sampling(logits, top_k, temperature, top_p, seed, max_k: int, use_top_p: bool = True):
    """Sample one token per row from the top ``top_k`` (and top-``top_p`` mass) of ``logits / temperature``.

    Per-row tensors ``top_k`` (int), ``temperature``, ``top_p`` (float), ``seed``
    (int); ``max_k`` (static) bounds ``top_k``. ``top_k == 1`` or
    ``temperature <= 0`` is greedy. Returns int64 ``[batch, 1]``.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> logits = Tensor([[0.1, 3.0, 0.2], [5.0, 0.0, 1.0]])
        >>> k = Tensor(np.array([1, 1], np.int64))  # top_k == 1: greedy
        >>> t = Tensor([1.0, 1.0])
        >>> p = Tensor([1.0, 1.0])
        >>> seed = Tensor(np.array([0, 1], np.uint64))
        >>> ops.topk_sampling(logits, k, t, p, seed, max_k=2)
        TensorType(dtype=int64, shape=[Dim(2), Dim(1)], device=cpu:0): [1, 0]
        >>> k = Tensor(np.array([2, 2], np.int64))
        >>> tokens = np.asarray(ops.topk_sampling(logits, k, t, p, seed, max_k=2))
        >>> bool(tokens[0, 0] in (1, 2) and tokens[1, 0] in (0, 2))  # each from its row's top 2
        True
    """
    return bind(topk_sampling_p, logits, top_k, temperature, top_p, seed, max_k=int(max_k), use_top_p=bool(use_top_p))


# ─── ragged merge ─────────────────────────────────────────────────────────


def _merge_rule(a, a_off, b, b_off):
    op = "merge_ragged_tensors"
    a = R.require_tensor(op, a, "a")
    b = R.require_tensor(op, b, "b")
    ao = R.require_tensor(op, a_off, "a_row_offsets", rank=1, kind=R.INT)
    bo = R.require_tensor(op, b_off, "b_row_offsets", rank=1, kind=R.INT)
    shapes = f"a {R.fmt(a)}, b {R.fmt(b)}"
    if a.dtype is not b.dtype:
        raise OpError(f"{op}: a and b must have the same dtype, got {shapes}")
    if a.rank < 1 or a.rank != b.rank or list(a.shape[1:]) != list(b.shape[1:]):
        raise OpError(f"{op}: a and b must have equal shapes after the row dim, got {shapes}")
    if ao.shape[0] != bo.shape[0]:
        raise OpError(f"{op}: a_row_offsets and b_row_offsets must have the same shape, got {R.fmt(ao)} and {R.fmt(bo)}")
    dev = R.same_device(op, a, b)
    return TensorType(a.dtype, [a.shape[0] + b.shape[0], *a.shape[1:]], dev), TensorType(DType.uint32, ao.shape, dev)


def _merge_impl(a, a_off, b, b_off):
    ao, bo = a_off.astype(jnp.int64), b_off.astype(jnp.int64)

    def dest(n, own, other, shift):
        r = jnp.arange(n)
        batch = jnp.clip(jnp.searchsorted(own[1:], r, side="right"), 0, own.shape[0] - 2)
        return r + other[batch + shift]

    out = jnp.zeros((a.shape[0] + b.shape[0], *a.shape[1:]), a.dtype)
    out = out.at[dest(a.shape[0], ao, bo, 0)].set(a).at[dest(b.shape[0], bo, ao, 1)].set(b)
    return out, (ao + bo).astype(jnp.uint32)


merge_ragged_tensors_p = register(
    OpDef("merge_ragged_tensors", rule=_merge_rule, impl=_merge_impl, multiple_results=True, differentiable=False)
)


@front(merge_ragged_tensors_p)
def merge_ragged_tensors(a, a_row_offsets, b, b_row_offsets):
    """Interleave two ragged batches: sequence i of ``a`` then sequence i of ``b``, for each i.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> a = Tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # sequences [1, 2] and [3, 4, 5, 6]
        >>> b = Tensor([7.0, 8.0, 9.0, 10.0])  # sequences [7, 8, 9] and [10]
        >>> a_offsets = Tensor(np.array([0, 2, 6], np.uint32))
        >>> b_offsets = Tensor(np.array([0, 3, 4], np.uint32))
        >>> merged, offsets = ops.merge_ragged_tensors(a, a_offsets, b, b_offsets)
        >>> merged
        TensorType(dtype=float32, shape=[Dim(10)], device=cpu:0): [1.0, 2.0, 7.0, 8.0, 9.0, 3.0, 4.0, 5.0, 6.0, 10.0]
        >>> offsets
        TensorType(dtype=uint32, shape=[Dim(3)], device=cpu:0): [0, 5, 10]
    """
    return bind(merge_ragged_tensors_p, a, a_row_offsets, b, b_row_offsets)


# ─── sampling penalties ───────────────────────────────────────────────────


def _freq_rule_common(op: str, fd: Any, fo: Any) -> tuple[TensorType, TensorType]:
    fd = R.require_tensor(op, fd, "frequency_data", rank=2, kind=R.INT)
    fo = R.require_tensor(op, fo, "frequency_offsets", rank=1, kind=R.INT)
    if fd.shape[1] != 2:
        raise OpError(f"{op}: frequency_data must be [unique_tokens, 2] (token id, count), got {R.fmt(fd)}")
    return fd, fo


def _penalties_rule(logits, fd, fo, fp, pp, rp) -> TensorType:
    op = "apply_penalties_to_logits"
    lg = R.require_tensor(op, logits, "logits", rank=2, kind=R.FLOAT)
    fd, fo = _freq_rule_common(op, fd, fo)
    if fo.shape[0] != lg.shape[0] + 1:
        raise OpError(f"{op}: frequency_offsets must be [batch + 1] = [{lg.shape[0] + 1}], got {R.fmt(fo)}")
    for t, name in ((fp, "frequency_penalty"), (pp, "presence_penalty"), (rp, "repetition_penalty")):
        t = R.require_tensor(op, t, name, kind=R.FLOAT)
        per_row = t.rank == 1 and t.shape[0] == lg.shape[0]
        if not per_row and any(d != 1 for d in t.shape):
            raise OpError(f"{op}: {name} must be a scalar or one value per batch row ([{lg.shape[0]}]), got {R.fmt(t)}")
    return lg


def _segment_of(offsets, n: int):
    """Batch index of each of ``n`` rows under prefix-sum ``offsets`` (== batch for rows past the end)."""
    return jnp.searchsorted(offsets[1:], jnp.arange(n), side="right")


def _penalty_at(v, rows, batch: int):
    """A penalty for each frequency entry: a scalar applies to every row, a ``[batch]`` one is read at the entry's row."""
    v = v.astype(jnp.float32)
    return v.reshape(-1)[rows] if v.ndim == 1 and v.size == batch and batch != 1 else v.reshape(())


def _penalties_impl(logits, fd, fo, fp, pp, rp):
    batch, vocab = logits.shape
    fo = fo.astype(jnp.int64)
    tok, count = fd[:, 0].astype(jnp.int64), fd[:, 1].astype(jnp.float32)
    row = _segment_of(fo, fd.shape[0])
    valid = (row < batch) & (tok >= 0) & (tok < vocab) & (count > 0)
    r, c = jnp.where(valid, row, batch), jnp.clip(tok, 0, vocab - 1)
    old = logits[jnp.minimum(r, batch - 1), c].astype(jnp.float32)
    rp, fp, pp = (_penalty_at(v, jnp.minimum(r, batch - 1), batch) for v in (rp, fp, pp))
    new = jnp.where(old > 0, old / rp, old * rp) - fp * count - pp
    return logits.at[r, c].set(new.astype(logits.dtype), mode="drop")


apply_penalties_p = register(OpDef("apply_penalties", rule=_penalties_rule, impl=_penalties_impl, differentiable=False))


@front(apply_penalties_p)
def apply_penalties(logits, frequency_data, frequency_offsets, frequency_penalty, presence_penalty, repetition_penalty):
    """Logits with repetition, then frequency and presence, penalties applied to seen tokens.

    For each ``(token, count)`` row of sequence b's slice of ``frequency_data``
    (token < 0 marks an empty slot): ``l = l / rp if l > 0 else l * rp`` then
    ``l -= frequency_penalty * count + presence_penalty``. Each penalty is a
    scalar or one value per batch row.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> logits = Tensor([[1.0, 2.0, -1.0, 0.5]])
        >>> frequency = Tensor(np.array([[1, 2], [2, 1], [-1, 0]], np.int32))  # (token, count); -1: empty
        >>> offsets = Tensor(np.array([0, 3], np.uint32))
        >>> fp, pp, rp = Tensor(0.5), Tensor(0.25), Tensor(2.0)
        >>> ops.apply_penalties(logits, frequency, offsets, fp, pp, rp)  # 2 / 2 - 0.5 * 2 - 0.25; -1 * 2 - 0.5 - 0.25
        TensorType(dtype=float32, shape=[Dim(1), Dim(4)], device=cpu:0): [1.0, -0.25, -2.75, 0.5]
    """
    return bind(apply_penalties_p, logits, frequency_data, frequency_offsets, frequency_penalty, presence_penalty, repetition_penalty)


def _update_freq_rule(fd, fo, tokens) -> TensorType:
    op = "update_frequency_data"
    fd, fo = _freq_rule_common(op, fd, fo)
    t = R.require_tensor(op, tokens, "tokens", rank=1, kind=R.INT)
    if fo.shape[0] != t.shape[0] + 1:
        raise OpError(f"{op}: frequency_offsets must have one more entry than tokens, got {R.fmt(fo)} and {R.fmt(t)}")
    return fd


def _update_freq_impl(fd, fo, tokens):
    n, batch = fd.shape[0], tokens.shape[0]
    fo = fo.astype(jnp.int64)
    tok = fd[:, 0].astype(jnp.int64)
    row = _segment_of(fo, n)
    new_tok = tokens.astype(jnp.int64)
    pos = jnp.arange(n)
    seg = jnp.minimum(row, batch)
    match = (row < batch) & (tok == new_tok[jnp.minimum(row, batch - 1)])
    empty = (row < batch) & (tok < 0)
    first_match = jax.ops.segment_min(jnp.where(match, pos, n), seg, num_segments=batch + 1)[:batch]
    first_empty = jax.ops.segment_min(jnp.where(empty, pos, n), seg, num_segments=batch + 1)[:batch]
    found = first_match < n
    target = jnp.where(new_tok < 0, n, jnp.where(found, first_match, first_empty))  # n: no slot, dropped
    counts = jnp.where(found, fd[jnp.minimum(target, n - 1), 1].astype(jnp.int64) + 1, 1)
    fd = fd.at[target, 0].set(new_tok.astype(fd.dtype), mode="drop")
    return fd.at[target, 1].set(counts.astype(fd.dtype), mode="drop")


update_frequency_data_p = register(OpDef("update_frequency_data", rule=_update_freq_rule, impl=_update_freq_impl, differentiable=False))


@front(update_frequency_data_p)
def update_frequency_data(frequency_data, frequency_offsets, tokens):
    """``frequency_data`` with each sequence's new token counted.

    A token already in the sequence's slice has its count incremented; a new
    one takes the slice's first empty slot (token id < 0) with count 1 (it is
    dropped when the slice is full). Negative ``tokens`` are padding.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> frequency = Tensor(np.array([[1, 2], [4, 1], [-1, 0], [0, 3], [-1, 0], [-1, 0]], np.int32))
        >>> offsets = Tensor(np.array([0, 3, 6], np.uint32))  # rows 0-2: sequence 0; rows 3-5: sequence 1
        >>> new_tokens = Tensor(np.array([4, 5], np.int64))
        >>> ops.update_frequency_data(frequency, offsets, new_tokens)  # 4 seen again; 5 takes a free slot
        TensorType(dtype=int32, shape=[Dim(6), Dim(2)], device=cpu:0): [1, 2, 4, 2, -1, 0, 0, 3, 5, 1, -1, 0]
    """
    return bind(update_frequency_data_p, frequency_data, frequency_offsets, tokens)
