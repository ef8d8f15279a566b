"""Attention: flash attention (forward + backward), ragged batches, split-K decode, paged decode.

Stable API (what ``lowering`` routes the attention op to; names and keyword
arguments are kept compatible):

* ``flash_attention(q, k, v, *, causal=False, local_window_size=None, scale=None,
  q_lens=None, kv_lens=None, q_offset=0, config=None, impl=None)`` on
  ``[batch, seq, heads, head_dim]``;
* ``flash_attention_ragged(q, k, v, input_row_offsets, *, kv_row_offsets=None,
  causal=False, local_window_size=None, scale=None, max_seq_len=None,
  max_kv_len=None, config=None, impl=None)`` on ``[total_tokens, heads, head_dim]``;
* ``decode_attention(q, k_cache, v_cache, kv_lens, *, causal=True,
  local_window_size=None, scale=None, config=None, impl=None)``;
* ``paged_decode_attention(q, k_pages, v_pages, block_table, kv_lens, *,
  causal=True, local_window_size=None, scale=None, config=None, impl=None)``;
* ``paged_decode_attention_pool(q, pool, layer, block_table, kv_lens, *, ...)``
  on a multi-layer pool ``[num_pages, 2, num_layers, page_size, Hkv, D]``
  (reads the layer in place: no per-layer copy).

Each goes through `custom_calls.attention.dispatch`: the Pallas (Triton)
kernels (``pallas_flash``, ``pallas_decode``) on GPU or with
``MAXFX_PALLAS_INTERPRET=1``, the plain-jnp reference
(`custom_calls.attention.reference`) elsewhere. See
``custom_calls/attention/README.md`` for kernels, layouts and fallbacks.

Example:
    >>> import numpy as np
    >>> from custom_calls import attention as att
    >>> q = np.ones((2, 1, 8, 64), np.float32); cache = np.zeros((2, 128, 2, 64), np.float32)
    >>> att.decode_attention(q, cache, cache, np.array([5, 128])).shape
    (2, 1, 8, 64)
"""

from custom_calls.attention.dispatch import (
    ENV_INTERPRET,
    decode_attention,
    flash_attention,
    flash_attention_ragged,
    kernel_mode,
    paged_decode_attention,
    paged_decode_attention_pool,
)
from custom_calls.attention.pallas_decode import DecodeConfig
from custom_calls.attention.pallas_flash import FlashConfig
from custom_calls.attention.reference import window_pair

__all__ = [
    "ENV_INTERPRET",
    "DecodeConfig",
    "FlashConfig",
    "decode_attention",
    "flash_attention",
    "flash_attention_ragged",
    "kernel_mode",
    "paged_decode_attention",
    "paged_decode_attention_pool",
    "window_pair",
]
