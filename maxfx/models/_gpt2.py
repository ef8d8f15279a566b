"""GPT-2 (``GPT2LMHeadModel``) as a tree of eager Modules.

Parameter names and layouts follow Hugging Face's checkpoint: ``Conv1D``
weights stay ``[in, out]`` (`Conv1D` multiplies from the right), ``c_attn``
packs q, k, v along its output, and the head is tied to ``transformer.wte``.
"""

from __future__ import annotations

from typing import Any

from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn import LayerNorm, Module, Sequential
from maxfx.models._config import GPT2Config, gpt2_gelu_mode
from maxfx.models._generate import CausalLM
from maxfx.models._layers import Conv1D, attention_with_cache, positions
from maxfx.models._source import ParamSource

__all__ = ["GPT2Attention", "GPT2Block", "GPT2LMHeadModel", "GPT2MLP", "GPT2Model"]


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
        q, k, v = (F.reshape(part, [b, t, c.n_head, c.head_dim]) for part in F.split(self.c_attn(x), [c.n_embd] * 3, axis=-1))
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
        >>> m(Tensor.constant([[1, 2, 3]], dtype=DType.int64)).shape
        [Dim(1), Dim(3), Dim(32)]
    """

    def __init__(self, config: GPT2Config, transformer: GPT2Model):
        self.config = config
        self.transformer = transformer

    @classmethod
    def from_source(cls, config: GPT2Config, src: ParamSource) -> GPT2LMHeadModel:
        """Build from a `ParamSource` by HF names (``transformer.h.0.attn.c_attn.weight``, ...)."""
        c = config
        e, inner, eps = c.n_embd, c.inner_dim, c.layer_norm_epsilon

        def conv(name: str, n_in: int, n_out: int) -> Conv1D:
            return Conv1D(src.tensor(name + ".weight", (n_in, n_out), fan_in=n_in), src.tensor(name + ".bias", (n_out,), kind="bias"))

        def ln(name: str) -> LayerNorm:
            return _layer_norm(src.norm(name + ".weight", e), src.tensor(name + ".bias", (e,), kind="bias"), eps)

        blocks = []
        for i in range(c.n_layer):
            p = f"transformer.h.{i}."
            attn = GPT2Attention(c, conv(p + "attn.c_attn", e, 3 * e), conv(p + "attn.c_proj", e, e))
            mlp = GPT2MLP(c, conv(p + "mlp.c_fc", e, inner), conv(p + "mlp.c_proj", inner, e))
            blocks.append(GPT2Block(ln(p + "ln_1"), attn, ln(p + "ln_2"), mlp))
        wte = src.embedding("transformer.wte", c.vocab_size, e)
        wpe = src.embedding("transformer.wpe", c.n_positions, e)
        model = GPT2Model(wte, wpe, Sequential(*blocks), ln("transformer.ln_f"))
        src.finish(ignore=("lm_head.weight",) + tuple(f"transformer.h.{i}.attn.bias" for i in range(c.n_layer)) + tuple(f"transformer.h.{i}.attn.masked_bias" for i in range(c.n_layer)))
        return cls(c, model)

    @property
    def num_layers(self) -> int:
        return self.config.n_layer

    def kv_shape(self) -> tuple[int, int]:
        return self.config.n_head, self.config.head_dim

    def hidden(self, ids: Tensor, qpos: Tensor, caches: list[Any] | None) -> tuple[Tensor, list[Any] | None]:
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
