"""Llama: the one definition behind `load_pretrained` (eager Modules) and `load_pretrained_graph` (a `maxfx.nn` graph).

Three parts, each written once, all driven by `LlamaConfig`:

- `read_llama`: every tensor of the model by Hugging Face name, with its shape
  and how it is stored (the only place that names and shapes Llama's tensors).
  It reads through the public `ParamSource` interface, so safetensors, ``.bin``,
  GGUF and random init all go through it.
- `LlamaForCausalLM.from_parameters`: those tensors as eager Modules
  (``model.layers.0.self_attn.q_proj.weight`` stays the parameter name), run by
  `CausalLM` (padded batches, a dense KV cache, ``jax.jit``-ed steps).
- `llama_transformer`: the same tensors as a `maxfx.nn.Transformer` over a ragged
  batch and the paged KV cache (`graph_weights` names them for ``weights_registry``),
  run by `maxfx.models.LlamaGraphModel`.

Both realizations share the layer math of `maxfx.nn` (``_q8``, ``_rope``,
``attention``). A Llama-family variant (projection biases, q/k norms, a sliding
window, fused projections, ...) is a `LlamaConfig` field that these three
places read; `maxfx.models._families` says which fields Qwen2, Qwen3, Mistral,
Phi-3 and Gemma set.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from lowering.dtypes import DType
from maxfx import nn
from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn import Module, RMSNorm, Sequential
from maxfx.graph import DeviceRef
from maxfx.models._config import MLP_ACTIVATIONS, LlamaConfig
from maxfx.models._generate import CausalLM
from maxfx.models._layers import ScaledRMSNorm, attention_with_cache, positions, rope, rope_table
from maxfx.models._paged import GraphWeight, graph_dtype, q8_graph_entries
from maxfx.models._source import Q8_0, ParamSource, StoredTensor, eager_embedding, eager_linear, eager_tensor
from maxfx.models._token_ids import check_token_ids
from maxfx.nn._q8 import Q8AttentionWithRope, Q8Embedding, Q8Linear
from maxfx.nn.activation import activation_table, lookup_activation
from maxfx.nn.attention import AttentionWithRope, GGUFQAttentionWithRope
from maxfx.nn.attention.mask_config import MHAMaskVariant
from maxfx.nn.kv_cache import KVCacheParams
from maxfx.nn.transformer import ReturnLogits, Transformer, TransformerBlock

__all__ = [
    "LlamaAttention",
    "LlamaDecoderLayer",
    "LlamaForCausalLM",
    "LlamaMLP",
    "LlamaModel",
    "graph_dtype",
    "graph_weights",
    "llama_transformer",
    "read_llama",
]

_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_NORMS = ("input_layernorm", "post_attention_layernorm")
_QK_NORMS = ("q_norm", "k_norm")
_ACTIVATIONS = activation_table(F)
# Phi-3's fused matrices (name under ``model.layers.N.``) -> the projections whose rows they stack, in order.
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
_FUSED_PARTS = {n for parts in _FUSED.values() for n in parts}


# ─── the tensors ──────────────────────────────────────────────────────────


def _matrices(c: LlamaConfig) -> dict[str, tuple[int, int, int | None]]:
    """A decoder layer's projections (name under ``model.layers.N.``) → (rows, cols, RoPE heads of its rows)."""
    hd, e, ff = c.head_dim, c.hidden_size, c.intermediate_size
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    return {
        "self_attn.q_proj": (q, e, c.num_attention_heads),
        "self_attn.k_proj": (kv, e, c.num_key_value_heads),
        "self_attn.v_proj": (kv, e, None),
        "self_attn.o_proj": (e, q, None),
        "mlp.gate_proj": (ff, e, None),
        "mlp.up_proj": (ff, e, None),
        "mlp.down_proj": (e, ff, None),
    }


def _biases(c: LlamaConfig) -> tuple[str, ...]:
    """The projections (under ``model.layers.N.``) that carry a bias."""
    qkv = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj") if c.qkv_bias else ()
    return qkv + (("self_attn.o_proj",) if c.o_bias else ())


def embedding_scale(c: LlamaConfig, dtype: DType) -> float:
    """What the embeddings are multiplied by: ``sqrt(hidden_size)`` rounded to ``dtype`` as Gemma does (1 otherwise)."""
    if not c.scale_embeddings:
        return 1.0
    return float(np.asarray(np.sqrt(c.hidden_size), dtype=dtype.to_numpy()))


