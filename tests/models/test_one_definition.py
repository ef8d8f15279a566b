"""One Llama definition serves both runtimes: the tensors `read_llama` reads become the eager
Module's parameters and the graph model's weights registry, and both models match a float64
numpy Llama (Llama-3 RoPE scaling, grouped-query attention, tied head)."""

from __future__ import annotations

import numpy as np

from maxfx.experimental.tensor import Tensor
from maxfx.models import LlamaConfig, LlamaForCausalLM, LlamaGraphModel
from maxfx.models._llama import graph_weights, read_llama
from maxfx.models._source import RandomSource
from tests.models.test_llama import np_llama

SCALING = (
    ("factor", 4.0),
    ("high_freq_factor", 4.0),
    ("low_freq_factor", 1.0),
    ("original_max_position_embeddings", 16),
    ("rope_type", "llama3"),
)
CFG = LlamaConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    rope_theta=1000.0,
    rope_scaling=SCALING,
    tie_word_embeddings=True,
    max_position_embeddings=32,
)


def test_eager_and_graph_models_are_built_from_the_same_tensors_and_match_numpy():
    params = read_llama(CFG, RandomSource(seed=5))
    eager = LlamaForCausalLM.from_parameters(CFG, params)
    graph = LlamaGraphModel(CFG, graph_weights(params), max_batch_size=2, max_seq_len=32)
    assert {n for n, _ in eager.parameters} == set(params)
    assert {"model." + n for n in graph.transformer.raw_state_dict()} == set(params)  # tied: no lm_head in either

    ids = np.random.default_rng(1).integers(0, 64, (2, 20))  # 20 positions: past original_max_position_embeddings
    want = np_llama({n: w.value.astype(np.float64) for n, w in params.items()}, CFG, ids)
    np.testing.assert_allclose(eager(Tensor(ids)).to_numpy(), want, rtol=0, atol=1e-4)
    np.testing.assert_allclose(graph(ids), want, rtol=0, atol=1e-4)
