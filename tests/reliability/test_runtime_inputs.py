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


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2"])
def test_graph_model_rejects_token_ids_outside_the_vocabulary(name):
    from maxfx.models import load_pretrained_graph
    from maxfx.models._token_ids import TokenIdError

    model = load_pretrained_graph(f"tests/data/models/{name}", max_batch_size=2)
    vocab, cls = model.vocab_size, type(model).__name__
    with pytest.raises(
        TokenIdError, match=rf"{cls}: token id {vocab} is out of range for the vocabulary of {vocab} tokens"
    ):
        model(np.array([[1, vocab]]))
    with pytest.raises(IndexError, match=rf"{cls}.forward_ragged, prompt 1: token id -1 is out of range"):
        model.forward_ragged([[1], [2, -1]])
    with pytest.raises(TokenIdError, match=rf"{cls}.generate: token id {vocab + 5} is out of range"):
        model.generate([[vocab + 5]], max_new_tokens=1)
    assert model([[1, vocab - 1]]).shape == (1, 2, vocab)


# ─── item 8: results larger than the device: a Python error, not an abort ──

_HUGE_EAGER = """
import json
from maxfx import random
from maxfx.experimental import functional as F
out = []
for name, make in [
    ("gaussian", lambda: random.gaussian([2**40]).to_numpy()),
    ("matmul", lambda: (random.gaussian([2**20, 1]) @ random.gaussian([1, 2**20])).to_numpy()),
]:
    try:
        make()
        out.append([name, "no error"])
    except MemoryError as e:
        out.append([name, str(e)])
with F.lazy():  # the fused path checks each new program too
    try:
        (random.gaussian([2**20, 1]) @ random.gaussian([1, 2**20])).to_numpy()
    except MemoryError as e:
        out.append(["lazy matmul", str(e)])
print(json.dumps(out))
"""


def test_eager_results_larger_than_memory_raise_resource_exhausted_in_process():
    import json
    import subprocess
    import sys

    # A child process: before the fix XLA aborted (SIGABRT), which would take pytest down with it.
    proc = subprocess.run([sys.executable, "-c", _HUGE_EAGER], capture_output=True, text=True, timeout=120, cwd=".")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert set(got) == {"gaussian", "matmul", "lazy matmul"}
    assert got["gaussian"].startswith(
        "RESOURCE_EXHAUSTED: random_normal: the result float32[1099511627776] needs 4398046511104 bytes"
    )
    for name in ("matmul", "lazy matmul"):
        assert got[name].startswith(
            "RESOURCE_EXHAUSTED: matmul: the result float32[1048576, 1048576] needs 4398046511104 bytes"
        ), got[name]


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

    with pytest.raises(
        ConfigError,
        match=rf"config.json: {key} must be {expected}, got {value!r}".replace("[", r"\[").replace("]", r"\]"),
    ):
        LlamaConfig.from_hf({**_LLAMA, key: value})


@pytest.mark.parametrize(
    ("family", "key", "value", "expected"),
    [
        ("GemmaConfig", "attention_bias", "false", "true or false"),  # read as True by bool()
        ("Qwen2Config", "use_sliding_window", "false", "true or false"),  # refused as "use_sliding_window=true"
        ("LlamaConfig", "mlp_bias", "false", "true or false"),
        ("LlamaConfig", "head_dim", "8", "an integer"),  # a raw TypeError from `head_dim % 2`
        ("Phi3Config", "head_dim", "8", "an integer"),  # "8" * 2 == "88"
    ],
)
def test_family_config_flags_and_sizes_are_checked_by_type(family, key, value, expected):
    from maxfx.models import ConfigError, _families
    from maxfx.models._config import LlamaConfig

    cls = getattr(_families, family, LlamaConfig)
    with pytest.raises(ConfigError, match=rf"config.json: {key} must be {expected}, got {value!r} \(str\)"):
        cls.from_hf({**_LLAMA, "head_dim": 8, key: value})
    json_value = {"true or false": False, "an integer": 8}[expected]
    assert cls.from_hf({**_LLAMA, "head_dim": 8, key: json_value}).head_dim == 8


