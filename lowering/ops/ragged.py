"""Ragged tensors: merging two batches of ragged rows by their row offsets.

Row offsets (``input_row_offsets``) are prefix sums starting at row 0.
"""

from __future__ import annotations

import jax.numpy as jnp

from lowering.context import bind
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.registry import OpDef, OpError, front, register
from lowering.types import TensorType

__all__ = ["merge_ragged_tensors"]

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
        raise OpError(
            f"{op}: a_row_offsets and b_row_offsets must have the same shape, got {R.fmt(ao)} and {R.fmt(bo)}"
        )
    dev = R.input_device(a, b)
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
