"""LoRA's segmented gather matrix-vector product (SGMV): each ragged row group through its own adapter."""

from __future__ import annotations

import jax.numpy as jnp

from lowering.context import bind
from lowering.ops import _rules as R
from lowering.ops.moe import ragged_matmul
from lowering.registry import OpDef, OpError, front, register
from lowering.types import TensorType

__all__ = ["sgmv"]

# ─── SGMV (LoRA) ──────────────────────────────────────────────────────────


def _sgmv_rule(x, lora, ids, ranks, offsets, *bias, mask_rank: bool) -> TensorType:
    op = "sgmv"
    x = R.require_tensor(op, x, "input", rank=2, kind=R.FLOAT)
    lo = R.require_tensor(op, lora, "lora", rank=3, kind=R.FLOAT)
    ids = R.require_tensor(op, ids, "lora_ids", rank=1, kind=R.INT)
    ranks = R.require_tensor(op, ranks, "lora_ranks", rank=1, kind=R.INT)
    off = R.require_tensor(op, offsets, "input_row_offsets", rank=1, kind=R.INT)
    shapes = (
        f"input {R.fmt(x)}, lora {R.fmt(lo)}, lora_ids {R.fmt(ids)}, lora_ranks {R.fmt(ranks)}, "
        f"row offsets {R.fmt(off)}"
    )
    if lo.shape[2] != x.shape[1]:
        raise OpError(f"{op}: lora must be [num_loras, out_dim, {x.shape[1]}]: {shapes}")
    if ranks.shape[0] != ids.shape[0] or off.shape[0] != ids.shape[0] + 1:
        raise OpError(f"{op}: need one lora_id and rank per group and one more row offset than groups: {shapes}")
    if lo.dtype is not x.dtype:
        raise OpError(f"{op}: input and lora must share a dtype: {shapes}")
    if bias:
        b = R.require_tensor(op, bias[0], "bias", rank=2)
        if b.shape[0] != lo.shape[0] or b.shape[1] != lo.shape[1] or b.dtype is not x.dtype:
            raise OpError(
                f"{op}: bias must be {x.dtype.name}[{lo.shape[0]}, {lo.shape[1]}] (one row per LoRA), got {R.fmt(b)}"
            )
    return TensorType(x.dtype, [x.shape[0], lo.shape[1]], R.input_device(x, lo))


def _sgmv_impl(x, lora, ids, ranks, offsets, *bias, mask_rank: bool):
    rows, out_dim = x.shape[0], lora.shape[1]
    ids = ids.astype(jnp.int64)
    valid = (ids >= 0) & (ids < lora.shape[0]) & (ranks > 0)
    safe = jnp.where(valid, ids, 0)
    w = jnp.where(valid[:, None, None], lora[safe], 0)
    if mask_rank:
        w = jnp.where((jnp.arange(out_dim)[None, :] < ranks[:, None].astype(jnp.int64))[:, :, None], w, 0)
    off = jnp.clip(offsets.astype(jnp.int32), 0, rows)
    y = ragged_matmul(x, w, off[1:] - off[:-1])
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
