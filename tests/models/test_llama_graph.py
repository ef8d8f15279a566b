"""The graph-API Llama (maxfx.nn layers + InferenceSession + paged KV cache) vs the reference goldens.

Every fixture format's logits match the goldens, greedy generation matches token
for token, decode steps reuse one executable, ragged batches match the goldens'
prefixes, GGUF Q4_0 stays packed, Q8_0 stays 8-bit (decoded in the graph), tied
embeddings match a numpy reference (float and Q8_0 tables).
"""

from __future__ import annotations

import functools
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from lowering.compile import compile_stats
from lowering.dtypes import DType
from lowering.quantization import QuantizationEncoding
from maxfx.models import ConfigError, load_pretrained_graph
from maxfx.nn._q8 import Q8AttentionWithRope, Q8Embedding, Q8Linear
from maxfx.nn.attention import GGUFQAttentionWithRope
from tests.graph_run import run_graph
from tests.models._helpers import FP32_ATOL, LLAMA, QUANT_KERNEL_ATOL, golden
from tests.nn._llama_ref import np_attention_layer, np_rms

FORMATS = {
    "safetensors": (str(LLAMA), "golden.npz"),
    "bin": ("bin", "golden.npz"),
    "gguf_q8_0": (str(LLAMA / "tiny_llama-q8_0.gguf"), "golden_q8_0.npz"),
    "gguf_q4_0": (str(LLAMA / "tiny_llama-q4_0.gguf"), "golden_q4_0.npz"),
}


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama_bin")  # config.json + pytorch_model.bin only
    for f in ("config.json", "pytorch_model.bin"):
        shutil.copy(LLAMA / f, d)
    return d


@functools.cache
def _graph_model(path: str):
    return load_pretrained_graph(path, max_batch_size=4)


def _load(fmt, bin_dir):
    path = FORMATS[fmt][0]
    return _graph_model(str(bin_dir) if path == "bin" else path)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_logits_match_golden(fmt, bin_dir):
    g = golden(LLAMA, FORMATS[fmt][1])
    logits = _load(fmt, bin_dir)(g["input_ids"])
    assert logits.shape == (2, 12, 256) and logits.dtype == np.float32
    # GGUF goldens are the reference run on the dequantized weights (float32 math);
    # the CPU kernels round activations to 16 bits (QUANT_KERNEL_ATOL says by how much).
    atol = QUANT_KERNEL_ATOL if fmt.startswith("gguf") else FP32_ATOL
    np.testing.assert_allclose(logits, g["logits"], rtol=0, atol=atol)


@pytest.mark.parametrize("fmt", ["gguf_q8_0", "gguf_q4_0"])
def test_gguf_logits_with_float_products_match_golden_to_fp32_rounding(fmt, float_products):
    g = golden(LLAMA, FORMATS[fmt][1])
    logits = load_pretrained_graph(FORMATS[fmt][0], max_batch_size=4)(
        g["input_ids"]
    )  # fresh: compiled with the kernels off
    np.testing.assert_allclose(logits, g["logits"], rtol=0, atol=FP32_ATOL)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_greedy_generation_matches_golden_and_decode_does_not_recompile(fmt, bin_dir):
    g = golden(LLAMA, FORMATS[fmt][1])
    compiles = []  # compile count seen after each step's token was chosen
    out = _load(fmt, bin_dir).generate(
        g["input_ids"], g["greedy_ids"].shape[1], stream=lambda t: compiles.append(compile_stats()["compiles"])
    )
    np.testing.assert_array_equal(out, g["greedy_ids"])
    # compiles[0]: after the prefill; compiles[1]: after the first decode step (its one compile, if any).
    assert len(compiles) == 16 and compiles[1:] == [compiles[1]] * 15, f"decode steps recompiled: {compiles}"


def test_ragged_prefill_matches_golden_prefixes():
    g = golden(LLAMA)
    model = _graph_model(str(LLAMA))
    a, b = g["input_ids"]
    parts = model.forward_ragged([a[:5], b, a[:9]])
    assert [p.shape for p in parts] == [(5, 256), (12, 256), (9, 256)]
    for got, want in zip(parts, (g["logits"][0, :5], g["logits"][1], g["logits"][0, :9])):
        np.testing.assert_allclose(got, want, rtol=0, atol=FP32_ATOL)  # causal: a prefix's logits are the full run's


def test_ragged_generation_equals_single_prompts():
    g = golden(LLAMA)
    model = _graph_model(str(LLAMA))
    a, b = g["input_ids"]
    batched = model.generate([a[:7], b], 6)
    assert batched.shape == (2, 6) and batched.dtype == np.int64
    np.testing.assert_array_equal(batched[1], g["greedy_ids"][1, :6])  # the full prompt: the golden's tokens
    np.testing.assert_array_equal(batched[0], model.generate([a[:7]], 6)[0])
    assert model.cache.num_free_pages == model.cache.total_num_pages  # every call gives its pages back


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    g = golden(LLAMA)
    model = _graph_model(str(LLAMA))
    ids = g["input_ids"]
    s1 = model.generate(ids, 5, temperature=0.8, top_p=0.9, seed=3)
    np.testing.assert_array_equal(s1, model.generate(ids, 5, temperature=0.8, top_p=0.9, seed=3))
    np.testing.assert_array_equal(model.generate(ids, 5, temperature=1.5, top_k=1, seed=0), g["greedy_ids"][:, :5])
    prompt = [ids[0, :7]]  # the shapes test_ragged_generation_equals_single_prompts compiled
    free = model.generate(prompt, 6)[0]
    out = model.generate(prompt, 6, eos_token_id=int(free[2]))
    np.testing.assert_array_equal(out[0], free[: list(free).index(free[2]) + 1])  # stops once the only row emitted EOS


