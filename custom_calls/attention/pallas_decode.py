"""Split-K flash-decoding: a few new query tokens against a long KV cache (dense or paged).

Layout: ``q [B, Sq, Hq, D]`` (``Sq`` new tokens, usually 1), dense caches
``k/v [B, T, Hkv, D]`` or a paged pool ``k/v_pages [num_pages, page_size, Hkv, D]``
with ``block_table int [B, max_pages]``, and ``kv_lens int [B]`` (the cache
already holds the new tokens: query ``i`` sits at position ``kv_len - Sq + i``).

Kernel (grid ``(B, Hkv, splits)``): the ``G = Hq / Hkv`` query heads of a KV
head and the ``Sq`` tokens are folded into the rows of one query tile
(``Sq·G`` rows padded to a power of two ≥ 16, Triton's smallest dot), so each
K/V tile is read from memory once per KV head. The context is cut into
``splits`` contiguous ranges (multiples of ``block_k``); each program runs an
online softmax over the ``block_k`` tiles of its range that hold a visible key
(``kv_len``, causal and sliding-window limits; tiles past ``kv_len`` are never
read) and writes its normalized partial output and base-2 logsumexp. XLA
merges the splits (``o = Σ o_s·2^(lse_s − lse)``). Splits default to enough
programs for ~2 waves on an H100 (``B·Hkv·splits ≥ 264``).

Paged: the same kernel with a tile loader that maps logical tile ``t`` to
pool page ``block_table[b, t·block_k // page_size]`` (``block_k`` divides the
page size). Page sizes must have a power-of-two factor ≥ 16.

Gradients (rarely needed for decode): a ``custom_vjp`` whose backward pass is
``jax.vjp`` of the jnp reference.

Example:
    >>> import numpy as np
    >>> from custom_calls.attention import pallas_decode as pd
    >>> q = np.ones((2, 1, 8, 64), np.float32); kv = np.ones((2, 300, 2, 64), np.float32)
    >>> pd.decode_attention(q, kv, kv, np.array([17, 300]), interpret=True).shape
    (2, 1, 8, 64)
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from custom_calls._pallas import pl, pltriton
from custom_calls.attention import _tiles as t_
from custom_calls.attention import reference as ref
from custom_calls.attention.pallas_flash import _head_fields, _HeadSpec, check_inputs, unsupported_reason

__all__ = [
    "DecodeConfig",
    "decode_attention",
    "paged_decode_attention",
    "paged_decode_attention_pool",
    "page_block",
    "TARGET_PROGRAMS",
]

TARGET_PROGRAMS = 264  # 2 waves of 132 SMs (H100)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """``block_k`` keys per tile (power of two ≥ 16), ``num_splits`` (None: auto), Triton launch parameters."""

    block_k: int = 128
    num_splits: int | None = None
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        if self.block_k < 16 or self.block_k & (self.block_k - 1):
            raise ValueError(f"block_k: must be a power of two >= 16, got {self.block_k}")
        if self.num_splits is not None and self.num_splits < 1:
            raise ValueError(f"num_splits: must be >= 1, got {self.num_splits}")


@dataclasses.dataclass(frozen=True)
class _Spec(_HeadSpec):
    rows: int  # Sq * G real rows
    rp: int  # padded rows
    group: int
    sq: int
    bk: int
    split_len: int  # keys per split (multiple of bk)
    page: int  # page size (0: dense cache)
    pool: bool  # k/v refs are one [num_pages, 2, num_layers, page, Hkv, Dp] pool (plane 0 = K, 1 = V)
    interpret: bool


def page_block(page_size: int, block_k: int) -> int:
    """Tile size for a paged cache: the largest power of two ≤ ``block_k`` dividing ``page_size`` (0 if < 16)."""
    b = page_size & -page_size if page_size > 0 else 0
    b = min(b, block_k)
    return b if b >= 16 else 0


def _kernel(lens_ref, *refs, spec: _Spec):
    layer_ref = None
    if spec.pool:
        bt_ref, layer_ref, q_ref, k_ref, v_ref, o_ref, lse_ref = refs
    elif spec.page:
        bt_ref, q_ref, k_ref, v_ref, o_ref, lse_ref = refs
    else:
        q_ref, k_ref, v_ref, o_ref, lse_ref = refs
    b, s = pl.program_id(0), pl.program_id(2)
    bk = spec.bk
    kv_len = lens_ref[b]
    c = spec.scale * t_.LOG2E
    q = q_ref[...]  # [rp, dp], zero-padded by the wrapper
    prec = lax.Precision.HIGHEST if q.dtype == jnp.float32 else None
    qpos = kv_len - spec.sq + jnp.arange(spec.rp) // spec.group
    lo_key = s * spec.split_len
    hi_key = jnp.minimum(lo_key + spec.split_len, kv_len)
    if spec.window is not None:  # keys left of the oldest query's window are never visible
        lo_key = jnp.maximum(lo_key, kv_len - spec.sq - spec.window[0])
    lo_key = jnp.minimum(lo_key, hi_key)
    t_lo, t_hi = lo_key // bk, t_.cdiv(hi_key, bk)

    def load(ref, kv: int, t, key_ok):
        if not spec.page:
            return t_.load_rows(ref, t * bk, bk, spec.d, spec.dp, key_ok)
        per_page = spec.page // bk
        page = bt_ref[b, t // per_page]
        rows = (t_.ds((t % per_page) * bk, bk), t_.ds(0, spec.dp))
        # pool form: page, K/V plane, layer, then the [page_size, Dp] rows of this program's KV head
        idx = (page, jnp.int32(kv), layer_ref[0], *rows) if spec.pool else (page, *rows)
        return pltriton.load(ref.at[idx], mask=t_.rows_mask(spec.d, spec.dp, key_ok), other=0.0)

    def body(t, carry):
        kpos = t * bk + jnp.arange(bk)
        key_ok = (kpos >= lo_key) & (kpos < hi_key)
        k = load(k_ref, 0, t, key_ok)
        v = load(v_ref, 1, t, key_ok)
        sc = t_.dot(q, k, trans_b=True, precision=prec) * c
        sc = t_.mask_scores(sc, qpos, kpos, spec.causal, spec.window, key_ok)
        return t_.softmax_step(carry, sc, v, masked=True, precision=prec)

    carry = lax.fori_loop(t_lo, t_hi, body, t_.softmax_init(spec.rp, spec.dp))
    o_ref[...], lse_ref[...] = t_.softmax_finish(carry, t_.NEG_INF)


def _fold_q(q, hkv: int, rp: int, dp: int):
    """``[B, Sq, Hq, D]`` → ``[B, Hkv, rp, dp]``: row ``i·G + g`` = token ``i``, head ``hkv·G + g``."""
    b, sq, hq, d = q.shape
    g = hq // hkv
    x = q.reshape(b, sq, hkv, g, d).transpose(0, 2, 1, 3, 4).reshape(b, hkv, sq * g, d)
    return jnp.pad(x, ((0, 0), (0, 0), (0, rp - sq * g), (0, dp - d)))


def _unfold_o(o, shape):
    b, sq, hq, d = shape
    hkv = o.shape[1]
    x = o[:, :, : sq * (hq // hkv), :d].reshape(b, hkv, sq, hq // hkv, d)
    return x.transpose(0, 2, 1, 3, 4).reshape(shape)


def _merge(o_s, lse_s):
    """Combine per-split ``o [.., S, R, D]`` / base-2 ``lse [.., S, R]`` over the split axis."""
    m = jnp.max(lse_s, axis=2, keepdims=True)
    m = jnp.where(m == -jnp.inf, 0.0, m)
    w = jnp.exp2(lse_s - m)  # 0 for empty splits
    den = jnp.sum(w, axis=2)
    return jnp.sum(o_s * w[..., None], axis=2) / jnp.where(den == 0, 1.0, den)[..., None]


def _splits(cfg: DecodeConfig, b: int, hkv: int, n_keys: int, bk: int) -> int:
    tiles = max(1, t_.cdiv(n_keys, bk))
    want = cfg.num_splits or t_.cdiv(TARGET_PROGRAMS, b * hkv)
    return max(1, min(want, tiles))


def _run(q, k, v, lens, bt, layer=None, *, spec: _Spec, splits: int, cfg: DecodeConfig):
    b, _, hq, _ = q.shape
    hkv = k.shape[-2]
    qf = _fold_q(q, hkv, spec.rp, spec.dp)
    rp, dp = spec.rp, spec.dp
    if spec.pool:  # the whole pool (any layer, K and V); the kernel indexes plane, layer and page itself
        kv_spec = pl.BlockSpec((*k.shape[:3], spec.page, None, dp), lambda b_, h, s: (0, 0, 0, 0, h, 0))
        extra = (bt, layer)
        extra_specs = [pl.BlockSpec(bt.shape, lambda b_, h, s: (0, 0)), pl.BlockSpec((1,), lambda b_, h, s: (0,))]
    elif spec.page:
        kv_spec = pl.BlockSpec((k.shape[0], spec.page, None, dp), lambda b_, h, s: (0, 0, h, 0))
        extra, extra_specs = (bt,), [pl.BlockSpec(bt.shape, lambda b_, h, s: (0, 0))]
    else:
        # at least one tile of rows, so tile slices are in-bounds at trace time (see pallas_flash._block_rows)
        kv_spec = pl.BlockSpec((None, max(k.shape[1], spec.bk), None, dp), lambda b_, h, s: (b_, 0, h, 0))
        extra, extra_specs = (), []
    o_s, lse_s = pl.pallas_call(
        functools.partial(_kernel, spec=spec),
        out_shape=(
            jax.ShapeDtypeStruct((b, hkv, splits, rp, dp), jnp.float32),
            jax.ShapeDtypeStruct((b, hkv, splits, rp), jnp.float32),
        ),
        grid=(b, hkv, splits),
        in_specs=[pl.BlockSpec(lens.shape, lambda b_, h, s: (0,))]
        + extra_specs
        + [pl.BlockSpec((None, None, rp, dp), lambda b_, h, s: (b_, h, 0, 0)), kv_spec, kv_spec],
        out_specs=(
            pl.BlockSpec((None, None, None, rp, dp), lambda b_, h, s: (b_, h, s, 0, 0)),
            pl.BlockSpec((None, None, None, rp), lambda b_, h, s: (b_, h, s, 0)),
        ),
        compiler_params=pltriton.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=spec.interpret,
        name="paged_decode_attention" if spec.page else "decode_attention",
    )(lens, *extra, qf, k, v)
    # merge only the real rows/columns (XLA fuses the slice into the reduction)
    o_s, lse_s = o_s[..., : spec.rows, : spec.d], lse_s[..., : spec.rows]
    return _unfold_o(_merge(o_s, lse_s), q.shape).astype(q.dtype)


def _make_spec(q, hkv, *, causal, local_window_size, scale, bk, split_len, page, interpret, pool=False):
    _, sq, hq, d = q.shape
    g = hq // hkv
    return _Spec(
        **_head_fields(d, causal, local_window_size, scale),
        rows=sq * g,
        rp=max(16, t_.next_pow2(sq * g)),
        group=g,
        sq=sq,
        bk=bk,
        split_len=split_len,
        page=page,
        pool=pool,
        interpret=bool(interpret),
    )


def _with_reference_vjp(kernel, reference, n_diff: int = 3):
    """``kernel(*args)`` made differentiable in its first ``n_diff`` arguments through ``jax.vjp(reference)``."""

    @jax.custom_vjp
    def f(*args):
        return kernel(*args)

    def fwd(*args):
        return kernel(*args), args

    def bwd(args, do):
        diff, rest = args[:n_diff], args[n_diff:]
        _, vjp = jax.vjp(lambda *d: reference(*d, *rest), *diff)
        return (*vjp(do), *(None for _ in rest))

    f.defvjp(fwd, bwd)
    return f


def _check_supported(fn: str, q):
    why = unsupported_reason(q)
    if why:
        raise ValueError(f"{fn} kernel: {why}")


def decode_attention(
    q,
    k_cache,
    v_cache,
    kv_lens,
    *,
    causal=True,
    local_window_size=None,
    scale=None,
    config: DecodeConfig | None = None,
    interpret=False,
):
    """Split-K decode attention over a dense cache; semantics of `reference.decode_attention`.

    Args:
        q: ``[B, Sq, Hq, D]``; k_cache, v_cache: ``[B, T, Hkv, D]`` (q's dtype).
        kv_lens: ``int [B]`` valid cache lengths (clipped to ``T``).
        config: `DecodeConfig` (``block_k`` is shrunk for short caches).
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k_cache), jnp.asarray(v_cache)
    check_inputs("decode_attention", q, k, v, 4)
    _check_supported("decode_attention", q)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"decode_attention: batch of q ({q.shape[0]}) and k_cache ({k.shape[0]}) differ")
    cfg = config or DecodeConfig()
    b, t = k.shape[0], k.shape[1]
    hkv = k.shape[2]
    bk = min(cfg.block_k, max(16, t_.next_pow2(t)))
    splits = _splits(cfg, b, hkv, t, bk)
    split_len = t_.cdiv(t_.cdiv(t, splits), bk) * bk
    head = dict(causal=causal, local_window_size=local_window_size, scale=scale)
    spec = _make_spec(q, hkv, bk=bk, split_len=split_len, page=0, interpret=interpret, **head)
    lens = jnp.minimum(jnp.asarray(kv_lens, jnp.int32).reshape(b), t)

    def kernel(q, k, v, lens):
        return _run(q, k, v, lens, None, spec=spec, splits=t_.cdiv(t, split_len), cfg=cfg)

    def reference(q, k, v, lens):
        return ref.decode_attention(q, k, v, lens, **head)

    return _with_reference_vjp(kernel, reference)(q, k, v, lens)


