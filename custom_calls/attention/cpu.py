"""One query per row on the CPU: the Python side of ``custom_calls/cpu/decode_attention.cc``.

A decode step's attention (one new token per row against its KV cache) is, as
XLA ops, about nine small thunks per layer, with products that wake a pool
thread each; `one_query_attention` is one kernel call that reads each cached key
and value once for the query heads sharing it. `custom_calls.attention.dispatch`
uses it where its jnp reference would run on a CPU backend: float32, one query
per row, no chunked mask, ALiBi or sinks, not while exporting (an artifact must
run where the library is not built). Gradients are the reference's.

`paged_one_query_attention` is the same for a paged cache (the generation
engine's): it reads each row's keys through its page table, from the
``[num_pages, page_size, Hkv, D]`` pool in place, where the reference would
first gather the pages into a dense window (`custom_calls.attention.dispatch`'s
`paged_decode_attention` runs it on a CPU backend).

Both read caches as ``[B, L, Hkv, D]``, the layout of every path of
`custom_calls.attention` (and of the Pallas kernels): `one_query_attention`
runs the paged kernel with row ``b``'s cache as its one page (``B`` pages of
``L`` slots), so a dense cache is read in place, in memory order, with no
copy into another layout. (The paged kernel measured as fast as the
head-major dense kernel it replaced inside a model step, docs/pages/kernels.md.)

Example:
    >>> import numpy as np
    >>> from custom_calls.attention import cpu
    >>> q = np.ones((1, 1, 4, 16), np.float32); kv = np.ones((1, 8, 2, 16), np.float32)
    >>> if cpu.applies(q, kv, kv, extensions=False):
    ...     print(cpu.one_query_attention(q, kv, kv, causal=True, window=None, scale=0.25, q_offset=7).shape)
    (1, 1, 4, 16)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from custom_calls import cpu
from custom_calls.attention import reference as ref

__all__ = ["applies", "applies_paged", "one_query_attention", "paged_one_query_attention"]


def _one_float32_query(q: Any, k: Any) -> bool:
    """One float32 query per row (``q [B, 1, Hq, D]``) and a non-empty cache."""
    return q.ndim == 4 and q.shape[1] == 1 and 0 not in q.shape and 0 not in k.shape and q.dtype == jnp.float32


def applies(q: Any, k: Any, v: Any, *, extensions: bool) -> bool:
    """Whether `one_query_attention` can stand in for the reference: see the module docstring."""
    return not extensions and _one_float32_query(q, k) and k.dtype == v.dtype == jnp.float32 and cpu.callable_here()


def applies_paged(q: Any, k_pages: Any, v_pages: Any) -> bool:
    """Whether `paged_one_query_attention` can run: `applies`, except that the pools may be float16 (half the bytes a
    step reads).
    """
    return (
        _one_float32_query(q, k_pages)
        and k_pages.dtype == v_pages.dtype
        and k_pages.dtype in (jnp.float32, jnp.float16)
        and cpu.callable_here()
    )


def _visible_range(b: int, sk: int, *, causal: bool, window: ref.Window, q_offset: Any, kv_lens: Any, q_lens: Any):
    """Per row, the keys ``[lo, hi)`` its query sees: the reference's masks for one query."""
    qpos = jnp.broadcast_to(jnp.asarray(q_offset, jnp.int32), (b,))
    hi = jnp.full((b,), sk, jnp.int32) if kv_lens is None else jnp.minimum(jnp.asarray(kv_lens, jnp.int32), sk)
    lo = jnp.zeros((b,), jnp.int32)
    if causal:
        hi = jnp.minimum(hi, qpos + 1)
    if window is not None:
        lo = jnp.maximum(lo, qpos - window[0])
        hi = jnp.minimum(hi, qpos + window[1] + 1)
    if q_lens is not None:  # a row with no query: nothing visible, output zero
        hi = jnp.where(jnp.asarray(q_lens, jnp.int32) > 0, hi, lo)
    return lo, hi


