"""KV-cache generation: batching ragged prompts, sampling, streaming, compile counts."""

from __future__ import annotations

import time

import numpy as np
import pytest

from maxfx.experimental.tensor import Tensor
from maxfx.models import GenerationStats, compile_counts
from tests.models._helpers import LLAMA, golden, model


@pytest.fixture(scope="module")
def llama():
    return model(str(LLAMA))


_PAD = 32  # causal: padding after the sequence leaves its logits alone; one shape, one compile


def _forward(m, ids):
    import jax  # noqa: PLC0415

    from lowering.x64 import x64  # noqa: PLC0415

    with x64():
        return jax.jit(lambda mod, x: mod(x))(m, Tensor(ids)).to_numpy()


def _teacher_forced_logits(m, prompt, new):
    """Full-sequence logits (no cache) of prompt + generated tokens, at the positions that chose them."""
    seq = np.concatenate([prompt, new])
    padded = np.zeros((2, _PAD), np.int64)
    padded[0, : len(seq)] = seq
    logits = _forward(m, padded)[0]
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(new)]


def test_greedy_equals_argmax_of_full_forward(llama):
    ids = golden(LLAMA)["input_ids"]
    prompt = ids[1, :7]
    new = llama.generate(ids[:, :7], max_new_tokens=6)[1]
    np.testing.assert_array_equal(new, _teacher_forced_logits(llama, prompt, new).argmax(-1))


def test_ragged_batch_matches_single_prompts(llama):
    ids = golden(LLAMA)["input_ids"]
    prompts = [ids[0, :5], ids[1, :12], ids[0, 3:11]]
    batched = llama.generate(prompts, max_new_tokens=8)
    assert batched.shape == (3, 8) and batched.dtype == np.int64
    for i, p in enumerate(prompts):
        np.testing.assert_array_equal(batched[i], llama.generate([p], max_new_tokens=8)[0])


def test_generation_compiles_once_per_bucket(llama):
    """generate runs on the engine: its step programs are bucketed, and values (temperature, top_p, seeds) are
    arrays.
    """
    ids = golden(LLAMA)["input_ids"]
    llama.generate(
        ids[:, :9], max_new_tokens=20
    )  # warm: one prefill step of both prompts (2 x 16 tokens), decode of 2 rows
    before = compile_counts()["compiles"]
    for t in (9, 10, 12, 16):  # same buckets: no new program, however many steps
        llama.generate(ids[:, :t], max_new_tokens=20)
    assert compile_counts()["compiles"] == before
    llama.generate(ids[:, :9], max_new_tokens=20, temperature=0.7, seed=0)  # sampling: the same two shapes, sampling
    after = compile_counts()["compiles"]
    assert after == before + 2
    llama.generate(
        ids[:, :9], max_new_tokens=20, temperature=1.3, top_p=0.9, seed=5
    )  # top_p adds the filtering variant
    llama.generate(ids[:, :9], max_new_tokens=20, temperature=0.2, top_p=0.5, seed=6)  # other values: no new program
    assert compile_counts()["compiles"] == after + 2


def test_sampling_is_reproducible_under_a_seed(llama):
    ids = golden(LLAMA)["input_ids"]
    a = llama.generate(ids, max_new_tokens=12, temperature=1.0, seed=42)
    b = llama.generate(ids, max_new_tokens=12, temperature=1.0, seed=42)
    c = llama.generate(ids, max_new_tokens=12, temperature=1.0, seed=43)
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()


def test_top_k_one_and_tiny_top_p_are_greedy(llama):
    ids = golden(LLAMA)["input_ids"]
    greedy = golden(LLAMA)["greedy_ids"]
    np.testing.assert_array_equal(llama.generate(ids, 16, temperature=2.0, top_k=1, seed=1), greedy)
    np.testing.assert_array_equal(llama.generate(ids, 16, temperature=2.0, top_p=1e-6, seed=1), greedy)