def read_llama(c: LlamaConfig, src: ParamSource) -> dict[str, StoredTensor]:
    """Every tensor of a Llama by Hugging Face name, read and checked through ``src`` (then ``src.finish()``).

    Matrices and the embedding keep their checkpoint format (packed GGUF blocks,
    Q8_0 blocks or floats); Q/K rows come back in rotate-half order; norms and
    biases are floats. The config's variant fields add tensors (q/k/v biases,
    q/k norms) or read fused ones (Phi-3's ``qkv_proj``/``gate_up_proj``, returned
    split under the q/k/v and gate/up names).

    Raises:
        CheckpointMismatchError: a tensor is missing, mis-shaped or left over.

    Example:
        >>> cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        >>> from maxfx.models._source import RandomSource
        >>> w = read_llama(cfg, RandomSource(seed=0))
        >>> w["model.layers.0.self_attn.k_proj.weight"].value.shape, len(w)
        ((8, 16), 12)
    """
    out: dict[str, StoredTensor] = {}
    mats = _matrices(c)

    def matrix(name: str, rows: int, cols: int, rope_heads: int | None = None) -> None:
        out[name] = src.read(name, (rows, cols), fan_in=cols, rope_heads=rope_heads, keep_blocks=True)

    def norm(name: str, dim: int = c.hidden_size) -> None:
        out[name] = src.read(name, (dim,), kind="norm")

    def fused(prefix: str, name: str, parts: tuple[str, ...]) -> None:
        # Phi-3 stores [q; k; v] and [gate; up] as one matrix: split its rows (blocks run along columns, so packed rows
        # split too).
        rows = [mats[n][0] for n in parts]
        w = src.read(
            f"{prefix}{name}.weight", (sum(rows), mats[parts[0]][1]), fan_in=mats[parts[0]][1], keep_blocks=True
        )
        for n, a, b in zip(parts, np.cumsum([0, *rows[:-1]]), np.cumsum(rows)):
            out[f"{prefix}{n}.weight"] = StoredTensor(np.ascontiguousarray(w.value[a:b]), w.format)

    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        for name, (rows, cols, rope_heads) in mats.items():
            if not (c.fused_projections and name in _FUSED_PARTS):
                matrix(f"{p}{name}.weight", rows, cols, rope_heads)
        if c.fused_projections:
            for name, parts in _FUSED.items():
                fused(p, name, parts)
        for name in _biases(c):
            out[f"{p}{name}.bias"] = src.read(f"{p}{name}.bias", (mats[name][0],), kind="bias")
        for name in _NORMS:
            norm(f"{p}{name}.weight")
        if c.qk_norm:
            for name in _QK_NORMS:
                norm(f"{p}self_attn.{name}.weight", c.head_dim)
    out["model.embed_tokens.weight"] = src.read(
        "model.embed_tokens.weight", (c.vocab_size, c.hidden_size), kind="embedding", keep_blocks=True
    )
    norm("model.norm.weight")
    if not c.tie_word_embeddings:
        matrix("lm_head.weight", c.vocab_size, c.hidden_size)
    src.finish()
    return out


# ─── eager Modules ────────────────────────────────────────────────────────


class LlamaAttention(Module):
    """Grouped-query self-attention with rotary embeddings.

    ``q_norm``/``k_norm`` (Qwen3) normalize each head before RoPE; the config's
    ``sliding_window`` (Mistral) limits each query to its latest positions.
    """

    def __init__(
        self,
        config: LlamaConfig,
        q_proj: Module,
        k_proj: Module,
        v_proj: Module,
        o_proj: Module,
        q_norm: Module | None = None,
        k_norm: Module | None = None,
    ):
        self.config = config
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.q_norm, self.k_norm = q_norm, k_norm

    def forward(self, x: Tensor, qpos: Tensor, cache: Any = None) -> tuple[Tensor, Any]:
        c = self.config
        b, t = x.shape[0], x.shape[1]
        q = F.reshape(self.q_proj(x), [b, t, c.num_attention_heads, c.head_dim])
        k = F.reshape(self.k_proj(x), [b, t, c.num_key_value_heads, c.head_dim])
        v = F.reshape(self.v_proj(x), [b, t, c.num_key_value_heads, c.head_dim])
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope_table(
            qpos, c.inv_freq()
        )  # once for q and k: XLA does not merge the two (libm sincos per entry)
        out, cache = attention_with_cache(rope(q, cos, sin), rope(k, cos, sin), v, qpos, cache, c.sliding_window)
        return self.o_proj(out), cache


