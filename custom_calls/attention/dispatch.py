"""Per-call choice between the Pallas attention kernels and the jnp reference.

The rule is `custom_calls._dispatch`'s (shared with `custom_calls.qmatmul.dispatch`):
``impl="reference"`` / ``"pallas"`` / ``"pallas_interpret"`` force a path;
``impl=None`` runs the kernel interpreted under ``MAXFX_PALLAS_INTERPRET=1``,
the Pallas (Triton) kernel on ``cuda`` when the default backend is a GPU or the
program is lowered for CUDA (``maxfx.export(..., platforms=[..., "cuda"])``),
else the reference (or the CPU C++ kernel below). This module adds what is
attention's: the checks, the fallback reasons and the paths.

Errors, the same on every path (``ValueError`` naming the parameter): q/k/v of
the wrong rank or mismatched shapes, ``n_heads`` not a multiple of
``n_kv_heads``, head_dim of q and k differ, q/k/v dtypes differ or are not
floating point, malformed ``local_window_size``, row offsets / ``kv_lens`` /
``block_table`` of the wrong shape.

Fallbacks to the reference (`custom_calls._dispatch.fallback`: logged, with a
one-time ``UserWarning`` per (function, reason)), when a kernel would otherwise run:

* every function: dtype not float32/bfloat16/float16 (e.g. float64);
  head_dim > 256; empty inputs;
* `paged_decode_attention` / `paged_decode_attention_pool`: ``page_size`` not
  a multiple of 16;
* `flash_attention` / `flash_attention_packed` extensions the kernels lack:
  ``chunk_size`` (chunked mask), ``alibi``, ``sinks``, and a ``v`` whose
  head_dim differs from ``k``'s (MLA). These are what the registry ops
  (``lowering/ops/attention.py``) need for MAX's chunked / ALiBi masks, sink
  weights and MLA values.

Where the reference runs on a CPU backend, `flash_attention` and
`paged_decode_attention` with one float32 query per row (an LLM decode step)
run the C++ kernels of `custom_calls.attention.cpu` instead (``impl=None`` only;
same masks and results; the paged one reads the pages in place).

Gradients: `flash_attention` and `flash_attention_ragged` have Pallas
backward kernels (``custom_vjp``); the decode functions differentiate through
the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from custom_calls._dispatch import ENV_INTERPRET, IMPLS, kernel_mode, reset_warnings, run
from custom_calls.attention import cpu as cpu_attention
from custom_calls.attention import pallas_decode as pd
from custom_calls.attention import pallas_flash as pf
from custom_calls.attention import reference as ref

__all__ = [
    "ENV_INTERPRET",
    "IMPLS",
    "kernel_mode",
    "flash_attention",
    "flash_attention_ragged",
    "decode_attention",
    "paged_decode_attention",
    "paged_decode_attention_pool",
    "flash_attention_packed",
    "attention",
    "paged_attention_pool",
    "reset_warnings",
]


def _fallback_reason(q, k) -> str | None:
    why = pf.unsupported_reason(q)
    if why is None and (q.size == 0 or k.size == 0):
        why = "empty input"
    return why


def _check(fn: str, q, k, v, rank: int) -> str | None:
    """`pf.check_inputs`, letting ``v`` differ from ``k`` in head_dim only (then: the reason the kernel cannot run)."""
    if v.ndim == k.ndim == rank and v.shape[:-1] == k.shape[:-1] and v.shape[-1] != k.shape[-1]:
        pf.check_inputs(fn, q, k, jax.ShapeDtypeStruct(k.shape, v.dtype), rank)
        return f"value head_dim {v.shape[-1]} differs from the key head_dim {k.shape[-1]}"
    pf.check_inputs(fn, q, k, v, rank)
    return None


def _extension_reason(chunk_size, alibi, sinks) -> str | None:
    named = [
        n
        for n, on in (
            ("chunk_size (chunked mask)", chunk_size is not None),
            ("alibi", alibi),
            ("sinks", sinks is not None),
        )
        if on
    ]
    return f"{', '.join(named)} not supported by the kernel" if named else None


def _checked(fn: str, q, k, v, rank: int):
    """``q, k, v`` as arrays, validated by `pf.check_inputs`."""
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    pf.check_inputs(fn, q, k, v, rank)
    return q, k, v


def flash_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    scale: float | None = None,
    q_lens: Any = None,
    kv_lens: Any = None,
    q_offset: Any = 0,
    config: pf.FlashConfig | None = None,
    impl: str | None = None,
    chunk_size: int | None = None,
    alibi: bool = False,
    sinks: Any = None,
) -> jax.Array:
    """Attention on ``[batch, seq, heads, head_dim]`` (``jax.nn.dot_product_attention`` layout).

    Args:
        q: ``[B, Sq, Hq, D]``; k, v: ``[B, Sk, Hkv, D]``, ``Hq % Hkv == 0`` (GQA/MQA).
        causal: mask keys after the query position (top-left aligned: query
            ``i`` at position ``q_offset + i``).
        local_window_size: ``w`` or ``(left, right)``: keys in
            ``[pos - left, pos + right]`` (``jax.nn`` convention).
        scale: score scale, default ``1/sqrt(D)``.
        q_lens, kv_lens: optional ``int [B]`` valid lengths (rows past
            ``q_lens`` are zero).
        q_offset: position of query row 0 (int or ``int [B]``).
        config: kernel tiling (`pallas_flash.FlashConfig`), default per head_dim.
        impl: force ``"reference"``, ``"pallas"``, ``"pallas_interpret"``.
        chunk_size, alibi, sinks: extensions (chunked mask, ALiBi bias, sink
            logits ``[Hq]``, see `reference`); with any of them, or a ``v``
            head_dim unlike ``k``'s, the reference runs (one-time warning
            where a kernel would have run).

    Returns:
        ``[B, Sq, Hq, Dv]`` in ``q``'s dtype (float32 softmax/accumulation).

    Example:
        >>> import numpy as np
        >>> from custom_calls.attention import flash_attention
        >>> q = np.ones((1, 8, 4, 16), np.float32); kv = np.ones((1, 8, 2, 16), np.float32)
        >>> flash_attention(q, kv, kv, causal=True).shape
        (1, 8, 4, 16)
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    why = _check("flash_attention", q, k, v, 4) or _extension_reason(chunk_size, alibi, sinks)
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"flash_attention: batch of q ({q.shape[0]}) and k ({k.shape[0]}) differ")
    ref.window_pair(local_window_size, causal)  # validate on every path
    b = q.shape[0]
    extras = tuple(jnp.asarray(x, jnp.int32) for x in (q_lens, kv_lens, q_offset) if x is not None)
    names = [n for n, x in (("q_lens", q_lens), ("kv_lens", kv_lens), ("q_offset", q_offset)) if x is not None]
    for n, x in zip(names, extras):
        if x.size not in (1, b) or (n != "q_offset" and x.shape != (b,)):
            raise ValueError(f"{n}: flash_attention expects int [{b}], got {list(x.shape)}")
    if sinks is not None:
        extras, names = (*extras, jnp.asarray(sinks)), [*names, "sinks"]
    common = dict(causal=causal, local_window_size=local_window_size, scale=scale)
    mods = dict(chunk_size=chunk_size, alibi=alibi)

    def unpack(rest):
        return dict(zip(names, rest))

    def kernel(q, k, v, *rest, interpret):
        return pf.flash_attention(q, k, v, **common, **unpack(rest), config=config, interpret=interpret)

    def reference(q, k, v, *rest):
        return ref.attention(q, k, v, **common, **mods, **unpack(rest))

    def cpu(q, k, v, *rest):
        if not cpu_attention.applies(q, k, v, extensions=bool(chunk_size or alibi or sinks is not None)):
            return None
        window = ref.window_pair(local_window_size, causal)
        return cpu_attention.one_query_attention(q, k, v, causal=causal, window=window, scale=scale, **unpack(rest))

    return run(
        "flash_attention",
        impl,
        (q, k, v, *extras),
        kernel,
        reference,
        why or _fallback_reason(q, k),
        cpu=cpu,
        cpu_label="one query",
    )


