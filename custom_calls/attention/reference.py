"""Plain-jnp attention: the oracle of the Pallas kernels and the CPU path.

Layouts follow ``jax.nn.dot_product_attention``: ``q [batch, q_seq, n_heads,
head_dim]``, ``k``/``v`` ``[batch, kv_seq, n_kv_heads, head_dim]`` with
``n_heads % n_kv_heads == 0`` (GQA; MQA when ``n_kv_heads == 1``). Scores and
softmax are float32 whatever the input dtype; the output has ``q``'s dtype.

Masks (combined with AND):

* ``causal``: query ``i`` sees keys at positions ``<= pos(i)``.
* ``local_window_size``: an int ``w`` or a ``(left, right)`` pair, the same
  convention as ``jax.nn.dot_product_attention``: key ``j`` is visible from
  query position ``p`` iff ``p - left <= j <= p + right`` (an int means
  ``(w, w)``; with ``causal`` the right side is 0). A "sliding window of W
  tokens including the current one" is ``local_window_size=(W - 1, 0)``.
* ``chunk_size`` ``c``: key and query in the same chunk of ``c`` positions
  (``j // c == pos // c``; Llama-4's chunked attention, combine with ``causal``).
* per-batch lengths: keys at ``>= kv_len`` and query rows at ``>= q_len`` are
  masked; query rows that see no key give zeros (and ``lse = -inf``).

Score modifiers (no Pallas kernel has them; `dispatch` falls back here):

* ``alibi``: add ``slope[h] * (j - pos)`` (ALiBi, `alibi_slopes`) to the scores.
* ``sinks``: ``[n_heads]`` logits of an extra "sink" key whose value is zero
  (it takes softmax mass without adding to the output).

``v`` may have a different head_dim than ``q``/``k`` (MLA's value width); the
output then has ``v``'s head_dim.

Query positions: dense `attention` places query ``i`` at position
``q_offset + i`` (``q_offset=0``: top-left aligned like ``jax.nn``). The ragged
and decode functions align the queries of each sequence to the *end* of its
keys (``pos(i) = kv_len - q_len + i``): the queries are the newest tokens and
the KV already holds them.

Example:
    >>> import numpy as np
    >>> from custom_calls.attention import reference as ref
    >>> q = np.ones((1, 4, 2, 8), np.float32); kv = np.ones((1, 4, 1, 8), np.float32)
    >>> ref.attention(q, kv, kv, causal=True).shape
    (1, 4, 2, 8)
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "window_pair",
    "attention",
    "attention_with_lse",
    "ragged_attention",
    "decode_attention",
    "paged_decode_attention",
    "gather_pages",
    "ragged_seq_table",
    "ragged_rows",
    "alibi_slopes",
    "packed_attention",
]

Window = tuple[int, int] | None


def window_pair(local_window_size: Any, causal: bool) -> Window:
    """Normalize ``local_window_size`` to ``(left, right)`` (right 0 when causal) or None."""
    if local_window_size is None:
        return None
    if isinstance(local_window_size, (int, np.integer)):
        left = right = int(local_window_size)
    else:
        try:
            left, right = (int(x) for x in local_window_size)
        except (TypeError, ValueError):
            raise ValueError(
                f"local_window_size: expected an int or a (left, right) pair, got {local_window_size!r}"
            ) from None
    if left < 0 or right < 0:
        raise ValueError(f"local_window_size: window sizes must be >= 0, got {(left, right)}")
    return (left, 0 if causal else right)


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi head slopes (Press et al.): ``2^(-8 i / n)`` for the nearest power of two ``n``, interleaved beyond it."""
    n = 2 ** math.floor(math.log2(n_heads))
    slopes = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    slopes += [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(n_heads - n)]
    return np.asarray(slopes, np.float32)


