"""Llama from every fixture format vs the reference goldens; bad checkpoints give clear errors."""

from __future__ import annotations

import json
import pickle
import shutil
import zipfile

import numpy as np
import pytest

from lowering.dtypes import DType
from maxfx.experimental.nn import Module, QuantizedLinear, Sequential
from maxfx.experimental.tensor import Tensor
from maxfx.models import CheckpointMismatchError, ConfigError, LlamaConfig, LlamaForCausalLM, load_pretrained
from maxfx.models._layers import Q8Linear
from tests.models._helpers import FP32_ATOL, LLAMA, QUANT_KERNEL_ATOL, golden, model

FORMATS = {
    "safetensors": (str(LLAMA), "golden.npz"),
    "bin": (str(LLAMA / "pytorch_model.bin"), "golden.npz"),
    "gguf_q8_0": (str(LLAMA / "tiny_llama-q8_0.gguf"), "golden_q8_0.npz"),
    "gguf_q4_0": (str(LLAMA / "tiny_llama-q4_0.gguf"), "golden_q4_0.npz"),
}


def _load(fmt: str):
    path, _ = FORMATS[fmt]
    if fmt == "bin":  # a folder holding only config.json + pytorch_model.bin
        return _bin_model()
    return model(path)


_BIN_CACHE = {}


def _bin_model():
    if "m" not in _BIN_CACHE:
        import tempfile  # noqa: PLC0415

        d = tempfile.mkdtemp(prefix="tiny_llama_bin_")
        for f in ("config.json", "pytorch_model.bin"):
            shutil.copy(LLAMA / f, d)
        _BIN_CACHE["m"] = load_pretrained(d)
    return _BIN_CACHE["m"]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_logits_match_golden(fmt):
    m = _load(fmt)
    g = golden(LLAMA, FORMATS[fmt][1])
    logits = m(Tensor(g["input_ids"]))
    assert isinstance(logits, Tensor) and [int(d) for d in logits.shape] == [2, 12, 256]
    # GGUF goldens are the reference run on the dequantized weights (float32 math);
    # the CPU kernels round activations to 16 bits (QUANT_KERNEL_ATOL says by how much).
    atol = QUANT_KERNEL_ATOL if fmt.startswith("gguf") else FP32_ATOL
    np.testing.assert_allclose(logits.to_numpy(), g["logits"], rtol=0, atol=atol)


@pytest.mark.parametrize("fmt", ["gguf_q8_0", "gguf_q4_0"])
def test_gguf_logits_with_float_products_match_golden_to_fp32_rounding(fmt, float_products):
    g = golden(LLAMA, FORMATS[fmt][1])
    logits = load_pretrained(FORMATS[fmt][0])(Tensor(g["input_ids"]))  # a fresh load: traced with the kernels off
    np.testing.assert_allclose(logits.to_numpy(), g["logits"], rtol=0, atol=FP32_ATOL)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_greedy_generation_matches_golden(fmt):
    m = _load(fmt)
    g = golden(LLAMA, FORMATS[fmt][1])
    out = m.generate(g["input_ids"], max_new_tokens=g["greedy_ids"].shape[1])
    np.testing.assert_array_equal(out, g["greedy_ids"])


