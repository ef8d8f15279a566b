"""A pure-numpy Llama-style decoder (float64) and helpers to build the same model from maxfx.nn layers.

The numpy model runs each sequence in full with a causal mask (no cache), so
comparing it with cached prefill/decode steps checks the paged KV cache too.
"""

from __future__ import annotations

import numpy as np

from maxfx import nn
from maxfx.dtype import DType
from maxfx.graph import DeviceRef
from maxfx.nn.attention import AttentionWithRope
from maxfx.nn.kv_cache import KVCacheParams
from maxfx.nn.rotary_embedding import RotaryEmbedding
from maxfx.nn.transformer import ReturnLogits, Transformer, TransformerBlock

CPU = DeviceRef.CPU()


def np_rms(x, w, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def np_rope(x, theta, interleaved, start=0):
    """x [S, H, D]: rotate position start + s."""
    s, _, d = x.shape
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = (start + np.arange(s))[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return np.stack([a * cos - b * sin, a * sin + b * cos], -1).reshape(x.shape)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)


def np_causal_attention(q, k, v, scale):
    """q [S, H, D], k/v [S, Hkv, D]: causal softmax attention, one head at a time."""
    s, h, d = q.shape
    group = h // k.shape[1]
    out = np.zeros((s, h, v.shape[2]))
    mask = np.tril(np.ones((s, s), bool))
    for hi in range(h):
        logits = q[:, hi] @ k[:, hi // group].T * scale
        logits = np.where(mask, logits, -np.inf)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        out[:, hi] = (w / w.sum(-1, keepdims=True)) @ v[:, hi // group]
    return out


def np_attention_layer(w, prefix, x, n_heads, n_kv, head_dim, theta, interleaved, start=0):
    s = x.shape[0]
    q = (x @ w[prefix + "q_proj.weight"].T).reshape(s, n_heads, head_dim)
    k = (x @ w[prefix + "k_proj.weight"].T).reshape(s, n_kv, head_dim)
    v = (x @ w[prefix + "v_proj.weight"].T).reshape(s, n_kv, head_dim)
    q, k = np_rope(q, theta, interleaved, start), np_rope(k, theta, interleaved, start)
    a = np_causal_attention(q, k, v, 1 / np.sqrt(head_dim))
    return a.reshape(s, n_heads * head_dim) @ w[prefix + "o_proj.weight"].T


def np_llama(w, tokens, cfg):
    """Logits [S, vocab] of one full sequence."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    h = w["embed_tokens.weight"][np.asarray(tokens)]
    for i in range(cfg["n_layers"]):
        p = f"layers.{i}."
        x = np_rms(h, w[p + "input_layernorm.weight"])
        h = h + np_attention_layer(
            w, p + "self_attn.", x, cfg["n_heads"], cfg["n_kv"], cfg["head_dim"], cfg["theta"], cfg["interleaved"]
        )
        x = np_rms(h, w[p + "post_attention_layernorm.weight"])
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return np_rms(h, w["norm.weight"]) @ w["lm_head.weight"].T


TINY = dict(
    vocab=50,
    dim=32,
    n_heads=4,
    n_kv=2,
    head_dim=8,
    ffn=48,
    n_layers=2,
    theta=10000.0,
    interleaved=True,
    page_size=4,
    max_seq_len=32,
)


def build_llama(cfg=TINY, return_logits=ReturnLogits.LAST_TOKEN):
    """The tiny Llama from maxfx.nn layers, plus its KVCacheParams."""
    f32 = DType.float32
    kv_params = KVCacheParams(f32, n_kv_heads=cfg["n_kv"], head_dim=cfg["head_dim"], page_size=cfg["page_size"])
    rope = RotaryEmbedding(cfg["dim"], cfg["n_heads"], cfg["theta"], cfg["max_seq_len"], interleaved=cfg["interleaved"])
    blocks = [
        TransformerBlock(
            attention=AttentionWithRope(
                rope=rope,
                num_attention_heads=cfg["n_heads"],
                num_key_value_heads=cfg["n_kv"],
                hidden_size=cfg["dim"],
                kv_params=kv_params,
            ),
            mlp=nn.MLP(f32, None, cfg["dim"], cfg["ffn"], [CPU]),
            attention_norm=nn.RMSNorm(cfg["dim"], f32),
            mlp_norm=nn.RMSNorm(cfg["dim"], f32),
        )
        for _ in range(cfg["n_layers"])
    ]
    model = Transformer(
        dim=cfg["dim"],
        n_heads=cfg["n_heads"],
        layers=blocks,
        norm=nn.RMSNorm(cfg["dim"], f32),
        output=nn.Linear(cfg["dim"], cfg["vocab"], f32, CPU),
        embedding=nn.Embedding(cfg["vocab"], cfg["dim"], f32, CPU),
        kv_params=kv_params,
        rope=rope,
        return_logits=return_logits,
    )
    return model, kv_params


def random_weights(model, rng):
    """Random float32 weights: projections ~ N(0, 1/fan_in), norms ~ 1 + N(0, 0.1)."""
    out = {}
    for name, v in model.state_dict().items():
        shape = np.shape(v)
        if name.endswith("norm.weight") or "layernorm" in name:
            out[name] = (1 + 0.1 * rng.normal(size=shape)).astype(np.float32)
        else:
            out[name] = (rng.normal(size=shape) / np.sqrt(shape[-1])).astype(np.float32)
    model.load_state_dict(out)
    return out
