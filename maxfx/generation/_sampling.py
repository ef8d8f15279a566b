"""Per-row sampling inside the engine's compiled step: every row of a batch has its own parameters.

`SamplingRows` holds one step's parameters as arrays (built on the host from each
request's `SamplingParams`); `choose` runs inside the step on float32 logits
``[B, V]``:

1. ``repetition`` (optional, with ``seen [B, V]``, the prompt and generated tokens):
   a seen token's logit ``l`` becomes ``l / r`` if ``l > 0`` else ``l * r`` (CTRL / HF).
2. ``bias`` (optional, ``[B, V]``, added): frequency and presence penalties as
   OpenAI defines them (``- frequency * count - presence * (count > 0)`` over the
   generated tokens) and masks (``-inf``: EOS before ``min_new_tokens``, grammar).
3. A row with ``temperature == 0`` takes the argmax. Other rows divide by the
   temperature, keep the ``top_k`` best (``top_k <= 0``: all), then the smallest set
   of best tokens whose probability reaches ``top_p``, then the tokens whose
   probability is at least ``min_p`` times the best one's (Hugging Face's order),
   and sample with the Gumbel-max trick from the row's key ``(seed, step)``: a seeded
   request draws the same tokens whatever batch it runs in.

Log probabilities are of the model's raw logits (before 1-3), as OpenAI's API reports.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> rows = SamplingRows.build([dict(temperature=0.0), dict(temperature=1.0, top_k=1, seed=3)], step=[0, 0])
    >>> logits = jnp.array([[0.0, 2.0, 1.0], [5.0, 0.0, 1.0]])
    >>> np.asarray(choose(logits, rows.arrays(), filters=True, sample=True)).tolist()
    [1, 0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.sampling_math import filter_logits, gumbel_argmax, masked_probs, tempered

__all__ = ["SamplingRows", "choose", "filter_logits", "penalize", "sampling_probs", "seed_key", "top_logprobs"]


def seed_key(seed: int) -> np.uint32:
    """A request's 32-bit key word from its (up to 64-bit) seed."""
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return np.uint32((seed & 0xFFFFFFFF) ^ (seed >> 32))


@dataclass
class SamplingRows:
    """One step's per-row sampling parameters (host numpy arrays, one entry per batch row)."""

    temperature: np.ndarray  # float32 [B]; 0: greedy
    top_k: np.ndarray  # int32 [B]; <= 0: the whole vocabulary
    top_p: np.ndarray  # float32 [B]
    min_p: np.ndarray  # float32 [B]
    keys: np.ndarray  # uint32 [B, 2]: (seed word, step)

    @classmethod
    def build(cls, rows: Sequence[Mapping[str, Any]], step: Sequence[int]) -> SamplingRows:
        """From per-row dicts with ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``seed`` (defaults: greedy, no
        filters).
        """
        n = len(rows)
        out = cls(
            np.zeros(n, np.float32),
            np.zeros(n, np.int32),
            np.ones(n, np.float32),
            np.zeros(n, np.float32),
            np.zeros((n, 2), np.uint32),
        )
        for i, r in enumerate(rows):
            k = r.get("top_k", -1)
            out.top_k[i] = -1 if k is None else int(k)
            # top_k == 1 keeps one token: the argmax, so the row is greedy (and skips the vocabulary sort).
            out.temperature[i] = 0.0 if out.top_k[i] == 1 else float(r.get("temperature", 0.0))
            out.top_p[i] = float(r.get("top_p", 1.0) or 1.0)
            out.min_p[i] = float(r.get("min_p", 0.0) or 0.0)
            out.keys[i] = (seed_key(r.get("seed", 0) or 0), int(step[i]) & 0xFFFFFFFF)
        return out

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays in the order `choose` takes them."""
        return self.temperature, self.top_k, self.top_p, self.min_p, self.keys

    @property
    def sample(self) -> bool:
        """Some row samples (temperature > 0)."""
        return bool((self.temperature > 0).any())

    @property
    def filters(self) -> bool:
        """Some sampling row uses top-k, top-p or min-p."""
        s = self.temperature > 0
        k = (self.top_k > 0) & (self.top_k < np.iinfo(np.int32).max)
        return bool((s & (k | (self.top_p < 1) | (self.min_p > 0))).any())


def _draw(key_data: jax.Array, x: jax.Array) -> jax.Array:
    return gumbel_argmax(jax.random.wrap_key_data(key_data, impl="threefry2x32"), x)


def penalize(
    logits: jax.Array, bias: jax.Array | None, repetition: jax.Array | None, seen: jax.Array | None
) -> jax.Array:
    """Steps 1 and 2 of the module docstring (either may be None)."""
    if repetition is not None:
        r = repetition[:, None]
        logits = jnp.where(seen, jnp.where(logits > 0, logits / r, logits * r), logits)
    if bias is not None:
        logits = logits + bias
    return logits


def choose(
    logits: jax.Array,
    params: Sequence[jax.Array],
    *,
    filters: bool,
    sample: bool,
    bias=None,
    repetition=None,
    seen=None,
) -> jax.Array:
    """The next token of each row (int32 ``[B]``); ``params`` as `SamplingRows.arrays`, ``filters``/``sample``
    static.
    """
    temperature, top_k, top_p, min_p, keys = params
    x = penalize(logits.astype(jnp.float32), bias, repetition, seen)
    greedy = jnp.argmax(x, axis=-1).astype(jnp.int32)
    if not sample:
        return greedy
    hot = tempered(x, temperature, top_k, top_p, min_p, filters=filters)
    drawn = jax.vmap(_draw)(keys, hot).astype(jnp.int32)
    return jnp.where(temperature > 0, drawn, greedy)


def sampling_probs(logits: jax.Array, params: Sequence[jax.Array], *, filters: bool) -> jax.Array:
    """The distribution each row samples from, ``[B, V]`` (one-hot argmax for greedy rows): speculative decoding's p and
    q.
    """
    temperature, top_k, top_p, min_p, _ = params
    return masked_probs(logits, temperature, top_k, top_p, min_p, filters=filters)


def top_logprobs(logits: jax.Array, chosen: jax.Array, n: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``log_softmax`` of the raw logits: the chosen tokens' ``[B]`` and the ``n`` best ``(values [B, n], ids [B,
    n])``.
    """
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(lp, chosen[:, None].astype(jnp.int32), axis=-1)[:, 0]
    values, ids = jax.lax.top_k(lp, n)
    return picked, values, ids.astype(jnp.int32)