def flash_attention_ragged(
    q: Any,
    k: Any,
    v: Any,
    input_row_offsets: Any,
    *,
    kv_row_offsets: Any = None,
    causal: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    scale: float | None = None,
    max_seq_len: int | None = None,
    max_kv_len: int | None = None,
    config: pf.FlashConfig | None = None,
    impl: str | None = None,
) -> jax.Array:
    """Attention over ragged batches packed along the token axis.

    Args:
        q: ``[total_q, Hq, D]``; k, v: ``[total_kv, Hkv, D]``.
        input_row_offsets: ``int [B+1]``: sequence ``b`` is q rows ``[off[b], off[b+1])``.
        kv_row_offsets: ``int [B+1]`` for k/v, default ``input_row_offsets``.
            Queries align to the end of their keys (query ``i`` of a sequence
            sits at position ``kv_len - q_len + i``): a cached prefix works.
        max_seq_len, max_kv_len: static bounds on the lengths (computed from
            concrete offsets; under ``jit`` pass them, else the totals are used).
        Other arguments as in `flash_attention`.

    Returns:
        ``[total_q, Hq, D]``; rows outside ``[off[0], off[-1])`` are zero.
    """
    q, k, v = _checked("flash_attention_ragged", q, k, v, 3)
    ref.window_pair(local_window_size, causal)
    qo = jnp.asarray(input_row_offsets, jnp.int32)
    ko = qo if kv_row_offsets is None else jnp.asarray(kv_row_offsets, jnp.int32)
    if qo.ndim != 1 or qo.shape[0] < 2 or ko.shape != qo.shape:
        raise ValueError(
            f"input_row_offsets: flash_attention_ragged expects int [batch+1] offsets (and kv_row_offsets of the same "
            f"shape), got {list(qo.shape)} and {list(ko.shape)}"
        )
    lq = ref._max_len(input_row_offsets, q.shape[0], max_seq_len)
    lk = lq if kv_row_offsets is None else ref._max_len(kv_row_offsets, k.shape[0], max_kv_len, "max_kv_len")
    common = dict(causal=causal, local_window_size=local_window_size, scale=scale, max_seq_len=lq)
    kv_given = kv_row_offsets is not None

    def kernel(q, k, v, qo, ko, interpret):
        return pf.flash_attention_ragged(
            q,
            k,
            v,
            qo,
            kv_row_offsets=ko if kv_given else None,
            max_kv_len=lk,
            **common,
            config=config,
            interpret=interpret,
        )

    def reference(q, k, v, qo, ko):
        return ref.ragged_attention(q, k, v, qo, kv_row_offsets=ko if kv_given else None, max_kv_len=lk, **common)

    return run("flash_attention_ragged", impl, (q, k, v, qo, ko), kernel, reference, _fallback_reason(q, k))