def test_gguf_weights_stay_packed():
    q4 = _load("gguf_q4_0")
    attn = q4.model.layers[0].self_attn
    assert isinstance(attn.q_proj, QuantizedLinear) and attn.q_proj.weight.dtype is DType.uint8
    assert [int(d) for d in attn.q_proj.weight.shape] == [64, 64 // 32 * 18]
    q8 = _load("gguf_q8_0")
    layer = q8.model.layers[0].mlp.down_proj
    assert isinstance(layer, Q8Linear) and layer.values.dtype is DType.int8 and layer.scales.dtype is DType.float16
    # no float copy of a matrix anywhere in the quantized model: only norms are float
    floats = [n for n, t in q4.parameters if t.dtype.is_float()]
    assert all(n.endswith("norm.weight") for n in floats), floats


def test_gguf_config_from_metadata():
    m = _load("gguf_q8_0")
    c = m.config
    assert (
        c.vocab_size,
        c.hidden_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
    ) == (256, 64, 2, 4, 2, 16)
    assert not c.tie_word_embeddings and m.lm_head is not None


def test_parameter_names_are_hf_names():
    m = _load("safetensors")
    from maxfx.graph.weights import SafetensorWeights  # noqa: PLC0415

    names = {n for n, _ in SafetensorWeights([LLAMA / "model.safetensors"]).items()}
    assert {n for n, _ in m.parameters} == names
    assert isinstance(m, Module) and isinstance(m.model.layers, Sequential)


def test_compile_with_symbolic_sequence_length():
    m = _load("safetensors")
    g = golden(LLAMA)
    compiled = m.compile(*m.input_types())
    for b, t in ((2, 12), (1, 5)):
        out = compiled(Tensor(g["input_ids"][:b, :t])).to_numpy()
        np.testing.assert_allclose(out, g["logits"][:b, :t], rtol=0, atol=FP32_ATOL)


def test_model_is_a_pytree_under_jit():
    import jax  # noqa: PLC0415

    from lowering.x64 import x64  # noqa: PLC0415

    m = _load("safetensors")
    g = golden(LLAMA)
    with x64():
        out = jax.jit(lambda mod, ids: mod(ids))(m, Tensor(g["input_ids"]))
    np.testing.assert_allclose(out.to_numpy(), g["logits"], rtol=0, atol=FP32_ATOL)


# ─── Llama 3 rope scaling and tied embeddings (numpy reference) ──────────


def np_inv_freq_llama3(d, theta, factor, lo, hi, old):
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    out = []
    for f in inv:
        wl = 2 * np.pi / f
        if wl < old / hi:
            out.append(f)
        elif wl > old / lo:
            out.append(f / factor)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append((1 - s) * f / factor + s * f)
    return np.array(out)


def test_llama3_rope_scaling_from_config_json_and_rope_parameters():
    base = json.loads((LLAMA / "config.json").read_text())
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    a = LlamaConfig.from_hf({**base, "rope_scaling": scaling, "head_dim": 128, "rope_theta": 500000.0})
    expected = np_inv_freq_llama3(128, 500000.0, 8.0, 1.0, 4.0, 64)
    np.testing.assert_allclose(a.inv_freq(), expected, rtol=1e-12)
    assert not np.allclose(expected, 1.0 / 500000.0 ** (np.arange(0, 128, 2) / 128))  # scaling did something
    # transformers 5 spelling: one rope_parameters object
    b = {k: v for k, v in base.items() if k not in ("rope_theta", "rope_scaling")}
    b = LlamaConfig.from_hf({**b, "head_dim": 128, "rope_parameters": {**scaling, "rope_theta": 500000.0}})
    np.testing.assert_allclose(b.inv_freq(), expected, rtol=1e-12)


def np_llama(w, c, ids):
    """Float64 numpy Llama (HF layout) for configs without a golden file."""
    x = w["model.embed_tokens.weight"][ids].astype(np.float64)
    b, t = ids.shape
    h, hk, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    ang = np.arange(t)[:, None] * c.inv_freq()[None]
    cos, sin = (np.concatenate([f(ang)] * 2, -1)[None, :, None] for f in (np.cos, np.sin))

    def rope(v):
        rot = np.concatenate([-v[..., d // 2 :], v[..., : d // 2]], -1)
        return v * cos + rot * sin

    def norm(v, wt):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + c.rms_norm_eps) * wt

    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        y = norm(x, w[p + "input_layernorm.weight"])
        q = rope((y @ w[p + "self_attn.q_proj.weight"].T).reshape(b, t, h, d))
        k = rope((y @ w[p + "self_attn.k_proj.weight"].T).reshape(b, t, hk, d))
        v = (y @ w[p + "self_attn.v_proj.weight"].T).reshape(b, t, hk, d)
        k, v = np.repeat(k, h // hk, 2), np.repeat(v, h // hk, 2)
        s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d)
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        p_ = np.exp(s - s.max(-1, keepdims=True))
        p_ /= p_.sum(-1, keepdims=True)
        x = x + np.einsum("bhts,bshd->bthd", p_, v).reshape(b, t, h * d) @ w[p + "self_attn.o_proj.weight"].T
        y = norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = y @ w[p + "mlp.gate_proj.weight"].T, y @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = norm(x, w["model.norm.weight"])
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def test_tied_llama3_random_model_matches_numpy():
    scaling = (
        ("factor", 4.0),
        ("high_freq_factor", 4.0),
        ("low_freq_factor", 1.0),
        ("original_max_position_embeddings", 16),
        ("rope_type", "llama3"),
    )
    c = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        rms_norm_eps=1e-5,
        rope_theta=1000.0,
        rope_scaling=scaling,
        tie_word_embeddings=True,
    )
    m = LlamaForCausalLM.random(c, seed=3)
    assert m.lm_head is None and "lm_head.weight" not in dict(m.parameters)
    w = {n: t.to_numpy().astype(np.float64) for n, t in m.parameters}
    ids = np.random.default_rng(0).integers(0, 64, (2, 20))
    np.testing.assert_allclose(m(Tensor(ids)).to_numpy(), np_llama(w, c, ids), rtol=0, atol=1e-4)


# ─── bad input ────────────────────────────────────────────────────────────


def _copy(tmp_path, files=("config.json", "model.safetensors")):
    d = tmp_path / "ckpt"
    d.mkdir()
    for f in files:
        shutil.copy(LLAMA / f, d / f)
    return d


def _copy_with_config(tmp_path, **changes):
    """The tiny checkpoint with ``changes`` written over its config.json entries."""
    d = _copy(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_truncated_safetensors_names_file(tmp_path):
    d = _copy(tmp_path)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(ValueError, match=r"model\.safetensors.*(truncated|tensor)"):
        load_pretrained(d)


def test_corrupt_safetensors_header(tmp_path):
    d = _copy(tmp_path)
    data = bytearray((d / "model.safetensors").read_bytes())
    data[8:40] = b"\xff" * 32
    (d / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model\.safetensors.*corrupt"):
        load_pretrained(d)


def test_truncated_bin_names_file(tmp_path):
    d = _copy(tmp_path, ("config.json", "pytorch_model.bin"))
    data = (d / "pytorch_model.bin").read_bytes()
    (d / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"pytorch_model\.bin"):
        load_pretrained(d)


class _Evil:
    def __reduce__(self):
        import os  # noqa: PLC0415

        return (os.system, ("echo pwned",))


def test_pickle_outside_allow_list_is_refused(tmp_path):
    d = _copy(tmp_path, ("config.json",))
    with zipfile.ZipFile(d / "pytorch_model.bin", "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"model.embed_tokens.weight": _Evil()}, protocol=2))
        zf.writestr("archive/version", "3\n")
    with pytest.raises(
        pickle.UnpicklingError, match=r"pytorch_model\.bin.*refusing to load global '(posix|os|nt)\.system'"
    ):
        load_pretrained(d)


def test_truncated_gguf_names_file(tmp_path):
    path = tmp_path / "t.gguf"
    data = (LLAMA / "tiny_llama-q4_0.gguf").read_bytes()
    path.write_bytes(data[: len(data) - 500])
    with pytest.raises(ValueError, match=r"t\.gguf.*truncated"):
        load_pretrained(path)


def test_config_weights_shape_mismatch_names_tensor(tmp_path):
    d = _copy_with_config(tmp_path, intermediate_size=96)
    with pytest.raises(
        CheckpointMismatchError,
        match=(
            r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[128, 64\] but "
            r".*config\.json needs \[96, 64\]"
        ),
    ):
        load_pretrained(d)


def test_missing_tensor_names_it(tmp_path):
    d = _copy(tmp_path, ("config.json",))
    from safetensors.numpy import load_file, save_file  # noqa: PLC0415

    tensors = load_file(LLAMA / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(CheckpointMismatchError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' .*missing"):
        load_pretrained(d)


def test_integer_tensor_where_config_needs_float_fails_at_load(tmp_path):
    """Issue 35: an F32 tensor relabelled I32 (same byte size) is refused at load, not at the first forward's mul."""
    d = _copy(tmp_path)
    path = d / "model.safetensors"
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + n]
    at = header.index(b'"F32"', header.index(b'"model.norm.weight"'))
    path.write_bytes(raw[:8] + header[:at] + b'"I32"' + header[at + 5 :] + raw[8 + n :])
    with pytest.raises(
        CheckpointMismatchError,
        match=r"model\.safetensors: tensor 'model\.norm\.weight' is stored as int32, but .*config\.json needs float32",
    ):
        load_pretrained(d)


def test_extra_layers_in_checkpoint_are_reported(tmp_path):
    d = _copy_with_config(tmp_path, num_hidden_layers=1)
    with pytest.raises(CheckpointMismatchError, match=r"not part of the model.*model\.layers\.1\."):
        load_pretrained(d)


def test_unknown_architecture(tmp_path):
    d = _copy_with_config(tmp_path, model_type="mamba")
    with pytest.raises(
        ConfigError,
        match=(
            r"config\.json: unsupported architecture model_type='mamba'; supported: gemma, gpt2, llama, mistral, "
            r"phi3, qwen2, qwen3"
        ),
    ):
        load_pretrained(d)


def test_deeply_nested_config_json_is_a_config_error(tmp_path):
    """Issue 35: 100000 nested lists made json raise a bare RecursionError; now a ConfigError naming the file."""
    d = _copy(tmp_path)
    (d / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError, match=r"ckpt/config\.json: JSON nested too deeply .*not a valid config file"):
        load_pretrained(d)


def test_unknown_gguf_architecture(tmp_path):
    import gguf  # noqa: PLC0415

    path = tmp_path / "falcon.gguf"
    w = gguf.GGUFWriter(str(path), "falcon")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ConfigError, match=r"falcon\.gguf: unsupported architecture general\.architecture='falcon'"):
        load_pretrained(path)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained(tmp_path)
    _copy(tmp_path, ("config.json",))
    with pytest.raises(FileNotFoundError, match="has no weights"):
        load_pretrained(tmp_path / "ckpt")
    with pytest.raises(ConfigError, match="missing config key 'hidden_size'"):
        LlamaConfig.from_hf({"vocab_size": 2, "num_attention_heads": 1})


def test_bfloat16_load_and_progress_bar(monkeypatch):
    import maxfx.models._source as source  # noqa: PLC0415

    totals = []
    real = source.progress_bar

    def spy(total, desc):
        totals.append((total, desc))
        return real(total, desc)

    monkeypatch.setattr(source, "progress_bar", spy)
    m = load_pretrained(LLAMA, dtype=DType.bfloat16)
    assert totals == [
        (
            (LLAMA / "model.safetensors").stat().st_size - _header_bytes(LLAMA / "model.safetensors"),
            "loading model.safetensors",
        )
    ]
    assert {t.dtype for _, t in m.parameters} == {DType.bfloat16}
    g = golden(LLAMA)
    np.testing.assert_allclose(m(Tensor(g["input_ids"])).to_numpy(), g["logits"], rtol=0, atol=0.15)


def _header_bytes(path):
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def test_load_pretrained_puts_the_model_on_the_default_device(monkeypatch):
    """MAX's default device: the model moves to it unless it is the host (weights are read
    there and stay uncopied); an explicit ``device`` always wins."""
    from maxfx.driver import CPU  # noqa: PLC0415
    from maxfx.models import _loading  # noqa: PLC0415

    moved = []
    monkeypatch.setattr(LlamaForCausalLM, "to", lambda self, device: moved.append(device) or self)

    class FakeGPU:
        is_host = False

    gpu = FakeGPU()
    monkeypatch.setattr(_loading, "defaults", lambda: (DType.bfloat16, gpu))
    load_pretrained(LLAMA)
    assert moved == [gpu]
    monkeypatch.setattr(_loading, "defaults", lambda: (DType.float32, CPU()))
    load_pretrained(LLAMA)
    assert moved == [gpu]  # a host default: no move
    load_pretrained(LLAMA, device=CPU())
    assert moved == [gpu, CPU()]
