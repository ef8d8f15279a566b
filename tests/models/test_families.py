"""The Llama-family architectures (Qwen2, Qwen3, Mistral, Phi-3, Gemma) vs Hugging Face goldens, eager and graph.

Goldens (``tests/data/models/tiny_<arch>/golden.npz``) are transformers' float32
logits of a [2, 12] prompt and its 16 greedy tokens (KV cache, no EOS stop).
Mistral's window (8) is shorter than the prompt (12) and than prompt + new tokens
(28), so both prefill and every decode step past position 8 depend on it; a float64
numpy model of windowed attention checks a longer run on a random Mistral too.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from maxfx.experimental.tensor import Tensor
from maxfx.models import ConfigError, LlamaForCausalLM, LlamaGraphModel, load_pretrained, load_pretrained_graph
from maxfx.models._families import GemmaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config
from maxfx.models._llama import graph_weights, read_llama
from maxfx.models._loading import ARCHITECTURES
from maxfx.models._source import RandomSource
from tests.models._helpers import DATA, golden

FAMILIES = {
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "mistral": MistralConfig,
    "phi3": Phi3Config,
    "gemma": GemmaConfig,
}
# The fixtures' README requires 1e-4 in float32; measured here <= 2e-5 (Gemma's logits reach 55).
ATOL = 1e-4


@functools.cache
def _model(arch: str, runtime: str):
    path = DATA / f"tiny_{arch}"
    if runtime == "eager":
        return load_pretrained(path)
    return load_pretrained_graph(path, max_batch_size=2, max_seq_len=64)


def _logits(m, ids: np.ndarray) -> np.ndarray:
    out = m(Tensor(ids)) if isinstance(m, LlamaForCausalLM) else m(ids)
    return out.to_numpy() if hasattr(out, "to_numpy") else np.asarray(out)


@pytest.mark.parametrize("runtime", ["eager", "graph"])
@pytest.mark.parametrize("arch", list(FAMILIES))
def test_logits_and_greedy_tokens_match_transformers(arch, runtime):
    g = golden(DATA / f"tiny_{arch}")
    m = _model(arch, runtime)
    assert type(m.config) is FAMILIES[arch] and m.config.architecture == arch
    np.testing.assert_allclose(_logits(m, g["input_ids"]), g["logits"], rtol=0, atol=ATOL)
    np.testing.assert_array_equal(np.asarray(m.generate(g["input_ids"], max_new_tokens=16)), g["greedy_ids"])


def test_what_each_config_reads_from_config_json():
    cfg = {arch: _model(arch, "eager").config for arch in FAMILIES}
    assert cfg["qwen2"].qkv_bias and not cfg["qwen2"].o_bias and cfg["qwen2"].tie_word_embeddings
    assert cfg["qwen3"].qk_norm and cfg["qwen3"].rope_theta == 1e6 and not cfg["qwen3"].qkv_bias
    assert cfg["mistral"].sliding_window == 8
    assert cfg["phi3"].fused_projections and cfg["phi3"].head_dim == 16
    g = cfg["gemma"]
    assert (g.norm_weight_offset, g.scale_embeddings, g.hidden_act, g.tie_word_embeddings) == (
        1.0,
        True,
        "gelu_pytorch_tanh",
        True,
    )


def test_checkpoint_layouts_become_the_llama_parameters():
    params = {arch: dict(_model(arch, "eager").parameters) for arch in FAMILIES}
    assert "model.layers.0.self_attn.q_proj.bias" in params["qwen2"] and "lm_head.weight" not in params["qwen2"]
    assert "model.layers.1.self_attn.k_norm.weight" in params["qwen3"]
    # Phi-3's fused rows are split at load: q, k, v (64 + 32 + 32 rows) and gate, up (128 + 128).
    phi = params["phi3"]
    assert "model.layers.0.self_attn.qkv_proj.weight" not in phi
    assert [int(phi[f"model.layers.0.self_attn.{n}_proj.weight"].shape[0]) for n in "qkv"] == [64, 32, 32]
    assert int(phi["model.layers.0.mlp.up_proj.weight"].shape[0]) == 128
    assert "lm_head.weight" not in params["gemma"]


def test_mistral_window_decides_the_golden():
    # Without the window the same weights give other logits: the golden really exercises it.
    g = golden(DATA / "tiny_mistral")
    m = _model("mistral", "eager")
    full = LlamaForCausalLM.from_parameters(
        m.config.replace(sliding_window=None), read_llama(m.config, _source("mistral"))
    )
    later = np.abs(_logits(full, g["input_ids"]) - g["logits"])[:, 8:]  # positions past the window
    assert later.max() > 1e-2
    np.testing.assert_allclose(_logits(full, g["input_ids"])[:, :8], g["logits"][:, :8], rtol=0, atol=ATOL)


def _source(arch: str):
    from maxfx.graph.weights import load_weights  # noqa: PLC0415
    from maxfx.models._source import CheckpointSource  # noqa: PLC0415

    folder = DATA / f"tiny_{arch}"
    return CheckpointSource(
        load_weights([folder / "model.safetensors"]), str(folder), None, str(folder / "config.json")
    )


# ─── sliding window vs a numpy reference ─────────────────────────────────


def np_windowed_llama(w: dict[str, np.ndarray], c, ids: np.ndarray) -> np.ndarray:
    """Float64 numpy Mistral: Llama whose query at position p sees positions (p - window, p]."""
    x = w["model.embed_tokens.weight"][ids]
    b, t = ids.shape
    h, hk, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    ang = np.arange(t)[:, None] * c.inv_freq()[None]
    cos, sin = (np.concatenate([f(ang)] * 2, -1)[None, :, None] for f in (np.cos, np.sin))
    pos = np.arange(t)
    visible = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - c.sliding_window)

    def rope(v):
        return v * cos + np.concatenate([-v[..., d // 2 :], v[..., : d // 2]], -1) * sin

    def norm(v, wt):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + c.rms_norm_eps) * wt

    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        y = norm(x, w[p + "input_layernorm.weight"])
        q = rope((y @ w[p + "self_attn.q_proj.weight"].T).reshape(b, t, h, d))
        k = np.repeat(rope((y @ w[p + "self_attn.k_proj.weight"].T).reshape(b, t, hk, d)), h // hk, 2)
        v = np.repeat((y @ w[p + "self_attn.v_proj.weight"].T).reshape(b, t, hk, d), h // hk, 2)
        s = np.where(visible, np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d), -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("bhts,bshd->bthd", a, v).reshape(b, t, h * d) @ w[p + "self_attn.o_proj.weight"].T
        y = norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = y @ w[p + "mlp.gate_proj.weight"].T, y @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


WINDOWED = MistralConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    sliding_window=4,
    max_position_embeddings=64,
)


@pytest.mark.parametrize("runtime", ["eager", "graph"])
def test_sliding_window_in_prefill_and_every_decode_step_matches_numpy(runtime):
    params = read_llama(WINDOWED, RandomSource(seed=7))
    if runtime == "eager":
        m = LlamaForCausalLM.from_parameters(WINDOWED, params)
    else:
        m = LlamaGraphModel(WINDOWED, graph_weights(params), max_batch_size=2, max_seq_len=32, page_size=4)
    w = {n: p.value.astype(np.float64) for n, p in params.items()}
    prompt = np.random.default_rng(2).integers(0, 64, (2, 6))  # longer than the window already
    new = np.asarray(m.generate(prompt, max_new_tokens=14))  # 20 positions: 5 windows
    seq = np.concatenate([prompt, new], 1)
    want = np_windowed_llama(w, WINDOWED, seq)
    np.testing.assert_allclose(_logits(m, seq), want, rtol=0, atol=1e-4)
    # Each decoded token is the reference's argmax at its step (ties within the float32 tolerance allowed).
    step = want[:, prompt.shape[1] - 1 : -1]
    chosen = np.take_along_axis(step, new[..., None], -1)[..., 0]
    assert (chosen >= step.max(-1) - 1e-4).all()


# ─── bad configs ──────────────────────────────────────────────────────────


def _config(arch: str, **changes) -> dict:
    cfg = json.loads((DATA / f"tiny_{arch}" / "config.json").read_text())
    for k, v in changes.items():
        if v is _DROP:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


_DROP = object()

BAD = {
    "qwen2-kv-heads": (
        "qwen2",
        {"num_key_value_heads": 3},
        r"num_attention_heads 4 must be a multiple of num_key_value_heads 3",
    ),
    "qwen2-layer-windows": ("qwen2", {"use_sliding_window": True}, r"use_sliding_window=true .* not supported"),
    "qwen3-no-head-dim": ("qwen3", {"head_dim": _DROP}, r"missing config key 'head_dim'"),
    "qwen3-no-vocab": ("qwen3", {"vocab_size": _DROP}, r"missing config key 'vocab_size'"),
    "mistral-window-0": ("mistral", {"sliding_window": 0}, r"sliding_window must be a positive integer or null, got 0"),
    "mistral-window-negative": (
        "mistral",
        {"sliding_window": -4},
        r"sliding_window must be a positive integer or null, got -4",
    ),
    "phi3-head-dim": ("phi3", {"head_dim": 8}, r"head_dim 8 contradicts hidden_size 64 / num_attention_heads 4"),
    "phi3-heads": ("phi3", {"num_attention_heads": 5}, r"hidden_size 64 is not a multiple of num_attention_heads 5"),
    "phi3-longrope": (
        "phi3",
        {"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}},
        r"rope_scaling type 'longrope' is not supported",
    ),
    "gemma-no-head-dim": ("gemma", {"head_dim": _DROP}, r"missing config key 'head_dim'"),
    "gemma-untied": (
        "gemma",
        {"tie_word_embeddings": False},
        r"tie_word_embeddings=false contradicts model_type='gemma'",
    ),
    "gemma-activation": ("gemma", {"hidden_act": "relu2"}, r"hidden_act 'relu2' is not supported"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("loader", [load_pretrained, load_pretrained_graph], ids=["eager", "graph"])
def test_bad_config_names_the_file_and_the_field(tmp_path, case, loader):
    arch, changes, match = BAD[case]
    (tmp_path / "config.json").write_text(json.dumps(_config(arch, **changes)))
    with pytest.raises(ConfigError, match=match) as e:
        loader(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value)


def test_unknown_model_type_lists_every_supported_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_config("qwen2", model_type="qwen9")))
    with pytest.raises(ConfigError, match="unsupported architecture model_type='qwen9'") as e:
        load_pretrained(tmp_path)
    assert all(arch in str(e.value) for arch in ARCHITECTURES)
    assert {"qwen2", "qwen3", "mistral", "phi3", "gemma", "llama", "gpt2"} <= set(ARCHITECTURES)


@pytest.mark.parametrize("runtime", ["eager", "graph"])
def test_sliding_window_with_prompts_of_different_lengths(runtime):
    # Rows of a ragged batch reach the window at different steps: each must decode as it does alone.
    params = read_llama(WINDOWED, RandomSource(seed=11))
    if runtime == "eager":
        m = LlamaForCausalLM.from_parameters(WINDOWED, params)
    else:
        m = LlamaGraphModel(WINDOWED, graph_weights(params), max_batch_size=2, max_seq_len=32, page_size=4)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 64, 3), rng.integers(0, 64, 9)]
    together = np.asarray(m.generate(prompts, max_new_tokens=10))
    for row, p in zip(together, prompts):
        np.testing.assert_array_equal(row, np.asarray(m.generate([p], max_new_tokens=10))[0])
