"""Helpers shared by the Triton-style attention kernels: masked tile loads, dots, tile ranges.

Every function here runs *inside* a Pallas kernel body (traced into Triton IR
on GPU, emulated in interpret mode on CPU), so it follows the Triton rules of
``shared/design/PALLAS_NOTES.md`` §2: refs are sliced (never values), every
loaded tensor has power-of-two dims, out-of-range rows are masked loads (no
out-of-bounds access), no captured constants.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from custom_calls._pallas import pl, pltriton

LOG2E = 1.4426950408889634
NEG_INF = float("-inf")


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a, b):
    return (a + b - 1) // b


def ds(start, n: int):
    """``pl.ds(start, n)`` with a static ``start`` typed int32.

    Interpret mode turns static starts into arrays when the enclosing program
    is lowered; under ``jax_enable_x64`` (maxfx graphs) a Python int would then
    be int64 next to int32 program ids, and the emulated slice rejects mixed
    index types. An ``np.int32`` stays int32 either way (and lowers to the same
    Triton literal).
    """
    return pl.ds(np.int32(start) if isinstance(start, int) else start, n)


def _rows_idx(start, n, dp, head):
    # one indexer only: the Triton lowering rejects a ref sliced twice (ref.at[a].at[b])
    if head is None:
        return (ds(start, n), ds(0, dp))
    return (ds(start, n), head, ds(0, dp))


def rows_mask(d: int, dp: int, row_ok=None):
    """Mask of a ``[n, Dp]`` row tile: columns ``< d`` and rows where ``row_ok`` holds (None when all are real)."""
    mask = None
    if d != dp:
        mask = (jnp.arange(dp) < d)[None, :]
    if row_ok is not None:
        mask = row_ok[:, None] if mask is None else mask & row_ok[:, None]
    return mask


def load_rows(ref, start, n: int, d: int, dp: int, row_ok=None, other=0.0, head=None):
    """Rows ``[start, start + n)`` of a ``[T, Dp]`` ref (``[T, G, Dp]`` with ``head``).

    Columns ``>= d`` and rows where ``row_ok`` is False read ``other``.
    """
    idx = _rows_idx(start, n, dp, head)
    mask = rows_mask(d, dp, row_ok)
    if mask is None:
        return ref[idx]
    return pltriton.load(ref.at[idx], mask=mask, other=other)


def store_rows(ref, start, x, d: int, dp: int, row_ok=None, head=None):
    """Store ``x [n, Dp]`` at rows ``[start, start + n)`` (masked like `load_rows`)."""
    idx = _rows_idx(start, x.shape[0], dp, head)
    mask = rows_mask(d, dp, row_ok)
    if mask is None:
        ref[idx] = x
    else:
        pltriton.store(ref.at[idx], x, mask=mask)


def load_vec(ref, start, n: int, ok=None, other=0.0, head=None):
    """``ref[start:start + n]`` of a 1-D ref (``ref[head, start:start + n]`` of a 2-D one), masked where ``ok`` is
    False.
    """
    idx = (ds(start, n),) if head is None else (head, ds(start, n))
    if ok is None:
        return ref[idx]
    return pltriton.load(ref.at[idx], mask=ok, other=other)


def store_vec(ref, start, x, ok=None):
    if ok is None:
        ref[ds(start, x.shape[0])] = x
    else:
        pltriton.store(ref.at[ds(start, x.shape[0])], x, mask=ok)


def dot(a, b, *, trans_b: bool, precision=None):
    """``a @ b`` (or ``a @ b.T``) with float32 accumulation."""
    dims = (((1,), (1,)), ((), ())) if trans_b else (((1,), (0,)), ((), ()))
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def visible(qpos, kpos, causal: bool, window, *, transposed: bool = False):
    """``[len(qpos), len(kpos)]`` mask of key positions visible from query positions (None when all are).

    ``transposed`` builds the ``[len(kpos), len(qpos)]`` mask directly (no
    in-register transpose, which costs a layout conversion on GPU).
    """
    ok = None

    def _and(a, b):
        return b if a is None else a & b

    qp, kp = (qpos[None, :], kpos[:, None]) if transposed else (qpos[:, None], kpos[None, :])
    if causal:
        ok = _and(ok, kp <= qp)
    if window is not None:
        ok = _and(ok, kp >= qp - window[0])
        if not causal:
            ok = _and(ok, kp <= qp + window[1])
    return ok


def mask_scores(s, qpos, kpos, causal: bool, window, key_ok=None, *, transposed: bool = False):
    """``s`` with the scores of keys that `visible` (or ``key_ok``, a per-key mask of untransposed scores) rules out at
    ``-inf``.
    """
    ok = visible(qpos, kpos, causal, window, transposed=transposed)
    if key_ok is not None:
        ok = key_ok[None, :] if ok is None else ok & key_ok[None, :]
    return s if ok is None else jnp.where(ok, s, NEG_INF)


def softmax_init(n: int, dp: int):
    """Online-softmax carry ``(acc [n, Dp], m [n], l [n])`` of ``n`` rows that have seen no key yet."""
    return jnp.zeros((n, dp), jnp.float32), jnp.full((n,), NEG_INF, jnp.float32), jnp.zeros((n,), jnp.float32)


def softmax_step(carry, s, v, *, masked: bool, precision=None):
    """Fold one KV tile (base-2 scores ``s [n, bk]``, values ``v [bk, Dp]``) into the online-softmax carry.

    ``masked``: a row of ``s`` may be all ``-inf``; its max is then taken as 0
    so that ``exp2`` gives zeros instead of NaN.
    """
    acc, m, l = carry
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    m_use = jnp.where(m_new == NEG_INF, 0.0, m_new) if masked else m_new
    p = jnp.exp2(s - m_use[:, None])
    alpha = jnp.exp2(m - m_use)
    l = l * alpha + jnp.sum(p, axis=1)
    acc = acc * alpha[:, None] + dot(p.astype(v.dtype), v, trans_b=False, precision=precision)
    return acc, m_new, l


def softmax_finish(carry, empty_lse: float):
    """``(o, lse)`` of a finished carry: the normalized output and base-2 logsumexp (``empty_lse`` where a row saw no
    key).
    """
    acc, m, l = carry
    empty = l == 0.0
    l_safe = jnp.where(empty, 1.0, l)
    return acc / l_safe[:, None], jnp.where(empty, empty_lse, m + jnp.log2(l_safe))


def _right(causal: bool, window):
    if causal:
        return 0
    return None if window is None else window[1]


def kv_tile_range(qmin, qmax, kv_len, bk: int, causal: bool, window):
    """KV tiles a block of queries at positions ``[qmin, qmax]`` needs.

    Returns ``(lo, a, c, hi)``: tiles ``[lo, hi)`` hold some visible key, and
    tiles ``[a, c)`` ⊆ ``[lo, hi)`` are visible from *every* query of the
    block and lie inside ``kv_len`` (they need no mask).
    """
    right = _right(causal, window)
    lo, hi = 0, cdiv(kv_len, bk)
    full_lo, full_hi = 0, kv_len // bk
    if right is not None:
        hi = jnp.minimum(hi, cdiv(jnp.maximum(qmax + right + 1, 0), bk))
        full_hi = jnp.minimum(full_hi, jnp.maximum(qmin + right + 1, 0) // bk)
    if window is not None:
        lo = jnp.maximum(qmin - window[0], 0) // bk
        full_lo = cdiv(jnp.maximum(qmax - window[0], 0), bk)
    hi = jnp.maximum(hi, lo)
    # without a window every tile from the first is visible on the left: a is lo, statically (no leading masked tiles)
    a = lo if window is None else jnp.clip(full_lo, lo, hi)
    c = jnp.clip(full_hi, a, hi)
    return lo, a, c, hi


def q_tile_range(kmin, kmax, pos0, q_len, bq: int, causal: bool, window, keys_all_valid):
    """Query tiles (rows ``r``, position ``pos0 + r``) that see some key in ``[kmin, kmax]``.

    Same ``(lo, a, c, hi)`` convention as `kv_tile_range`; ``[a, c)`` are
    tiles whose rows all exist and see every key (``keys_all_valid`` False
    empties it).
    """
    right = _right(causal, window)
    lo, hi = 0, cdiv(q_len, bq)
    full_lo, full_hi = 0, q_len // bq
    if right is not None:
        lo = jnp.maximum(kmin - right - pos0, 0) // bq
        full_lo = cdiv(jnp.maximum(kmax - right - pos0, 0), bq)
    if window is not None:
        hi = jnp.minimum(hi, cdiv(jnp.maximum(kmax + window[0] + 1 - pos0, 0), bq))
        full_hi = jnp.minimum(full_hi, jnp.maximum(kmin + window[0] - pos0 + 1, 0) // bq)
    hi = jnp.maximum(hi, lo)
    a = jnp.clip(full_lo, lo, hi)
    c = jnp.clip(jnp.where(keys_all_valid, full_hi, a), a, hi)
    return lo, a, c, hi