class LlamaMLP(Module):
    """Gated feed-forward: ``down(act(gate(x)) * up(x))``, ``act`` SiLU (SwiGLU) or tanh-GELU (Gemma)."""

    def __init__(self, gate_proj: Module, up_proj: Module, down_proj: Module, act: str = "silu"):
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.act = act  # a maxfx.nn activation name

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(lookup_activation(_ACTIVATIONS, self.act)(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``."""

    def __init__(
        self, self_attn: LlamaAttention, mlp: LlamaMLP, input_layernorm: RMSNorm, post_attention_layernorm: RMSNorm
    ):
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
    The decoder layers sit in a `Sequential` of identical blocks, which
    ``model.compile`` compiles once as a subgraph called per layer
    (``use_subgraphs=True``, the default for models).

    Example:
        >>> from maxfx.models import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
        ...                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        >>> m = LlamaForCausalLM.random(cfg, seed=0)
        >>> m(Tensor([[1, 2, 3]], dtype=DType.int64)).shape
        [Dim(1), Dim(3), Dim(32)]
    """

    def __init__(self, config: LlamaConfig, model: LlamaModel, lm_head: Module | None):
        self.config = config
        self.model = model
        self.lm_head = lm_head  # None: tied to the embedding

    @classmethod
    def from_source(cls, config: LlamaConfig, src: ParamSource) -> LlamaForCausalLM:
        """Build from a `ParamSource` (checkpoint reader or random init), by HF names (`read_llama`)."""
        return cls.from_parameters(config, read_llama(config, src))

    @classmethod
    def from_parameters(cls, config: LlamaConfig, w: Mapping[str, StoredTensor]) -> LlamaForCausalLM:
        """Build from `read_llama`'s tensors; packed and Q8_0 matrices stay as stored (`QuantizedLinear`,
        `Q8Linear`).
        """
        c = config

        def norm(name: str, dim: int = c.hidden_size) -> Module:
            weight = eager_tensor(w[name + ".weight"])
            if c.norm_weight_offset or c.norm_multiply_before_cast:
                return ScaledRMSNorm(
                    weight,
                    eps=c.rms_norm_eps,
                    offset=c.norm_weight_offset,
                    multiply_before_cast=c.norm_multiply_before_cast,
                )
            return RMSNorm(dim, eps=c.rms_norm_eps, weight=weight)

        def proj(name: str) -> Module:
            layer = eager_linear(w[name + ".weight"])
            if name + ".bias" in w:
                layer.bias = eager_tensor(w[name + ".bias"])
            return layer

        layers = []
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            qk_norms = (norm(p + "self_attn." + n, c.head_dim) for n in _QK_NORMS) if c.qk_norm else ()
            attn = LlamaAttention(c, *(proj(p + "self_attn." + n) for n in _PROJ), *qk_norms)
            mlp = LlamaMLP(*(proj(p + "mlp." + n) for n in _MLP), act=MLP_ACTIVATIONS[c.hidden_act])
            layers.append(LlamaDecoderLayer(attn, mlp, *(norm(p + n) for n in _NORMS)))
        embed = eager_embedding(w["model.embed_tokens.weight"])
        head = None if c.tie_word_embeddings else proj("lm_head")
        return cls(c, LlamaModel(embed, Sequential(*layers), norm("model.norm")), head)

    # -- CausalLM hooks ----------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    def kv_shape(self) -> tuple[int, int]:
        return self.config.num_key_value_heads, self.config.head_dim

    def hidden(self, ids: Tensor, qpos: Tensor, caches: list[Any] | None) -> tuple[Tensor, list[Any] | None]:
        check_token_ids(type(self).__name__, ids, self.config.vocab_size)
        x = self.model.embed_tokens(ids)
        if self.config.scale_embeddings:  # Gemma: the scale rounded to the activations' dtype first, as HF does
            x = x * embedding_scale(self.config, x.dtype)
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
        return (
            emb.as_linear()(h) if hasattr(emb, "as_linear") else h @ emb.weight.T
        )  # packed/Q8_0 tables: the table's own product


# ─── the maxfx.nn graph ───────────────────────────────────────────────────

_CPU = DeviceRef.CPU()


def graph_weights(params: Mapping[str, StoredTensor]) -> dict[str, GraphWeight]:
    """`read_llama`'s tensors under the `maxfx.nn.Transformer` state-dict names (HF's without ``model.``).

    A Q8_0 matrix's raw blocks become two entries, ``weight`` (int8 quants) and
    ``scales`` (float16), a byte view: the values stay 8-bit.
    """
    out: dict[str, GraphWeight] = {}
    for hf, w in params.items():
        out.update(q8_graph_entries(hf.removeprefix("model."), w.value, w.format))
    return out


def _linear(in_dim: int, out_dim: int, dtype: DType, fmt: Any, has_bias: bool = False) -> nn.Linear | Q8Linear:
    if fmt == Q8_0:
        return Q8Linear(in_dim, out_dim, dtype, _CPU)
    return nn.Linear(in_dim, out_dim, dtype, _CPU, quantization_encoding=fmt, has_bias=has_bias)


def _graph_attention(
    c: LlamaConfig, w: Mapping[str, GraphWeight], prefix: str, rope: Any, kv_params: KVCacheParams, dtype: DType
) -> Any:
    fmts = {n: w[f"{prefix}self_attn.{n}.weight"][1] for n in _PROJ}
    qkv = {fmts["q_proj"], fmts["k_proj"], fmts["v_proj"]}
    if len(qkv) != 1:
        raise ValueError(
            f"LlamaGraphModel: {prefix}self_attn q/k/v projections mix weight formats {fmts}; the fused QKV kernels "
            "need one format"
        )
    (fmt,) = qkv
    kw = dict(
        rope=rope,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        hidden_size=c.hidden_size,
        kv_params=kv_params,
    )
    variant = (
        dict(has_bias=c.qkv_bias, use_qk_norm=c.qk_norm, rms_norm_eps=c.rms_norm_eps)
        if (c.qkv_bias or c.qk_norm)
        else {}
    )
    if variant and fmt is not None:
        raise ValueError(
            f"LlamaGraphModel: {prefix}self_attn: q/k/v biases and q/k norms need float weights, got {fmt}"
        )
    if fmt is None:
        attn = AttentionWithRope(**kw, **variant, dtype=dtype)
    elif fmt == Q8_0:  # the fused QKV kernel gets a wqkv decoded in the graph
        attn = Q8AttentionWithRope(**kw, dtype=dtype)
    else:
        attn = GGUFQAttentionWithRope(**kw, dtype=dtype, quantization_encoding=fmt)
    if fmts["o_proj"] != fmt or c.o_bias:
        attn.o_proj = _linear(
            c.num_attention_heads * c.head_dim, c.hidden_size, dtype, fmts["o_proj"], has_bias=c.o_bias
        )
    if c.sliding_window is not None:  # the ragged flash kernel masks keys outside (q_pos - window, q_pos]
        attn.mask_variant, attn.local_window_size = MHAMaskVariant.SLIDING_WINDOW_CAUSAL_MASK, int(c.sliding_window)
    return attn


def _graph_mlp(c: LlamaConfig, w: Mapping[str, GraphWeight], prefix: str, dtype: DType) -> nn.MLP:
    mlp = nn.MLP(
        dtype, None, c.hidden_size, c.intermediate_size, [_CPU], activation_function=MLP_ACTIVATIONS[c.hidden_act]
    )
    dims = {
        "gate_proj": (c.hidden_size, c.intermediate_size),
        "up_proj": (c.hidden_size, c.intermediate_size),
        "down_proj": (c.intermediate_size, c.hidden_size),
    }
    for n in _MLP:  # each projection in its own format (GGUF files mix block types)
        setattr(mlp, n, _linear(*dims[n], dtype, w[f"{prefix}mlp.{n}.weight"][1]))
    return mlp


def llama_transformer(c: LlamaConfig, w: Mapping[str, GraphWeight], kv_params: KVCacheParams, rope: Any) -> Transformer:
    """The `maxfx.nn.Transformer` for ``c`` whose layers hold ``w``'s formats (`graph_weights` names → (value, format)).

    Returns every token's logits (``ReturnLogits.ALL``); ``rope`` is the RoPE layer (its table sizes the context).
    """
    dtype = graph_dtype(w)
    blocks = []
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        norms = [_graph_norm(c, dtype) for _ in _NORMS]
        blocks.append(
            TransformerBlock(_graph_attention(c, w, p, rope, kv_params, dtype), _graph_mlp(c, w, p, dtype), *norms)
        )
    emb_fmt = w["embed_tokens.weight"][1]
    if emb_fmt == Q8_0:
        embedding = Q8Embedding(c.vocab_size, c.hidden_size, dtype, _CPU)
    else:
        embedding = nn.Embedding(c.vocab_size, c.hidden_size, dtype, _CPU, quantization_encoding=emb_fmt)
    if c.tie_word_embeddings and emb_fmt == Q8_0:
        head = embedding.tied_head()  # one table (quants + scales), two uses
    elif c.tie_word_embeddings:
        head = _linear(c.hidden_size, c.vocab_size, dtype, emb_fmt)
        head.set_shared_weight("weight", embedding.weight)  # one tensor, two uses
    else:
        head = _linear(c.hidden_size, c.vocab_size, dtype, w["lm_head.weight"][1])
    return Transformer(
        c.hidden_size,
        c.num_attention_heads,
        blocks,
        _graph_norm(c, dtype),
        head,
        embedding,
        kv_params,
        rope,
        return_logits=ReturnLogits.ALL,
        embedding_multiplier=embedding_scale(c, dtype),
    )


def _graph_norm(c: LlamaConfig, dtype: DType) -> nn.RMSNorm:
    # Llama casts before scaling (HF's LlamaRMSNorm); Gemma scales by (1 + w) in float32, then casts.
    return nn.RMSNorm(
        c.hidden_size,
        dtype,
        eps=c.rms_norm_eps,
        weight_offset=c.norm_weight_offset,
        multiply_before_cast=c.norm_multiply_before_cast,
    )