def _check_lens(fn: str, kv_lens, b: int):
    lens = jnp.asarray(kv_lens, jnp.int32)
    if lens.shape != (b,):
        raise ValueError(f"kv_lens: {fn} expects int [{b}], got {list(lens.shape)}")
    return lens


def decode_attention(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    kv_lens: Any,
    *,
    causal: bool = True,
    local_window_size: int | tuple[int, int] | None = None,
    scale: float | None = None,
    config: pd.DecodeConfig | None = None,
    impl: str | None = None,
) -> jax.Array:
    """A few new query tokens against a dense KV cache (split-K flash-decoding on GPU).

    Args:
        q: ``[B, Sq, Hq, D]`` (``Sq`` new tokens, usually 1).
        k_cache, v_cache: ``[B, T, Hkv, D]``; the first ``kv_lens[b]`` entries
            are valid and already include the new tokens.
        kv_lens: ``int [B]``; query ``i`` sits at position ``kv_lens[b] - Sq + i``.
        causal: mask keys after each query's position (matters for ``Sq > 1``).
        config: `pallas_decode.DecodeConfig` (``block_k``, ``num_splits``, warps, stages).
        Other arguments as in `flash_attention`.

    Returns:
        ``[B, Sq, Hq, D]`` in ``q``'s dtype.
    """
    q, k, v = _checked("decode_attention", q, k_cache, v_cache, 4)
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"k_cache: decode_attention batch ({k.shape[0]}) differs from q's ({q.shape[0]})")
    head = dict(causal=causal, local_window_size=local_window_size, scale=scale)
    return _run_decode(
        "decode_attention", impl, pd.decode_attention, ref.decode_attention, (q, k, v), kv_lens, head, config
    )


