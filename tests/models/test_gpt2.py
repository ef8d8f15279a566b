"""GPT-2 from safetensors and .bin vs the reference goldens; layout and config checks."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from maxfx.experimental.tensor import Tensor
from maxfx.models import CheckpointMismatchError, ConfigError, GPT2Config, GPT2LMHeadModel, load_pretrained
from maxfx.models._layers import Conv1D
from tests.models._helpers import FP32_ATOL, GPT2, golden, model


@pytest.fixture(scope="module")
def bin_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt2_bin")
    for f in ("config.json", "pytorch_model.bin"):
        shutil.copy(GPT2 / f, d)
    return load_pretrained(d)


@pytest.fixture(scope="module")
def st_model():
    return model(str(GPT2))


def test_safetensors_logits_match_golden(st_model):
    g = golden(GPT2)
    np.testing.assert_allclose(st_model(Tensor(g["input_ids"])).to_numpy(), g["logits"], rtol=0, atol=FP32_ATOL)


def test_bin_logits_match_golden(bin_model):
    g = golden(GPT2)
    np.testing.assert_allclose(bin_model(Tensor(g["input_ids"])).to_numpy(), g["logits"], rtol=0, atol=FP32_ATOL)


@pytest.mark.parametrize("which", ["safetensors", "bin"])
def test_greedy_generation_matches_golden(which, st_model, bin_model):
    m = st_model if which == "safetensors" else bin_model
    g = golden(GPT2)
    np.testing.assert_array_equal(m.generate(g["input_ids"], max_new_tokens=16), g["greedy_ids"])


def test_conv1d_layout_and_tied_head(st_model):
    attn = st_model.transformer.h[0].attn
    assert isinstance(attn.c_attn, Conv1D) and [int(d) for d in attn.c_attn.weight.shape] == [64, 192]  # [in, out]
    names = {n for n, _ in st_model.parameters}
    assert "transformer.wte.weight" in names and not any(n.startswith("lm_head") for n in names)


def _gelu_tanh(y):
    return 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))


def np_gpt2(w, c, ids, gelu=_gelu_tanh):
    """float64 numpy GPT-2 over HF-named weights (``gelu``: the MLP's activation, default the tanh approximation)."""

    def ln(v, p):
        m = v.mean(-1, keepdims=True)
        return (v - m) / np.sqrt(((v - m) ** 2).mean(-1, keepdims=True) + c.layer_norm_epsilon) * w[p + ".weight"] + w[
            p + ".bias"
        ]

    b, t = ids.shape
    h, e = c.n_head, c.n_embd
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:t]
    for i in range(c.n_layer):
        p = f"transformer.h.{i}."
        qkv = ln(x, p + "ln_1") @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (a.reshape(b, t, h, e // h) for a in np.split(qkv, 3, -1))
        s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(e // h)
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        x = (
            x
            + np.einsum("bhts,bshd->bthd", pr, v).reshape(b, t, e) @ w[p + "attn.c_proj.weight"]
            + w[p + "attn.c_proj.bias"]
        )
        y = ln(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        y = gelu(y)
        x = x + y @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].T


def test_random_gpt2_with_n_inner_matches_numpy():
    c = GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=16, n_inner=40)
    m = GPT2LMHeadModel.random(c, seed=1)
    w = {n: t.to_numpy().astype(np.float64) for n, t in m.parameters}
    ids = np.random.default_rng(0).integers(0, 50, (2, 9))
    np.testing.assert_allclose(m(Tensor(ids)).to_numpy(), np_gpt2(w, c, ids), rtol=0, atol=1e-4)


def test_learned_positions_limit_generation(st_model):
    with pytest.raises(ValueError, match=r"max_new_tokens \(200\) exceeds the model's context of 128 positions"):
        st_model.generate([[1, 2, 3]], max_new_tokens=200)


def test_unsupported_activation_and_mismatch(tmp_path):
    with pytest.raises(ConfigError, match="activation_function 'relu' is not supported"):
        GPT2Config(vocab_size=4, n_embd=4, n_layer=1, n_head=1, activation_function="relu")
    d = tmp_path / "g"
    d.mkdir()
    shutil.copy(GPT2 / "model.safetensors", d)
    cfg = json.loads((GPT2 / "config.json").read_text())
    cfg["n_positions"] = 64
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointMismatchError, match=r"'transformer\.wpe\.weight' has shape \[128, 64\] but .*needs \[64, 64\]"
    ):
        load_pretrained(d)
