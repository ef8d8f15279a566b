"""The graph-API GPT-2 (maxfx.nn layers + InferenceSession + paged KV cache) vs the reference goldens.

The same `read_gpt2` tensors build the eager model and the graph: logits match the
transformers goldens, greedy generation equals the eager model's tokens (and the
golden's) with one decode executable, ragged batches (rows at different cache
positions, so different learned positions) match the goldens' prefixes, and a
random GPT-2 with ``n_inner`` matches a float64 numpy GPT-2.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from lowering.compile import compile_stats
from lowering.dtypes import DType
from maxfx.engine import InferenceSession
from maxfx.experimental.tensor import Tensor
from maxfx.graph import Graph, TensorType
from maxfx.models import GPT2Config, GPT2GraphModel, GPT2LMHeadModel, load_pretrained_graph
from maxfx.models._gpt2 import GPT2GraphAttention, gpt2_graph_weights, read_gpt2
from maxfx.models._source import RandomSource
from maxfx.nn.transformer._transformer import ragged_positions
from tests.models._helpers import FP32_ATOL, GPT2, golden, model
from tests.models.test_gpt2 import np_gpt2


@functools.cache
def _graph_model():
    return load_pretrained_graph(GPT2, max_batch_size=4)


def test_logits_match_golden():
    g = golden(GPT2)
    logits = _graph_model()(g["input_ids"])
    assert logits.shape == g["logits"].shape and logits.dtype == np.float32
    np.testing.assert_allclose(logits, g["logits"], rtol=0, atol=FP32_ATOL)  # the eager GPT-2 test's bound


def test_greedy_generation_equals_the_eager_model_and_decode_does_not_recompile():
    g = golden(GPT2)
    compiles = []
    out = _graph_model().generate(g["input_ids"], 16, stream=lambda t: compiles.append(compile_stats()["compiles"]))
    np.testing.assert_array_equal(out, model(str(GPT2)).generate(g["input_ids"], max_new_tokens=16))
    np.testing.assert_array_equal(out, g["greedy_ids"])
    assert compiles[1:] == [compiles[1]] * 15, f"decode steps recompiled: {compiles}"


def test_ragged_prefill_and_generation_use_each_row_s_positions():
    g = golden(GPT2)
    m = _graph_model()
    a, b = g["input_ids"]
    parts = m.forward_ragged([a[:5], b, a[:9]])
    for got, want in zip(parts, (g["logits"][0, :5], g["logits"][1], g["logits"][0, :9])):
        np.testing.assert_allclose(got, want, rtol=0, atol=FP32_ATOL)
    batched = m.generate([a[:7], b], 6)  # the rows' decode positions differ at every step
    np.testing.assert_array_equal(batched[1], g["greedy_ids"][1, :6])
    np.testing.assert_array_equal(batched[0], m.generate([a[:7]], 6)[0])
    assert m.cache.num_free_pages == m.cache.total_num_pages


def test_graph_layout_fused_qkv_with_biases_and_tied_head():
    tr = _graph_model().transformer
    attn = tr.layers[0].self_attn
    assert (
        isinstance(attn, GPT2GraphAttention)
        and [int(d) for d in attn.qkv_proj.weight.shape] == [192, 64]
        and attn.o_proj.bias is not None
    )
    names = set(tr.raw_state_dict())
    assert (
        "position_embedding.weight" in names
        and "norm.bias" in names
        and not any(n.startswith("lm_head") for n in names)
    )


def test_eager_and_graph_models_are_built_from_the_same_tensors_and_match_numpy():
    c = GPT2Config(
        vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=24, n_inner=40, activation_function="gelu"
    )
    params = read_gpt2(c, RandomSource(seed=3))
    eager = GPT2LMHeadModel.from_parameters(c, params)
    graph = GPT2GraphModel(c, gpt2_graph_weights(params), max_batch_size=2)
    assert {n for n, _ in eager.parameters} == set(params)
    ids = np.random.default_rng(0).integers(0, 50, (2, 24))  # every learned position
    w = {n: t.value.astype(np.float64) for n, t in params.items()}
    want = np_gpt2(
        w, c, ids, gelu=lambda y: 0.5 * y * (1 + _erf(y / np.sqrt(2)))
    )  # activation_function="gelu": exact GELU
    np.testing.assert_allclose(eager(Tensor(ids)).to_numpy(), want, rtol=0, atol=1e-4)
    np.testing.assert_allclose(graph(ids), want, rtol=0, atol=1e-4)


_erf = np.vectorize(math.erf)


def test_bad_sizes_raise_clear_errors():
    c = GPT2Config(vocab_size=8, n_embd=8, n_layer=1, n_head=2, n_positions=16)
    weights = gpt2_graph_weights(read_gpt2(c, RandomSource(seed=0)))
    with pytest.raises(ValueError, match="max_seq_len=32 exceeds the 16 learned positions"):
        GPT2GraphModel(c, weights, max_seq_len=32)
    with pytest.raises(
        ValueError, match=r"GPT2GraphModel.generate: prompt \+ new tokens need 130 cache positions; max_seq_len is 128"
    ):
        _graph_model().generate([[1, 2, 3]], 128)


def test_ragged_positions_match_numpy():
    offsets, cached = (
        np.array([0, 2, 2, 7], np.uint32),
        np.array([4, 9, 0], np.uint32),
    )  # the middle row has no new tokens
    with Graph("positions", input_types=[TensorType(DType.uint32, [4]), TensorType(DType.uint32, [3])]) as g:
        g.output(ragged_positions(g.inputs[0].tensor, g.inputs[1].tensor, 7))
    got = InferenceSession().load(g).execute(offsets, cached)[0].to_numpy()
    want = np.concatenate([cached[b] + np.arange(offsets[b + 1] - offsets[b]) for b in range(3)])
    np.testing.assert_array_equal(got, want)  # [4, 5, 0, 1, 2, 3, 4]