def _run_decode(
    fn: str,
    impl,
    kernel_fn: Callable,
    reference_fn: Callable,
    operands: tuple,
    kv_lens,
    head: dict,
    config,
    *,
    block_table=None,
    page_size=None,
    cpu=None,
    cpu_label: str = "",
):
    """`run` for the decode entry points, after the mask, table and length checks.

    ``operands`` start with ``q`` and the K/V storage; both paths get
    ``(*operands, [block_table,] kv_lens)`` and the ``head`` keywords (causal,
    local_window_size, scale). ``page_size`` (paged caches) adds the kernel's
    page-size condition to the fallback reason.
    """
    q, kv = operands[0], operands[1]
    ref.window_pair(head["local_window_size"], head["causal"])
    tables = () if block_table is None else (_check_block_table(fn, block_table, q.shape[0]),)
    lens = _check_lens(fn, kv_lens, q.shape[0])

    def kernel(*args, interpret):
        return kernel_fn(*args, **head, config=config, interpret=interpret)

    def reference(*args):
        return reference_fn(*args, **head)

    why = _fallback_reason(q, kv)
    if why is None and page_size is not None and not pd.page_block(page_size, (config or pd.DecodeConfig()).block_k):
        why = f"page_size {page_size} is not a multiple of 16"
    args = (*operands, *tables, lens)
    return run(fn, impl, args, kernel, reference, why, cpu=cpu, cpu_label=cpu_label, depth=1)


