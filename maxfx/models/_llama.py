"""Llama (``LlamaForCausalLM``) as a tree of eager Modules.

Parameter names follow Hugging Face's (``model.layers.0.self_attn.q_proj.weight``),
so ``model.state_dict()`` lines up with a safetensors checkpoint. The decoder
layers sit in a `Sequential` of identical blocks, which `Module.compile` traces
once and loops over.
"""

from __future__ import annotations

from typing import Any

from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn import Module, RMSNorm, Sequential
from maxfx.models._config import LlamaConfig
from maxfx.models._generate import CausalLM
from maxfx.models._layers import PackedEmbedding, Q8Embedding, attention_with_cache, positions, rope
from maxfx.models._source import ParamSource

__all__ = ["LlamaAttention", "LlamaDecoderLayer", "LlamaForCausalLM", "LlamaMLP", "LlamaModel"]


class LlamaAttention(Module):
    """Grouped-query self-attention with rotary embeddings."""

    def __init__(self, config: LlamaConfig, q_proj: Module, k_proj: Module, v_proj: Module, o_proj: Module):
        self.config = config
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj

    def forward(self, x: Tensor, qpos: Tensor, cache: Any = None) -> tuple[Tensor, Any]:
        c = self.config
        b, t = x.shape[0], x.shape[1]
        q = F.reshape(self.q_proj(x), [b, t, c.num_attention_heads, c.head_dim])
        k = F.reshape(self.k_proj(x), [b, t, c.num_key_value_heads, c.head_dim])
        v = F.reshape(self.v_proj(x), [b, t, c.num_key_value_heads, c.head_dim])
        inv = c.inv_freq()
        out, cache = attention_with_cache(rope(q, qpos, inv), rope(k, qpos, inv), v, qpos, cache)
        return self.o_proj(out), cache


class LlamaMLP(Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, gate_proj: Module, up_proj: Module, down_proj: Module):
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(self, self_attn: LlamaAttention, mlp: LlamaMLP, input_layernorm: RMSNorm, post_attention_layernorm: RMSNorm):
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = input_layernorm
        self.post_attention_layernorm = post_attention_layernorm

    def step(self, x: Tensor, qpos: Tensor, cache: Any) -> tuple[Tensor, Any]:
        a, cache = self.self_attn(self.input_layernorm(x), qpos, cache)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), cache

    def forward(self, x: Tensor) -> Tensor:
        return self.step(x, positions(x), None)[0]


class LlamaModel(Module):
    """Embedding, decoder layers and the final norm (HF's ``model.*`` weights)."""

    def __init__(self, embed_tokens: Module, layers: Sequential, norm: RMSNorm):
        self.embed_tokens = embed_tokens
        self.layers = layers
        self.norm = norm


class LlamaForCausalLM(CausalLM):
    """Llama decoder with a language-model head: ``model(input_ids) -> logits [B, T, vocab]``.

    Build one with `maxfx.models.load_pretrained` or `LlamaForCausalLM.random`.

    Example:
        >>> from maxfx.models import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        >>> m = LlamaForCausalLM.random(cfg, seed=0)
        >>> m(Tensor.constant([[1, 2, 3]], dtype=DType.int64)).shape
        [Dim(1), Dim(3), Dim(32)]
    """

    def __init__(self, config: LlamaConfig, model: LlamaModel, lm_head: Module | None):
        self.config = config
        self.model = model
        self.lm_head = lm_head  # None: tied to the embedding

    @classmethod
    def from_source(cls, config: LlamaConfig, src: ParamSource) -> LlamaForCausalLM:
        """Build from a `ParamSource` (checkpoint reader or random init), by HF names."""
        c = config
        hd, h, hkv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        e, ff = c.hidden_size, c.intermediate_size
        layers = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            attn = LlamaAttention(
                c,
                src.linear(p + "self_attn.q_proj", h * hd, e, rope_heads=h),
                src.linear(p + "self_attn.k_proj", hkv * hd, e, rope_heads=hkv),
                src.linear(p + "self_attn.v_proj", hkv * hd, e),
                src.linear(p + "self_attn.o_proj", e, h * hd),
            )
            mlp = LlamaMLP(src.linear(p + "mlp.gate_proj", ff, e), src.linear(p + "mlp.up_proj", ff, e), src.linear(p + "mlp.down_proj", e, ff))
            norms = [RMSNorm(e, eps=c.rms_norm_eps, weight=src.norm(p + n, e)) for n in ("input_layernorm.weight", "post_attention_layernorm.weight")]
            layers.append(LlamaDecoderLayer(attn, mlp, *norms))
        embed = src.embedding("model.embed_tokens", c.vocab_size, e)
        norm = RMSNorm(e, eps=c.rms_norm_eps, weight=src.norm("model.norm.weight", e))
        head = None if c.tie_word_embeddings else src.linear("lm_head", c.vocab_size, e)
        src.finish()
        return cls(c, LlamaModel(embed, Sequential(*layers), norm), head)

    # -- CausalLM hooks ----------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    def kv_shape(self) -> tuple[int, int]:
        return self.config.num_key_value_heads, self.config.head_dim

    def hidden(self, ids: Tensor, qpos: Tensor, caches: list[Any] | None) -> tuple[Tensor, list[Any] | None]:
        x = self.model.embed_tokens(ids)
        if caches is None:
            return self.model.norm(self.model.layers(x)), None
        new = []
        for layer, cache in zip(self.model.layers, caches):
            x, cache = layer.step(x, qpos, cache)
            new.append(cache)
        return self.model.norm(x), new

    def head(self, h: Tensor) -> Tensor:
        if self.lm_head is not None:
            return self.lm_head(h)
        emb = self.model.embed_tokens
        if isinstance(emb, PackedEmbedding):
            from maxfx.experimental.nn import QuantizedLinear  # noqa: PLC0415

            return QuantizedLinear(emb.weight, emb.encoding)(h)
        if isinstance(emb, Q8Embedding):
            return emb.as_linear()(h)
        return h @ emb.weight.T