def _kernel(q, k, v, lo, hi, *, scale: float):
    """The paged kernel over ``k, v [B, L, Hkv, D]`` as ``B`` pages of ``L`` slots, row ``b`` on page ``b`` (read in
    place).
    """
    b, _, hq, d = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    table = jnp.arange(b, dtype=jnp.int32)[:, None]
    out = jax.ffi.ffi_call("maxfx_paged_decode_attention", jax.ShapeDtypeStruct((b, hkv, hq // hkv, dv), jnp.float32))(
        q.reshape(b, hkv, hq // hkv, d), k, v, table, lo, hi, scale=np.float32(scale)
    )
    return out.reshape(b, 1, hq, dv)


def one_query_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    window: ref.Window,
    scale: float | None,
    q_offset: Any = 0,
    kv_lens: Any = None,
    q_lens: Any = None,
) -> jax.Array:
    """`reference.attention` for ``q [B, 1, Hq, D]`` against ``k, v [B, Sk, Hkv, D]`` by the C++ kernel.

    ``window`` is `reference.window_pair`'s ``(left, right)`` or None; the other
    arguments are `reference.attention`'s. Call only where `applies`.
    """
    b, sk = q.shape[0], k.shape[1]
    scale = ref._scale(scale, q.shape[-1])
    lo, hi = _visible_range(b, sk, causal=causal, window=window, q_offset=q_offset, kv_lens=kv_lens, q_lens=q_lens)

    @jax.custom_vjp
    def attend(q, k, v):
        return _kernel(q, k, v, lo, hi, scale=scale)

    def reference(q, k, v):
        return ref.attention(
            q,
            k,
            v,
            causal=causal,
            local_window_size=window,
            scale=scale,
            q_lens=q_lens,
            kv_lens=kv_lens,
            q_offset=q_offset,
        )

    def fwd(q, k, v):
        return attend(q, k, v), (q, k, v)

    def bwd(saved, g):
        return jax.vjp(reference, *saved)[1](g)

    attend.defvjp(fwd, bwd)
    return attend(q, k, v)


def paged_one_query_attention(
    q: Any, k_pages: Any, v_pages: Any, block_table: Any, kv_lens: Any, *, window: ref.Window, scale: float | None
) -> jax.Array:
    """`reference.paged_decode_attention` for one query per row (``q [B, 1, Hq, D]``) by the C++ kernel.

    Row ``b``'s query sits at position ``kv_lens[b] - 1`` and sees the keys
    ``[0, kv_lens[b])`` (within ``window``, `reference.window_pair`'s pair or None)
    of its pages ``block_table[b]`` in ``k_pages, v_pages [num_pages, page_size, Hkv, D]``
    (float32 or float16 pools; scores and sums in float32). Call only where
    `applies_paged`. Gradients are the reference's.

    Example:
        >>> import numpy as np
        >>> from custom_calls.attention import cpu
        >>> q = np.ones((1, 1, 4, 16), np.float32); pages = np.ones((3, 16, 2, 16), np.float32)
        >>> if cpu.applies_paged(q, pages, pages):
        ...     print(cpu.paged_one_query_attention(q, pages, pages, np.array([[2, 1]]), np.array([20]), window=None,
        ...     scale=0.25).shape)
        (1, 1, 4, 16)
    """
    b, hq, d = q.shape[0], q.shape[2], q.shape[3]
    hkv, dv = k_pages.shape[2], v_pages.shape[3]
    scale = ref._scale(scale, d)
    kv_lens = jnp.asarray(kv_lens, jnp.int32)
    table = jnp.asarray(block_table, jnp.int32)
    lo, hi = _visible_range(
        b,
        table.shape[1] * k_pages.shape[1],
        causal=True,
        window=window,
        q_offset=kv_lens - 1,
        kv_lens=kv_lens,
        q_lens=None,
    )
    call = jax.ffi.ffi_call("maxfx_paged_decode_attention", jax.ShapeDtypeStruct((b, hkv, hq // hkv, dv), jnp.float32))

    @jax.custom_vjp
    def attend(q, k_pages, v_pages):
        return call(q.reshape(b, hkv, hq // hkv, d), k_pages, v_pages, table, lo, hi, scale=np.float32(scale)).reshape(
            b, 1, hq, dv
        )

    def reference(q, k_pages, v_pages):
        k_pages, v_pages = k_pages.astype(q.dtype), v_pages.astype(q.dtype)
        return ref.paged_decode_attention(
            q, k_pages, v_pages, table, kv_lens, causal=True, local_window_size=window, scale=scale
        )

    def fwd(q, k_pages, v_pages):
        return attend(q, k_pages, v_pages), (q, k_pages, v_pages)

    def bwd(saved, g):
        return jax.vjp(reference, *saved)[1](g)

    attend.defvjp(fwd, bwd)
    return attend(jnp.asarray(q), jnp.asarray(k_pages), jnp.asarray(v_pages))
