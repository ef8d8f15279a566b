"""Issue 19 items 7, 8, 9 and 11: out-of-range indices, huge eager requests,
malformed user inputs and concurrent in-place writes give typed errors (or
correct results), never a silent wrong answer or a process abort."""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.experimental import functional as F
from maxfx.experimental.tensor import Tensor

# ─── item 7: out-of-range indices ────────────────────────────────────────


def test_eager_gather_out_of_range_raises_naming_index_axis_and_size():
    with pytest.raises(IndexError, match=r"gather: index 7 is out of range for axis 0 of size 3"):
        F.gather(Tensor([1.0, 2.0, 3.0]), Tensor([0, 7], dtype=DType.int64), axis=0)
    with pytest.raises(IndexError, match=r"gather: index -4 is out of range for axis 1 of size 3"):
        F.gather(Tensor(np.zeros((2, 3), np.float32)), Tensor([[0], [-4]], dtype=DType.int32), axis=1)


def test_eager_gather_in_range_and_negative_indices_match_numpy():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[3, -1], [0, -4]], np.int64)
    out = F.gather(Tensor(x), Tensor(idx, dtype=DType.int64), axis=1).to_numpy()
    np.testing.assert_array_equal(out, np.take(x, idx, axis=1))


def test_eager_gather_nd_out_of_range_names_the_component_axis():
    x = Tensor(np.zeros((3, 4), np.float32))
    with pytest.raises(IndexError, match=r"gather_nd: index 4 is out of range for axis 1 of size 4"):
        F.gather_nd(x, Tensor([[1, 2], [0, 4]], dtype=DType.int32))
    with pytest.raises(IndexError, match=r"gather_nd: index 3 is out of range for axis 0 of size 3"):
        F.gather_nd(x, Tensor([[3]], dtype=DType.int32))


def test_gather_under_jit_clamps_as_documented():
    import jax

    x = np.array([1.0, 2.0, 3.0], np.float32)
    out = jax.jit(lambda t, i: F.gather(t, i, axis=0))(Tensor(x), Tensor([0, 7], dtype=DType.int32))
    np.testing.assert_array_equal(out.to_numpy(), np.take(x, [0, 7], mode="clip"))


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2"])
def test_model_call_rejects_token_ids_outside_the_vocabulary(name):
    from maxfx.models import load_pretrained

    model = load_pretrained(f"tests/data/models/{name}")
    vocab = model.config.vocab_size
    with pytest.raises(ValueError, match=rf"token id {vocab} is out of range for the vocabulary of {vocab} tokens"):
        model([[1, vocab]])
    with pytest.raises(IndexError, match=r"token id -1 is out of range"):
        model([[-1, 2]])
    assert model([[1, vocab - 1]]).shape[-1] == vocab


# ─── item 9: inputs that bare float()/int()/bool() took or failed on without a name ──

_LLAMA = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("rms_norm_eps", "tiny", "a finite number"),
        ("rope_theta", [10000.0], "a finite number"),
        ("max_position_embeddings", "2048", "an integer"),
        ("tie_word_embeddings", "false", "true or false"),  # bool("false") is True
        ("bos_token_id", 1.5, "an integer"),
    ],
)
def test_llama_config_value_of_wrong_type_names_key_value_and_type(key, value, expected):
    from maxfx.models import ConfigError, LlamaConfig

    with pytest.raises(ConfigError, match=rf"config.json: {key} must be {expected}, got {value!r}".replace("[", r"\[").replace("]", r"\]")):
        LlamaConfig.from_hf({**_LLAMA, key: value})


def test_llama3_rope_scaling_numbers_are_checked_when_read():
    from maxfx.models import ConfigError, LlamaConfig

    scaling = {"rope_type": "llama3", "factor": "8", "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    with pytest.raises(ConfigError, match=r"rope_scaling.factor must be a finite number, got '8'"):
        LlamaConfig.from_hf({**_LLAMA, "rope_scaling": scaling})


def test_gpt2_config_value_of_wrong_type_names_key():
    from maxfx.models import ConfigError, GPT2Config

    with pytest.raises(ConfigError, match=r"config.json: n_positions must be an integer, got 'x' \(str\)"):
        GPT2Config.from_hf(dict(vocab_size=32, n_embd=16, n_layer=1, n_head=2, n_positions="x"))
    with pytest.raises(ConfigError, match=r"layer_norm_epsilon must be a finite number, got nan"):
        GPT2Config.from_hf(dict(vocab_size=32, n_embd=16, n_layer=1, n_head=2, layer_norm_epsilon=float("nan")))


def test_config_numbers_as_json_writes_them_still_load():
    from maxfx.models import GPT2Config, LlamaConfig

    cfg = LlamaConfig.from_hf({**_LLAMA, "max_position_embeddings": 64.0, "eos_token_id": [3, 4], "rms_norm_eps": 1e-5, "tie_word_embeddings": True})
    assert (cfg.max_position_embeddings, cfg.eos_token_id, cfg.tie_word_embeddings) == (64, 3, True)
    assert GPT2Config.from_hf(dict(vocab_size=32, n_embd=16, n_layer=1, n_head=2, max_position_embeddings=8)).n_positions == 8
