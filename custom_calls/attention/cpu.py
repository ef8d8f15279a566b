"""One query per row on the CPU: the Python side of ``custom_calls/cpu/decode_attention.cc``.

A decode step's attention (one new token per row against its KV cache) is, as
XLA ops, about nine small thunks per layer, with products that wake a pool
thread each; `one_query_attention` is one kernel call that reads each cached key
and value once for the query heads sharing it. `custom_calls.attention.dispatch`
uses it where its jnp reference would run on a CPU backend: float32, one query
per row, no chunked mask, ALiBi or sinks, not while exporting (an artifact must
run where the library is not built). Gradients are the reference's.

The kernel reads the cache head-major (``[B, Hkv, L, D]``); callers pass
``[B, L, Hkv, D]`` as everywhere in `custom_calls.attention`, and a cache kept
head-major and passed as a transposed view costs no copy (the transposes cancel).

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

__all__ = ["applies", "one_query_attention"]


def applies(q: Any, k: Any, v: Any, *, extensions: bool) -> bool:
    """Whether `one_query_attention` can stand in for the reference: see the module docstring."""
    if extensions or q.ndim != 4 or q.shape[1] != 1 or 0 in q.shape or 0 in k.shape:
        return False
    return all(x.dtype == jnp.float32 for x in (q, k, v)) and cpu.callable_here()


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
    b, _, hq, d = q.shape
    hkv, dv = k.shape[2], v.shape[3]
    kt, vt = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))
    out = jax.ffi.ffi_call("maxfx_decode_attention", jax.ShapeDtypeStruct((b, hkv, hq // hkv, dv), jnp.float32))(q.reshape(b, hkv, hq // hkv, d), kt, vt, lo, hi, scale=np.float32(scale))
    return out.reshape(b, 1, hq, dv)


def one_query_attention(q: Any, k: Any, v: Any, *, causal: bool, window: ref.Window, scale: float | None, q_offset: Any = 0, kv_lens: Any = None, q_lens: Any = None) -> jax.Array:
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
        return ref.attention(q, k, v, causal=causal, local_window_size=window, scale=scale, q_lens=q_lens, kv_lens=kv_lens, q_offset=q_offset)

    def fwd(q, k, v):
        return attend(q, k, v), (q, k, v)

    def bwd(saved, g):
        return jax.vjp(reference, *saved)[1](g)

    attend.defvjp(fwd, bwd)
    return attend(q, k, v)
