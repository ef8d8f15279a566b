"""Attention and paged KV-cache ops.

The attention math lives in `custom_calls.attention` (one jnp reference,
the Pallas flash and decode kernels on GPU or with ``MAXFX_PALLAS_INTERPRET=1``);
this module checks types, maps MAX's mask names to the kernels' keywords and
states each op's arguments: which kernel serves them is the dispatch's choice.
``attention`` (padded ``[batch, seq, heads, dim]``) calls
``dispatch.attention``, ``paged_attention`` calls ``dispatch.paged_attention_pool``
(a decode step may run a split-K decode kernel there); ``ragged_attention``
describes each sequence's q rows, k/v rows and first query position in the
kernel's packed table and calls ``flash_attention_packed``.
Scores and softmax are float32; ``n_heads`` is a multiple of ``n_kv_heads``
(GQA). Sink weights, ALiBi, chunked masks and MLA's narrower values run the
reference (the dispatch warns once where a kernel would have run).

Ragged tensors are ``[total_tokens, ...]`` with ``row_offsets [batch + 1]``
prefix sums; rows past ``row_offsets[-1]`` are padding.

The paged KV cache is a block pool
``[num_pages, kv_dim, num_layers, page_size, n_kv_heads, head_dim]``
(``kv_dim`` 2 = K and V, 1 = a single latent cache for MLA) plus a lookup table
``[batch, max_pages]`` of page ids: token position ``p`` of sequence ``b`` lives
in page ``lookup[b, p // page_size]`` at slot ``p % page_size``.
``kv_cache_store`` writes rows functionally (the pool is a buffer that the op
mutates), ``kv_cache_gather`` reads rows, ``paged_attention`` reads the whole
cache of each sequence.

Masks (``mask``): ``"null"``, ``"causal"``, ``"sliding_window"`` (causal, keys
in ``(q_pos - window, q_pos]``), ``"chunked"`` (causal within chunks of
``window`` positions) and ``"causal_alibi"`` (causal plus ALiBi biases).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from custom_calls.attention import dispatch as att
from custom_calls.attention.reference import ragged_rows
from lowering.context import bind
from lowering.dims import Dim, StaticDim
from lowering.ops._rules import (
    FLOAT,
    INT,
    OpError,
    fmt,
    input_device,
    require_same_dim,
    require_tensor,
    require_tensor_of,
)
from lowering.registry import OpDef, front, register
from lowering.rope_math import JAX_ARRAYS, rotate_pairs
from lowering.types import BufferType, TensorType, Type

__all__ = [
    "MASKS",
    "attention",
    "flash_attention",
    "kv_cache_gather",
    "kv_cache_store",
    "paged_attention",
    "ragged_attention",
    "rope_ragged",
]

MASKS = ("null", "causal", "sliding_window", "chunked", "causal_alibi")


# ─── masks → the attention kernels ───────────────────────────────────────


def _mask_args(mask: str, window: int) -> dict[str, Any]:
    """MAX mask name → `custom_calls.attention` keywords (positions are absolute, keys at 0..kv_len-1).

    MAX's sliding window of ``W`` tokens including the current one is the
    ``jax.nn``-style window ``(W - 1, 0)``; chunked and ALiBi masks are
    reference-only extensions of the dispatch.
    """
    if mask == "null":
        return {"causal": False}
    args: dict[str, Any] = {"causal": True}
    if mask == "sliding_window":
        args["local_window_size"] = (window - 1, 0)
    elif mask == "chunked":
        args["chunk_size"] = window
    elif mask == "causal_alibi":
        args["alibi"] = True
    return args


def _packed(q, k, v, seq, sink, *, max_q: int, max_kv: int, mask: str, scale: float, window: int):
    """Attention over the packed layout (`custom_calls.attention.dispatch.flash_attention_packed`)."""
    k, v = _like(q, k), _like(q, v)
    return att.flash_attention_packed(
        q, k, v, seq, max_q_len=max_q, max_kv_len=max_kv, scale=scale, sinks=sink, **_mask_args(mask, window)
    )


def _like(q, x):
    # The rules accept any float k/v; the kernels need one dtype (scores are float32 either way).
    return x if x.dtype == q.dtype else x.astype(q.dtype)


# ─── rule helpers ─────────────────────────────────────────────────────────


def _check_heads(op: str, q: TensorType, k: TensorType, hq: Dim, hkv: Dim) -> None:
    if isinstance(hq, StaticDim) and isinstance(hkv, StaticDim) and (hkv.dim == 0 or hq.dim % hkv.dim):
        raise OpError(
            f"{op}: query heads ({hq}) must be a multiple of key/value heads ({hkv}) for grouped-query attention "
            f"({fmt(q)} vs {fmt(k)})"
        )


def _check_qkv(
    op: str, q: Type, k: Type, v: Type, rank: int, mask: str, window: int
) -> tuple[TensorType, TensorType, TensorType]:
    """q, k, v as rank-``rank`` float tensors (heads on axis -2, head dim last), and a valid mask."""
    q, k, v = (require_tensor_of(op, t, name, rank=rank, kind=FLOAT) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    _check_mask(op, mask, window)
    return q, k, v


def _check_qkv_heads(op: str, q: TensorType, k: TensorType, v: TensorType) -> None:
    """Key and value heads agree, query and key head dims agree, and the query heads group over the key heads."""
    require_same_dim(op, "key and value heads", k.shape[-2], v.shape[-2], k, v)
    require_same_dim(op, "query and key head dims", q.shape[-1], k.shape[-1], q, k)
    _check_heads(op, q, k, q.shape[-2], k.shape[-2])


def _check_mask(op: str, mask: str, window: int) -> None:
    if mask not in MASKS:
        raise OpError(f"{op}: mask must be one of {MASKS}, got {mask!r}")
    if mask in ("sliding_window", "chunked") and window <= 0:
        raise OpError(f"{op}: mask {mask!r} needs a positive window size, got {window}")


def _pool(op: str, t: Type) -> Type:
    if not isinstance(t, (TensorType, BufferType)) or t.rank != 6 or not t.dtype.is_float():
        raise OpError(
            f"{op}: blocks must be a rank-6 float pool [num_pages, kv_dim, num_layers, page_size, n_kv_heads, "
            f"head_dim], got {fmt(t)}"
        )
    return t


def _optional(names: Sequence[str], present: Sequence[str], types: Sequence[Type]) -> dict[str, Type | None]:
    it = iter(types)
    return {n: (next(it) if n in present else None) for n in names}


# ─── attention (padded) ───────────────────────────────────────────────────


def _attention_rule(q, k, v, *rest, mask: str, scale: float, window: int, present: tuple[str, ...]):
    op = "attention"
    q, k, v = _check_qkv(op, q, k, v, 4, mask, window)
    require_same_dim(op, "batch sizes", q.shape[0], k.shape[0], q, k)
    require_same_dim(op, "key and value lengths", k.shape[1], v.shape[1], k, v)
    _check_qkv_heads(op, q, k, v)
    opt = _optional(("q_offset", "kv_length", "sink"), present, rest)
    for name in ("q_offset", "kv_length"):
        if opt[name] is not None:
            t = require_tensor_of(op, opt[name], name, rank=1, kind=INT)
            require_same_dim(op, f"{name} and batch sizes", t.shape[0], q.shape[0], t, q)
    if opt["sink"] is not None:
        t = require_tensor_of(op, opt["sink"], "sink_weights", rank=1, kind=FLOAT)
        require_same_dim(op, "sink weights and query heads", t.shape[0], q.shape[2], t, q)
    return TensorType(q.dtype, [q.shape[0], q.shape[1], q.shape[2], v.shape[3]], input_device(q, k, v))


def _attention_impl(q, k, v, *rest, mask, scale, window, present):
    opt = dict(zip(present, rest))
    return att.attention(
        q,
        _like(q, k),
        _like(q, v),
        scale=scale,
        q_offset=opt.get("q_offset", 0),
        kv_lens=opt.get("kv_length"),
        sinks=opt.get("sink"),
        **_mask_args(mask, window),
    )


attention_p = register(OpDef("attention", rule=_attention_rule, impl=_attention_impl))


@front(attention_p)
def attention(
    q, k, v, *, mask: str = "causal", scale: float, window: int = -1, q_offset=None, kv_length=None, sink_weights=None
):
    """Masked softmax attention over padded ``[batch, seq, heads, dim]`` tensors.

    ``k``/``v`` may have fewer heads than ``q`` (grouped-query attention).
    Query ``i`` sits at position ``q_offset[b] + i`` (default 0); keys at or past
    ``kv_length[b]`` (default: all) are ignored.

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> q = Tensor(np.zeros((1, 2, 1, 2), np.float32))  # [batch, seq, heads, dim]: equal scores
        >>> v = Tensor(np.array([10.0, 0.0, 20.0, 2.0], np.float32).reshape(1, 2, 1, 2))
        >>> ops.attention(q, q, v, mask="causal", scale=0.125)[0, :, 0]  # query 1 averages keys 0 and 1
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [10.0, 0.0, 15.0, 1.0]
        >>> ops.attention(q, q, v, mask="null", scale=0.125)[0, :, 0]
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [15.0, 1.0, 15.0, 1.0]
    """
    extra = {"q_offset": q_offset, "kv_length": kv_length, "sink": sink_weights}
    present = tuple(n for n, x in extra.items() if x is not None)
    return bind(
        attention_p,
        q,
        k,
        v,
        *[extra[n] for n in present],
        mask=mask,
        scale=float(scale),
        window=int(window),
        present=present,
    )


@front()
def flash_attention(q, k, v, *, causal: bool = False, scale: float | None = None, local_window_size: int = -1):
    """``jax.nn``-style attention on ``[batch, seq, heads, head_dim]`` (the functional API's entry).

    A thin front over ``attention`` (the Pallas flash kernel on GPU, the
    reference elsewhere): ``k``/``v`` may have fewer heads (GQA); ``scale``
    defaults to ``1/sqrt(head_dim)``; queries and keys are top-left aligned.
    ``local_window_size`` ``W > 0`` is MAX's sliding window of ``W`` tokens
    including the current one (as in ``maxfx.nn.kernels.flash_attention_gpu``)
    and needs ``causal=True``.

    Example:
        >>> from maxfx import functional as F
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor.ones([1, 4, 2, 8])
        >>> F.flash_attention(x, x, x, causal=True).shape
        [Dim(1), Dim(4), Dim(2), Dim(8)]
    """
    window = int(local_window_size)
    if window > 0 and not causal:
        raise OpError(
            f"flash_attention: local_window_size={window} is a causal sliding window (MAX convention); pass causal=True"
        )
    if scale is None:
        d = Dim(q.shape[-1]) if len(q.shape) else None
        if not isinstance(d, StaticDim):
            raise OpError(
                "flash_attention: the default scale needs q [batch, seq, heads, head_dim] with a static head_dim, got "
                f"shape {list(q.shape)}"
            )
        scale = 1.0 / float(d.dim) ** 0.5
    mask = "null" if not causal else ("sliding_window" if window > 0 else "causal")
    return attention(q, k, v, mask=mask, scale=float(scale), window=window)


# ─── ragged_attention ─────────────────────────────────────────────────────


def _ragged_rule(q, k, v, q_rows, kv_rows, *rest, mask, scale, window, present, max_q, max_kv):
    op = "ragged_attention"
    q, k, v = _check_qkv(op, q, k, v, 3, mask, window)
    require_same_dim(op, "key and value rows", k.shape[0], v.shape[0], k, v)
    _check_qkv_heads(op, q, k, v)
    qr, kr = (
        require_tensor_of(op, q_rows, "input_row_offsets", rank=1, kind=INT),
        require_tensor_of(op, kv_rows, "kv_row_offsets", rank=1, kind=INT),
    )
    require_same_dim(op, "query and key/value batch sizes (row offsets)", qr.shape[0], kr.shape[0], qr, kr)
    opt = _optional(("q_start", "kv_start"), present, rest)
    for name, t in opt.items():
        if t is not None:
            t = require_tensor_of(op, t, name, rank=1, kind=INT)
            require_same_dim(op, f"{name} and batch size + 1", t.shape[0] + 1, qr.shape[0], t, qr)
    return TensorType(q.dtype, [q.shape[0], q.shape[1], v.shape[2]], input_device(q, k, v))


def _ragged_impl(q, k, v, q_rows, kv_rows, *rest, mask, scale, window, present, max_q, max_kv):
    opt = dict(zip(present, rest))
    nb = q_rows.shape[0] - 1
    sq = min(max_q, q.shape[0]) if max_q else q.shape[0]
    sk = min(max_kv, k.shape[0]) if max_kv else k.shape[0]
    qo, ko = q_rows.astype(jnp.int32), kv_rows.astype(jnp.int32)
    q_start = opt.get("q_start", jnp.zeros((nb,), jnp.int32)).astype(jnp.int32)
    kv_start = opt.get("kv_start", jnp.zeros((nb,), jnp.int32)).astype(jnp.int32)
    # keys sit at kv_start + j, queries at q_start + i: only the difference matters
    seq = jnp.stack([qo[:-1], qo[1:] - qo[:-1], ko[:-1], ko[1:] - ko[:-1], q_start - kv_start])
    return _packed(q, k, v, seq, None, max_q=sq, max_kv=sk, mask=mask, scale=scale, window=window)


ragged_attention_p = register(OpDef("ragged_attention", rule=_ragged_rule, impl=_ragged_impl))


@front(ragged_attention_p)
def ragged_attention(
    q,
    k,
    v,
    input_row_offsets,
    *,
    mask: str = "causal",
    scale: float,
    window: int = -1,
    kv_row_offsets=None,
    q_start=None,
    kv_start=None,
    max_q_len: int = 0,
    max_kv_len: int = 0,
):
    """Attention over ragged ``[total_tokens, heads, dim]`` tensors.

    Sequence ``b`` has query rows ``input_row_offsets[b]:input_row_offsets[b+1]``
    and key/value rows from ``kv_row_offsets`` (default: the same offsets).
    Query ``i`` of sequence ``b`` is at position ``q_start[b] + i`` and key ``j`` at
    ``kv_start[b] + j`` (defaults 0). ``max_q_len``/``max_kv_len`` bound the
    per-sequence lengths (0: the total row count) to size the padded work.

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> q = Tensor(np.zeros((3, 1, 2), np.float32))  # [total_tokens, heads, dim]: equal scores
        >>> v = Tensor(np.array([[[10.0, 0.0]], [[20.0, 2.0]], [[30.0, 4.0]]], np.float32))
        >>> offsets = Tensor(np.array([0, 2, 3], np.uint32))  # sequences: rows 0-1 and row 2
        >>> ops.ragged_attention(q, q, v, offsets, mask="causal", scale=0.125)[:, 0]
        TensorType(dtype=float32, shape=[Dim(3), Dim(2)], device=cpu:0): [10.0, 0.0, 15.0, 1.0, 30.0, 4.0]
    """
    extra = {"q_start": q_start, "kv_start": kv_start}
    present = tuple(n for n, x in extra.items() if x is not None)
    kv_rows = input_row_offsets if kv_row_offsets is None else kv_row_offsets
    return bind(
        ragged_attention_p,
        q,
        k,
        v,
        input_row_offsets,
        kv_rows,
        *[extra[n] for n in present],
        mask=mask,
        scale=float(scale),
        window=int(window),
        present=present,
        max_q=int(max_q_len),
        max_kv=int(max_kv_len),
    )


# ─── paged cache addressing ───────────────────────────────────────────────


def _row_slots(blocks, lookup, row_offsets, start_pos, batch_offset, n_rows: int):
    """Page id and slot of each ragged row (page id = num_pages, out of range, for rows that write nothing)."""
    b, i, valid = ragged_rows(row_offsets, n_rows)
    b = b + batch_offset.astype(jnp.int32).reshape(())
    pos = start_pos.astype(jnp.int32)[b] + i
    page_size = blocks.shape[3]
    col = pos // page_size
    valid = valid & (col < lookup.shape[1]) & (b < lookup.shape[0])
    page = lookup.astype(jnp.int32)[jnp.clip(b, 0, lookup.shape[0] - 1), jnp.clip(col, 0, lookup.shape[1] - 1)]
    page = jnp.where(valid, page, blocks.shape[0])
    return page, pos % page_size, valid


def _paged_check(op: str, blocks, lookup, layer, row_offsets, start_pos, batch_offset=None):
    pool = _pool(op, blocks)
    lk = require_tensor_of(op, lookup, "lookup_table", rank=2, kind=INT)
    require_tensor_of(op, row_offsets, "input_row_offsets", rank=1, kind=INT)
    st = require_tensor_of(op, start_pos, "cache_lengths", rank=1, kind=INT)
    require_same_dim(op, "cache_lengths and lookup_table batch sizes", st.shape[0], lk.shape[0], st, lk)
    for name, t in (("layer_idx", layer), ("batch_offset", batch_offset)):
        if t is not None:
            t = require_tensor(op, t, name)
            if not t.dtype.is_integral() or any(d != 1 for d in t.shape):
                raise OpError(f"{op}: {name} must be an integer scalar, got {fmt(t)}")
    return pool


# ─── kv_cache_store / kv_cache_gather ─────────────────────────────────────


def _store_rule(blocks, x, lookup, layer, row_offsets, start_pos, batch_offset, *, kv_index: int):
    op = "kv_cache_store"
    pool = _paged_check(op, blocks, lookup, layer, row_offsets, start_pos, batch_offset)
    if not isinstance(blocks, BufferType):
        raise OpError(f"{op}: blocks must be a buffer (the KV cache is written in place), got {fmt(blocks)}")
    x = require_tensor_of(op, x, "x", rank=3, kind=FLOAT)
    if list(x.shape[1:]) != list(pool.shape[4:]):
        raise OpError(
            f"{op}: rows must be [n, n_kv_heads, head_dim] = [n, {pool.shape[4]}, {pool.shape[5]}], got {fmt(x)}"
        )
    if not 0 <= kv_index < int(pool.shape[1]):
        raise OpError(f"{op}: kv_index {kv_index} is out of range for a pool with kv_dim {pool.shape[1]}")
    return None


def _store_impl(blocks, x, lookup, layer, row_offsets, start_pos, batch_offset, *, kv_index: int):
    page, slot, _ = _row_slots(blocks, lookup, row_offsets, start_pos, batch_offset, x.shape[0])
    return (
        blocks.at[page, kv_index, layer.astype(jnp.int32).reshape(()), slot].set(x.astype(blocks.dtype), mode="drop"),
    )


kv_cache_store_p = register(
    OpDef("kv_cache_store", rule=_store_rule, impl=_store_impl, mutates=(0,), differentiable=False)
)


@front(kv_cache_store_p)
def kv_cache_store(
    blocks, x, lookup_table, layer_idx, input_row_offsets, start_positions, batch_offset, *, kv_index: int = 0
) -> None:
    """Write ragged rows ``x [n, n_kv_heads, head_dim]`` into the paged pool ``blocks`` (a buffer).

    Row ``i`` of sequence ``b`` goes to position ``start_positions[b + batch_offset] + i``
    of layer ``layer_idx``, K (``kv_index=0``) or V (1). Rows past the last
    offset, or past the pages in ``lookup_table``, are not written.

    Example:
        >>> import numpy as np
        >>> from maxfx.driver import Tensor
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
        >>> cpu, u32 = DeviceRef.CPU(), DType.uint32
        >>> pool = BufferType(DType.float32, [4, 2, 1, 2, 1, 2],
        ...     cpu)  # [pages, K|V, layers, page_size, kv_heads, head_dim]
        >>> lookup = np.array([[3, 1]], np.uint32)  # sequence 0: positions 0-1 on page 3, 2-3 on page 1
        >>> row_offsets = np.array([0, 2], np.uint32)  # one sequence of 2 new rows...
        >>> cached = np.array([1], np.uint32)  # ...after 1 cached token: positions 1 and 2
        >>> types = [pool, TensorType(DType.float32, [2, 1, 2], cpu), TensorType(u32, [1, 2], cpu), TensorType(u32, [2],
        ...     cpu), TensorType(u32, [1], cpu)]
        >>> with Graph("store", input_types=types) as g:
        ...     blocks, k, lookup_table, offsets, cache_lengths = g.inputs
        ...     zero = ops.constant(0, u32, cpu)
        ...     ops.kv_cache_store(blocks, k, lookup_table, zero, offsets, cache_lengths, zero, kv_index=0)
        ...     g.output()
        >>> cache = Tensor.from_numpy(np.zeros((4, 2, 1, 2, 1, 2), np.float32))
        >>> k_rows = np.array([[[1.0, 2.0]], [[3.0, 4.0]]], np.float32)
        >>> _ = InferenceSession().load(g).execute(cache, k_rows, lookup, row_offsets, cached)
        >>> c = cache.to_numpy()
        >>> c[3, 0, 0, 1, 0].tolist(), c[1, 0, 0, 0, 0].tolist()  # K at positions 1 and 2
        ([1.0, 2.0], [3.0, 4.0])
    """
    bind(
        kv_cache_store_p,
        blocks,
        x,
        lookup_table,
        layer_idx,
        input_row_offsets,
        start_positions,
        batch_offset,
        kv_index=int(kv_index),
    )


def _gather_rule(blocks, lookup, layer, row_offsets, start_pos, batch_offset, *, kv_index: int, n_rows: Dim):
    op = "kv_cache_gather"
    pool = _paged_check(op, blocks, lookup, layer, row_offsets, start_pos, batch_offset)
    if not 0 <= kv_index < int(pool.shape[1]):
        raise OpError(f"{op}: kv_index {kv_index} is out of range for a pool with kv_dim {pool.shape[1]}")
    return TensorType(pool.dtype, [n_rows, pool.shape[4], pool.shape[5]], pool.device)


def _gather_impl(blocks, lookup, layer, row_offsets, start_pos, batch_offset, *, kv_index: int, n_rows: int):
    page, slot, valid = _row_slots(blocks, lookup, row_offsets, start_pos, batch_offset, n_rows)
    rows = blocks[jnp.clip(page, 0, blocks.shape[0] - 1), kv_index, layer.astype(jnp.int32).reshape(()), slot]
    return jnp.where(valid[:, None, None], rows, jnp.zeros((), blocks.dtype))


kv_cache_gather_p = register(OpDef("kv_cache_gather", rule=_gather_rule, impl=_gather_impl, differentiable=False))


@front(kv_cache_gather_p)
def kv_cache_gather(
    blocks, lookup_table, layer_idx, input_row_offsets, start_positions, batch_offset, *, n_rows, kv_index: int = 0
):
    """Read ragged rows ``[n_rows, n_kv_heads, head_dim]`` from the paged pool (the inverse of `kv_cache_store`).

    Rows past the last offset read as zeros.

    Example:
        >>> import numpy as np
        >>> from maxfx.driver import Tensor
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
        >>> cpu, u32 = DeviceRef.CPU(), DType.uint32
        >>> pool = BufferType(DType.float32, [4, 2, 1, 2, 1, 2],
        ...     cpu)  # [pages, K|V, layers, page_size, kv_heads, head_dim]
        >>> lookup = np.array([[3, 1]], np.uint32)  # sequence 0: positions 0-1 on page 3, 2-3 on page 1
        >>> row_offsets = np.array([0, 2], np.uint32)  # one sequence of 2 new rows...
        >>> cached = np.array([1], np.uint32)  # ...after 1 cached token: positions 1 and 2
        >>> types = [pool, TensorType(u32, [1, 2], cpu), TensorType(u32, [2], cpu), TensorType(u32, [1], cpu)]
        >>> with Graph("gather", input_types=types) as g:
        ...     blocks, lookup_table, offsets, cache_lengths = g.inputs
        ...     zero = ops.constant(0, u32, cpu)
        ...     g.output(ops.kv_cache_gather(blocks, lookup_table, zero, offsets, cache_lengths, zero, n_rows=3,
        ...     kv_index=1))
        >>> c = np.zeros((4, 2, 1, 2, 1, 2), np.float32)
        >>> c[3, 1, 0, 1, 0] = [5.0, 6.0]  # V at position 1
        >>> c[1, 1, 0, 0, 0] = [7.0, 8.0]  # V at position 2
        >>> rows = InferenceSession().load(g).execute(Tensor.from_numpy(c), lookup, row_offsets, cached)[0]
        >>> rows.to_numpy()[:, 0].tolist()  # row 2 is past the last offset: zeros
        [[5.0, 6.0], [7.0, 8.0], [0.0, 0.0]]
    """
    return bind(
        kv_cache_gather_p,
        blocks,
        lookup_table,
        layer_idx,
        input_row_offsets,
        start_positions,
        batch_offset,
        kv_index=int(kv_index),
        n_rows=Dim(n_rows),
    )


# ─── paged_attention ──────────────────────────────────────────────────────


def _paged_rule(q, blocks, lookup, layer, row_offsets, cache_lengths, *rest, mask, scale, window, present, v_dim):
    op = "paged_attention"
    pool = _paged_check(op, blocks, lookup, layer, row_offsets, cache_lengths)
    q = require_tensor_of(op, q, "input", rank=3, kind=FLOAT)
    _check_mask(op, mask, window)
    if q.shape[2] != pool.shape[5]:
        raise OpError(
            f"{op}: input head_dim {q.shape[2]} does not match the cache's head_dim {pool.shape[5]} ({fmt(q)} vs "
            f"{fmt(pool)})"
        )
    _check_heads(op, q, pool, q.shape[1], pool.shape[4])
    if v_dim is None and int(pool.shape[1]) != 2:
        raise OpError(
            f"{op}: a cache with kv_dim {pool.shape[1]} holds no values; pass v_dim (MLA: values are the first v_dim "
            "latent dims)"
        )
    opt = _optional(("kv_row_offsets", "sink"), present, rest)
    if opt["kv_row_offsets"] is not None:
        t = require_tensor_of(op, opt["kv_row_offsets"], "kv_row_offsets", rank=1, kind=INT)
        require_same_dim(
            op, "kv_row_offsets and input_row_offsets sizes", t.shape[0], row_offsets.shape[0], t, row_offsets
        )
    if opt["sink"] is not None:
        t = require_tensor_of(op, opt["sink"], "sink_weights", rank=1, kind=FLOAT)
        require_same_dim(op, "sink weights and query heads", t.shape[0], q.shape[1], t, q)
    dv = pool.shape[5] if v_dim is None else Dim(v_dim)
    return TensorType(q.dtype, [q.shape[0], q.shape[1], dv], input_device(q, pool))


def _paged_impl(q, blocks, lookup, layer, row_offsets, cache_lengths, *rest, mask, scale, window, present, v_dim):
    opt = dict(zip(present, rest))
    return att.paged_attention_pool(
        q,
        blocks,
        layer,
        lookup,
        row_offsets,
        cache_lengths,
        kv_row_offsets=opt.get("kv_row_offsets"),
        sinks=opt.get("sink"),
        v_dim=v_dim,
        scale=scale,
        **_mask_args(mask, window),
    )


paged_attention_p = register(OpDef("paged_attention", rule=_paged_rule, impl=_paged_impl))


@front(paged_attention_p)
def paged_attention(
    q,
    blocks,
    lookup_table,
    layer_idx,
    input_row_offsets,
    cache_lengths,
    *,
    mask: str = "causal",
    scale: float,
    window: int = -1,
    kv_row_offsets=None,
    sink_weights=None,
    v_dim: int | None = None,
):
    """Attention of ragged queries ``[total_tokens, n_heads, head_dim]`` over a paged KV cache.

    Query ``i`` of sequence ``b`` is at position ``cache_lengths[b] + i``; the
    sequence's keys are its cache positions ``< cache_lengths[b] + seq_len[b]``
    (the new rows must already be stored); with ``kv_row_offsets`` (cross
    attention) the keys are positions ``< kv_row_offsets[b+1] - kv_row_offsets[b]``.
    ``v_dim`` reads values as the first ``v_dim`` dims of the keys (MLA's latent cache).

    Example:
        >>> import numpy as np
        >>> from maxfx.driver import Tensor
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
        >>> cpu, u32 = DeviceRef.CPU(), DType.uint32
        >>> pool = BufferType(DType.float32, [4, 2, 1, 2, 1, 2],
        ...     cpu)  # [pages, K|V, layers, page_size, kv_heads, head_dim]
        >>> lookup = np.array([[3, 1]], np.uint32)  # sequence 0: positions 0-1 on page 3, 2-3 on page 1
        >>> row_offsets = np.array([0, 2], np.uint32)  # one sequence of 2 new rows...
        >>> cached = np.array([1], np.uint32)  # ...after 1 cached token: positions 1 and 2
        >>> types = [pool, TensorType(DType.float32, [2, 1, 2], cpu), TensorType(u32, [1, 2], cpu), TensorType(u32, [2],
        ...     cpu), TensorType(u32, [1], cpu)]
        >>> with Graph("attend", input_types=types) as g:
        ...     blocks, q, lookup_table, offsets, cache_lengths = g.inputs
        ...     layer = ops.constant(0, u32, cpu)
        ...     g.output(ops.paged_attention(q, blocks, lookup_table, layer, offsets, cache_lengths, scale=0.125))
        >>> c = np.zeros((4, 2, 1, 2, 1, 2), np.float32)  # zero keys: equal scores
        >>> c[3, 1, 0, :, 0] = [[0.0, 0.0], [3.0, 3.0]]  # V at positions 0 and 1
        >>> c[1, 1, 0, 0, 0] = [6.0, 9.0]  # V at position 2 (a new row, already stored)
        >>> q = np.zeros((2, 1, 2), np.float32)
        >>> out = InferenceSession().load(g).execute(Tensor.from_numpy(c), q, lookup, row_offsets, cached)[0]
        >>> out.to_numpy()[:, 0].tolist()  # means of V[0:2] and V[0:3]
        [[1.5, 1.5], [3.0, 4.0]]
    """
    extra = {"kv_row_offsets": kv_row_offsets, "sink": sink_weights}
    present = tuple(n for n, x in extra.items() if x is not None)
    return bind(
        paged_attention_p,
        q,
        blocks,
        lookup_table,
        layer_idx,
        input_row_offsets,
        cache_lengths,
        *[extra[n] for n in present],
        mask=mask,
        scale=float(scale),
        window=int(window),
        present=present,
        v_dim=None if v_dim is None else int(v_dim),
    )


# ─── paged_cache_attention (the generation engine's) ────────────────────


def _paged_cache_rule(q, k_pages, v_pages, pages, q_offset, *, mask: str, scale: float, window: int):
    op = "paged_cache_attention"
    q, k, v = _check_qkv(op, q, k_pages, v_pages, 4, mask, window)
    if mask not in ("causal", "sliding_window"):
        raise OpError(f"{op}: mask must be 'causal' or 'sliding_window' (self-attention over a cache), got {mask!r}")
    require_same_dim(op, "page counts of k_pages and v_pages", k.shape[0], v.shape[0], k, v)
    require_same_dim(op, "page sizes of k_pages and v_pages", k.shape[1], v.shape[1], k, v)
    _check_qkv_heads(op, q, k, v)
    table = require_tensor_of(op, pages, "pages", rank=2, kind=INT)
    offset = require_tensor_of(op, q_offset, "q_offset", rank=1, kind=INT)
    require_same_dim(op, "pages and query batch sizes", table.shape[0], q.shape[0], table, q)
    require_same_dim(op, "q_offset and query batch sizes", offset.shape[0], q.shape[0], offset, q)
    return TensorType(q.dtype, [q.shape[0], q.shape[1], q.shape[2], v.shape[3]], input_device(q, k, v))


def _paged_cache_impl(q, k_pages, v_pages, pages, q_offset, *, mask, scale, window):
    # The pools stay in their stored dtype (a float16 KV cache is read as it is; converting it here would copy it
    # whole).
    first = q_offset.astype(jnp.int32)
    table = jnp.clip(pages.astype(jnp.int32), 0, k_pages.shape[0] - 1)
    masks = _mask_args(mask, window)
    if q.shape[1] == 1:  # decode: the query at position q_offset is the last of its q_offset + 1 keys
        return att.paged_decode_attention(q, k_pages, v_pages, table, first + 1, scale=scale, **masks)
    # Prefill chunks: the rows' pages as dense windows, then the (flash) attention of queries at q_offset + i.
    b, w = table.shape
    dense = lambda x: _like(q, x[table].reshape(b, w * x.shape[1], *x.shape[2:]))  # noqa: E731
    return att.flash_attention(q, dense(k_pages), dense(v_pages), scale=scale, q_offset=first, **masks)


paged_cache_attention_p = register(
    OpDef("paged_cache_attention", rule=_paged_cache_rule, impl=_paged_cache_impl, differentiable=False)
)
"""Self-attention of ``q [B, T, H, D]`` over a paged KV cache, the generation engine's (not a MAX op; no front).

Operands ``(q, k_pages, v_pages, pages, q_offset)``: ``k_pages [P, page_size, Hkv, D]``
and ``v_pages [P, page_size, Hkv, Dv]`` are the layer's pools, ``pages int [B, W]``
each row's pages in order (position ``s`` of row ``b`` in page ``pages[b, s // page_size]``,
slot ``s % page_size``), ``q_offset int [B]`` each row's first query position.
Query ``i`` of row ``b`` sits at position ``q_offset[b] + i`` and sees the keys at
positions up to its own (``mask="causal"``), within the last ``window`` positions
(``"sliding_window"``); the new tokens' keys must be stored first. Returns
``[B, T, H, Dv]``. One query per row (decode) runs
`custom_calls.attention.dispatch.paged_decode_attention`, which reads the pages in
place (the Pallas kernel on GPU, the C++ kernel on CPU); longer chunks gather
their pages and run `flash_attention`. Inference only (``differentiable=False``).
"""


# ─── rope_ragged ──────────────────────────────────────────────────────────


def _rope_rule(x, freqs, row_offsets, start_pos, *rest, interleaved: bool, mrope_section):
    op = "rope_ragged"
    x, f = (
        require_tensor_of(op, x, "input", rank=3, kind=FLOAT),
        require_tensor_of(op, freqs, "freqs_cis", rank=2, kind=FLOAT),
    )
    d = f.shape[1]
    if isinstance(d, StaticDim) and d.dim % 2:
        raise OpError(f"{op}: freqs_cis must be [max_seq_len, head_dim] with an even head_dim, got {fmt(f)}")
    if x.shape[2] != d:
        raise OpError(f"{op}: input head_dim {x.shape[2]} does not match freqs_cis head_dim {d} ({fmt(x)} vs {fmt(f)})")
    require_tensor_of(op, row_offsets, "input_row_offsets", rank=1, kind=INT)
    require_tensor_of(op, start_pos, "start_positions", rank=1, kind=INT)
    if rest:
        p = require_tensor(op, rest[0], "position_ids")
        want = 1 if mrope_section is None else 2
        if not p.dtype.is_integral() or p.rank != want or p.shape[-1] != x.shape[0]:
            raise OpError(
                f"{op}: position_ids must be an integer tensor [{'sections, ' if want == 2 else ''}{x.shape[0]}], got "
                f"{fmt(p)}"
            )
        if mrope_section is not None and isinstance(d, StaticDim) and sum(mrope_section) != d.dim // 2:
            raise OpError(f"{op}: mrope_section {list(mrope_section)} must sum to head_dim // 2 = {d.dim // 2}")
    return TensorType(x.dtype, x.shape, x.device)


def apply_rope(x, cos, sin, interleaved: bool):
    """Rotate pairs of ``x [..., D]`` by angles with ``cos``/``sin [..., D/2]`` (float32 math;
    `lowering.rope_math.rotate_pairs`).
    """
    return rotate_pairs(x, cos, sin, interleaved=interleaved, xp=JAX_ARRAYS)


def _rope_impl(x, freqs, row_offsets, start_pos, *rest, interleaved: bool, mrope_section):
    t = x.shape[0]
    f = freqs.astype(jnp.float32).reshape(freqs.shape[0], -1, 2)
    if rest:
        pos = rest[0].astype(jnp.int32)
    else:
        b, i, valid = ragged_rows(row_offsets, t)
        pos = jnp.where(valid, start_pos.astype(jnp.int32)[b] + i, 0)
    if mrope_section is not None:
        # Each frequency band takes its position from its section's axis (Qwen2-VL's M-RoPE).
        axis = np.repeat(np.arange(len(mrope_section)), mrope_section)
        cs = f[pos[axis, :].T, np.arange(f.shape[1])[None, :]]  # [T, D/2, 2]
    else:
        cs = f[pos]
    cos, sin = cs[..., 0][:, None, :], cs[..., 1][:, None, :]
    return apply_rope(x, cos, sin, interleaved)


rope_ragged_p = register(OpDef("rope_ragged", rule=_rope_rule, impl=_rope_impl))


@front(rope_ragged_p)
def rope_ragged(
    x, freqs_cis, input_row_offsets, start_positions, *, interleaved: bool = True, position_ids=None, mrope_section=None
):
    """Rotary position embedding of ragged rows ``x [total_tokens, heads, head_dim]``.

    ``freqs_cis [max_seq_len, head_dim]`` holds ``(cos, sin)`` pairs per
    frequency. Row ``i`` of sequence ``b`` is at position ``start_positions[b] + i``
    unless ``position_ids`` gives positions (``[sections, total_tokens]`` with
    ``mrope_section``). ``interleaved`` rotates pairs ``(2i, 2i+1)``, otherwise
    ``(i, i + head_dim/2)``.

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> freqs_cis = Tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0,
        ...     -1.0]])  # (cos, sin): 90 degrees per position
        >>> x = Tensor(np.array([[[1.0, 0.0]], [[1.0, 0.0]]], np.float32))  # [tokens, heads, head_dim]
        >>> offsets = Tensor(np.array([0, 2], np.uint32))
        >>> start = Tensor(np.array([1], np.uint32))  # the sequence starts at position 1
        >>> ops.rope_ragged(x, freqs_cis, offsets, start)[:, 0]  # rotated by 90 and 180 degrees
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [0.0, 1.0, -1.0, 0.0]
    """
    section = None if mrope_section is None else tuple(int(s) for s in mrope_section)
    extra = () if position_ids is None else (position_ids,)
    return bind(
        rope_ragged_p,
        x,
        freqs_cis,
        input_row_offsets,
        start_positions,
        *extra,
        interleaved=bool(interleaved),
        mrope_section=section,
    )
