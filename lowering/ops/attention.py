"""Attention and paged KV-cache ops.

All attention math lives in one function, `attention_reference`: masked
``softmax(Q Kᵀ · scale) V`` over a padded batch ``[batch, seq, heads, dim]``
with float32 accumulation, grouped-query heads (``n_heads`` a multiple of
``n_kv_heads``), per-sequence query offsets (the position of the first query
in the key sequence, i.e. the cache length) and key lengths. The ops
``attention`` (padded), ``ragged_attention`` (ragged q/k/v) and
``paged_attention`` (ragged q, K/V read from a paged cache) only move data
into that layout and back; a Pallas kernel can replace `attention_reference`
under all three.

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

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.context import bind
from lowering.dims import Dim, StaticDim
from lowering.ops._rules import OpError, fmt, require_tensor, same_device
from lowering.registry import OpDef, front, register
from lowering.types import BufferType, TensorType, Type

__all__ = [
    "MASKS",
    "attention",
    "attention_reference",
    "kv_cache_gather",
    "kv_cache_store",
    "paged_attention",
    "ragged_attention",
    "rope_ragged",
]

MASKS = ("null", "causal", "sliding_window", "chunked", "causal_alibi")
_HIGHEST = jax.lax.Precision.HIGHEST


# ─── the attention math ───────────────────────────────────────────────────


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi head slopes (Press et al.): ``2^(-8 i / n)`` for the nearest power of two, interleaved beyond it."""
    n = 2 ** math.floor(math.log2(n_heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    if n < n_heads:
        extra = [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(n_heads - n)]
        slopes += extra
    return np.asarray(slopes, np.float32)


def _mask(mask: str, window: int, q_pos, k_pos, kv_length):
    """Boolean ``[batch, Sq, Sk]``: key ``k_pos`` visible from query ``q_pos``."""
    visible = k_pos[None, None, :] < kv_length[:, None, None]
    if mask == "null":
        return visible
    causal = k_pos[None, None, :] <= q_pos[:, :, None]
    visible = visible & causal
    if mask == "sliding_window":
        visible = visible & (k_pos[None, None, :] > q_pos[:, :, None] - window)
    elif mask == "chunked":
        visible = visible & (k_pos[None, None, :] // window == q_pos[:, :, None] // window)
    return visible


def attention_reference(q, k, v, q_offset, kv_length, sink=None, *, mask: str, scale: float, window: int = -1, return_stats: bool = False):
    """Masked softmax attention over padded sequences (float32 accumulation).

    Args:
        q: ``[batch, Sq, n_heads, D]``; query ``i`` of sequence ``b`` is at
            position ``q_offset[b] + i``.
        k: ``[batch, Sk, n_kv_heads, D]``; key ``j`` is at position ``j`` and
            exists when ``j < kv_length[b]``.
        v: ``[batch, Sk, n_kv_heads, Dv]``.
        q_offset, kv_length: integer ``[batch]``.
        sink: optional ``[n_heads]`` logits of an extra "sink" key with a zero value.
        mask: one of `MASKS`; ``window`` sizes the sliding/chunked masks.
        return_stats: also return ``[batch, Sq, n_heads, 2]`` softmax stats
            (row max, row sum of ``exp(s - max)``) for merging partial results.

    Returns:
        ``[batch, Sq, n_heads, Dv]`` in ``q``'s dtype; rows with no visible key are 0.
    """
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    qf = q.astype(jnp.float32).reshape(b, sq, hkv, group, d)
    s = jnp.einsum("bqhgd,bkhd->bhgqk", qf, k.astype(jnp.float32), precision=_HIGHEST) * jnp.float32(scale)
    q_pos = q_offset.astype(jnp.int32)[:, None] + jnp.arange(sq, dtype=jnp.int32)[None, :]
    k_pos = jnp.arange(sk, dtype=jnp.int32)
    if mask == "causal_alibi":
        slopes = jnp.asarray(alibi_slopes(hq)).reshape(hkv, group)
        rel = (k_pos[None, None, :] - q_pos[:, :, None]).astype(jnp.float32)  # [b, sq, sk], <= 0 where visible
        s = s + slopes[None, :, :, None, None] * rel[:, None, None]
    visible = _mask(mask, window, q_pos, k_pos, kv_length.astype(jnp.int32))
    s = jnp.where(visible[:, None, None], s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    if sink is not None:
        sink_l = sink.astype(jnp.float32).reshape(1, hkv, group, 1, 1)
        m = jnp.maximum(m, sink_l)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    if sink is not None:
        denom = denom + jnp.exp(sink_l - m)
    o = jnp.einsum("bhgqk,bkhd->bqhgd", p, v.astype(jnp.float32), precision=_HIGHEST)
    dn = jnp.moveaxis(denom[..., 0], 3, 1)[..., None]  # [b, sq, hkv, group, 1]
    o = jnp.where(dn > 0, o / jnp.where(dn > 0, dn, 1.0), 0.0)
    out = o.reshape(b, sq, hq, v.shape[-1]).astype(q.dtype)
    if not return_stats:
        return out
    stats = jnp.stack([jnp.moveaxis(m[..., 0], 3, 1), jnp.moveaxis(denom[..., 0], 3, 1)], axis=-1).reshape(b, sq, hq, 2)
    return out, stats


# ─── ragged ↔ padded ──────────────────────────────────────────────────────


def _offsets(row_offsets):
    return row_offsets.astype(jnp.int32)


def _row_batch(row_offsets, n_rows: int):
    """For each row ``t < n_rows``: its sequence ``b``, index in the sequence, and validity."""
    offs = _offsets(row_offsets)
    t = jnp.arange(n_rows, dtype=jnp.int32)
    nb = offs.shape[0] - 1
    b = jnp.clip(jnp.searchsorted(offs[1:], t, side="right"), 0, max(nb - 1, 0)).astype(jnp.int32)
    valid = t < offs[-1]
    return b, t - offs[b], valid


def _to_padded(x, row_offsets, s: int):
    """``[T, ...]`` ragged rows → ``[batch, s, ...]`` (zeros past each length)."""
    offs = _offsets(row_offsets)
    lens = offs[1:] - offs[:-1]
    pos = jnp.arange(s, dtype=jnp.int32)
    idx = offs[:-1, None] + pos[None, :]
    out = jnp.take(x, jnp.clip(idx, 0, x.shape[0] - 1), axis=0)
    valid = (pos[None, :] < lens[:, None]).reshape(idx.shape + (1,) * (x.ndim - 1))
    return jnp.where(valid, out, jnp.zeros((), x.dtype))


def _to_ragged(y, row_offsets, n_rows: int):
    """``[batch, s, ...]`` → ``[n_rows, ...]`` ragged rows (padding rows are 0)."""
    b, i, valid = _row_batch(row_offsets, n_rows)
    out = y[b, jnp.clip(i, 0, y.shape[1] - 1)]
    return jnp.where(valid.reshape((-1,) + (1,) * (out.ndim - 1)), out, jnp.zeros((), y.dtype))


# ─── rule helpers ─────────────────────────────────────────────────────────


def _float(op: str, t: Type, name: str, rank: int) -> TensorType:
    t = require_tensor(op, t, name)
    if not t.dtype.is_float() or t.rank != rank:
        raise OpError(f"{op}: {name} must be a rank-{rank} floating-point tensor, got {fmt(t)}")
    return t


def _ints(op: str, t: Type, name: str, rank: int) -> TensorType:
    t = require_tensor(op, t, name)
    if not t.dtype.is_integral() or t.rank != rank:
        raise OpError(f"{op}: {name} must be a rank-{rank} integer tensor, got {fmt(t)}")
    return t


def _same(op: str, what: str, a: Dim, b: Dim, ta: Type, tb: Type) -> None:
    # Symbolic dims may be bound to equal sizes at run time: only provable mismatches are errors here.
    if a != b and (isinstance(a, StaticDim) and isinstance(b, StaticDim) or not isinstance(a, StaticDim) and not isinstance(b, StaticDim) and str(a) == str(b)):
        raise OpError(f"{op}: {what} differ: {a} vs {b} ({fmt(ta)} and {fmt(tb)})")


def _check_heads(op: str, q: TensorType, k: TensorType, hq: Dim, hkv: Dim) -> None:
    if isinstance(hq, StaticDim) and isinstance(hkv, StaticDim) and (hkv.dim == 0 or hq.dim % hkv.dim):
        raise OpError(f"{op}: query heads ({hq}) must be a multiple of key/value heads ({hkv}) for grouped-query attention ({fmt(q)} vs {fmt(k)})")


def _check_mask(op: str, mask: str, window: int) -> None:
    if mask not in MASKS:
        raise OpError(f"{op}: mask must be one of {MASKS}, got {mask!r}")
    if mask in ("sliding_window", "chunked") and window <= 0:
        raise OpError(f"{op}: mask {mask!r} needs a positive window size, got {window}")


def _pool(op: str, t: Type) -> Type:
    if not isinstance(t, (TensorType, BufferType)) or t.rank != 6 or not t.dtype.is_float():
        raise OpError(f"{op}: blocks must be a rank-6 float pool [num_pages, kv_dim, num_layers, page_size, n_kv_heads, head_dim], got {fmt(t)}")
    return t


def _optional(names: Sequence[str], present: Sequence[str], types: Sequence[Type]) -> dict[str, Type | None]:
    it = iter(types)
    return {n: (next(it) if n in present else None) for n in names}


# ─── attention (padded) ───────────────────────────────────────────────────


def _attention_rule(q, k, v, *rest, mask: str, scale: float, window: int, present: tuple[str, ...]):
    op = "attention"
    q, k, v = _float(op, q, "q", 4), _float(op, k, "k", 4), _float(op, v, "v", 4)
    _check_mask(op, mask, window)
    _same(op, "batch sizes", q.shape[0], k.shape[0], q, k)
    _same(op, "key and value lengths", k.shape[1], v.shape[1], k, v)
    _same(op, "key and value heads", k.shape[2], v.shape[2], k, v)
    _same(op, "query and key head dims", q.shape[3], k.shape[3], q, k)
    _check_heads(op, q, k, q.shape[2], k.shape[2])
    opt = _optional(("q_offset", "kv_length", "sink"), present, rest)
    for name in ("q_offset", "kv_length"):
        if opt[name] is not None:
            t = _ints(op, opt[name], name, 1)
            _same(op, f"{name} and batch sizes", t.shape[0], q.shape[0], t, q)
    if opt["sink"] is not None:
        t = _float(op, opt["sink"], "sink_weights", 1)
        _same(op, "sink weights and query heads", t.shape[0], q.shape[2], t, q)
    return TensorType(q.dtype, [q.shape[0], q.shape[1], q.shape[2], v.shape[3]], same_device(op, q, k, v))


def _attention_impl(q, k, v, *rest, mask, scale, window, present):
    opt = dict(zip(present, rest))
    b = q.shape[0]
    q_offset = opt.get("q_offset", jnp.zeros((b,), jnp.int32))
    kv_length = opt.get("kv_length", jnp.full((b,), k.shape[1], jnp.int32))
    return attention_reference(q, k, v, q_offset, kv_length, opt.get("sink"), mask=mask, scale=scale, window=window)


attention_p = register(OpDef("attention", rule=_attention_rule, impl=_attention_impl))


@front(attention_p)
def attention(q, k, v, *, mask: str = "causal", scale: float, window: int = -1, q_offset=None, kv_length=None, sink_weights=None):
    """Masked softmax attention over padded ``[batch, seq, heads, dim]`` tensors.

    ``k``/``v`` may have fewer heads than ``q`` (grouped-query attention).
    Query ``i`` sits at position ``q_offset[b] + i`` (default 0); keys at or past
    ``kv_length[b]`` (default: all) are ignored.

    Example:
        >>> out = ops.attention(q, k, v, mask="causal", scale=0.125)  # doctest: +SKIP
    """
    extra = {"q_offset": q_offset, "kv_length": kv_length, "sink": sink_weights}
    present = tuple(n for n, x in extra.items() if x is not None)
    return bind(attention_p, q, k, v, *[extra[n] for n in present], mask=mask, scale=float(scale), window=int(window), present=present)


# ─── ragged_attention ─────────────────────────────────────────────────────


def _ragged_rule(q, k, v, q_rows, kv_rows, *rest, mask, scale, window, present, max_q, max_kv):
    op = "ragged_attention"
    q, k, v = _float(op, q, "q", 3), _float(op, k, "k", 3), _float(op, v, "v", 3)
    _check_mask(op, mask, window)
    _same(op, "key and value rows", k.shape[0], v.shape[0], k, v)
    _same(op, "key and value heads", k.shape[1], v.shape[1], k, v)
    _same(op, "query and key head dims", q.shape[2], k.shape[2], q, k)
    _check_heads(op, q, k, q.shape[1], k.shape[1])
    qr, kr = _ints(op, q_rows, "input_row_offsets", 1), _ints(op, kv_rows, "kv_row_offsets", 1)
    _same(op, "query and key/value batch sizes (row offsets)", qr.shape[0], kr.shape[0], qr, kr)
    opt = _optional(("q_start", "kv_start"), present, rest)
    for name, t in opt.items():
        if t is not None:
            t = _ints(op, t, name, 1)
            _same(op, f"{name} and batch size + 1", t.shape[0] + 1, qr.shape[0], t, qr)
    return TensorType(q.dtype, [q.shape[0], q.shape[1], v.shape[2]], same_device(op, q, k, v))


def _ragged_impl(q, k, v, q_rows, kv_rows, *rest, mask, scale, window, present, max_q, max_kv):
    opt = dict(zip(present, rest))
    nb = q_rows.shape[0] - 1
    sq = min(max_q, q.shape[0]) if max_q else q.shape[0]
    sk = min(max_kv, k.shape[0]) if max_kv else k.shape[0]
    qo, ko = _offsets(q_rows), _offsets(kv_rows)
    q_start = opt.get("q_start", jnp.zeros((nb,), jnp.int32)).astype(jnp.int32)
    kv_start = opt.get("kv_start", jnp.zeros((nb,), jnp.int32)).astype(jnp.int32)
    out = attention_reference(
        _to_padded(q, qo, sq), _to_padded(k, ko, sk), _to_padded(v, ko, sk), q_start - kv_start, ko[1:] - ko[:-1], mask=mask, scale=scale, window=window
    )
    return _to_ragged(out, qo, q.shape[0])


ragged_attention_p = register(OpDef("ragged_attention", rule=_ragged_rule, impl=_ragged_impl))


@front(ragged_attention_p)
def ragged_attention(q, k, v, input_row_offsets, *, mask: str = "causal", scale: float, window: int = -1, kv_row_offsets=None, q_start=None, kv_start=None, max_q_len: int = 0, max_kv_len: int = 0):
    """Attention over ragged ``[total_tokens, heads, dim]`` tensors.

    Sequence ``b`` has query rows ``input_row_offsets[b]:input_row_offsets[b+1]``
    and key/value rows from ``kv_row_offsets`` (default: the same offsets).
    Query ``i`` of sequence ``b`` is at position ``q_start[b] + i`` and key ``j`` at
    ``kv_start[b] + j`` (defaults 0). ``max_q_len``/``max_kv_len`` bound the
    per-sequence lengths (0: the total row count) to size the padded work.

    Example:
        >>> out = ops.ragged_attention(q, k, v, offsets, mask="causal", scale=0.125)  # doctest: +SKIP
    """
    extra = {"q_start": q_start, "kv_start": kv_start}
    present = tuple(n for n, x in extra.items() if x is not None)
    kv_rows = input_row_offsets if kv_row_offsets is None else kv_row_offsets
    return bind(
        ragged_attention_p, q, k, v, input_row_offsets, kv_rows, *[extra[n] for n in present],
        mask=mask, scale=float(scale), window=int(window), present=present, max_q=int(max_q_len), max_kv=int(max_kv_len),
    )  # fmt: skip


# ─── paged cache addressing ───────────────────────────────────────────────


def _pool_layer(blocks, lookup, layer, kv_index: int):
    """``[batch, max_pages * page_size, n_kv_heads, head_dim]``: every cached row of one layer."""
    g = blocks[lookup.astype(jnp.int32), kv_index, layer.astype(jnp.int32).reshape(())]  # [B, P, page, H, D]
    b, p, page = g.shape[:3]
    return g.reshape(b, p * page, *g.shape[3:])


def _row_slots(blocks, lookup, row_offsets, start_pos, batch_offset, n_rows: int):
    """Page id and slot of each ragged row (page id = num_pages, out of range, for rows that write nothing)."""
    b, i, valid = _row_batch(row_offsets, n_rows)
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
    lk = _ints(op, lookup, "lookup_table", 2)
    _ints(op, row_offsets, "input_row_offsets", 1)
    st = _ints(op, start_pos, "cache_lengths", 1)
    _same(op, "cache_lengths and lookup_table batch sizes", st.shape[0], lk.shape[0], st, lk)
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
    x = _float(op, x, "x", 3)
    if list(x.shape[1:]) != list(pool.shape[4:]):
        raise OpError(f"{op}: rows must be [n, n_kv_heads, head_dim] = [n, {pool.shape[4]}, {pool.shape[5]}], got {fmt(x)}")
    if not 0 <= kv_index < int(pool.shape[1]):
        raise OpError(f"{op}: kv_index {kv_index} is out of range for a pool with kv_dim {pool.shape[1]}")
    return None


def _store_impl(blocks, x, lookup, layer, row_offsets, start_pos, batch_offset, *, kv_index: int):
    page, slot, _ = _row_slots(blocks, lookup, row_offsets, start_pos, batch_offset, x.shape[0])
    return (blocks.at[page, kv_index, layer.astype(jnp.int32).reshape(()), slot].set(x.astype(blocks.dtype), mode="drop"),)


kv_cache_store_p = register(OpDef("kv_cache_store", rule=_store_rule, impl=_store_impl, mutates=(0,), differentiable=False))


@front(kv_cache_store_p)
def kv_cache_store(blocks, x, lookup_table, layer_idx, input_row_offsets, start_positions, batch_offset, *, kv_index: int = 0) -> None:
    """Write ragged rows ``x [n, n_kv_heads, head_dim]`` into the paged pool ``blocks`` (a buffer).

    Row ``i`` of sequence ``b`` goes to position ``start_positions[b + batch_offset] + i``
    of layer ``layer_idx``, K (``kv_index=0``) or V (1). Rows past the last
    offset, or past the pages in ``lookup_table``, are not written.

    Example:
        >>> ops.kv_cache_store(blocks, k, lookup, layer, offsets, cache_lengths, zero, kv_index=0)  # doctest: +SKIP
    """
    bind(kv_cache_store_p, blocks, x, lookup_table, layer_idx, input_row_offsets, start_positions, batch_offset, kv_index=int(kv_index))


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
def kv_cache_gather(blocks, lookup_table, layer_idx, input_row_offsets, start_positions, batch_offset, *, n_rows, kv_index: int = 0):
    """Read ragged rows ``[n_rows, n_kv_heads, head_dim]`` from the paged pool (the inverse of `kv_cache_store`).

    Rows past the last offset read as zeros.

    Example:
        >>> k_new = ops.kv_cache_gather(blocks, lookup, layer, offsets, cache_lengths, zero, n_rows=x.shape[0])  # doctest: +SKIP
    """
    return bind(kv_cache_gather_p, blocks, lookup_table, layer_idx, input_row_offsets, start_positions, batch_offset, kv_index=int(kv_index), n_rows=Dim(n_rows))


# ─── paged_attention ──────────────────────────────────────────────────────


def _paged_rule(q, blocks, lookup, layer, row_offsets, cache_lengths, *rest, mask, scale, window, present, v_dim):
    op = "paged_attention"
    pool = _paged_check(op, blocks, lookup, layer, row_offsets, cache_lengths)
    q = _float(op, q, "input", 3)
    _check_mask(op, mask, window)
    if q.shape[2] != pool.shape[5]:
        raise OpError(f"{op}: input head_dim {q.shape[2]} does not match the cache's head_dim {pool.shape[5]} ({fmt(q)} vs {fmt(pool)})")
    _check_heads(op, q, pool, q.shape[1], pool.shape[4])
    if v_dim is None and int(pool.shape[1]) != 2:
        raise OpError(f"{op}: a cache with kv_dim {pool.shape[1]} holds no values; pass v_dim (MLA: values are the first v_dim latent dims)")
    opt = _optional(("kv_row_offsets", "sink"), present, rest)
    if opt["kv_row_offsets"] is not None:
        t = _ints(op, opt["kv_row_offsets"], "kv_row_offsets", 1)
        _same(op, "kv_row_offsets and input_row_offsets sizes", t.shape[0], row_offsets.shape[0], t, row_offsets)
    if opt["sink"] is not None:
        t = _float(op, opt["sink"], "sink_weights", 1)
        _same(op, "sink weights and query heads", t.shape[0], q.shape[1], t, q)
    dv = pool.shape[5] if v_dim is None else Dim(v_dim)
    return TensorType(q.dtype, [q.shape[0], q.shape[1], dv], same_device(op, q, pool))


def _paged_impl(q, blocks, lookup, layer, row_offsets, cache_lengths, *rest, mask, scale, window, present, v_dim):
    opt = dict(zip(present, rest))
    k = _pool_layer(blocks, lookup, layer, 0)
    v = k[..., :v_dim] if v_dim is not None else _pool_layer(blocks, lookup, layer, 1)
    offs = _offsets(row_offsets)
    cl = cache_lengths.astype(jnp.int32)
    if "kv_row_offsets" in opt:
        ko = _offsets(opt["kv_row_offsets"])
        kv_len = ko[1:] - ko[:-1]
    else:
        kv_len = cl + offs[1:] - offs[:-1]
    out = attention_reference(_to_padded(q, offs, q.shape[0]), k, v, cl, kv_len, opt.get("sink"), mask=mask, scale=scale, window=window)
    return _to_ragged(out, offs, q.shape[0])


paged_attention_p = register(OpDef("paged_attention", rule=_paged_rule, impl=_paged_impl))


@front(paged_attention_p)
def paged_attention(q, blocks, lookup_table, layer_idx, input_row_offsets, cache_lengths, *, mask: str = "causal", scale: float, window: int = -1, kv_row_offsets=None, sink_weights=None, v_dim: int | None = None):
    """Attention of ragged queries ``[total_tokens, n_heads, head_dim]`` over a paged KV cache.

    Query ``i`` of sequence ``b`` is at position ``cache_lengths[b] + i``; the
    sequence's keys are its cache positions ``< cache_lengths[b] + seq_len[b]``
    (the new rows must already be stored); with ``kv_row_offsets`` (cross
    attention) the keys are positions ``< kv_row_offsets[b+1] - kv_row_offsets[b]``.
    ``v_dim`` reads values as the first ``v_dim`` dims of the keys (MLA's latent cache).

    Example:
        >>> out = ops.paged_attention(q, blocks, lookup, layer, offsets, cache_lengths, scale=0.125)  # doctest: +SKIP
    """
    extra = {"kv_row_offsets": kv_row_offsets, "sink": sink_weights}
    present = tuple(n for n, x in extra.items() if x is not None)
    return bind(
        paged_attention_p, q, blocks, lookup_table, layer_idx, input_row_offsets, cache_lengths, *[extra[n] for n in present],
        mask=mask, scale=float(scale), window=int(window), present=present, v_dim=None if v_dim is None else int(v_dim),
    )  # fmt: skip


# ─── rope_ragged ──────────────────────────────────────────────────────────


def _rope_rule(x, freqs, row_offsets, start_pos, *rest, interleaved: bool, mrope_section):
    op = "rope_ragged"
    x, f = _float(op, x, "input", 3), _float(op, freqs, "freqs_cis", 2)
    d = f.shape[1]
    if isinstance(d, StaticDim) and d.dim % 2:
        raise OpError(f"{op}: freqs_cis must be [max_seq_len, head_dim] with an even head_dim, got {fmt(f)}")
    if x.shape[2] != d:
        raise OpError(f"{op}: input head_dim {x.shape[2]} does not match freqs_cis head_dim {d} ({fmt(x)} vs {fmt(f)})")
    _ints(op, row_offsets, "input_row_offsets", 1)
    _ints(op, start_pos, "start_positions", 1)
    if rest:
        p = require_tensor(op, rest[0], "position_ids")
        want = 1 if mrope_section is None else 2
        if not p.dtype.is_integral() or p.rank != want or p.shape[-1] != x.shape[0]:
            raise OpError(f"{op}: position_ids must be an integer tensor [{'sections, ' if want == 2 else ''}{x.shape[0]}], got {fmt(p)}")
        if mrope_section is not None and isinstance(d, StaticDim) and sum(mrope_section) != d.dim // 2:
            raise OpError(f"{op}: mrope_section {list(mrope_section)} must sum to head_dim // 2 = {d.dim // 2}")
    return TensorType(x.dtype, x.shape, x.device)


def apply_rope(x, cos, sin, interleaved: bool):
    """Rotate pairs of ``x [..., D]`` by angles with ``cos``/``sin [..., D/2]`` (float32 math)."""
    xf = x.astype(jnp.float32)
    if interleaved:
        x0, x1 = xf[..., 0::2], xf[..., 1::2]
        out = jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(xf.shape)
    else:
        half = xf.shape[-1] // 2
        x0, x1 = xf[..., :half], xf[..., half:]
        out = jnp.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return out.astype(x.dtype)


def _rope_impl(x, freqs, row_offsets, start_pos, *rest, interleaved: bool, mrope_section):
    t = x.shape[0]
    f = freqs.astype(jnp.float32).reshape(freqs.shape[0], -1, 2)
    if rest:
        pos = rest[0].astype(jnp.int32)
    else:
        b, i, valid = _row_batch(row_offsets, t)
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
def rope_ragged(x, freqs_cis, input_row_offsets, start_positions, *, interleaved: bool = True, position_ids=None, mrope_section=None):
    """Rotary position embedding of ragged rows ``x [total_tokens, heads, head_dim]``.

    ``freqs_cis [max_seq_len, head_dim]`` holds ``(cos, sin)`` pairs per
    frequency. Row ``i`` of sequence ``b`` is at position ``start_positions[b] + i``
    unless ``position_ids`` gives positions (``[sections, total_tokens]`` with
    ``mrope_section``). ``interleaved`` rotates pairs ``(2i, 2i+1)``, otherwise
    ``(i, i + head_dim/2)``.

    Example:
        >>> q = ops.rope_ragged(q, freqs_cis, offsets, cache_lengths)  # doctest: +SKIP
    """
    section = None if mrope_section is None else tuple(int(s) for s in mrope_section)
    extra = () if position_ids is None else (position_ids,)
    return bind(rope_ragged_p, x, freqs_cis, input_row_offsets, start_positions, *extra, interleaved=bool(interleaved), mrope_section=section)