def test_gemma_attention_bias_false_gives_no_bias():
    from maxfx.models._families import GemmaConfig

    cfg = GemmaConfig.from_hf({**_LLAMA, "head_dim": 8, "attention_bias": False})
    assert (cfg.qkv_bias, cfg.o_bias) == (False, False)


def test_hidden_act_that_is_not_a_string_is_a_config_error():
    from maxfx.models import ConfigError, LlamaConfig

    with pytest.raises(ConfigError, match=r"hidden_act \['silu'\] is not supported"):
        LlamaConfig.from_hf({**_LLAMA, "hidden_act": ["silu"]})


def test_llama3_rope_scaling_numbers_are_checked_when_read():
    from maxfx.models import ConfigError, LlamaConfig

    scaling = {
        "rope_type": "llama3",
        "factor": "8",
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
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

    cfg = LlamaConfig.from_hf(
        {
            **_LLAMA,
            "max_position_embeddings": 64.0,
            "eos_token_id": [3, 4],
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
        }
    )
    assert (cfg.max_position_embeddings, cfg.eos_token_id, cfg.tie_word_embeddings) == (64, 3, True)
    assert (
        GPT2Config.from_hf(dict(vocab_size=32, n_embd=16, n_layer=1, n_head=2, max_position_embeddings=8)).n_positions
        == 8
    )


def test_integer_tensor_assigned_over_a_float_weight_is_refused_at_assignment():
    from maxfx.experimental.nn import Embedding, Linear

    layer = Linear(4, 4)
    before = layer.weight
    with pytest.raises(
        TypeError,
        match=(
            r"Linear.weight is a Tensor of dtype float32; the assigned Tensor has dtype int32 \(integer where "
            r"floating-point is expected\).*value.cast\(DType.float32\)"
        ),
    ):
        layer.weight = Tensor(np.zeros((4, 4), np.int32))  # used to fail only inside forward's matmul
    assert layer.weight is before
    table = Embedding(8, dim=2)
    with pytest.raises(
        TypeError, match=r"Embedding.weight is a Tensor of dtype float32; the assigned Tensor has dtype uint8"
    ):
        table.weight = Tensor(np.zeros((8, 2), np.uint8))


def test_same_kind_and_first_assignments_of_tensors_are_accepted():
    from maxfx.experimental.nn import Linear, Module

    layer = Linear(4, 4)
    layer.weight = Tensor(np.eye(4, dtype=np.float32)).cast(DType.bfloat16)  # float -> float: a precision choice
    x = np.arange(4, dtype=np.float32)[None]
    np.testing.assert_array_equal(
        layer(Tensor(x).cast(DType.bfloat16)).cast(DType.float32).to_numpy(),
        x + layer.bias.cast(DType.float32).to_numpy(),
    )

    class Quantized(Module):
        def __init__(self):
            self.weight = Tensor(np.zeros((2, 2), np.int8))  # first assignment: any dtype

    q = Quantized()
    q.weight = Tensor(np.ones((2, 2), np.uint8))  # integer -> integer (int8 -> uint8 packing)
    q.weight = Tensor([[True, False]])  # bool is neither kind: not checked
    layer.bias = 0  # a Tensor field replaced by a non-Tensor
    assert q.weight.dtype is DType.bool and layer.bias == 0


def test_graph_output_of_a_string_is_a_type_error_naming_what_is_expected():
    from maxfx.graph import Graph, TensorType

    with Graph("g", input_types=[TensorType(DType.float32, [2])]) as g:
        with pytest.raises(
            TypeError,
            match=(
                r"Graph 'g': output 0 must be a graph value \(TensorValue, BufferValue\) or numeric constant data, "
                r"got str 'not a tensor'"
            ),
        ):
            g.output("not a tensor")


def test_weights_registry_entry_that_is_a_path_names_the_weight():
    from maxfx.engine import InferenceSession
    from maxfx.graph import DeviceRef, Graph, TensorType, Weight

    w = Weight("proj.weight", DType.float32, [2], DeviceRef.CPU())
    with Graph("g", input_types=[TensorType(DType.float32, [2])]) as g:
        g.output(g.inputs[0].tensor * w)
    with pytest.raises(
        TypeError,
        match=(
            r"weights_registry\['proj.weight'\] is a str \('w.npy'\), not the weight's values; expected an array of "
            r"float32\[2\]"
        ),
    ):
        InferenceSession().load(g, weights_registry={"proj.weight": "w.npy"})
    with pytest.raises(TypeError, match=r"weights_registry\['proj.weight'\]: as_array: cannot turn object"):
        InferenceSession().load(g, weights_registry={"proj.weight": object()})


@pytest.mark.parametrize(("shape", "error", "message"), [
    ([2.5], TypeError, r"Tensor.zeros: dim 0 of shape \[2.5\] must be an int, got float 2.5"),
    ([2, "3"], TypeError, r"Tensor.zeros: dim 1 of shape \[2, '3'\] must be an int, got str"),
    ([True], TypeError, r"dim 0 of shape \[True\] must be an int, got bool"),
    ([2, -1], ValueError, r"Tensor.zeros: dim 1 of shape \[2, -1\] is negative"),
])  # fmt: skip
def test_tensor_zeros_rejects_non_integer_and_negative_dims(shape, error, message):
    with pytest.raises(error, match=message):
        Tensor.zeros(shape)


@pytest.mark.parametrize(
    ("draw", "op"), [("gaussian", "random.gaussian"), ("normal", "random.gaussian"), ("uniform", "random.uniform")]
)
def test_random_draws_reject_non_integer_and_negative_dims(draw, op):
    from maxfx import random

    with pytest.raises(TypeError, match=rf"{op}: dim 0 of shape \[2.5\] must be an int, got float 2.5"):
        getattr(random, draw)([2.5])  # int(2.5) used to draw 2 samples
    with pytest.raises(ValueError, match=rf"{op}: dim 1 of shape \[3, -1\] is negative"):
        getattr(random, draw)([3, -1])
    assert getattr(random, draw)(np.int64(3)).to_numpy().shape == (3,)


def test_random_graph_ops_and_randn_reject_float_dims():
    from maxfx.graph import DeviceRef, Graph, ops

    with pytest.raises(TypeError, match=r"random_normal: shape entries must be ints, got float 2.5"):
        Tensor.randn([2, 2.5])
    with Graph("g"):
        key = ops.constant(np.array([0, 0], np.uint32), DType.uint32, DeviceRef.CPU())
        with pytest.raises(TypeError, match=r"random_uniform: shape entries must be ints, got float 2.5"):
            ops.random_uniform(key, [2.5], DType.float32, DeviceRef.CPU())


def test_tensor_type_rejects_negative_static_dims():
    from maxfx.graph import TensorType

    with pytest.raises((TypeError, ValueError), match=r"non-negative.*-2"):
        TensorType(DType.float32, [-2, 3])


# ─── item 11: concurrent in-place writes ─────────────────────────────────


def _write_rows_from_threads(t, rows: int, threads: int = 8) -> None:
    import threading

    barrier = threading.Barrier(threads)

    def writer(k: int) -> None:
        barrier.wait()  # all threads start together, so their writes interleave
        for i in range(k, rows, threads):
            t[i, :] = np.full(t.shape[1], i + 1, np.float32)

    workers = [threading.Thread(target=writer, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_setitem_from_8_threads_keeps_every_row():
    rows = 400
    t = Tensor(np.zeros((rows, 4), np.float32))
    _write_rows_from_threads(t, rows)
    expected = np.repeat(np.arange(1, rows + 1, dtype=np.float32)[:, None], 4, axis=1)
    missing = np.flatnonzero((t.to_numpy() != expected).any(axis=1))
    assert missing.size == 0, f"{missing.size} of {rows} rows lost: {missing[:10]}"


def test_buffer_store_slice_from_8_threads_keeps_every_row():
    import threading

    rows, threads = 200, 8
    t = Tensor(np.zeros((rows, 2), np.float32))
    barrier = threading.Barrier(threads)

    def writer(k: int) -> None:
        barrier.wait()
        for i in range(k, rows, threads):
            F.buffer_store_slice(t, Tensor(np.full((1, 2), i + 1, np.float32)), (slice(i, i + 1),))

    workers = [threading.Thread(target=writer, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    np.testing.assert_array_equal(t.to_numpy()[:, 0], np.arange(1, rows + 1, dtype=np.float32))
