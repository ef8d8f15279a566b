"""Building blocks of the eager model definitions: checkpoint-layout layers and attention over a KV cache.

- `Conv1D`: GPT-2's transposed Linear (``weight: [in, out]``).
- `Q8Linear` / `Q8Embedding`: GGUF Q8_0 weights kept 8-bit (int8 values plus
  one float16 scale per 32), decoded inside the compiled program by the Q8_0
  math of `maxfx.nn._q8` (the graph layers' too).
- `PackedEmbedding`: rows of GGUF blocks (Q4_0, Q4_K, ...) decoded after the gather.
- `ScaledRMSNorm`: RMSNorm scaling by ``(w + offset)`` in float32 (Gemma's ``1 + w``).
- `rope` / `attend`: rotary embeddings (`maxfx.nn._rope.apply_rope`) at per-row
  positions, and causal grouped-query attention over a KV cache through the
  registry ``attention`` op (`maxfx.nn.attention._attention_without_rope.padded_attention`: the
  Pallas flash kernel on GPU, the jnp reference elsewhere), optionally in a
  sliding window (Mistral).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lowering.context import bind
from lowering.dtypes import DType
from lowering.ops.attention import paged_cache_attention_p
from lowering.quantization import QuantizationEncoding
from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn import Embedding, Linear, Module, QuantizedLinear
from maxfx.generation._paged_cache import PagedLayerCache
from maxfx.graph import ops
from maxfx.nn._q8 import q8_lookup, q8_matmul
from maxfx.nn._rope import apply_rope, rope_cos_sin
from maxfx.nn.attention._attention_without_rope import padded_attention

__all__ = [
    "Conv1D",
    "PackedEmbedding",
    "Q8Embedding",
    "Q8Linear",
    "ScaledRMSNorm",
    "attend",
    "embedding",
    "linear",
    "rope",
]


def linear(weight: Tensor, bias: Tensor | None = None) -> Linear:
    """A `Linear` around existing tensors (no random initialisation)."""
    m = object.__new__(Linear)
    m.weight = weight
    m.bias = 0 if bias is None else bias
    return m


def embedding(weight: Tensor) -> Embedding:
    """An `Embedding` around an existing ``[vocab, dim]`` table."""
    m = object.__new__(Embedding)
    m.weight = weight
    return m


class Conv1D(Module):
    """GPT-2's ``Conv1D``: ``y = x @ weight + bias`` with ``weight: [in_dim, out_dim]``."""

    def __init__(self, weight: Tensor, bias: Tensor):
        self.weight = weight
        self.bias = bias

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight + self.bias


class Q8Linear(Module):
    """``y = x @ W.T`` with W stored as GGUF Q8_0: ``values`` int8 ``[out, in]``, ``scales`` float16 ``[out, in /
    32]``.
    """

    def __init__(self, values: Tensor, scales: Tensor):
        self.values = values
        self.scales = scales

    def forward(self, x: Tensor) -> Tensor:
        return q8_matmul(x, self.values, self.scales)


class Q8Embedding(Module):
    """Embedding table stored as GGUF Q8_0 (rows decoded after the gather)."""

    def __init__(self, values: Tensor, scales: Tensor):
        self.values = values
        self.scales = scales

    def forward(self, ids: Tensor) -> Tensor:
        return q8_lookup(self.values, self.scales, _index(ids), DType.float32)

    def as_linear(self) -> Q8Linear:
        """The ``hidden → vocab`` product over the same Q8_0 table (a tied head)."""
        return Q8Linear(self.values, self.scales)


class PackedEmbedding(Module):
    """Embedding table of packed GGUF rows (``uint8 [vocab, row_bytes]``), decoded after the gather."""

    def __init__(self, weight: Tensor, encoding: QuantizationEncoding):
        self.weight = weight
        self.encoding = encoding

    def forward(self, ids: Tensor) -> Tensor:
        return ops.dequantize(self.encoding, ops.gather(self.weight, _index(ids), axis=0))

    def as_linear(self) -> QuantizedLinear:
        """The ``hidden → vocab`` product over the same packed table (a tied head)."""
        return QuantizedLinear(self.weight, self.encoding)


def _index(ids: Tensor) -> Tensor:
    return ids if ids.dtype in (DType.int32, DType.int64) else F.cast(ids, DType.int64)


# ─── attention ────────────────────────────────────────────────────────────


def positions(ids: Tensor) -> Tensor:
    """``[1, T]`` int64 positions ``0 .. T-1`` of a ``[B, T]`` batch (T may be symbolic)."""
    t = ids.shape[1]
    return F.unsqueeze(F.range(0, t, 1, out_dim=t, dtype=DType.int64, device=ids.device), 0)


def rope_table(pos: Tensor, inv_freq: np.ndarray) -> tuple[Tensor, Tensor]:
    """cos and sin ``[B or 1, T, D // 2]`` of the rotary angles at int positions ``pos [B or 1, T]``."""
    return rope_cos_sin(pos, F.constant(inv_freq.astype(np.float32), DType.float32, pos.device))


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding in Hugging Face's rotate-half layout; ``x [B, T, H, D]``, ``cos``/``sin`` from `rope_table`."""
    return apply_rope(x, ops.unsqueeze(cos, 2), ops.unsqueeze(sin, 2), interleaved=False)