def _paged_launch(fn, q, k_pages, v_pages, block_table, kv_lens, *, pool: bool, config, **head):
    """Validated inputs of a paged decode call (``k_pages``/``v_pages``: ``[num_pages, page_size, Hkv, D]``
    arrays or views); returns the launch spec and config, split count, lengths and clipped block table."""
    check_inputs(fn, q, k_pages, v_pages, 4)
    _check_supported(fn, q)
    num_pages, page, hkv = k_pages.shape[:3]
    bt = jnp.asarray(block_table, jnp.int32)
    if bt.ndim != 2 or bt.shape[0] != q.shape[0]:
        raise ValueError(f"block_table: {fn} needs int [batch, max_pages], got {list(bt.shape)}")
    cfg = config or DecodeConfig()
    bk = page_block(page, cfg.block_k)
    if not bk:
        raise ValueError(f"page_size: the paged decode kernel needs a multiple of 16, got {page}")
    b, n_keys = q.shape[0], bt.shape[1] * page
    splits = _splits(cfg, b, hkv, n_keys, bk)
    split_len = t_.cdiv(t_.cdiv(n_keys, splits), bk) * bk
    spec = _make_spec(q, hkv, bk=bk, split_len=split_len, page=page, pool=pool, **head)
    lens = jnp.minimum(jnp.asarray(kv_lens, jnp.int32).reshape(b), n_keys)
    bt = jnp.clip(bt, 0, num_pages - 1)  # never follow an out-of-pool entry
    return spec, cfg, t_.cdiv(n_keys, split_len), lens, bt


