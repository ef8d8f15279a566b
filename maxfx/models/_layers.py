"""Building blocks shared by the model definitions: checkpoint-layout layers and attention.

- `Conv1D`: GPT-2's transposed Linear (``weight: [in, out]``).
- `Q8Linear` / `Q8Embedding`: GGUF Q8_0 weights kept 8-bit (int8 values plus
  one float16 scale per 32; the same bytes as the file, split into two arrays).
  MAX has no Q8_0 encoding, so ``ops.qmatmul`` does not take it; the product
  decodes the blocks inside the compiled program instead.
- `PackedEmbedding`: rows of GGUF blocks (Q4_0, Q4_K, ...) decoded after the gather.
- `attend` / `rope`: causal (grouped-query) attention over a KV cache (the
  registry ``attention`` op: the Pallas flash kernel on GPU, the jnp
  reference elsewhere) and rotary position embeddings, written with
  ``maxfx.functional`` ops.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding
from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn import Embedding, Linear, Module
from maxfx.graph import ops as _graph_ops

__all__ = ["Conv1D", "PackedEmbedding", "Q8Embedding", "Q8Linear", "attend", "embedding", "linear", "rope"]

_dequantize = F.functional(_graph_ops.dequantize)
_attention = F.functional(_graph_ops.attention)

Q8_BLOCK = 32  # values per Q8_0 block (34 bytes: float16 scale + 32 int8)


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


def split_q8_0(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 bytes ``uint8 [rows, n_blocks * 34]`` → (int8 ``[rows, n_blocks * 32]``, float16 ``[rows, n_blocks]``).

    A view-and-copy of the bytes: no arithmetic, the values stay 8-bit.
    """
    rows, width = raw.shape
    blocks = np.ascontiguousarray(raw).reshape(rows, width // 34, 34)
    scales = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16).reshape(rows, -1)
    values = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(rows, -1)
    return values, scales


