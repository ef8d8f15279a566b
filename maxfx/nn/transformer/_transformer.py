"""`Transformer` and `TransformerBlock`: a decoder over a ragged batch and the paged KV cache.

Weight names follow Hugging Face's Llama (without the ``model.`` prefix):
``embed_tokens``, ``layers.{i}.self_attn.{q,k,v,o}_proj``, ``layers.{i}.mlp.{gate,up,down}_proj``,
``layers.{i}.input_layernorm``, ``layers.{i}.post_attention_layernorm``, ``norm``, ``lm_head``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from lowering.dtypes import DType
from maxfx.graph import ops
from maxfx.nn._layer import LayerList, Module

__all__ = ["ReturnLogits", "Transformer", "TransformerBlock"]


def ragged_positions(input_row_offsets: Any, cache_lengths: Any, total: Any) -> Any:
    """int64 ``[total]``: each ragged token's position in its sequence, counting the tokens already cached.

    Token ``j`` of row ``b`` (``offsets[b] <= j < offsets[b + 1]``) is at
    ``cache_lengths[b] + j - offsets[b]``; for offsets ``[0, 2, 5]`` and cache
    lengths ``[4, 0]`` that is ``[4, 5, 0, 1, 2]``.
    """
    offsets = input_row_offsets.cast(DType.int64)
    index = ops.range(0, total, dtype=DType.int64, device=offsets.device)
    # the row of token j: how many rows end at or before j (a [total, batch] comparison; batches are small)
    ends = ops.unsqueeze(offsets[1:], 0)
    row = ops.reshape(ops.sum((ops.unsqueeze(index, -1) >= ends).cast(DType.int64), axis=-1), [-1])
    starts = ops.gather(offsets, row, axis=0)
    return ops.gather(cache_lengths.cast(DType.int64), row, axis=0) + index - starts


class ReturnLogits(str, enum.Enum):
    """Which logits `Transformer` returns: each sequence's last token, every token, or the last ``n``."""

    ALL = "all"
    LAST_TOKEN = "last_token"
    VARIABLE = "variable"


class TransformerBlock(Module):
    """Stack of Attention, FeedForward, and RMSNorm layers (pre-norm residual block).

    ``h = x + r * attention(attention_norm(x))``; ``out = h + r * mlp(mlp_norm(h))``
    with ``r = residual_multiplier``.

    Call: ``block(layer_idx, x, kv_collection, freqs_cis, input_row_offsets)`` on
    ragged ``x [total_tokens, hidden]``; ``kv_collection`` and the rest go to the attention layer.
    """

    def __init__(
        self, attention: Module, mlp: Module, attention_norm: Module, mlp_norm: Module, residual_multiplier: float = 1.0
    ):
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = attention_norm
        self.post_attention_layernorm = mlp_norm
        self.residual_multiplier = float(residual_multiplier)

    def _scaled(self, v: Any) -> Any:
        return v * self.residual_multiplier if self.residual_multiplier != 1.0 else v

    def __call__(
        self, layer_idx: Any, x: Any, kv_collection: Any, freqs_cis: Any, input_row_offsets: Any, **kwargs: Any
    ) -> Any:
        attn = self.self_attn(layer_idx, self.input_layernorm(x), kv_collection, freqs_cis, input_row_offsets, **kwargs)
        h = x + self._scaled(attn)
        return h + self._scaled(self.mlp(self.post_attention_layernorm(h)))