def test_gguf_q4_0_stays_packed(bin_dir):
    q4 = _load("gguf_q4_0", bin_dir).transformer
    attn = q4.layers[0].self_attn
    assert isinstance(attn, GGUFQAttentionWithRope) and attn.quantization_encoding is QuantizationEncoding.Q4_0
    assert attn.q_proj.weight.dtype is DType.uint8 and [int(d) for d in attn.q_proj.weight.shape] == [64, 64 // 32 * 18]
    assert (
        q4.lm_head.quantization_encoding is QuantizationEncoding.Q4_0
        and q4.layers[1].mlp.down_proj.quantization_encoding is QuantizationEncoding.Q4_0
    )
    assert q4.embed_tokens.quantization_encoding is QuantizationEncoding.Q4_0


def test_gguf_q8_0_stays_8_bit(bin_dir):
    from maxfx.models._llama_graph import _from_gguf  # noqa: PLC0415

    _, registry = _from_gguf(LLAMA / "tiny_llama-q8_0.gguf", None)  # what LlamaGraphModel hands to weights_registry
    matrices = [n for n in registry if n.endswith("_proj.weight") or n in ("embed_tokens.weight", "lm_head.weight")]
    assert len(matrices) == 2 * 7 + 2
    for n in matrices:  # int8 quants [rows, cols] + float16 scales [rows, cols / 32]: the file's bytes, not float32
        quants, scales = registry[n][0], registry[n.removesuffix("weight") + "scales"][0]
        assert (
            quants.dtype == np.int8
            and scales.dtype == np.float16
            and scales.shape == (quants.shape[0], quants.shape[1] // 32)
        ), n
    assert {v.dtype for v, _ in registry.values()} == {np.dtype(np.int8), np.dtype(np.float16), np.dtype(np.float32)}
    assert all(v.ndim == 1 for v, _ in registry.values() if v.dtype == np.float32)  # only the norms are float
    q8 = _load("gguf_q8_0", bin_dir).transformer
    attn = q8.layers[0].self_attn
    assert (
        isinstance(attn, Q8AttentionWithRope)
        and isinstance(attn.o_proj, Q8Linear)
        and isinstance(q8.layers[1].mlp.down_proj, Q8Linear)
    )
    assert isinstance(q8.embed_tokens, Q8Embedding) and isinstance(q8.lm_head, Q8Linear)
    graph_weights = q8.raw_state_dict()
    assert (
        graph_weights["layers.0.self_attn.q_proj.weight"].dtype is DType.int8
        and graph_weights["lm_head.scales"].dtype is DType.float16
    )


def _np_logits(w, tokens, cfg):
    """float64 numpy Llama (rotate-half RoPE, eps from the config)."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    eps, hd = cfg["rms_norm_eps"], cfg["head_dim"]
    h = w["embed_tokens.weight"][np.asarray(tokens)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = np_rms(h, w[p + "input_layernorm.weight"], eps)
        h = h + np_attention_layer(
            w, p + "self_attn.", x, cfg["num_attention_heads"], cfg["num_key_value_heads"], hd, cfg["rope_theta"], False
        )
        x = np_rms(h, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
        h = h + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return np_rms(h, w["norm.weight"], eps) @ w["embed_tokens.weight"].T


def test_tied_embeddings_match_numpy(tmp_path):
    cfg = json.loads((LLAMA / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(LLAMA / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    model = load_pretrained_graph(tmp_path, max_batch_size=1, max_seq_len=16)
    assert "lm_head.weight" not in model.transformer.raw_state_dict()  # the head reads the embedding's weight
    tokens = golden(LLAMA)["input_ids"][0, :6]
    ref = _np_logits({k.removeprefix("model."): v for k, v in tensors.items()}, tokens, cfg)
    np.testing.assert_allclose(model([tokens])[0], ref, rtol=0, atol=FP32_ATOL)


def test_tied_q8_0_embeddings_match_numpy(float_products):  # float products, as the numpy reference
    import dataclasses  # noqa: PLC0415

    from maxfx.models._llama_graph import LlamaGraphModel, _from_gguf  # noqa: PLC0415

    config, weights = _from_gguf(LLAMA / "tiny_llama-q8_0.gguf", None)
    del weights["lm_head.weight"], weights["lm_head.scales"]
    model = LlamaGraphModel(
        dataclasses.replace(config, tie_word_embeddings=True), weights, max_batch_size=1, max_seq_len=16
    )
    assert not any(n.startswith("lm_head") for n in model.transformer.raw_state_dict())  # the head reads the Q8_0 table
    decoded = {}  # numpy decode of the Q8_0 parts: int8 quants times their block's float16 scale
    for name, (value, _) in weights.items():
        if name.endswith("scales"):
            continue
        scales = weights.get(name.removesuffix("weight") + "scales")
        decoded[name] = (
            value
            if scales is None
            else (value.reshape(len(value), -1, 32) * scales[0][..., None].astype(np.float64)).reshape(value.shape)
        )
    cfg = {
        "rms_norm_eps": config.rms_norm_eps,
        "head_dim": config.head_dim,
        "num_hidden_layers": config.num_hidden_layers,
        "rope_theta": config.rope_theta,
    }
    cfg.update(num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads)
    tokens = golden(LLAMA)["input_ids"][0, :6]
    np.testing.assert_allclose(model([tokens])[0], _np_logits(decoded, tokens, cfg), rtol=0, atol=FP32_ATOL)


def test_bad_inputs_raise_clear_errors(tmp_path):
    model = _graph_model(str(LLAMA))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "falcon"}))
    with pytest.raises(
        ConfigError,
        match=(
            r"unsupported architecture model_type='falcon'; supported: gemma, gpt2, llama, mistral, phi3, qwen2, "
            r"qwen3"
        ),
    ):
        load_pretrained_graph(
            tmp_path
        )  # GPT-2 folders load (tests/models/test_gpt2_graph.py); an unknown one names the supported
    with pytest.raises(ValueError, match="max_batch_size=4"):
        model.generate([[1, 2]] * 5, 2)
    with pytest.raises(ValueError, match=r"token id 256 is out of range for the vocabulary of 256 tokens"):
        model([[1, 256]])
    with pytest.raises(ValueError, match="max_seq_len is 128"):
        model.generate([[1, 2, 3]], 127)
    with pytest.raises(ValueError, match="forward_ragged"):
        model([1, 2, 3])
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate([[1, 2]], 0)
    with pytest.raises(ValueError, match="not .gguf"):
        load_pretrained_graph(LLAMA / "model.safetensors")
    assert model.cache.num_free_pages == model.cache.total_num_pages  # failed calls hold no pages


def test_folder_config_errors_come_from_the_shared_reader(tmp_path):
    from maxfx.models import load_pretrained  # noqa: PLC0415

    with pytest.raises(FileNotFoundError, match="load_pretrained_graph: .* has no config.json"):
        load_pretrained_graph(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    for load in (load_pretrained, load_pretrained_graph):  # one reader, one message
        with pytest.raises(ConfigError, match="config.json: not valid JSON"):
            load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    for load in (load_pretrained, load_pretrained_graph):
        with pytest.raises(ConfigError, match="unsupported architecture model_type='mamba'"):
            load(tmp_path)


def test_docs_page_example_runs(capsys):
    import re  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    page = Path(__file__).resolve().parents[2] / "docs" / "pages" / "models_graph.md"
    (block,) = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    exec(compile(block, str(page), "exec"), {})  # noqa: S102 - our own docs
    assert capsys.readouterr().out.splitlines() == ["(2, 12, 256) True", "[(7, 256), (12, 256)]", "True True"]


def _rope_table(rope) -> np.ndarray:
    return run_graph(lambda: rope.freqs_cis)[0]


def _np_table(inv_freq, length):
    ang = np.arange(length)[:, None] * inv_freq[None, :]
    return np.stack([np.cos(ang), np.sin(ang)], -1).reshape(length, -1)


def test_rope_scaling_and_gguf_freq_factors_reach_the_rope_layer():
    from maxfx.models import LlamaConfig  # noqa: PLC0415
    from maxfx.models._llama_graph import _rope  # noqa: PLC0415

    base = dict(
        vocab_size=32,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    inv = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    # Llama 3: wavelengths < 64/4 kept, > 64/1 divided by 8, blended in between (all three bands occur here).
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    cfg = LlamaConfig.from_hf({**base, "rope_scaling": scaling})
    wavelen = 2 * np.pi / inv
    smooth = (64 / wavelen - 1.0) / (4.0 - 1.0)
    want = np.where(wavelen < 16, inv, np.where(wavelen > 64, inv / 8, (1 - smooth) * inv / 8 + smooth * inv))
    assert (wavelen < 16).any() and (wavelen > 64).any() and ((wavelen >= 16) & (wavelen <= 64)).any()
    np.testing.assert_allclose(_rope_table(_rope(cfg, 8, False)), _np_table(want, 16), rtol=0, atol=2e-5)
    factors = tuple(1.0 + np.arange(8) / 2)  # GGUF's rope_freqs: per-frequency divisors
    cfg = LlamaConfig(**base, rope_freq_factors=factors)
    np.testing.assert_allclose(
        _rope_table(_rope(cfg, 8, False)), _np_table(inv / np.array(factors), 16), rtol=0, atol=2e-5
    )