def _q8_decode(values: Tensor, scales: Tensor, dtype: DType) -> Tensor:
    rows, cols = int(values.shape[0]), int(values.shape[1])
    blocks = F.reshape(F.cast(values, DType.float32), [rows, cols // Q8_BLOCK, Q8_BLOCK])
    w = F.reshape(blocks * F.unsqueeze(F.cast(scales, DType.float32), -1), [rows, cols])
    return w if dtype is DType.float32 else F.cast(w, dtype)


class Q8Linear(Module):
    """``y = x @ W.T`` with W stored as GGUF Q8_0: ``values`` int8 ``[out, in]``, ``scales`` float16 ``[out, in / 32]``."""

    def __init__(self, values: Tensor, scales: Tensor):
        self.values = values
        self.scales = scales

    def forward(self, x: Tensor) -> Tensor:
        return x @ _q8_decode(self.values, self.scales, x.dtype).T


class Q8Embedding(Module):
    """Embedding table stored as GGUF Q8_0 (rows decoded after the gather)."""

    def __init__(self, values: Tensor, scales: Tensor):
        self.values = values
        self.scales = scales

    def forward(self, ids: Tensor) -> Tensor:
        ids = _index(ids)
        values = F.gather(self.values, ids, axis=0)
        scales = F.gather(self.scales, ids, axis=0)
        blocks = F.reshape(F.cast(values, DType.float32), [*values.shape[:-1], int(values.shape[-1]) // Q8_BLOCK, Q8_BLOCK])
        return F.reshape(blocks * F.unsqueeze(F.cast(scales, DType.float32), -1), [*values.shape])

    def as_linear(self) -> Q8Linear:
        return Q8Linear(self.values, self.scales)


class PackedEmbedding(Module):
    """Embedding table of packed GGUF rows (``uint8 [vocab, row_bytes]``), decoded after the gather."""

    def __init__(self, weight: Tensor, encoding: QuantizationEncoding):
        self.weight = weight
        self.encoding = encoding

    def forward(self, ids: Tensor) -> Tensor:
        return _dequantize(self.encoding, F.gather(self.weight, _index(ids), axis=0))


def _index(ids: Tensor) -> Tensor:
    return ids if ids.dtype in (DType.int32, DType.int64) else F.cast(ids, DType.int64)


# ─── attention ────────────────────────────────────────────────────────────


def positions(ids: Tensor) -> Tensor:
    """``[1, T]`` int64 positions ``0 .. T-1`` of a ``[B, T]`` batch (T may be symbolic)."""
    t = ids.shape[1]
    return F.unsqueeze(F.range(0, t, 1, out_dim=t, dtype=DType.int64, device=ids.device), 0)


def rope(x: Tensor, pos: Tensor, inv_freq: np.ndarray) -> Tensor:
    """Rotary embedding in Hugging Face's rotate-half layout.

    Args:
        x: ``[B, T, H, D]``.
        pos: int ``[B or 1, T]`` positions.
        inv_freq: ``[D // 2]`` inverse frequencies.
    """
    inv = F.constant(inv_freq.astype(np.float32), DType.float32, x.device)
    angles = F.unsqueeze(F.cast(pos, DType.float32), -1) * inv  # [B, T, D/2]
    angles = F.unsqueeze(F.concat([angles, angles], axis=-1), 2)  # [B, T, 1, D]
    cos, sin = F.cos(angles), F.sin(angles)
    if x.dtype is not DType.float32:
        cos, sin = F.cast(cos, x.dtype), F.cast(sin, x.dtype)
    half = int(x.shape[-1]) // 2
    rotated = F.concat([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def attend(q: Tensor, k: Tensor, v: Tensor, qpos: Tensor | None = None) -> Tensor:
    """Causal grouped-query attention through the registry ``attention`` op (the Pallas flash kernel on GPU).

    Args:
        q: ``[B, T, H, D]``; k, v: ``[B, S, Hkv, D]`` (slot s holds position s).
        qpos: int ``[B, T]`` positions of the queries, consecutive per row, for
            queries against a cache (the row's query ``i`` sees slots
            ``0 .. qpos[b, i]``); None: the queries sit at positions ``0 .. T-1``.

    Returns:
        ``[B, T, H * D]``. Query head h uses KV head ``h // (H / Hkv)``.
    """
    b, t = q.shape[0], q.shape[1]
    scale = 1.0 / float(np.sqrt(int(q.shape[-1])))
    if qpos is None:
        out = _attention(q, k, v, mask="causal", scale=scale)
    else:
        # Per row: first query position and valid cache length (slots past it are stale or unwritten).
        first = F.reshape(qpos[:, :1], [b])
        last = F.reshape(qpos[:, -1:], [b])
        out = _attention(q, k, v, mask="causal", scale=scale, q_offset=first, kv_length=last + 1)
    return F.reshape(out, [b, t, -1])


def write_cache(cache: Tensor, new: Tensor, pos: Tensor) -> Tensor:
    """``cache [B, L, Hkv, D]`` with ``new [B, T, Hkv, D]`` written at slots ``pos [B, T]``."""
    idx = F.broadcast_to(F.unsqueeze(F.unsqueeze(pos, -1), -1), new.shape)
    return F.scatter(cache, new, idx, axis=1)


def attention_with_cache(q: Tensor, k: Tensor, v: Tensor, qpos: Tensor, cache: Any) -> tuple[Tensor, Any]:
    """Attention for one layer; ``cache`` is None (no cache), ``("fresh", L)`` (prefill) or ``(k_cache, v_cache)``.

    Returns the attention output and the layer's new cache (None without one).
    A fresh cache attends over the T new keys only and pads them to L slots;
    a running cache writes the new keys at their positions first, then attends
    over all L slots (the mask hides slots after each query's position).
    """
    if cache is None:
        return attend(q, k, v), None
    if isinstance(cache[0], str):
        length = cache[1]
        pad = [0, 0, 0, length - int(k.shape[1]), 0, 0, 0, 0]
        return attend(q, k, v), (F.pad(k, pad), F.pad(v, pad))
    k_all, v_all = write_cache(cache[0], k, qpos), write_cache(cache[1], v, qpos)
    return attend(q, k_all, v_all, qpos), (k_all, v_all)