def paged_decode_attention(
    q,
    k_pages,
    v_pages,
    block_table,
    kv_lens,
    *,
    causal=True,
    local_window_size=None,
    scale=None,
    config: DecodeConfig | None = None,
    interpret=False,
):
    """Split-K decode attention over a paged cache; semantics of `reference.paged_decode_attention`.

    Args:
        q: ``[B, Sq, Hq, D]``; k_pages, v_pages: ``[num_pages, page_size, Hkv, D]``.
        block_table: ``int [B, max_pages]``; kv_lens: ``int [B]`` (clipped to
            ``max_pages * page_size``).

    Raises:
        ValueError: ``page_size`` has no power-of-two factor ≥ 16 (see `page_block`),
            or malformed shapes.
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k_pages), jnp.asarray(v_pages)
    head = dict(causal=causal, local_window_size=local_window_size, scale=scale)
    spec, cfg, splits, lens, bt = _paged_launch(
        "paged_decode_attention", q, k, v, block_table, kv_lens, pool=False, config=config, interpret=interpret, **head
    )

    def kernel(q, k, v, lens, bt):
        return _run(q, k, v, lens, bt, spec=spec, splits=splits, cfg=cfg)

    def reference(q, k, v, lens, bt):
        return ref.paged_decode_attention(q, k, v, bt, lens, **head)

    return _with_reference_vjp(kernel, reference)(q, k, v, lens, bt)


def paged_decode_attention_pool(
    q,
    pool,
    layer,
    block_table,
    kv_lens,
    *,
    causal=True,
    local_window_size=None,
    scale=None,
    config: DecodeConfig | None = None,
    interpret=False,
):
    """`paged_decode_attention` reading layer ``layer`` straight out of a multi-layer block pool.

    A KV cache that keeps all layers in one pool
    ``[num_pages, 2, num_layers, page_size, Hkv, D]`` (plane 0 = K, 1 = V; the
    maxfx/MAX paged layout) would need a copy of the layer's pages to call
    `paged_decode_attention`; this kernel indexes page, plane and layer itself,
    so a decode step reads only the pages the block table names.

    Args:
        pool: the block pool, in ``q``'s dtype.
        layer: int scalar (may be traced), clipped into ``[0, num_layers)``.
        Other arguments as in `paged_decode_attention`.
    """
    q, pool = jnp.asarray(q), jnp.asarray(pool)
    ref.check_pool(pool)
    pages = jax.ShapeDtypeStruct((pool.shape[0], *pool.shape[3:]), pool.dtype)
    head = dict(causal=causal, local_window_size=local_window_size, scale=scale)
    spec, cfg, splits, lens, bt = _paged_launch(
        "paged_decode_attention_pool",
        q,
        pages,
        pages,
        block_table,
        kv_lens,
        pool=True,
        config=config,
        interpret=interpret,
        **head,
    )
    layer = jnp.clip(jnp.asarray(layer, jnp.int32).reshape(1), 0, pool.shape[2] - 1)

    def kernel(q, pool, lens, bt, layer):
        return _run(q, pool, pool, lens, bt, layer, spec=spec, splits=splits, cfg=cfg)

    def reference(q, pool, lens, bt, layer):
        return ref.paged_decode_attention_pool(q, pool, layer, bt, lens, **head)

    return _with_reference_vjp(kernel, reference, n_diff=2)(q, pool, lens, bt, layer)