def test_sampled_tokens_respect_top_k_and_top_p(llama):
    ids = golden(LLAMA)["input_ids"]
    prompt = ids[0]
    new = llama.generate(ids, 10, temperature=1.5, top_k=3, seed=7)[0]
    logits = _teacher_forced_logits(llama, prompt, new)
    ranks = (logits > logits[np.arange(len(new)), new][:, None]).sum(-1)
    assert ranks.max() < 3, ranks
    new = llama.generate(ids, 10, temperature=1.0, top_p=0.5, seed=7)[0]
    logits = _teacher_forced_logits(llama, prompt, new).astype(np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    for p, tok in zip(probs, new):  # the chosen token is inside the smallest set reaching mass 0.5
        above = p[p > p[tok]].sum()
        assert above < 0.5 + 1e-5


def test_high_temperature_samples_spread(llama):
    out = llama.generate(golden(LLAMA)["input_ids"], 16, temperature=50.0, seed=3)
    assert len(np.unique(out)) > 20  # nearly uniform over 256 tokens


def test_stream_callback_iterator_and_stats(llama):
    ids = golden(LLAMA)["input_ids"]
    seen = []
    out, stats = llama.generate(ids, 5, stream=seen.append, progress=True, return_stats=True)
    np.testing.assert_array_equal(np.stack(seen, 1), out)
    assert isinstance(stats, GenerationStats) and stats.new_tokens == 10 and stats.prompt_tokens == 24
    assert stats.prefill_tokens_per_s > 0 and stats.decode_tokens_per_s > 0
    steps = list(llama.stream(ids, 5))
    np.testing.assert_array_equal(np.stack(steps, 1), out)


def test_eos_stops_rows(llama):
    g = golden(LLAMA)
    eos = int(g["greedy_ids"][0, 2])
    out = llama.generate(g["input_ids"], 16, eos_token_id=eos)
    row0 = out[0]
    assert (row0[2:] == eos).all()
    first = np.flatnonzero(g["greedy_ids"][1] == eos)
    stop = first[0] if len(first) else 16
    np.testing.assert_array_equal(out[1, :stop], g["greedy_ids"][1, :stop])


def test_bad_arguments(llama):
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int"):
        llama.generate([[1, 2]], 0)
    with pytest.raises(ValueError, match="temperature must be a number >= 0, got -1"):
        llama.generate([[1, 2]], 2, temperature=-1)
    with pytest.raises(ValueError, match=r"top_k must be an int in \[1, 256\]"):
        llama.generate([[1, 2]], 2, temperature=1.0, top_k=0)
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\]"):
        llama.generate([[1, 2]], 2, temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match=r"token ids outside \[0, 256\)"):
        llama.generate([[1, 999]], 2)
    with pytest.raises(ValueError, match="prompt 1 must be a non-empty"):
        llama.generate([[1, 2], []], 2)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"temperature": "hot"}, "temperature must be a number >= 0, got 'hot'"),
        ({"temperature": float("nan")}, "temperature must be a number >= 0, got nan"),
        ({"temperature": 1.0, "top_p": "most"}, r"top_p must be a number in \(0, 1\], got 'most'"),
        ({"seed": "abc"}, "seed must be an int or None, got 'abc'"),
        (
            {"max_new_tokens": 10**18},
            r"max_new_tokens \(1000000000000000000\) exceeds the model's context of 128 positions",
        ),
        ({"max_new_tokens": True}, "max_new_tokens must be a positive int, got True"),
    ],
)
def test_hostile_arguments_fail_at_once_with_the_argument_named(llama, kwargs, message):
    kwargs = {"max_new_tokens": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        llama.generate([[1, 2]], **kwargs)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        llama.stream([[1, 2]], **kwargs)  # checked before anything is allocated (no 10**18-slot cache)
    assert time.perf_counter() - start < 1.0


def test_progress_bar_only_for_long_generations_by_default():
    from maxfx.models._generate import LONG_GENERATION, _progress  # noqa: PLC0415 - private helper under test

    assert _progress(None, LONG_GENERATION - 1).disable  # short: never a bar
    assert not _progress(True, 4).disable  # asked for: always
    assert _progress(False, 10 * LONG_GENERATION).disable  # refused: never


def test_tracing_asks_no_tracer_for_its_device(monkeypatch):
    """Asking a tracer for its devices makes JAX walk the whole jaxpr for an error message:
    tracing a model was quadratic in its depth (39 s for 30 layers). Tracing must never do it."""
    import jax  # noqa: PLC0415
    from jax._src.interpreters import partial_eval  # noqa: PLC0415 - the walk being guarded against

    walks = []
    original = partial_eval.JaxprStackFrame.find_progenitors
    monkeypatch.setattr(
        partial_eval.JaxprStackFrame, "find_progenitors", lambda *a, **k: walks.append(1) or original(*a, **k)
    )
    m = model(str(LLAMA))
    ids = np.array([[1, 2, 3, 4]])
    jax.jit(lambda m, x: m(x)._array()).lower(m, Tensor(ids))
    m.generate(ids, max_new_tokens=2)
    assert not walks, f"tracing walked the jaxpr {len(walks)} times"


def test_models_that_differ_only_in_weight_types_each_get_their_program():
    """Same structure and static arguments, other weight dtypes: the executable last used
    for them is rejected by its own type check and the exact one is found (no recompile)."""
    from maxfx.dtype import DType  # noqa: PLC0415
    from maxfx.models import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    half, full = LlamaForCausalLM.random(cfg, seed=3, dtype=DType.bfloat16), LlamaForCausalLM.random(cfg, seed=3)
    ids = [[1, 2, 3, 4, 5]]
    want = half.generate(ids, max_new_tokens=4)
    full.generate(ids, max_new_tokens=4)
    before = compile_counts()
    np.testing.assert_array_equal(half.generate(ids, max_new_tokens=4), want)
    np.testing.assert_array_equal(half.generate(ids, max_new_tokens=4), want)
    full.generate(ids, max_new_tokens=4)
    assert compile_counts() == before
