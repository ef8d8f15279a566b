"""GPT-2 (``GPT2LMHeadModel``): the one definition behind `load_pretrained` (eager Modules) and `load_pretrained_graph`
(a `maxfx.nn` graph).

Three parts, as for Llama (`maxfx.models._llama`):

- `read_gpt2`: every tensor by Hugging Face name and shape (the only place that
  names and shapes GPT-2's tensors), read through the public `ParamSource`.
- `GPT2LMHeadModel.from_parameters`: those tensors as eager Modules. ``Conv1D``
  weights stay ``[in, out]`` (`Conv1D` multiplies from the right), ``c_attn``
  packs q, k, v along its output, and the head is tied to ``transformer.wte``.
- `gpt2_transformer`: the same tensors (`gpt2_graph_weights` names them) as a
  `maxfx.nn.Transformer` (LayerNorm, learned positions, fused ``qkv_proj`` with
  biases, GELU MLP, tied head) over a ragged batch and the paged KV cache, run by
  `GPT2GraphModel` (the shared `PagedCausalLM` runtime).

Example:
    >>> from maxfx.models._source import RandomSource
    >>> cfg = GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions=8)
    >>> w = read_gpt2(cfg, RandomSource(seed=0))
    >>> w["transformer.h.0.attn.c_attn.weight"].value.shape, len(w)
    ((16, 48), 16)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from lowering.dtypes import DType
from maxfx import nn
from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn import LayerNorm, Module, Sequential
from maxfx.graph import DeviceRef, ops
from maxfx.models._config import GPT2Config, gpt2_gelu_mode
from maxfx.models._generate import CausalLM
from maxfx.models._layers import Conv1D, attention_with_cache, positions
from maxfx.models._paged import GraphWeight, PagedCausalLM, graph_dtype
from maxfx.models._source import ParamSource, StoredTensor, eager_embedding, eager_tensor, rename_tensor
from maxfx.models._token_ids import check_token_ids
from maxfx.nn.attention._rope_attention import _RaggedAttentionBase
from maxfx.nn.kv_cache import KVCacheParams
from maxfx.nn.transformer import ReturnLogits, Transformer, TransformerBlock

__all__ = [
    "GPT2Attention",
    "GPT2Block",
    "GPT2GraphModel",
    "GPT2LMHeadModel",
    "GPT2MLP",
    "GPT2Model",
    "gpt2_graph_weights",
    "gpt2_transformer",
    "read_gpt2",
]


# ─── the tensors ──────────────────────────────────────────────────────────


def _unused(c: GPT2Config) -> tuple[str, ...]:
    """Checkpoint entries that are not parameters: the lm_head copy of the tied table, the causal-mask buffers."""
    return (
        "lm_head.weight",
        *(f"transformer.h.{i}.attn.{b}" for i in range(c.n_layer) for b in ("bias", "masked_bias")),
    )


def read_gpt2(c: GPT2Config, src: ParamSource) -> dict[str, StoredTensor]:
    """Every tensor of a GPT-2 by Hugging Face name, read and checked through ``src`` (then ``src.finish()``).

    ``Conv1D`` weights come back ``[in, out]`` as stored; all values are floats.

    Raises:
        CheckpointMismatchError: a tensor is missing, mis-shaped or left over.

    Example:
        >>> from maxfx.models._source import RandomSource
        >>> w = read_gpt2(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_inner=24), RandomSource(seed=0))
        >>> w["transformer.h.0.mlp.c_fc.weight"].value.shape
        (16, 24)
    """
    e, inner = c.n_embd, c.inner_dim
    out: dict[str, StoredTensor] = {}

    def conv(name: str, n_in: int, n_out: int) -> None:
        out[name + ".weight"] = src.read(name + ".weight", (n_in, n_out), fan_in=n_in)
        out[name + ".bias"] = src.read(name + ".bias", (n_out,), kind="bias")

    def ln(name: str) -> None:
        out[name + ".weight"] = src.read(name + ".weight", (e,), kind="norm")
        out[name + ".bias"] = src.read(name + ".bias", (e,), kind="bias")

    for i in range(c.n_layer):
        p = f"transformer.h.{i}."
        conv(p + "attn.c_attn", e, 3 * e)
        conv(p + "attn.c_proj", e, e)
        conv(p + "mlp.c_fc", e, inner)
        conv(p + "mlp.c_proj", inner, e)
        ln(p + "ln_1")
        ln(p + "ln_2")
    out["transformer.wte.weight"] = src.read(
        "transformer.wte.weight", (c.vocab_size, e), kind="embedding", keep_blocks=True
    )
    out["transformer.wpe.weight"] = src.read(
        "transformer.wpe.weight", (c.n_positions, e), kind="embedding", keep_blocks=True
    )
    ln("transformer.ln_f")
    src.finish(ignore=_unused(c))
    return out


# ─── eager Modules ────────────────────────────────────────────────────────


def _layer_norm(weight: Tensor, bias: Tensor, eps: float) -> LayerNorm:
    m = object.__new__(LayerNorm)
    m.weight, m.bias, m.eps = weight, bias, eps
    return m


class GPT2Attention(Module):
    """Multi-head causal self-attention with a fused qkv projection."""

    def __init__(self, config: GPT2Config, c_attn: Conv1D, c_proj: Conv1D):
        self.config = config
        self.c_attn, self.c_proj = c_attn, c_proj

    def forward(self, x: Tensor, qpos: Tensor, cache: Any = None) -> tuple[Tensor, Any]:
        c = self.config
        b, t = x.shape[0], x.shape[1]
        q, k, v = (
            F.reshape(part, [b, t, c.n_head, c.head_dim]) for part in F.split(self.c_attn(x), [c.n_embd] * 3, axis=-1)
        )
        out, cache = attention_with_cache(q, k, v, qpos, cache)
        return self.c_proj(out), cache


class GPT2MLP(Module):
    """``c_proj(gelu(c_fc(x)))`` (tanh-approximated GELU for ``gelu_new``)."""

    def __init__(self, config: GPT2Config, c_fc: Conv1D, c_proj: Conv1D):
        self.approximate = gpt2_gelu_mode(config)
        self.c_fc, self.c_proj = c_fc, c_proj

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate))


class GPT2Block(Module):
    """Pre-norm block: ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))``."""

    def __init__(self, ln_1: LayerNorm, attn: GPT2Attention, ln_2: LayerNorm, mlp: GPT2MLP):
        self.ln_1, self.attn, self.ln_2, self.mlp = ln_1, attn, ln_2, mlp

    def step(self, x: Tensor, qpos: Tensor, cache: Any) -> tuple[Tensor, Any]:
        a, cache = self.attn(self.ln_1(x), qpos, cache)
        x = x + a
        return x + self.mlp(self.ln_2(x)), cache

    def forward(self, x: Tensor) -> Tensor:
        return self.step(x, positions(x), None)[0]


class GPT2Model(Module):
    """Token and position embeddings, blocks and the final LayerNorm (HF's ``transformer.*``)."""

    def __init__(self, wte: Module, wpe: Module, h: Sequential, ln_f: LayerNorm):
        self.wte, self.wpe, self.h, self.ln_f = wte, wpe, h, ln_f


class GPT2LMHeadModel(CausalLM):
    """GPT-2 with its tied language-model head: ``model(input_ids) -> logits [B, T, vocab]``.

    Example:
        >>> from maxfx.models import GPT2Config, GPT2LMHeadModel
        >>> m = GPT2LMHeadModel.random(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2), seed=0)
        >>> m(Tensor([[1, 2, 3]], dtype=DType.int64)).shape
        [Dim(1), Dim(3), Dim(32)]
    """

    def __init__(self, config: GPT2Config, transformer: GPT2Model):
        self.config = config
        self.transformer = transformer

    @classmethod
    def from_source(cls, config: GPT2Config, src: ParamSource) -> GPT2LMHeadModel:
        """Build from a `ParamSource` (checkpoint reader or random init), by HF names (`read_gpt2`)."""
        return cls.from_parameters(config, read_gpt2(config, src))

    @classmethod
    def from_parameters(cls, config: GPT2Config, w: Mapping[str, StoredTensor]) -> GPT2LMHeadModel:
        """Build from `read_gpt2`'s tensors (``transformer.h.0.attn.c_attn.weight``, ...)."""
        c = config

        def conv(name: str) -> Conv1D:
            return Conv1D(eager_tensor(w[name + ".weight"]), eager_tensor(w[name + ".bias"]))

        def ln(name: str) -> LayerNorm:
            return _layer_norm(eager_tensor(w[name + ".weight"]), eager_tensor(w[name + ".bias"]), c.layer_norm_epsilon)

        blocks = []
        for i in range(c.n_layer):
            p = f"transformer.h.{i}."
            attn = GPT2Attention(c, conv(p + "attn.c_attn"), conv(p + "attn.c_proj"))
            mlp = GPT2MLP(c, conv(p + "mlp.c_fc"), conv(p + "mlp.c_proj"))
            blocks.append(GPT2Block(ln(p + "ln_1"), attn, ln(p + "ln_2"), mlp))
        wte, wpe = eager_embedding(w["transformer.wte.weight"]), eager_embedding(w["transformer.wpe.weight"])
        return cls(c, GPT2Model(wte, wpe, Sequential(*blocks), ln("transformer.ln_f")))

    @property
    def num_layers(self) -> int:
        return self.config.n_layer

    def kv_shape(self) -> tuple[int, int]:
        return self.config.n_head, self.config.head_dim

    def hidden(self, ids: Tensor, qpos: Tensor, caches: list[Any] | None) -> tuple[Tensor, list[Any] | None]:
        check_token_ids(type(self).__name__, ids, self.config.vocab_size)
        tr = self.transformer
        x = tr.wte(ids) + tr.wpe(qpos)
        if caches is None:
            return tr.ln_f(tr.h(x)), None
        new = []
        for block, cache in zip(tr.h, caches):
            x, cache = block.step(x, qpos, cache)
            new.append(cache)
        return tr.ln_f(x), new

    def head(self, h: Tensor) -> Tensor:
        return h @ self.transformer.wte.weight.T


# ─── the maxfx.nn graph ───────────────────────────────────────────────────

_CPU = DeviceRef.CPU()
# HF name under transformer.h.N. -> Transformer state-dict name under layers.N. (Conv1D weights are transposed to
# Linear's [out, in])
_GRAPH_LAYER = {
    "ln_1": "input_layernorm",
    "ln_2": "post_attention_layernorm",
    "attn.c_attn": "self_attn.qkv_proj",
    "attn.c_proj": "self_attn.o_proj",
    "mlp.c_fc": "mlp.c_fc",
    "mlp.c_proj": "mlp.c_proj",
}
_GRAPH_TOP = {"transformer.wte": "embed_tokens", "transformer.wpe": "position_embedding", "transformer.ln_f": "norm"}


def _graph_name(hf: str) -> str:
    """``transformer.h.3.attn.c_attn.weight`` -> ``layers.3.self_attn.qkv_proj.weight``."""
    return rename_tensor(
        hf, top=_GRAPH_TOP, layer=_GRAPH_LAYER, hf_layers="transformer.h", layers="layers", what="graph"
    )


def gpt2_graph_weights(params: Mapping[str, StoredTensor]) -> dict[str, GraphWeight]:
    """`read_gpt2`'s tensors under the `gpt2_transformer` state-dict names, ``Conv1D`` weights transposed to ``[out,
    in]``.

    Example:
        >>> from maxfx.models._source import RandomSource
        >>> w = gpt2_graph_weights(read_gpt2(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2),
        ...     RandomSource(seed=0)))
        >>> w["layers.0.self_attn.qkv_proj.weight"][0].shape, w["position_embedding.weight"][0].shape
        ((48, 16), (1024, 16))
    """
    out: dict[str, GraphWeight] = {}
    for hf, t in params.items():
        name = _graph_name(hf)
        is_conv = name.endswith("weight") and (".self_attn." in name or ".mlp." in name)
        out[name] = (np.ascontiguousarray(t.value.T if is_conv else t.value), t.format)
    return out


class GPT2GraphAttention(_RaggedAttentionBase):
    """GPT-2's causal self-attention over the paged cache: fused ``qkv_proj`` and ``o_proj``, both with biases, no
    rotary positions.

    The ragged pipeline of `maxfx.nn.AttentionWithRope` (fused QKV matmul writing
    K/V into the cache, then flash attention) without its RoPE step: GPT-2's
    positions are learned and added to the embeddings.
    """

    def __init__(self, c: GPT2Config, kv_params: KVCacheParams, dtype: DType):
        super().__init__()
        self._init_common(
            type(self).__name__,
            num_attention_heads=c.n_head,
            num_key_value_heads=c.n_head,
            hidden_size=c.n_embd,
            kv_params=kv_params,
            devices=None,
            dtype=dtype,
            linear_cls=nn.Linear,
            stacked_qkv=True,
            scale=None,
            has_bias=True,
            clip_qkv=None,
        )
        self.o_proj = nn.Linear(
            c.n_embd, c.n_embd, dtype, _CPU, has_bias=True
        )  # c_proj has a bias (Llama's o_proj has none)


class GPT2GraphMLP(nn.Module):
    """``c_proj(gelu(c_fc(x)))`` with biases, as graph ops (``approximate`` from the config's
    ``activation_function``).
    """

    def __init__(self, c: GPT2Config, dtype: DType):
        super().__init__()
        self.approximate = gpt2_gelu_mode(c)
        self.c_fc = nn.Linear(c.n_embd, c.inner_dim, dtype, _CPU, has_bias=True)
        self.c_proj = nn.Linear(c.inner_dim, c.n_embd, dtype, _CPU, has_bias=True)

    def __call__(self, x: Any) -> Any:
        return self.c_proj(ops.gelu(self.c_fc(x), approximate=self.approximate))


def gpt2_transformer(c: GPT2Config, dtype: DType, kv_params: KVCacheParams) -> Transformer:
    """The `maxfx.nn.Transformer` of ``c`` (every token's logits, ``ReturnLogits.ALL``) whose state dict
    `gpt2_graph_weights` fills.

    Token and learned position embeddings, pre-LayerNorm blocks, the final LayerNorm and a head
    that reads the token embedding's table (one tensor, two uses).
    """
    eps = c.layer_norm_epsilon
    blocks = []
    for _ in range(c.n_layer):
        norms = [nn.LayerNorm(c.n_embd, [_CPU], dtype, eps=eps) for _ in range(2)]
        blocks.append(TransformerBlock(GPT2GraphAttention(c, kv_params, dtype), GPT2GraphMLP(c, dtype), *norms))
    wte = nn.Embedding(c.vocab_size, c.n_embd, dtype, _CPU)
    wpe = nn.Embedding(c.n_positions, c.n_embd, dtype, _CPU)
    head = nn.Linear(c.n_embd, c.vocab_size, dtype, _CPU)
    head.set_shared_weight("weight", wte.weight)
    norm = nn.LayerNorm(c.n_embd, [_CPU], dtype, eps=eps)
    return Transformer(
        c.n_embd,
        c.n_head,
        blocks,
        norm,
        head,
        wte,
        kv_params,
        None,
        return_logits=ReturnLogits.ALL,
        position_embedding=wpe,
    )


class GPT2GraphModel(PagedCausalLM):
    """GPT-2 compiled as one `maxfx.nn` graph over the paged KV cache: ``model(input_ids) -> logits [B, T, vocab]`` and
    ``generate``.

    Build one with `maxfx.models.load_pretrained_graph`; the runtime (ragged
    prefill, decode, sampling) is `PagedCausalLM`'s.

    Args:
        config: the `GPT2Config`.
        weights: `gpt2_graph_weights` of `read_gpt2`'s tensors.
        max_batch_size: as `PagedCausalLM`.
        max_seq_len: as `PagedCausalLM`; default ``n_positions``, which it cannot exceed
            (the positions are learned).
        page_size: as `PagedCausalLM`.
        session: as `PagedCausalLM`.

    Example:
        >>> from maxfx.models import load_pretrained_graph
        >>> model = load_pretrained_graph("tests/data/models/tiny_gpt2", max_batch_size=2)  # doctest: +SKIP
        >>> model([[1, 2, 3]]).shape  # doctest: +SKIP
        (1, 3, 256)
    """

    def __init__(
        self,
        config: GPT2Config,
        weights: Mapping[str, GraphWeight],
        *,
        max_batch_size: int = 8,
        max_seq_len: int | None = None,
        page_size: int = 16,
        session: Any = None,
    ):
        if max_seq_len is not None and int(max_seq_len) > config.n_positions:
            raise ValueError(
                f"GPT2GraphModel: max_seq_len={max_seq_len} exceeds the {config.n_positions} learned positions "
                "(n_positions)"
            )
        super().__init__(
            config,
            weights,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            page_size=page_size,
            session=session,
        )

    # The eager model's reading of the config: one place says how GPT-2's layers and KV heads are counted, for both
    # runtimes.
    num_layers = GPT2LMHeadModel.num_layers
    kv_shape = GPT2LMHeadModel.kv_shape

    def build_transformer(self, weights: Mapping[str, GraphWeight]) -> Transformer:
        return gpt2_transformer(self.config, graph_dtype(weights), self.kv_params)