def attend(q: Tensor, k: Tensor, v: Tensor, qpos: Tensor | None = None, window: int | None = None) -> Tensor:
    """Causal grouped-query attention (`padded_attention`), from position 0 or against a cache.

    Args:
        q: ``[B, T, H, D]``; k, v: ``[B, S, Hkv, D]`` (slot s holds position s).
        qpos: int ``[B, T]`` positions of the queries, consecutive per row, for
            queries against a cache (the row's query ``i`` sees slots
            ``0 .. qpos[b, i]``); None: the queries sit at positions ``0 .. T-1``.
        window: a sliding window (Mistral): the query at position p sees only
            positions ``p - window + 1 .. p``. The cache keeps every position,
            so the window is exact however long the sequence grows.

    Returns:
        ``[B, T, H * D]``.
    """
    mask = {} if window is None else {"mask": "sliding_window", "window": int(window)}
    if qpos is None:
        return padded_attention(q, k, v, **mask)
    # Per row: first query position and valid cache length (slots past it are stale or unwritten).
    b = q.shape[0]
    return padded_attention(
        q, k, v, q_offset=F.reshape(qpos[:, :1], [b]), kv_length=F.reshape(qpos[:, -1:], [b]) + 1, **mask
    )


def write_cache(cache: Tensor, new: Tensor, pos: Tensor) -> Tensor:
    """``cache [B, L, Hkv, D]`` with ``new [B, T, Hkv, D]`` written at slots ``pos [B, T]``.

    One layout on every path (the Pallas kernels, the CPU kernel and the
    reference all read ``[B, L, Hkv, D]`` in place), so a cache made under one
    kernel mode serves under another.
    """
    pos = F.unsqueeze(F.unsqueeze(pos, -1), -1)  # [B, T, 1, 1]
    return F.scatter(cache, new, F.broadcast_to(pos, new.shape), axis=1)


def paged_attention(
    cache: PagedLayerCache, q: Tensor, k: Tensor, v: Tensor, qpos: Tensor, window: int | None
) -> tuple[Tensor, PagedLayerCache]:
    """Attention over the engine's paged cache: write the new keys/values into their slots, then attend
    over each row's pages (``paged_cache_attention``: decode reads them in place)."""
    b, t, n_kv, d = (int(x) for x in k.shape)
    slots = F.reshape(cache.slots, [b * t, 1])
    where = F.concat([slots // cache.page_size, slots % cache.page_size], axis=-1)  # (page, offset) of each new token
    # Stored in the pool's dtype (float16 when the KV cache is kept in half precision).
    k_pool = ops.scatter_nd(cache.k, F.cast(F.reshape(k, [b * t, n_kv, d]), cache.k.dtype), where)
    v_pool = ops.scatter_nd(cache.v, F.cast(F.reshape(v, [b * t, *v.shape[2:]]), cache.v.dtype), where)
    mask = {"mask": "causal", "window": -1} if window is None else {"mask": "sliding_window", "window": int(window)}
    out = bind(
        paged_cache_attention_p,
        q,
        k_pool,
        v_pool,
        cache.pages,
        F.reshape(qpos[:, :1], [b]),
        scale=1.0 / math.sqrt(d),
        **mask,
    )
    return F.reshape(out, [b, t, -1]), PagedLayerCache(k_pool, v_pool, cache.slots, cache.pages, cache.page_size)


def attention_with_cache(
    q: Tensor, k: Tensor, v: Tensor, qpos: Tensor, cache: Any, window: int | None = None
) -> tuple[Tensor, Any]:
    """Attention for one layer; ``cache`` is None (no cache), ``("fresh", L)`` (prefill), ``(k_cache, v_cache)``
    (each ``[B, L, Hkv, D]``), or a `PagedLayerCache` (the generation engine).

    Returns the attention output and the layer's new cache (None without one).
    A fresh cache attends over the T new keys only and pads them to L slots;
    a running cache writes the new keys at their positions first, then attends
    over all L slots (the mask hides slots after each query's position, and
    before its ``window`` when there is one).
    """
    if cache is None:
        return attend(q, k, v, window=window), None
    if isinstance(cache, PagedLayerCache):
        return paged_attention(cache, q, k, v, qpos, window)
    if isinstance(cache[0], str):
        pad = [0, 0, 0, cache[1] - int(k.shape[1]), 0, 0, 0, 0]  # along the slot axis
        return attend(q, k, v, window=window), (F.pad(k, pad), F.pad(v, pad))
    k_all, v_all = write_cache(cache[0], k, qpos), write_cache(cache[1], v, qpos)
    return attend(q, k_all, v_all, qpos, window), (k_all, v_all)


class ScaledRMSNorm(Module):
    """RMSNorm scaling by ``(weight + offset)``, the product in float32 before the cast back (Gemma: offset 1).

    The math is ``ops.rms_norm`` (the graph layers' too). Llama's norm
    (cast first, then scale) stays `maxfx.experimental.nn.RMSNorm`.

    Example:
        >>> norm = ScaledRMSNorm(Tensor([0.0, 1.0]), eps=1e-6, offset=1.0)
        >>> norm(Tensor([[3.0, 4.0]])).to_numpy().astype(float).round(3).tolist()
        [[0.849, 2.263]]
    """

    def __init__(self, weight: Tensor, *, eps: float, offset: float = 0.0, multiply_before_cast: bool = True):
        self.weight = weight
        self.eps, self.offset, self.multiply_before_cast = float(eps), float(offset), bool(multiply_before_cast)

    def forward(self, x: Tensor) -> Tensor:
        return ops.rms_norm(x, self.weight, self.eps, self.offset, self.multiply_before_cast)