def paged_decode_attention(
    q: Any,
    k_pages: Any,
    v_pages: Any,
    block_table: Any,
    kv_lens: Any,
    *,
    causal: bool = True,
    local_window_size: int | tuple[int, int] | None = None,
    scale: float | None = None,
    config: pd.DecodeConfig | None = None,
    impl: str | None = None,
) -> jax.Array:
    """`decode_attention` over a paged KV cache (a block pool plus a block table).

    Args:
        q: ``[B, Sq, Hq, D]``.
        k_pages, v_pages: ``[num_pages, page_size, Hkv, D]``, in ``q``'s dtype or
            a narrower float one (a float16 KV cache: the CPU kernel reads it in
            place, the other paths convert it to ``q``'s dtype).
        block_table: ``int [B, max_pages]``: logical page ``j`` of sequence ``b``
            is pool page ``block_table[b, j]``; entries past ``kv_lens`` are ignored.
        kv_lens: ``int [B]``.
        Other arguments as in `decode_attention`. The kernel needs
        ``page_size % 16 == 0`` (else the reference, with a one-time warning).
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k_pages), jnp.asarray(v_pages)
    if (
        jnp.issubdtype(k.dtype, jnp.floating) and k.dtype == v.dtype
    ):  # pools may be stored narrower than q (a float16 KV cache)
        pf.check_inputs(
            "paged_decode_attention",
            q,
            jax.ShapeDtypeStruct(k.shape, q.dtype),
            jax.ShapeDtypeStruct(v.shape, q.dtype),
            4,
        )
    else:
        pf.check_inputs("paged_decode_attention", q, k, v, 4)

    def reference(q, k, v, table, lens, **common):
        return ref.paged_decode_attention(q, k.astype(q.dtype), v.astype(q.dtype), table, lens, **common)

    def kernel(q, k, v, *rest, **kw):
        return pd.paged_decode_attention(q, k.astype(q.dtype), v.astype(q.dtype), *rest, **kw)

    def cpu(q, k, v, table, lens):
        if q.shape[1] != 1 or not cpu_attention.applies_paged(q, k, v):
            return None
        window = ref.window_pair(local_window_size, causal)
        return cpu_attention.paged_one_query_attention(q, k, v, table, lens, window=window, scale=scale)

    head = dict(causal=causal, local_window_size=local_window_size, scale=scale)
    return _run_decode(
        "paged_decode_attention",
        impl,
        kernel,
        reference,
        (q, k, v),
        kv_lens,
        head,
        config,
        block_table=block_table,
        page_size=k.shape[1],
        cpu=cpu,
        cpu_label="one query, pages read in place",
    )


def _check_block_table(fn: str, block_table, b: int):
    bt = jnp.asarray(block_table, jnp.int32)
    if bt.ndim != 2 or bt.shape[0] != b:
        raise ValueError(f"block_table: {fn} expects int [{b}, max_pages], got {list(bt.shape)}")
    return bt


def paged_decode_attention_pool(
    q: Any,
    pool: Any,
    layer: Any,
    block_table: Any,
    kv_lens: Any,
    *,
    causal: bool = True,
    local_window_size: int | tuple[int, int] | None = None,
    scale: float | None = None,
    config: pd.DecodeConfig | None = None,
    impl: str | None = None,
) -> jax.Array:
    """`paged_decode_attention` over layer ``layer`` of a multi-layer KV pool, without copying the layer out.

    Args:
        q: ``[B, Sq, Hq, D]``.
        pool: ``[num_pages, 2, num_layers, page_size, Hkv, D]``: plane 0 holds
            keys, plane 1 values (the layout of maxfx's paged KV cache).
        layer: int scalar, may be traced (clipped into ``[0, num_layers)``).
        block_table, kv_lens: as in `paged_decode_attention`.

    Example:
        >>> import numpy as np
        >>> from custom_calls import attention as att
        >>> pool = np.zeros((4, 2, 3, 16, 2, 64), np.float32)  # 4 pages, K/V, 3 layers
        >>> q = np.ones((1, 1, 8, 64), np.float32)
        >>> att.paged_decode_attention_pool(q, pool, 2, np.array([[3, 0]]), np.array([20])).shape
        (1, 1, 8, 64)
    """
    q, pool = jnp.asarray(q), jnp.asarray(pool)
    ref.check_pool(pool)
    pages = jax.ShapeDtypeStruct((pool.shape[0], *pool.shape[3:]), pool.dtype)
    pf.check_inputs("paged_decode_attention_pool", q, pages, pages, 4)
    layer = jnp.asarray(layer)
    if layer.size != 1 or not jnp.issubdtype(layer.dtype, jnp.integer):
        raise ValueError(
            f"layer: paged_decode_attention_pool expects an integer scalar, got {layer.dtype}{list(layer.shape)}"
        )
    head = dict(causal=causal, local_window_size=local_window_size, scale=scale)
    return _run_decode(
        "paged_decode_attention_pool",
        impl,
        pd.paged_decode_attention_pool,
        ref.paged_decode_attention_pool,
        (q, pool, layer),
        kv_lens,
        head,
        config,
        block_table=block_table,
        page_size=pool.shape[3],
    )


def flash_attention_packed(
    q: Any,
    k: Any,
    v: Any,
    seq: Any,
    *,
    max_q_len: int,
    max_kv_len: int,
    causal: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    scale: float | None = None,
    chunk_size: int | None = None,
    alibi: bool = False,
    sinks: Any = None,
    config: pf.FlashConfig | None = None,
    impl: str | None = None,
) -> jax.Array:
    """Attention on the kernel's packed layout: any per-sequence q/kv rows and query positions.

    The general form behind `flash_attention_ragged` (extension, not part of
    the stable four): it also covers queries not aligned to the end of their
    keys (chunked prefill) and keys read from a padded or gathered cache.

    Args:
        q: ``[Tq, Hq, D]``; k, v: ``[Tk, Hkv, D]``.
        seq: ``int [5, B]``: per sequence the first q row, q length, first k/v
            row, k/v length and the position of its first query (keys at
            positions ``0..kv_len-1``).
        max_q_len, max_kv_len: static bounds of the lengths in ``seq``.
        Other arguments as in `flash_attention`.

    Returns:
        ``[Tq, Hq, Dv]``; rows no sequence covers are zero.

    Example:
        >>> import numpy as np
        >>> from custom_calls.attention.dispatch import flash_attention_packed
        >>> q = np.ones((5, 2, 8), np.float32); seq = np.array([[0, 2], [2, 3], [0, 2], [2, 3], [0, 0]])
        >>> flash_attention_packed(q, q, q, seq, max_q_len=3, max_kv_len=3, causal=True).shape
        (5, 2, 8)
    """
    q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
    why = _check("flash_attention_packed", q, k, v, 3) or _extension_reason(chunk_size, alibi, sinks)
    ref.window_pair(local_window_size, causal)
    table = jnp.asarray(seq, jnp.int32)
    if table.ndim != 2 or table.shape[0] != 5:
        raise ValueError(f"seq: flash_attention_packed expects int [5, batch], got {list(table.shape)}")
    common = dict(
        causal=causal, local_window_size=local_window_size, scale=scale, max_q_len=max_q_len, max_kv_len=max_kv_len
    )
    args = (q, k, v, table) if sinks is None else (q, k, v, table, jnp.asarray(sinks))

    def kernel(q, k, v, table, interpret):
        o = pf.flash_attention_packed(q, k, v, table, **common, config=config, interpret=interpret)
        t = jnp.arange(q.shape[0])[:, None]
        covered = jnp.any((t >= table[0][None, :]) & (t < (table[0] + table[1])[None, :]), axis=1)
        return jnp.where(covered[:, None, None], o, 0).astype(o.dtype)  # the kernel leaves such rows unwritten

    def reference(q, k, v, table, *sink):
        return ref.packed_attention(
            q, k, v, table, **common, chunk_size=chunk_size, alibi=alibi, sinks=sink[0] if sink else None
        )

    return run("flash_attention_packed", impl, args, kernel, reference, why or _fallback_reason(q, k))


# ─── the registry ops' routes: which of the kernels above serves an op's arguments ─────────────────────────


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    q_offset: Any = 0,
    kv_lens: Any = None,
    sinks: Any = None,
    causal: bool = False,
    local_window_size: int | tuple[int, int] | None = None,
    scale: float | None = None,
    chunk_size: int | None = None,
    alibi: bool = False,
    impl: str | None = None,
) -> jax.Array:
    """`flash_attention`, or `decode_attention` where it computes the same faster (the ``attention`` op's route).

    With one query per row, ``kv_lens`` and no window, sinks, chunks or ALiBi,
    where a kernel runs, the split-K decode kernel reads the cache once, split
    across blocks, while the flash kernel would tile over queries there are none
    of. (The decode kernel places the query at the end of its keys, which differs
    from ``q_offset`` once a window matters.) Elsewhere `flash_attention` runs,
    its CPU one-query kernel included. Arguments as in `flash_attention`.

    Example:
        >>> import numpy as np
        >>> from custom_calls.attention import dispatch
        >>> q = np.ones((2, 1, 4, 16), np.float32); cache = np.ones((2, 8, 2, 16), np.float32)
        >>> dispatch.attention(q, cache, cache, q_offset=np.array([3, 7]), kv_lens=np.array([4, 8]), causal=True).shape
        (2, 1, 4, 16)
    """
    q = jnp.asarray(q)
    one_query = q.ndim == 4 and q.shape[1] == 1 and kv_lens is not None
    plain = sinks is None and local_window_size is None and chunk_size is None and not alibi
    if one_query and plain and kernel_mode(impl) is not None:
        lens = jnp.asarray(kv_lens, jnp.int32)
        if causal:  # the query at position p sees keys [0, min(p + 1, kv_lens)): all of a cache of that length
            lens = jnp.minimum(lens, jnp.asarray(q_offset, jnp.int32) + 1)
        return decode_attention(q, k, v, lens, causal=False, scale=scale, impl=impl)
    return flash_attention(
        q,
        k,
        v,
        causal=causal,
        local_window_size=local_window_size,
        scale=scale,
        kv_lens=kv_lens,
        q_offset=q_offset,
        impl=impl,
        chunk_size=chunk_size,
        alibi=alibi,
        sinks=sinks,
    )


def _layer_rows(pool, table, layer, plane: int):
    """``[B, max_pages * page_size, Hkv, D]``: the rows of ``plane`` of one layer, in each sequence's page order."""
    g = pool[table, plane, layer]  # [B, P, page, H, D]
    return g.reshape(g.shape[0], g.shape[1] * g.shape[2], *g.shape[3:])


def paged_attention_pool(
    q: Any,
    pool: Any,
    layer: Any,
    block_table: Any,
    row_offsets: Any,
    cache_lengths: Any,
    *,
    kv_row_offsets: Any = None,
    sinks: Any = None,
    v_dim: int | None = None,
    causal: bool = True,
    local_window_size: int | tuple[int, int] | None = None,
    scale: float | None = None,
    chunk_size: int | None = None,
    alibi: bool = False,
    impl: str | None = None,
) -> jax.Array:
    """Ragged queries over layer ``layer`` of a multi-layer paged pool (the ``paged_attention`` op's route).

    Args:
        q: ``[total_tokens, Hq, D]``; row ``i`` of sequence ``b`` (rows
            ``row_offsets[b]:row_offsets[b+1]``) sits at position ``cache_lengths[b] + i``.
        pool: ``[num_pages, kv_dim, num_layers, page_size, Hkv, D]``: plane 0
            keys, plane 1 values (the new rows already stored).
        layer: int scalar; block_table: ``int [B, max_pages]``; row_offsets:
            ``int [B+1]``; cache_lengths: ``int [B]``.
        kv_row_offsets: ``int [B+1]``: the keys of sequence ``b`` are its
            ``kv_row_offsets[b+1] - kv_row_offsets[b]`` first positions (cross
            attention); default ``cache_lengths[b] + seq_len[b]``.
        v_dim: values are the first ``v_dim`` dims of the keys (MLA's latent cache).
        Other arguments as in `flash_attention`.

    A decode step (one row per sequence) with none of ``kv_row_offsets``,
    ``sinks``, ``v_dim``, chunks or ALiBi, where a kernel runs and takes the
    page size, runs `paged_decode_attention_pool` with each row as its own
    one-token sequence, reading the pages in place; everything else gathers the
    layer's pages and runs `flash_attention_packed`.

    Returns:
        ``[total_tokens, Hq, Dv]`` in ``q``'s dtype; rows past the last offset are zero.
    """
    q, pool = jnp.asarray(q), jnp.asarray(pool)
    table, layer = jnp.asarray(block_table, jnp.int32), jnp.asarray(layer, jnp.int32).reshape(())
    offs, cached = jnp.asarray(row_offsets, jnp.int32), jnp.asarray(cache_lengths, jnp.int32)
    masks = dict(causal=causal, local_window_size=local_window_size, scale=scale)
    extended = kv_row_offsets is not None or sinks is not None or v_dim is not None or chunk_size is not None or alibi
    if (
        0 < q.shape[0] == table.shape[0]
        and not extended
        and pool.shape[1] == 2
        and kernel_mode(impl) is not None
        and pd.page_block(pool.shape[3], pd.DecodeConfig().block_k) > 0
    ):
        # Row i of sequence b sees keys < cache_lengths[b] + i + 1 (causal) or all of its sequence's: exact for any
        # row offsets; padding rows see no key (zeros). A query in another dtype is cast to the pool's.
        b, i, valid = ref.ragged_rows(offs, q.shape[0])
        seen = i + 1 if causal else offs[b + 1] - offs[b]
        kv_len = jnp.where(valid, cached[b] + seen, 0)
        out = paged_decode_attention_pool(
            q[:, None].astype(pool.dtype), pool, layer, table[b], kv_len, **masks, impl=impl
        )
        return out[:, 0].astype(q.dtype)
    k = _layer_rows(pool, table, layer, 0)
    v = k[..., :v_dim] if v_dim is not None else _layer_rows(pool, table, layer, 1)
    if kv_row_offsets is None:
        kv_len = cached + offs[1:] - offs[:-1]
    else:
        ko = jnp.asarray(kv_row_offsets, jnp.int32)
        kv_len = ko[1:] - ko[:-1]
    # the gathered rows are [batch, s, ...]: sequence b's keys are rows b*s.. of their flattening
    nb, s = k.shape[:2]
    seq = jnp.stack([offs[:-1], offs[1:] - offs[:-1], jnp.arange(nb, dtype=jnp.int32) * s, kv_len, cached])
    flat = lambda x: x.reshape(nb * s, *x.shape[2:]).astype(q.dtype)  # noqa: E731
    return flash_attention_packed(
        q,
        flat(k),
        flat(v),
        seq,
        max_q_len=q.shape[0],
        max_kv_len=s,
        **masks,
        chunk_size=chunk_size,
        alibi=alibi,
        sinks=sinks,
        impl=impl,
    )
