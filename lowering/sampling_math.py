"""The sampling arithmetic, written once for the engine and MAX's sampling kernels.

The engine's compiled step (`maxfx.generation._sampling`) and the registry ops
behind MAX's kernel names (`lowering.ops.sampling_kernels`: ``mo.apply_packed_bitmask``,
``sampler.topk_topp_masked_probs``, ``sampler.gumbel_argmax_from_probs``,
``sampler.fused_token_sampling_with_dist``) call these functions, so a filter or a
draw means the same thing on every path:

- `filter_logits`: each row's top-k, then top-p, then min-p set (Hugging Face's order);
- `tempered`: the logits a row samples from (divided by its temperature, then filtered);
- `masked_probs`: the distribution a row samples from (one-hot argmax for greedy rows);
- `gumbel_argmax`: one draw by the Gumbel-max trick from a key;
- `packed_bits`: a grammar's packed int32 token bitmask as bools (numpy or JAX).

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> p = masked_probs(jnp.log(jnp.array([[0.5, 0.3, 0.2]])), jnp.array([1.0]), jnp.array([2]), jnp.array([1.0]))
    >>> np.round(np.asarray(p), 3).tolist()
    [[0.625, 0.375, 0.0]]
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["filter_logits", "gumbel_argmax", "masked_probs", "packed_bits", "tempered"]


def filter_logits(x: jax.Array, top_k: jax.Array, top_p: jax.Array, min_p: jax.Array) -> jax.Array:
    """Temperature-scaled logits ``x [B, V]`` with the tokens outside each row's top-k / top-p / min-p set at ``-inf``.

    ``top_k <= 0`` keeps the whole vocabulary; ``top_p >= 1`` and ``min_p <= 0`` keep
    every token. Ties at a threshold are kept (every token equal to the k-th best stays in).
    """
    vocab = x.shape[-1]
    ranked = -jnp.sort(-x, axis=-1)  # best first
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth = jnp.take_along_axis(ranked, (k - 1)[:, None], axis=-1)
    x = jnp.where(x < kth, -jnp.inf, x)
    ranked = jnp.where(jnp.arange(vocab)[None, :] < k[:, None], ranked, -jnp.inf)
    probs = jax.nn.softmax(ranked, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # the mass of the better-ranked tokens
    keep = (before < top_p[:, None]) | (top_p[:, None] >= 1.0)  # float32 sums can reach 1 before the last token
    cutoff = jnp.min(jnp.where(keep, ranked, jnp.inf), axis=-1, keepdims=True)
    x = jnp.where(x < cutoff, -jnp.inf, x)
    p = jax.nn.softmax(x, axis=-1)
    floor = min_p[:, None] * jnp.max(p, axis=-1, keepdims=True)
    return jnp.where(p < floor, -jnp.inf, x)


def tempered(
    x: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    min_p: jax.Array | None = None,
    *,
    filters: bool = True,
) -> jax.Array:
    """Float32 logits ``x [B, V]`` divided by each row's temperature (greedy rows, ``<= 0``, by 1), then `filter_logits`
    unless ``filters`` is False (static).
    """
    hot = x / jnp.where(temperature > 0, temperature, 1.0)[:, None]
    if filters:
        hot = filter_logits(hot, top_k, top_p, jnp.zeros_like(top_p) if min_p is None else min_p)
    return hot


def masked_probs(
    logits: jax.Array,
    temperature: jax.Array,
    top_k: jax.Array,
    top_p: jax.Array,
    min_p: jax.Array | None = None,
    *,
    filters: bool = True,
) -> jax.Array:
    """Float32 ``[B, V]``: ``softmax(logits / temperature)`` over each row's filtered set, one-hot argmax where
    ``temperature <= 0``.

    ``filters=False`` (static) skips `filter_logits` when no row filters.
    """
    x = logits.astype(jnp.float32)
    hot = tempered(x, temperature, top_k, top_p, min_p, filters=filters)
    onehot = jax.nn.one_hot(jnp.argmax(x, axis=-1), x.shape[-1], dtype=jnp.float32)
    return jnp.where((temperature > 0)[:, None], jax.nn.softmax(hot, axis=-1), onehot)


def gumbel_argmax(key: jax.Array, scores: jax.Array) -> jax.Array:
    """One index drawn with probability ``softmax(scores)`` (Gumbel-max: ``argmax(scores + Gumbel noise)``), ``key`` a
    typed PRNG key.

    ``scores`` are logits or ``log(p)`` of unnormalised probabilities; ``-inf`` is never drawn.
    """
    u = jax.random.uniform(key, scores.shape, jnp.float32, minval=1e-20, maxval=1.0)
    return jnp.argmax(scores - jnp.log(-jnp.log(u)))


def packed_bits(words: Any, vocab: int, xp: Any = np) -> Any:
    """Bool ``[..., vocab]``: token ``t`` is allowed when bit ``t % 32`` of word ``t // 32`` of ``words`` is set.

    ``words [..., ceil(vocab / 32)]`` is int32, the layout llguidance and xgrammar
    fill. ``xp`` is ``numpy`` (the engine's host-side mask) or ``jax.numpy`` (the op):
    one definition of the bit order for both. An arithmetic shift keeps bit 31 (the
    sign) right: ``(w >> 31) & 1`` is 1 exactly when ``w < 0``.

    Example:
        >>> import numpy as np
        >>> packed_bits(np.array([[0b101, -(1 << 31)]], np.int32), 34).nonzero()[1].tolist()
        [0, 2]
        >>> packed_bits(np.array([[0, -(1 << 31)]], np.int32), 64).nonzero()[1].tolist()  # bit 31: the sign
        [63]
    """
    tokens = xp.arange(vocab, dtype=xp.int32)
    w = xp.take(words, tokens // 32, axis=-1)
    return ((w >> (tokens % 32)) & 1) != 0