def _visible(qpos, kpos, causal: bool, window: Window, chunk: int | None = None):
    """Boolean mask broadcasting ``qpos[..., None]`` against ``kpos``."""
    qp, kp = qpos[..., :, None], kpos[..., None, :]
    ok = jnp.ones(jnp.broadcast_shapes(qp.shape, kp.shape), bool)
    if causal:
        ok = ok & (kp <= qp)
    if window is not None:
        ok = ok & (kp >= qp - window[0]) & (kp <= qp + window[1])
    if chunk is not None:
        ok = ok & (kp // chunk == qp // chunk)
    return ok


# One query per row (a decode step) is a matrix-vector product per head: as
# broadcast products and sums over the cache in its own layout ([B, Sk, Hkv, D]),
# XLA's CPU backend reads the cache once in a loop fusion, in place; as a dot,
# or over a head-major view, it copies the cache into another layout first,
# every step (3-6x slower at 30 layers). Only the (D times smaller) scores and
# probabilities change layout.
def _one_query_scores(qf, k):
    """Scores ``[B, Hkv, G, 1, Sk]`` of queries ``qf [B, 1, Hkv, G, D]`` against keys ``[B, Sk, Hkv, D]``."""
    s = jnp.sum(qf[:, :, :, :, :] * k.astype(jnp.float32)[:, :, :, None, :], axis=-1)  # [B, Sk, Hkv, G]
    return jnp.transpose(s, (0, 2, 3, 1))[:, :, :, None, :]


def _one_query_values(p, v):
    """``sum_k p v`` as ``[B, 1, Hkv, G, Dv]`` for probabilities ``p [B, Hkv, G, 1, Sk]`` and values ``[B, Sk, Hkv,
    Dv]``.
    """
    pt = jnp.transpose(p[:, :, :, 0, :], (0, 3, 1, 2))  # [B, Sk, Hkv, G]
    return jnp.sum(pt[..., None] * v.astype(jnp.float32)[:, :, :, None, :], axis=1)[:, None]


def _core(q, k, v, *, causal, window, scale, q_len, kv_len, q_pos0, chunk=None, alibi=False, sinks=None):
    """Masked GQA attention on ``[B, Sq, Hq, D]`` / ``[B, Sk, Hkv, D]``; returns (o, lse) (lse natural log, [B, Hq,
    Sq]).
    """
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    qf = q.astype(jnp.float32).reshape(b, sq, hkv, g, d)
    if sq == 1:  # one query per row (decode): products and sums, see `_one_query_scores`
        s = _one_query_scores(qf, k) * scale
    else:
        # Queries head-major first ([B, Hkv, G, Sq, D], a copy of q): the product then
        # comes out as [B, Hkv, G, Sq, Sk] with no transpose of the (larger) scores,
        # which XLA would otherwise recompute in every fusion that reads them.
        qh = qf.transpose(0, 2, 3, 1, 4)
        s = jnp.einsum("bhgqd,bkhd->bhgqk", qh, k.astype(jnp.float32), precision="highest") * scale
    qpos = q_pos0[:, None] + jnp.arange(sq)[None, :]  # [B, Sq]
    kpos = jnp.arange(sk)
    if alibi:
        rel = (kpos[None, None, :] - qpos[:, :, None]).astype(jnp.float32)  # [B, Sq, Sk]
        s = s + jnp.asarray(alibi_slopes(hq)).reshape(1, hkv, g, 1, 1) * rel[:, None, None]
    ok = _visible(qpos, kpos[None, :], causal, window, chunk)  # [B, Sq, Sk]
    ok = ok & (kpos[None, None, :] < kv_len[:, None, None]) & (jnp.arange(sq)[None, :, None] < q_len[:, None, None])
    # A row that sees no key attends to every key instead (finite scores, zero
    # gradients) and its output is zeroed below: the softmax is then the plain
    # max / subtract / exp / sum chain, which XLA's CPU backend fuses into one
    # YNNPACK kernel (a guard on an infinite max broke that fusion).
    empty = ~jnp.any(ok, axis=-1, keepdims=True)  # [B, Sq, 1]
    s = jnp.where((ok | empty)[:, None, None], s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    if sinks is not None:  # the sink key joins the softmax (max and denominator), with value 0
        sink = jnp.asarray(sinks).astype(jnp.float32).reshape(1, hkv, g, 1, 1)
        m = jnp.maximum(m, sink)
    p = jnp.exp(s - m)
    l = jnp.sum(p, axis=-1, keepdims=True)  # >= 1: the largest term is exp(0)
    if sinks is not None:
        l = l + jnp.exp(sink - m)
    p = p / l
    if sq == 1:
        o = _one_query_values(p, v)
    else:
        o = jnp.einsum("bhgqk,bkhd->bqhgd", p, v.astype(jnp.float32), precision="highest")
    o = jnp.where(empty[:, :, :, None, None], 0.0, o)
    lse = m[..., 0] + jnp.log(l[..., 0])  # [B, Hkv, G, Sq]
    # A row with no key: -inf, or only the sink's value when there is one.
    lse = jnp.where(empty[:, None, None, :, 0], -jnp.inf if sinks is None else sink[..., 0], lse)
    return o.reshape(b, sq, hq, v.shape[-1]).astype(q.dtype), lse.reshape(b, hq, sq)


def _check_qkv(fn: str, q, k, v, q_rank: int) -> None:
    if q.ndim != q_rank or k.ndim != q_rank or v.ndim != q_rank:
        raise ValueError(f"{fn}: q, k, v must be rank {q_rank}, got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if k.shape[:-1] != v.shape[:-1]:  # v's head_dim may differ (MLA)
        raise ValueError(f"{fn}: k {list(k.shape)} and v {list(v.shape)} must agree except in head_dim")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{fn}: head_dim of q ({q.shape[-1]}) and k ({k.shape[-1]}) differ")
    if k.shape[-2] == 0 or q.shape[-2] % k.shape[-2]:
        raise ValueError(f"{fn}: n_heads ({q.shape[-2]}) must be a multiple of n_kv_heads ({k.shape[-2]})")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{fn}: {name} must be floating point, got {x.dtype}")


def _scale(scale, d: int) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _masks(causal, local_window_size, scale, d: int) -> dict:
    """Validated mask and scale arguments of `_core`."""
    return dict(causal=causal, window=window_pair(local_window_size, causal), scale=_scale(scale, d))


def _lens(x, b: int, default: int):
    return jnp.full((b,), default, jnp.int32) if x is None else jnp.asarray(x, jnp.int32).reshape(b)


def _mods(chunk_size, alibi, sinks, hq: int) -> dict:
    """Validated chunk / ALiBi / sink arguments of `_core`."""
    if chunk_size is not None and int(chunk_size) <= 0:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")
    if sinks is not None and jnp.shape(sinks) != (hq,):
        raise ValueError(f"sinks: expected float [{hq}] (one logit per query head), got {list(jnp.shape(sinks))}")
    return dict(chunk=None if chunk_size is None else int(chunk_size), alibi=bool(alibi), sinks=sinks)


def attention(
    q,
    k,
    v,
    *,
    causal=False,
    local_window_size=None,
    scale=None,
    q_lens=None,
    kv_lens=None,
    q_offset=0,
    chunk_size=None,
    alibi=False,
    sinks=None,
    return_lse=False,
):
    """Softmax attention ``softmax(q k^T * scale + mask) v``, fp32 inside.

    Args:
        q: ``[B, Sq, Hq, D]``; k, v: ``[B, Sk, Hkv, D]``.
        causal, local_window_size: masks (module docstring).
        scale: defaults to ``1/sqrt(D)``.
        q_lens, kv_lens: optional ``int [B]`` valid lengths (padding masks).
        q_offset: position of query row 0 (int or ``int [B]``).
        chunk_size, alibi, sinks: chunked mask, ALiBi bias, sink logits ``[Hq]``
            (module docstring).
        return_lse: also return the natural-log logsumexp of the scores,
            ``float32 [B, n_heads, q_seq]`` (as `pallas_flash.flash_attention`).

    Returns:
        ``[B, Sq, Hq, Dv]`` in ``q.dtype`` (and the logsumexp).
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    _check_qkv("attention", q, k, v, 4)
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"attention: batch of q ({q.shape[0]}) and k ({k.shape[0]}) differ")
    b, sq = q.shape[:2]
    o, lse = _core(
        q,
        k,
        v,
        **_masks(causal, local_window_size, scale, q.shape[-1]),
        q_len=_lens(q_lens, b, sq),
        kv_len=_lens(kv_lens, b, k.shape[1]),
        q_pos0=jnp.broadcast_to(jnp.asarray(q_offset, jnp.int32), (b,)),
        **_mods(chunk_size, alibi, sinks, q.shape[2]),
    )
    return (o, lse) if return_lse else o


def attention_with_lse(q, k, v, **kwargs):
    """`attention` with ``return_lse=True``: the output and the natural-log logsumexp
    ``float32 [B, n_heads, q_seq]``.
    """
    return attention(q, k, v, return_lse=True, **kwargs)


def _max_len(offsets, total: int, max_seq_len, name: str = "max_seq_len") -> int:
    """Static bound on the sequence lengths of ``offsets`` (checked against concrete offsets)."""
    try:
        o = np.asarray(offsets)
        actual = int(np.max(np.diff(o))) if o.size > 1 else 0
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        actual = None  # traced offsets: the total is an upper bound
    if max_seq_len is None:
        return total if actual is None else actual
    if actual is not None and actual > int(max_seq_len):
        raise ValueError(f"{name}: {max_seq_len} is smaller than the longest sequence in the offsets ({actual})")
    return int(max_seq_len)


def ragged_seq_table(q_offsets, kv_offsets=None):
    """The `packed_attention` ``seq [5, B]`` table of ragged row offsets (queries aligned to the end of their keys)."""
    qo = jnp.asarray(q_offsets, jnp.int32)
    ko = qo if kv_offsets is None else jnp.asarray(kv_offsets, jnp.int32)
    ql, kl = qo[1:] - qo[:-1], ko[1:] - ko[:-1]
    return jnp.stack([qo[:-1], ql, ko[:-1], kl, kl - ql])


def ragged_rows(row_offsets, n_rows: int):
    """For each row ``t < n_rows`` of a ragged batch: its sequence ``b``, its index in the sequence, and whether
    it lies before the last offset (``row_offsets int [B+1]``, starting at 0)."""
    offs = jnp.asarray(row_offsets).astype(jnp.int32)
    t = jnp.arange(n_rows, dtype=jnp.int32)
    nb = offs.shape[0] - 1
    b = jnp.clip(jnp.searchsorted(offs[1:], t, side="right"), 0, max(nb - 1, 0)).astype(jnp.int32)
    return b, t - offs[b], t < offs[-1]


def _rows_from(x, starts, max_len: int):
    """``x[starts[b] + i]`` for ``i < max_len`` → ``[B, max_len, ...]`` (indices clipped into ``x``)."""
    idx = starts[:, None] + jnp.arange(max_len)[None, :]
    return x[jnp.clip(idx, 0, max(x.shape[0] - 1, 0))]


def ragged_attention(
    q,
    k,
    v,
    input_row_offsets,
    *,
    kv_row_offsets=None,
    causal=False,
    local_window_size=None,
    scale=None,
    max_seq_len=None,
    max_kv_len=None,
):
    """Attention over ragged batches packed along the token axis.

    Args:
        q: ``[total_q, Hq, D]``; k, v: ``[total_kv, Hkv, D]``.
        input_row_offsets: ``int [B+1]``, sequence ``b`` is q rows ``[off[b], off[b+1])``.
        kv_row_offsets: ``int [B+1]`` for k/v (default: ``input_row_offsets``).
            Queries are aligned to the end of their keys (module docstring).
        max_seq_len, max_kv_len: static bounds on the query / key lengths
            (computed from concrete offsets; under ``jit`` pass them or the
            totals are used).

    Returns:
        ``[total_q, Hq, D]``; rows not covered by any sequence are zero.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    _check_qkv("ragged_attention", q, k, v, 3)
    qo = jnp.asarray(input_row_offsets, jnp.int32)
    ko = qo if kv_row_offsets is None else jnp.asarray(kv_row_offsets, jnp.int32)
    if qo.ndim != 1 or ko.shape != qo.shape:
        raise ValueError(f"ragged_attention: row offsets must be int [B+1], got {list(qo.shape)} and {list(ko.shape)}")
    lq = _max_len(input_row_offsets, q.shape[0], max_seq_len)
    lk = lq if kv_row_offsets is None else _max_len(kv_row_offsets, k.shape[0], max_kv_len, "max_kv_len")
    seq = ragged_seq_table(qo, ko)
    masks = dict(causal=causal, local_window_size=local_window_size, scale=scale)
    return packed_attention(q, k, v, seq, max_q_len=lq, max_kv_len=lk, **masks)


def decode_attention(q, k_cache, v_cache, kv_lens, *, causal=True, local_window_size=None, scale=None):
    """A few new query tokens per sequence against a KV cache that already holds them.

    Args:
        q: ``[B, Sq, Hq, D]`` (``Sq`` new tokens, usually 1).
        k_cache, v_cache: ``[B, T, Hkv, D]``; only the first ``kv_lens[b]`` are valid.
        kv_lens: ``int [B]``; query ``i`` sits at position ``kv_lens[b] - Sq + i``.

    Returns:
        ``[B, Sq, Hq, D]`` in ``q.dtype``.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k_cache), jnp.asarray(v_cache)
    _check_qkv("decode_attention", q, k, v, 4)
    b, sq = q.shape[:2]
    kv_len = _lens(kv_lens, b, k.shape[1])
    return _core(
        q,
        k,
        v,
        **_masks(causal, local_window_size, scale, q.shape[-1]),
        q_len=jnp.full((b,), sq, jnp.int32),
        kv_len=kv_len,
        q_pos0=kv_len - sq,
    )[0]


def gather_pages(pages, block_table):
    """``pages [P, page, Hkv, D]`` gathered by ``block_table [B, n]`` → ``[B, n * page, Hkv, D]``."""
    g = pages[block_table]  # [B, n, page, Hkv, D]
    return g.reshape(g.shape[0], g.shape[1] * g.shape[2], *g.shape[3:])


def paged_decode_attention(
    q, k_pages, v_pages, block_table, kv_lens, *, causal=True, local_window_size=None, scale=None
):
    """`decode_attention` over a paged KV cache.

    Args:
        q: ``[B, Sq, Hq, D]``.
        k_pages, v_pages: the block pool ``[num_pages, page_size, Hkv, D]``.
        block_table: ``int [B, max_pages]``; logical page ``j`` of sequence ``b``
            is pool page ``block_table[b, j]`` (entries past ``kv_lens`` are ignored).
        kv_lens: ``int [B]``.
    """
    k_pages, v_pages = jnp.asarray(k_pages), jnp.asarray(v_pages)
    bt = jnp.asarray(block_table, jnp.int32)
    if k_pages.ndim != 4 or k_pages.shape != v_pages.shape:
        raise ValueError(
            f"paged_decode_attention: k_pages/v_pages must be [num_pages, page_size, n_kv_heads, head_dim], "
            f"got {list(k_pages.shape)} and {list(v_pages.shape)}"
        )
    if bt.ndim != 2 or bt.shape[0] != jnp.shape(q)[0]:
        raise ValueError(f"paged_decode_attention: block_table must be int [batch, max_pages], got {list(bt.shape)}")
    bt = jnp.clip(bt, 0, k_pages.shape[0] - 1)
    return decode_attention(
        q,
        gather_pages(k_pages, bt),
        gather_pages(v_pages, bt),
        kv_lens,
        causal=causal,
        local_window_size=local_window_size,
        scale=scale,
    )


def check_pool(pool) -> None:
    """Raise ``ValueError`` naming ``pool`` unless it is ``[num_pages, 2 (K, V), num_layers, page_size, Hkv, D]``."""
    if len(pool.shape) != 6 or pool.shape[1] != 2:
        raise ValueError(
            f"pool: expected [num_pages, 2 (K, V), num_layers, page_size, n_kv_heads, head_dim], got {list(pool.shape)}"
        )


def pool_layer_pages(pool, layer):
    """K and V pages ``[num_pages, page_size, Hkv, D]`` of ``layer`` in a `check_pool`-shaped pool.

    ``layer`` is an int scalar (may be traced; clipped into range).
    """
    pool = jnp.asarray(pool)
    check_pool(pool)
    li = jnp.clip(jnp.asarray(layer, jnp.int32).reshape(()), 0, pool.shape[2] - 1)
    return pool[:, 0, li], pool[:, 1, li]


def paged_decode_attention_pool(
    q, pool, layer, block_table, kv_lens, *, causal=True, local_window_size=None, scale=None
):
    """`paged_decode_attention` over layer ``layer`` of a multi-layer pool (see `pool_layer_pages`)."""
    k_pages, v_pages = pool_layer_pages(pool, layer)
    return paged_decode_attention(
        q, k_pages, v_pages, block_table, kv_lens, causal=causal, local_window_size=local_window_size, scale=scale
    )


def packed_attention(
    q,
    k,
    v,
    seq,
    *,
    max_q_len: int,
    max_kv_len: int,
    causal=False,
    local_window_size=None,
    scale=None,
    chunk_size=None,
    alibi=False,
    sinks=None,
):
    """Attention on the packed token layout of the flash kernel (``pallas_flash``).

    Args:
        q: ``[Tq, Hq, D]``; k, v: ``[Tk, Hkv, D]`` (``v`` may have another head_dim).
        seq: ``int [5, B]``: per sequence the first q row, q length, first k/v
            row, k/v length and the position of its first query (keys sit at
            positions ``0..kv_len-1``).
        max_q_len, max_kv_len: static upper bounds of the lengths.
        Other arguments as in `attention`.

    Returns:
        ``[Tq, Hq, Dv]``; rows no sequence covers are zero.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    _check_qkv("packed_attention", q, k, v, 3)
    seq = jnp.asarray(seq, jnp.int32)
    if seq.ndim != 2 or seq.shape[0] != 5:
        raise ValueError(f"seq: packed_attention expects int [5, batch], got {list(seq.shape)}")
    q_start, q_len, kv_start, kv_len, pos0 = seq
    lq, lk = max(int(max_q_len), 1), max(int(max_kv_len), 1)
    qp, kp, vp = _rows_from(q, q_start, lq), _rows_from(k, kv_start, lk), _rows_from(v, kv_start, lk)
    o, _ = _core(
        qp,
        kp,
        vp,
        **_masks(causal, local_window_size, scale, q.shape[-1]),
        q_len=q_len,
        kv_len=kv_len,
        q_pos0=pos0,
        **_mods(chunk_size, alibi, sinks, q.shape[1]),
    )
    i = jnp.arange(lq)[None, :]
    rows = jnp.where(i < q_len[:, None], q_start[:, None] + i, q.shape[0])  # out of range: dropped
    out = jnp.zeros((q.shape[0], q.shape[1], v.shape[-1]), q.dtype)
    return out.at[rows].set(o, mode="drop")
