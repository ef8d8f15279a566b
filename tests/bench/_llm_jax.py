"""A plain-JAX Llama-family decoder written for speed: the baseline `tests/bench/llm.py` holds maxfx to.

Independent of maxfx (``jax.numpy`` / ``jax.lax`` only). It reads a weight dict by
Hugging Face names and a `Arch` of plain numbers, and covers the variants the
benchmark runs:

- Llama: RMSNorm cast-then-scale, SwiGLU, optional tied head;
- Qwen3: RMSNorm over ``head_dim`` on q and k before RoPE, ``head_dim``
  independent of ``hidden / heads``;
- Gemma: RMSNorm scaling by ``(1 + w)`` in float32, embeddings times
  ``sqrt(hidden)`` (rounded to the activations' dtype), tanh-GELU gated MLP,
  tied head.

What makes it fast (what a careful JAX user would write):

- projections contract the weight's last axis with ``lax.dot_general``
  (`_proj`), never ``y @ w.T``: XLA's CPU backend copies a transposed operand
  on every call instead of folding the transpose into the dot;
- the KV cache is a fixed-size ``[B, Hkv, L, D]`` buffer per layer (attention is
  a batched matmul over ``(b, kv-head)`` with no transposes of the cache);
- prefill attends over the prompt's own keys and writes them into a fresh
  cache with ``dynamic_update_slice``;
- the decode step takes the position as a device scalar (all rows share it),
  writes the new key/value with ``dynamic_update_slice`` into cache buffers it
  is donated, takes the argmax inside the step and returns ``pos + 1``, so a
  generation loop never touches the host until it reads the tokens at the end.

Example:
    >>> arch = Arch(vocab=64, hidden=32, inter=64, layers=1, heads=2, kv_heads=1, head_dim=16)
    >>> prefill, decode = make_steps(arch)  # jitted; decode donates its cache argument
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class Arch:
    """The numbers and switches of one decoder (a plain record, no maxfx types)."""

    vocab: int
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float = 1e-6
    theta: float = 10000.0
    tied: bool = False
    qk_norm: bool = False  # Qwen3
    gemma: bool = False  # (1 + w) norms, scaled embeddings, tanh-GELU MLP

    def inv_freq(self) -> np.ndarray:
        return 1.0 / self.theta ** (np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)


def _proj(y, w):
    """``y @ w.T`` for ``w [out, in]``, reading ``w`` in place (contracts its last axis)."""
    return jax.lax.dot_general(y, w, (((y.ndim - 1,), (1,)), ((), ())))


def _norm(arch: Arch, x, w):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + arch.eps)
    if arch.gemma:  # scale by (1 + w) in float32, then cast
        return (y * (1.0 + w.astype(jnp.float32))).astype(x.dtype)
    return y.astype(x.dtype) * w  # Llama / Qwen: cast, then scale


def _rope(x, cos, sin):
    """Rotate-half RoPE; x ``[B, T, H, D]``, cos/sin ``[T, D]``."""
    h = x.shape[-1] // 2
    rot = jnp.concatenate([-x[..., h:], x[..., :h]], -1)
    return x * cos[:, None, :].astype(x.dtype) + rot * sin[:, None, :].astype(x.dtype)


def _cos_sin(arch: Arch, pos):
    ang = pos.astype(jnp.float32)[:, None] * jnp.asarray(arch.inv_freq(), jnp.float32)
    ang = jnp.concatenate([ang, ang], -1)
    return jnp.cos(ang), jnp.sin(ang)


def _qkv(arch: Arch, p: dict, pre: str, y, cos, sin):
    """Projections of ``y [B, T, E]`` → q ``[B, Hkv, R, T, D]``, k/v ``[B, Hkv, T, D]`` (rotated, normed)."""
    b, t, _ = y.shape
    g, d = arch.kv_heads, arch.head_dim
    q = _proj(y, p[pre + "q_proj.weight"]).reshape(b, t, arch.heads, d)
    k = _proj(y, p[pre + "k_proj.weight"]).reshape(b, t, g, d)
    v = _proj(y, p[pre + "v_proj.weight"]).reshape(b, t, g, d)
    if arch.qk_norm:
        q, k = _norm(arch, q, p[pre + "q_norm.weight"]), _norm(arch, k, p[pre + "k_norm.weight"])
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    q = q.reshape(b, t, g, arch.heads // g, d).transpose(0, 2, 3, 1, 4)
    return q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)


def _attend(arch: Arch, q, k, v, visible):
    """q ``[B, G, R, T, D]`` over k/v ``[B, G, S, D]``; ``visible [T, S]`` bool. Returns ``[B, T, H * D]``."""
    s = jnp.einsum("bgrtd,bgsd->bgrts", q, k).astype(jnp.float32) * (1.0 / np.sqrt(arch.head_dim))
    s = jnp.where(visible, s, -jnp.inf)
    pr = jax.nn.softmax(s, -1).astype(v.dtype)
    o = jnp.einsum("bgrts,bgsd->btgrd", pr, v)
    return o.reshape(o.shape[0], o.shape[1], arch.heads * arch.head_dim)


def _mlp(arch: Arch, p: dict, pre: str, y):
    g = _proj(y, p[pre + "gate_proj.weight"])
    act = jax.nn.gelu(g, approximate=True) if arch.gemma else jax.nn.silu(g)
    return _proj(act * _proj(y, p[pre + "up_proj.weight"]), p[pre + "down_proj.weight"])


def _embed(arch: Arch, p: dict, ids):
    x = p["model.embed_tokens.weight"][ids]
    if arch.gemma:  # sqrt(hidden) rounded to the activations' dtype first
        x = x * jnp.asarray(np.sqrt(arch.hidden), x.dtype)
    return x


def _logits(arch: Arch, p: dict, x):
    w = p["model.embed_tokens.weight"] if arch.tied else p["lm_head.weight"]
    return _proj(_norm(arch, x, p["model.norm.weight"]), w).astype(jnp.float32)


def make_steps(arch: Arch):
    """``(prefill, decode)``, both jitted.

    - ``prefill(params, ids [B, T] int32, *, length) -> (tokens [B] int32, caches)``:
      the prompt (all rows length T) into fresh ``[B, Hkv, length, D]`` caches;
    - ``decode(params, caches, tokens [B], pos) -> (tokens, caches, pos + 1)``:
      one token per row at position ``pos`` (an int32 device scalar); ``caches`` is donated.
    """

    def prefill(params, ids, *, length):
        b, t = ids.shape
        cos, sin = _cos_sin(arch, jnp.arange(t))
        causal = jnp.tril(jnp.ones((t, t), bool))
        x = _embed(arch, params, ids)
        caches = []
        for i in range(arch.layers):
            pre = f"model.layers.{i}."
            q, k, v = _qkv(
                arch, params, pre + "self_attn.", _norm(arch, x, params[pre + "input_layernorm.weight"]), cos, sin
            )
            x = x + _proj(_attend(arch, q, k, v, causal), params[pre + "self_attn.o_proj.weight"])
            x = x + _mlp(arch, params, pre + "mlp.", _norm(arch, x, params[pre + "post_attention_layernorm.weight"]))
            empty = jnp.zeros((b, arch.kv_heads, length, arch.head_dim), k.dtype)
            caches.append(
                (
                    jax.lax.dynamic_update_slice(empty, k, (0, 0, 0, 0)),
                    jax.lax.dynamic_update_slice(empty, v, (0, 0, 0, 0)),
                )
            )
        return jnp.argmax(_logits(arch, params, x[:, -1]), -1).astype(jnp.int32), caches

    def decode(params, caches, tokens, pos):
        cos, sin = _cos_sin(arch, pos[None])
        x = _embed(arch, params, tokens[:, None])
        length = caches[0][0].shape[2]
        visible = (jnp.arange(length) <= pos)[None, :]
        new = []
        for i, (kc, vc) in enumerate(caches):
            pre = f"model.layers.{i}."
            q, k, v = _qkv(
                arch, params, pre + "self_attn.", _norm(arch, x, params[pre + "input_layernorm.weight"]), cos, sin
            )
            kc = jax.lax.dynamic_update_slice(kc, k, (0, 0, pos, 0))
            vc = jax.lax.dynamic_update_slice(vc, v, (0, 0, pos, 0))
            x = x + _proj(_attend(arch, q, kc, vc, visible), params[pre + "self_attn.o_proj.weight"])
            x = x + _mlp(arch, params, pre + "mlp.", _norm(arch, x, params[pre + "post_attention_layernorm.weight"]))
            new.append((kc, vc))
        return jnp.argmax(_logits(arch, params, x[:, 0]), -1).astype(jnp.int32), new, pos + 1

    return jax.jit(prefill, static_argnames=("length",)), jax.jit(decode, donate_argnums=(1,))