class Transformer(Module):
    """Transformer model consisting for TransformerBlock layers.

    Call signature (MAX 26.7's)::

        logits = model(tokens, kv_collection, return_n_logits, input_row_offsets)

    Args of the call:
        tokens: int ``[total_tokens]``, the ragged batch's token ids.
        kv_collection: a `PagedCacheValues` shared by all layers (or a list, one per layer).
        return_n_logits: for ``VARIABLE``, how many trailing tokens per sequence get
            logits (a Python int: XLA needs a static count); ignored otherwise.
        input_row_offsets: uint32 ``[batch + 1]`` prefix sums.

    ``rope`` may be None for attention without rotary embeddings (the layers then
    get ``freqs_cis=None``). ``position_embedding`` (a maxfx extension, default None)
    adds learned absolute positions, GPT-2 style: token ``i`` of sequence ``b`` gets
    ``position_embedding(cache_lengths[b] + i)`` added to its token embedding, so a
    decode step continues where the cache ends.

    Returns:
        outputs (tuple): ``(last_logits,)`` for ``LAST_TOKEN`` (float32 ``[batch, vocab]``);
            ``(last_logits, logits, offsets)`` for ``ALL`` (``logits [total_tokens, vocab]``,
            ``offsets = input_row_offsets``) and ``VARIABLE`` (``logits [batch * n, vocab]``,
            ``offsets = [0, n, 2n, ...]``).

    Example:
        >>> model = Transformer(dim=32, n_heads=4, layers=blocks, norm=RMSNorm(32, DType.float32),  # doctest: +SKIP
        ...                     output=Linear(32, vocab, DType.float32, cpu), embedding=Embedding(vocab, 32,
        ...     DType.float32, cpu),
        ...                     kv_params=kv_params, rope=rope)
        >>> (logits,) = model(tokens, kv_collection, 1, input_row_offsets)  # doctest: +SKIP
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        layers: Sequence[Module],
        norm: Module,
        output: Module,
        embedding: Module,
        kv_params: Any,
        rope: Any,
        return_logits: ReturnLogits = ReturnLogits.LAST_TOKEN,
        embedding_multiplier: float = 1.0,
        logits_scaling: float = 1.0,
        position_embedding: Module | None = None,
    ):
        super().__init__()
        self.dim, self.n_heads = int(dim), int(n_heads)
        self.layers = LayerList(list(layers))
        self.norm = norm
        self.lm_head = output
        self.embed_tokens = embedding
        self.kv_params = kv_params
        self.rope = rope
        self.return_logits = ReturnLogits(return_logits)
        self.embedding_multiplier = float(embedding_multiplier)
        self.logits_scaling = float(logits_scaling)
        self.position_embedding = position_embedding  # None: a plain attribute, no weights

    def _logits(self, h: Any) -> Any:
        logits = self.lm_head(self.norm(h)).cast(DType.float32)
        return logits / self.logits_scaling if self.logits_scaling != 1.0 else logits

    def __call__(
        self, tokens: Any, kv_collection: Any, return_n_logits: Any, input_row_offsets: Any, **kwargs: Any
    ) -> tuple[Any, ...]:
        if tokens.rank != 1:
            raise ValueError(f"Transformer: tokens must be ragged [total_tokens], got shape {list(tokens.shape)}")
        h = self.embed_tokens(tokens)
        if self.embedding_multiplier != 1.0:
            h = h * self.embedding_multiplier
        freqs_cis = self.rope.freqs_cis if self.rope is not None else None
        per_layer = isinstance(kv_collection, (list, tuple))
        if per_layer and len(kv_collection) != len(self.layers):
            raise ValueError(f"Transformer: {len(kv_collection)} KV collections for {len(self.layers)} layers")
        if self.position_embedding is not None:
            cache_lengths = (kv_collection[0] if per_layer else kv_collection).cache_lengths
            h = h + self.position_embedding(ragged_positions(input_row_offsets, cache_lengths, tokens.shape[0]))
        for i, layer in enumerate(self.layers):
            kv = kv_collection[i] if per_layer else kv_collection
            h = layer(ops.constant(i, DType.uint32, h.device), h, kv, freqs_cis, input_row_offsets, **kwargs)
        offsets = input_row_offsets.cast(DType.int64)
        last = ops.gather(h, offsets[1:] - 1, axis=0)
        last_logits = self._logits(last)
        if self.return_logits is ReturnLogits.LAST_TOKEN:
            return (last_logits,)
        if self.return_logits is ReturnLogits.ALL:
            return (last_logits, self._logits(h), input_row_offsets)
        return (last_logits, *self._variable_logits(h, offsets, return_n_logits))

    def _variable_logits(self, h: Any, offsets: Any, return_n_logits: Any) -> tuple[Any, Any]:
        if (
            hasattr(return_n_logits, "type")
            or isinstance(return_n_logits, bool)
            or not isinstance(return_n_logits, int)
            or return_n_logits < 1
        ):
            raise ValueError(
                "Transformer: ReturnLogits.VARIABLE needs return_n_logits as a positive Python int (XLA compiles a "
                "static number "
                f"of logit rows), got {return_n_logits!r}"
            )
        n = return_n_logits
        back = ops.constant([n - i for i in range(n)], DType.int64, h.device)  # n, n-1, ..., 1 tokens from the end
        rows = ops.reshape(ops.unsqueeze(offsets[1:], -1) - back, [-1])
        return self._logits(ops.gather(h, rows, axis=0)), self._offsets_of(offsets, n)

    @staticmethod
    def _offsets_of(offsets: Any, n: int) -> Any:
        """``[0, n, 2n, ..., batch * n]`` shaped like ``input_row_offsets``."""
        return ops.range(0, offsets.shape[0], dtype=DType.int64, device=offsets.device) * n
