"""max.pipelines.lib.interfaces (PipelineModel, KVCacheMixin, ...), log_probabilities and sampling.sampling, against
numpy.
"""

import types

import numpy as np
import pytest

from maxfx.driver import CPU, Tensor
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.generation import TextContext
from maxfx.graph import DeviceRef, Graph, TensorType, ops
from maxfx.nn import RejectionSampler, RejectionSamplerWithResiduals
from maxfx.nn.comm import Signals
from maxfx.nn.kv_cache import KVCacheParams, KVCacheStrategy, PagedKVCacheManager
from maxfx.nn.transformer import ReturnLogits
from maxfx.pipelines import PipelineConfig, SamplingConfig
from maxfx.pipelines.lib import interfaces
from maxfx.pipelines.lib.interfaces import (
    AlwaysSignalBuffersMixin,
    KVCacheMixin,
    ModelInputs,
    ModelOutputs,
    PipelineModel,
    get_paged_manager,
)
from maxfx.pipelines.lib.interfaces.pipeline_model import RaggedTokenInputs
from maxfx.pipelines.lib.log_probabilities import (
    compute_log_probabilities_ragged,
    log_probabilities_ragged_graph,
    log_softmax,
)
from maxfx.pipelines.lib.sampling.sampling import rejection_sampler, rejection_sampler_with_residuals, token_sampler

LLAMA = "tests/data/models/tiny_llama"
CPU_REF = DeviceRef.CPU()


def np_log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


@pytest.fixture(scope="module")
def session():
    return InferenceSession()


# ─── a concrete PipelineModel ─────────────────────────────────────────────────


def _one_hot_graph(vocab):
    """tokens [t], offsets [b + 1], return_n [1] -> (3 * one-hot of each sequence's last token [b, V], 3 * one-hot of
    every token [t, V]).
    """
    with Graph(
        "one_hot",
        input_types=[
            TensorType(DType.int64, ["t"], CPU_REF),
            TensorType(DType.uint32, ["b1"], CPU_REF),
            TensorType(DType.int64, [1], CPU_REF),
        ],
    ) as g:
        tokens, offsets, _ = (v.tensor for v in g.inputs)
        ids = ops.unsqueeze(ops.range(0, vocab, 1, dtype=DType.int64, device=CPU_REF), 0)
        last = ops.gather(tokens, ops.cast(offsets[1:], DType.int64) - 1, 0)
        g.output(
            ops.cast(ops.unsqueeze(last, 1) == ids, DType.float32) * 3.0,
            ops.cast(ops.unsqueeze(tokens, 1) == ids, DType.float32) * 3.0,
        )
    return g


class TinyModel(PipelineModel, KVCacheMixin):
    """Every abstract method delegates to the base bodies (MAX's usual implementations)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.model = self.session.load(_one_hot_graph(int(self.huggingface_config.vocab_size)))

    @classmethod
    def calculate_max_seq_len(cls, pipeline_config, huggingface_config):
        return super().calculate_max_seq_len(pipeline_config, huggingface_config)

    @classmethod
    def get_kv_params(cls, huggingface_config, n_devices, kv_cache_config, cache_dtype):
        return super().get_kv_params(huggingface_config, n_devices, kv_cache_config, cache_dtype)

    @classmethod
    def get_num_layers(cls, huggingface_config):
        return super().get_num_layers(huggingface_config)

    @classmethod
    def estimate_kv_cache_size(
        cls, pipeline_config, available_cache_memory, devices, huggingface_config, kv_cache_config, cache_dtype
    ):
        return super().estimate_kv_cache_size(
            pipeline_config, available_cache_memory, devices, huggingface_config, kv_cache_config, cache_dtype
        )

    def execute(self, model_inputs):
        return super().execute(model_inputs)

    def prepare_initial_token_inputs(self, context_batch, kv_cache_inputs=None, return_n_logits=1):
        return super().prepare_initial_token_inputs(context_batch, kv_cache_inputs, return_n_logits)

    def prepare_next_token_inputs(self, next_tokens, prev_model_inputs):
        return super().prepare_next_token_inputs(next_tokens, prev_model_inputs)


class NoCacheModel(PipelineModel):
    @classmethod
    def calculate_max_seq_len(cls, pipeline_config, huggingface_config):
        return 32

    def execute(self, model_inputs):
        return ModelOutputs(logits=np.zeros((1, 4), np.float32))

    def prepare_initial_token_inputs(self, context_batch, kv_cache_inputs=None, return_n_logits=1):
        return ModelInputs()

    def prepare_next_token_inputs(self, next_tokens, prev_model_inputs):
        return prev_model_inputs


def _config(**kwargs):
    return PipelineConfig(
        model_path=LLAMA, max_length=64, max_batch_size=2, kv_cache_page_size=16, device_specs="cpu", **kwargs
    )


BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads of 16 float32s (tiny_llama)


def _tiny(session, config=None, available=10 * 16 * BYTES_PER_TOKEN, return_logits=ReturnLogits.ALL):
    config = config or _config()
    m = config.model_config
    m.kv_cache._available_cache_memory = available
    return TinyModel(
        config, session, m.huggingface_config, m.quantization_encoding, [CPU()], m.kv_cache, None, None, return_logits
    )


def test_the_package_exports():
    assert set(interfaces.__all__) >= {
        "PipelineModel",
        "KVCacheMixin",
        "ModelInputs",
        "ModelOutputs",
        "AlwaysSignalBuffersMixin",
        "get_paged_manager",
    }


def test_model_inputs_update_sets_only_known_non_none_fields():
    inputs = RaggedTokenInputs(tokens=[1, 2], input_row_offsets=[0, 2])
    inputs.update(tokens=[3], kv_cache_inputs=None, lora_ids=[0], nonsense=1)
    assert (
        inputs.tokens == [3]
        and inputs.lora_ids == [0]
        and inputs.kv_cache_inputs is None
        and not hasattr(inputs, "nonsense")
    )
    base = ModelInputs()
    assert (base.kv_cache_inputs, base.lora_ids, base.lora_ranks) == (None, None, None)


def test_model_outputs_defaults_and_frozen():
    out = ModelOutputs(logits=1)
    assert (out.logits, out.next_token_logits, out.logit_offsets) == (1, None, None)
    with pytest.raises(AttributeError):
        out.logits = 2


def test_abstract_methods_must_be_implemented():
    with pytest.raises(TypeError, match="abstract"):
        PipelineModel(None, None, None, None, [], None, None, None, ReturnLogits.LAST_TOKEN)

    class Partial(PipelineModel):
        def execute(self, model_inputs):
            return super().execute(model_inputs)

    with pytest.raises(TypeError, match="abstract"):
        Partial(None, None, None, None, [], None, None, None, ReturnLogits.LAST_TOKEN)


def test_a_model_with_a_kv_cache_gets_a_paged_manager_sized_by_memory(session):
    model = _tiny(session)
    assert model.max_seq_len == 64 and model.dtype is DType.float32 and model.lora_manager is None
    assert isinstance(model, KVCacheMixin) and isinstance(model.kv_manager, PagedKVCacheManager)
    assert (
        model.kv_manager.total_num_pages,
        model.kv_manager.page_size,
        model.kv_manager.num_layers,
        model.kv_manager.max_batch_size,
    ) == (10, 16, 2, 2)
    assert model.signal_buffers == []  # one device: nothing to synchronize
    pipeline = types.SimpleNamespace(_pipeline_model=model)
    assert get_paged_manager(pipeline) is model.kv_manager
    pool = object()  # a pipeline's declared KV managers count whatever they are (maxfx's engine has a PagePool)
    assert get_paged_manager(types.SimpleNamespace(kv_manager=object(), kv_managers=[pool])) is pool
    assert get_paged_manager(types.SimpleNamespace(_pipeline_model=object(), kv_managers=[])) is None
    with pytest.raises(ValueError, match="hold no KV page"):
        _tiny(session, available=100)


def test_kv_params_layers_and_sizes_from_the_hf_config(session):
    config = _config()
    hf = config.model_config.huggingface_config
    params = TinyModel.get_kv_params(hf, 1, config.model_config.kv_cache, DType.float32)
    assert (params.n_kv_heads, params.head_dim, params.page_size, params.cache_strategy) == (
        2,
        16,
        16,
        KVCacheStrategy.PAGED,
    )
    assert TinyModel.get_num_layers(hf) == 2
    assert TinyModel.get_num_layers({"n_layer": 5}) == 5  # GPT-2's key
    with pytest.raises(ValueError, match="num_hidden_layers"):
        TinyModel.get_num_layers({})
    args = (config, 10**9, [CPU()], hf, config.model_config.kv_cache, DType.float32)
    assert TinyModel.estimate_kv_cache_size(*args) == 2 * 64 * BYTES_PER_TOKEN  # max_batch_size sequences of max_length
    assert TinyModel.estimate_kv_cache_size(config, 1000, *args[2:]) == 1000
    assert TinyModel.estimate_weights_size(config) == config.model_config.weights_size() > 0
    assert TinyModel.estimate_activation_memory(config, hf) == 0


def test_infer_optimal_batch_size(session):
    config = _config()
    hf, kv = config.model_config.huggingface_config, config.model_config.kv_cache
    gpu = types.SimpleNamespace(is_host=False)
    assert (
        TinyModel.infer_optimal_batch_size(config, 10**9, hf, [CPU()], kv, DType.float32) == 1
    )  # batching on a lone CPU: 1, as MAX
    assert NoCacheModel.infer_optimal_batch_size(config, 10**9, hf, [gpu], kv, DType.float32) == 1  # no KV cache: 1
    assert TinyModel.infer_optimal_batch_size(config, 30 * 64 * BYTES_PER_TOKEN + 5, hf, [gpu], kv, DType.float32) == 30
    assert TinyModel.infer_optimal_batch_size(config, 0, hf, [gpu], kv, DType.float32) == 1
    assert TinyModel.infer_optimal_batch_size(config, 10**15, hf, [gpu], kv, DType.float32) == 4096


def test_calculate_max_seq_len_bounds_max_length():
    config = _config()
    assert TinyModel.calculate_max_seq_len(config, {"max_position_embeddings": 100}) == 64
    with pytest.raises(ValueError, match="exceeds"):
        TinyModel.calculate_max_seq_len(config, {"max_position_embeddings": 32})
    assert TinyModel.calculate_max_seq_len(types.SimpleNamespace(max_length=None), {"n_positions": 77}) == 77
    with pytest.raises(ValueError, match="neither"):
        TinyModel.calculate_max_seq_len(types.SimpleNamespace(max_length=None), {})


def test_lora_configs_are_refused(session):
    config = _config()
    config._lora_config = object()  # what enable_lora=True sets
    with pytest.raises(ValueError, match="LoRA"):
        _tiny(session, config=config)


def test_inputs_execute_and_log_probabilities(session):
    model = _tiny(session)
    contexts = [
        TextContext(max_length=16, tokens=np.array([5, 6, 7])),
        TextContext(max_length=16, tokens=np.array([9])),
    ]
    inputs = model.prepare_initial_token_inputs(contexts, kv_cache_inputs=None, return_n_logits=1)
    assert inputs.tokens.to_numpy().tolist() == [5, 6, 7, 9] and inputs.input_row_offsets.to_numpy().tolist() == [
        0,
        3,
        4,
    ]
    out = model.execute(inputs)
    next_logits, logits = out.next_token_logits.to_numpy(), out.logits.to_numpy()
    assert next_logits.shape == (2, 256) and logits.shape == (4, 256)
    assert next_logits.argmax(-1).tolist() == [7, 9] and logits.argmax(-1).tolist() == [5, 6, 7, 9]
    sampled = np.array([7, 1])
    lps = model.compute_log_probabilities(session, inputs, out, sampled, [2, 1], [True, False])
    row_lp = np_log_softmax(next_logits)
    # Request 0 echoes: logits rows 0, 1 score tokens 6, 7; the last row scores the sampled 7.
    expected0 = [np_log_softmax(logits[0])[6], np_log_softmax(logits[1])[7], row_lp[0, 7]]
    np.testing.assert_allclose(lps[0].token_log_probabilities, expected0, rtol=1e-5)
    assert set(lps[0].top_log_probabilities[2]) >= {7} and len(lps[0].top_log_probabilities[2]) == 2
    np.testing.assert_allclose(lps[1].token_log_probabilities, [row_lp[1, 1]], rtol=1e-5)
    assert (
        lps[1].top_log_probabilities[0][9] == pytest.approx(row_lp[1, 9], rel=1e-5)
        and 1 in lps[1].top_log_probabilities[0]
    )
    nxt = model.prepare_next_token_inputs(np.array([3, 4]), inputs)
    assert nxt.tokens.to_numpy().tolist() == [3, 4] and nxt.input_row_offsets.to_numpy().tolist() == [0, 1, 2]
    assert model.execute(nxt).next_token_logits.to_numpy().argmax(-1).tolist() == [3, 4]
    last_only = _tiny(session, return_logits=ReturnLogits.LAST_TOKEN)
    with pytest.raises(ValueError, match="enable_echo"):
        last_only.compute_log_probabilities(session, inputs, out, sampled, [1, 1], [True, False])
    with pytest.raises(ValueError, match="ragged"):
        model.compute_log_probabilities(session, ModelInputs(), out, sampled, [1, 1], [False, False])
    with pytest.raises(TypeError, match="ragged"):
        model.prepare_next_token_inputs(np.array([1]), ModelInputs())


def test_signal_buffers(monkeypatch, session):
    monkeypatch.setattr(Signals, "NUM_BYTES", 16)

    class Always(AlwaysSignalBuffersMixin, TinyModel):
        pass

    model = _tiny(session)
    always = Always(
        model.pipeline_config,
        session,
        model.huggingface_config,
        model.encoding,
        [CPU()],
        model.kv_cache_config,
        None,
        None,
        ReturnLogits.ALL,
    )
    [buf] = always.signal_buffers  # one per device, even for one device
    assert buf.dtype is DType.uint8 and list(buf.shape) == [16] and not buf.to_numpy().any()
    assert model.signal_buffers == []


# ─── log probabilities ────────────────────────────────────────────────────────


def _expected(logits, next_logits, tokens, offsets, sampled, top_n, echo):
    out = []
    for b, (n, e) in enumerate(zip(top_n, echo)):
        if n == 0:
            out.append(None)
            continue
        start, end = offsets[b], offsets[b + 1]
        rows = (
            [(logits[j], tokens[j + 1]) for j in range(start, end - 1)] + [(logits[end - 1], sampled[b])]
            if e
            else [(next_logits[b], sampled[b])]
        )
        values, tops = [], []
        for row, scored in rows:
            lp = np_log_softmax(row)
            values.append(lp[scored])
            best = np.argsort(-lp)[:n]
            tops.append({int(t): lp[t] for t in [*best, scored]})
        out.append((values, tops))
    return out


@pytest.fixture(scope="module")
def logprob_model(session):
    return session.load(log_probabilities_ragged_graph(CPU_REF, levels=3))


@pytest.mark.parametrize("echo", [[False, False, False], [True, False, True], [True, True, True]])
def test_ragged_log_probabilities_match_numpy(logprob_model, echo):
    rng = np.random.default_rng(7)
    vocab, lengths = 11, [3, 1, 4]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, vocab, offsets[-1])
    logits = rng.normal(size=(offsets[-1], vocab)).astype(np.float32)
    next_logits = logits[offsets[1:] - 1]
    sampled = rng.integers(0, vocab, 3)
    top_n = [5, 0, 2]
    got = compute_log_probabilities_ragged(
        CPU(),
        logprob_model,
        input_row_offsets=offsets,
        logits=logits,
        next_token_logits=next_logits,
        tokens=tokens,
        sampled_tokens=sampled,
        batch_top_n=top_n,
        batch_echo=echo,
    )
    expected = _expected(logits, next_logits, tokens, offsets, sampled, top_n, echo)
    assert got[1] is None
    for lp, exp in zip(got, expected):
        if exp is None:
            continue
        np.testing.assert_allclose(lp.token_log_probabilities, exp[0], rtol=1e-5, atol=1e-6)
        assert [set(d) for d in lp.top_log_probabilities] == [set(d) for d in exp[1]]
        for d, e in zip(lp.top_log_probabilities, exp[1]):
            np.testing.assert_allclose([d[k] for k in sorted(d)], [e[k] for k in sorted(e)], rtol=1e-5, atol=1e-6)


def test_log_probabilities_without_full_logits_and_small_vocabularies(session, logprob_model):
    logits = np.log(np.array([[0.5, 0.3, 0.2]], np.float32))
    [lp] = compute_log_probabilities_ragged(
        CPU(),
        logprob_model,
        input_row_offsets=np.array([0, 2]),
        logits=None,
        next_token_logits=logits,
        tokens=np.array([1, 2]),
        sampled_tokens=np.array([2]),
        batch_top_n=[5],
        batch_echo=[False],
    )
    assert sorted(lp.top_log_probabilities[0]) == [0, 1, 2]  # 3 tokens: the graph's padding slots are dropped
    np.testing.assert_allclose(lp.token_log_probabilities, [np.log(0.2)], rtol=1e-5)
    level0 = session.load(log_probabilities_ragged_graph(CPU_REF, levels=0))  # only the scored token's column
    u32 = lambda a: np.asarray(a, np.uint32)  # noqa: E731
    lp_logits, lp_tokens = (
        o.to_numpy()
        for o in level0.execute(logits, u32([1, 2]), u32([0]), u32([0, 1]), u32([0, 2]), u32([0, 1]), u32([0, 1]))
    )
    assert lp_tokens.tolist() == [[0]] and lp_logits[0, 0] == pytest.approx(np.log(0.5), rel=1e-5)
    with pytest.raises(ValueError, match="larger levels"):  # as MAX: no top tokens to give
        compute_log_probabilities_ragged(
            CPU(),
            level0,
            input_row_offsets=np.array([0, 2]),
            logits=None,
            next_token_logits=logits,
            tokens=np.array([1, 2]),
            sampled_tokens=np.array([0]),
            batch_top_n=[1],
            batch_echo=[False],
        )
    np.testing.assert_allclose(log_softmax(np.log([0.5, 0.25, 0.25])), np.log([0.5, 0.25, 0.25]), rtol=1e-6)


def test_log_probabilities_errors(logprob_model):
    args = dict(
        input_row_offsets=np.array([0, 2]),
        next_token_logits=np.zeros((1, 4), np.float32),
        tokens=np.array([1, 2]),
        sampled_tokens=np.array([0]),
    )
    with pytest.raises(ValueError, match="echo needs"):
        compute_log_probabilities_ragged(CPU(), logprob_model, logits=None, batch_top_n=[1], batch_echo=[True], **args)
    with pytest.raises(ValueError, match="rebuild it with larger levels"):
        compute_log_probabilities_ragged(CPU(), logprob_model, logits=None, batch_top_n=[8], batch_echo=[False], **args)
    with pytest.raises(ValueError, match="batch sizes disagree"):
        compute_log_probabilities_ragged(
            CPU(), logprob_model, logits=None, batch_top_n=[1, 1], batch_echo=[False, False], **args
        )
    with pytest.raises(ValueError, match="float32"):
        compute_log_probabilities_ragged(
            CPU(),
            logprob_model,
            logits=None,
            batch_top_n=[1],
            batch_echo=[False],
            **{**args, "next_token_logits": np.zeros((1, 4))},
        )
    with pytest.raises(ValueError, match="levels"):
        log_probabilities_ragged_graph(CPU_REF, levels=2.5)
    with pytest.raises(TypeError, match="DeviceRef"):
        log_probabilities_ragged_graph("cpu", levels=3)


# ─── token_sampler ────────────────────────────────────────────────────────────


def _run_sampler(
    session,
    config,
    logits,
    *,
    top_k,
    temperature=None,
    top_p=None,
    seed=None,
    prev=None,
    return_logits=False,
    max_k=None,
    **named,
):
    """Run token_sampler with the named optional inputs; returns (outputs as numpy, the logits buffer)."""
    graph = token_sampler(config, CPU_REF, return_logits=return_logits, max_k=max_k)
    batch = len(top_k)
    values = {
        "logits": Tensor.from_numpy(np.ascontiguousarray(logits, np.float32)),
        "prev_tokens": np.zeros((batch, 0), np.int64) if prev is None else prev,
        "top_k": np.asarray(top_k, np.int64),
        "max_k": np.array(max(top_k), np.int64),
        "temperature": np.ones(batch, np.float32) if temperature is None else np.asarray(temperature, np.float32),
        "top_p": np.ones(batch, np.float32) if top_p is None else np.asarray(top_p, np.float32),
        "min_top_p": np.array(1.0 if top_p is None else min(top_p), np.float32),
        "seed": np.arange(batch, dtype=np.uint64) if seed is None else np.asarray(seed, np.uint64),
        **named,
    }
    names = ["logits", "prev_tokens", "top_k", "max_k", "temperature", "top_p", "min_top_p", "seed"]
    names += ["existing_logits"] if return_logits else []
    names += ["logit_offsets"] if config.enable_variable_logits else []
    names += ["bitmask"] if config.enable_structured_output else []
    if config.enable_penalties:
        names += [
            "penalty_freq_data",
            "penalty_freq_offsets",
            "repetition_freq_data",
            "repetition_freq_offsets",
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
        ]
    names += ["min_tokens_mask"] if config.enable_min_tokens else []
    assert len(graph.inputs) == len(names)
    outputs = session.load(graph).execute(*[values[n] for n in names])
    return [o.to_numpy() for o in outputs], values


def test_greedy_sampling_is_argmax_and_the_seed_advances(session):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 10)).astype(np.float32)
    (tokens, all_tokens, seed), _ = _run_sampler(
        session, SamplingConfig(), logits, top_k=[1, 1, 1, 1], prev=np.array([[1], [2], [3], [4]]), seed=[5, 6, 7, 8]
    )
    assert tokens.tolist() == logits.argmax(-1).tolist()
    assert all_tokens.tolist() == [[p, t] for p, t in zip([1, 2, 3, 4], tokens.tolist())]
    assert seed.tolist() == [6, 7, 8, 9]
    (tokens, _, _), _ = _run_sampler(
        session, SamplingConfig(), logits, top_k=[5, 5, 5, 5], temperature=[0, 0, 0, 0]
    )  # temperature 0: greedy
    assert tokens.tolist() == logits.argmax(-1).tolist()


def test_top_k_sampling_stays_in_the_top_k_and_whole_vocabulary_rows_reach_every_token(session):
    logits = np.tile(np.array([[3.0, 2.9, -5.0, -5.0, 2.8, -9.0]], np.float32), (64, 1))
    (tokens, _, _), _ = _run_sampler(session, SamplingConfig(), logits, top_k=[2] * 64, seed=np.arange(64))
    assert set(tokens.tolist()) == {0, 1}
    (again, _, _), _ = _run_sampler(session, SamplingConfig(), logits, top_k=[2] * 64, seed=np.arange(64))
    assert again.tolist() == tokens.tolist()  # seeded
    uniform = np.zeros((300, 6), np.float32)
    (tokens, _, _), _ = _run_sampler(session, SamplingConfig(), uniform, top_k=[-1] * 300, seed=np.arange(300), max_k=6)
    assert set(tokens.tolist()) == set(range(6))
    (tokens, _, _), _ = _run_sampler(
        session, SamplingConfig(), logits, top_k=[-1] * 64, top_p=[0.3] * 64, seed=np.arange(64)
    )
    assert set(tokens.tolist()) == {0}  # the best token alone holds 30% of the mass
    with pytest.raises(ValueError, match="max_k"):
        token_sampler(SamplingConfig(), CPU_REF, max_k=0)
    with pytest.raises(TypeError, match="DeviceRef"):
        token_sampler(SamplingConfig(), "cpu")


def test_variable_logits_sample_each_sequences_last_row_and_return_logits(session):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(5, 7)).astype(np.float32)
    config = SamplingConfig(enable_variable_logits=True)
    (tokens, _, all_logits, _), _ = _run_sampler(
        session,
        config,
        logits,
        top_k=[1, 1],
        prev=np.array([[7], [8]]),
        return_logits=True,
        logit_offsets=np.array([0, 2, 5], np.uint32),
        existing_logits=np.array([[0.5], [0.25]], np.float32),
    )
    assert tokens.tolist() == [logits[1].argmax(), logits[4].argmax()]
    np.testing.assert_allclose(all_logits, [[0.5, logits[1].max()], [0.25, logits[4].max()]])


def test_structured_output_bitmask_and_min_tokens_mask(session):
    logits = np.array([[0.0, 5.0, 4.0, 1.0], [3.0, 0.0, 2.0, 1.0]], np.float32)
    bitmask = np.ones((2, 32), bool)  # llguidance pads to 32 tokens
    bitmask[0, 1] = False
    (tokens, _, _), _ = _run_sampler(
        session, SamplingConfig(enable_structured_output=True), logits, top_k=[1, 1], bitmask=bitmask
    )
    assert tokens.tolist() == [2, 0]
    (tokens, _, _), values = _run_sampler(
        session,
        SamplingConfig(enable_min_tokens=True),
        logits,
        top_k=[1, 1],
        min_tokens_mask=np.array([[1, 0], [0, 2]], np.int32),
    )
    assert tokens.tolist() == [1, 2]
    assert values["logits"].to_numpy()[1, 0] == -10000.0  # the mask is written into the logits buffer, as MAX


def test_penalties_per_row_match_numpy_and_count_the_sampled_token(session):
    logits = np.array([[2.0, 1.8, -1.0, 0.5], [1.0, 3.0, 2.9, -2.0]], np.float32)
    # (token, count) slots: rows 0-2 belong to sequence 0, rows 3-5 to sequence 1; -1 marks a free slot.
    repetition = np.array([[0, 1], [2, 1], [-1, 0], [1, 2], [-1, 0], [-1, 0]], np.int32)
    frequency = np.array([[0, 3], [-1, 0], [-1, 0], [1, 1], [3, 2], [-1, 0]], np.int32)
    offsets = np.array([0, 3, 6], np.uint32)
    rp, fp, pp = np.array([2.0, 1.5], np.float32), np.array([0.1, 0.5], np.float32), np.array([0.05, 0.2], np.float32)
    expected = logits.astype(np.float64).copy()
    for data, kind in ((repetition, "rep"), (frequency, "freq")):
        for b in range(2):
            for tok, count in data[offsets[b] : offsets[b + 1]]:
                if tok < 0:
                    continue
                if kind == "rep":
                    expected[b, tok] = expected[b, tok] / rp[b] if expected[b, tok] > 0 else expected[b, tok] * rp[b]
                else:
                    expected[b, tok] -= fp[b] * count + pp[b]
    (tokens, _, _), values = _run_sampler(
        session,
        SamplingConfig(enable_penalties=True),
        logits,
        top_k=[1, 1],
        penalty_freq_data=Tensor.from_numpy(frequency.copy()),
        penalty_freq_offsets=offsets,
        repetition_freq_data=Tensor.from_numpy(repetition.copy()),
        repetition_freq_offsets=offsets,
        frequency_penalty=fp,
        presence_penalty=pp,
        repetition_penalty=rp,
    )
    np.testing.assert_allclose(values["logits"].to_numpy(), expected, rtol=1e-6)
    assert tokens.tolist() == expected.argmax(-1).tolist() == [1, 2]
    freq = values["penalty_freq_data"].to_numpy()
    assert freq[1].tolist() == [1, 1] and freq[5].tolist() == [2, 1]  # each sampled token takes a free slot
    rep = values["repetition_freq_data"].to_numpy()
    assert rep[2].tolist() == [1, 1] and rep[4].tolist() == [2, 1]


# ─── rejection samplers ───────────────────────────────────────────────────────


def _spec_inputs(rng, batch=3, steps=4, vocab=9):
    target = rng.normal(size=(batch * (steps + 1), vocab)).astype(np.float32)
    offsets = np.arange(0, batch * (steps + 1) + 1, steps + 1, dtype=np.int64)
    draft_tokens = rng.integers(0, vocab, (batch, steps)).astype(np.int64)
    rows = offsets[:-1, None] + np.arange(steps)[None, :]
    return draft_tokens, target, offsets, rows


def test_rejection_sampler_accepts_identical_drafts_and_rejects_overconfident_ones(session):
    rng = np.random.default_rng(3)
    draft_tokens, target, offsets, rows = _spec_inputs(rng)
    same = target[rows, draft_tokens]  # the draft's logits equal the target's: every draft is accepted
    model = session.load(rejection_sampler(CPU_REF, seed=1))
    first, sampled = (o.to_numpy() for o in model.execute(draft_tokens, same, target, offsets))
    assert first[:, 0].tolist() == [4, 4, 4] and sampled[:, 0].tolist() == target[offsets[1:] - 1].argmax(-1).tolist()
    worse = same.copy()
    worse[0, 1] += 1.0  # sequence 0's second draft was more likely under the draft model: rejected there
    worse[2, 0] += 1.0
    first, sampled = (o.to_numpy() for o in model.execute(draft_tokens, worse, target, offsets))
    assert first[:, 0].tolist() == [1, 4, 0]
    assert sampled[:, 0].tolist() == [target[1].argmax(), target[9].argmax(), target[10].argmax()]


def test_rejection_sampler_matches_the_nn_module(session):
    rng = np.random.default_rng(4)
    draft_tokens, target, offsets, rows = _spec_inputs(rng)
    draft_logits = (target[rows, draft_tokens] + rng.normal(scale=0.5, size=draft_tokens.shape)).astype(np.float32)
    types_ = [
        TensorType(DType.int64, [3, 4], CPU_REF),
        TensorType(DType.float32, [3, 4], CPU_REF),
        TensorType(DType.float32, [15, 9], CPU_REF),
        TensorType(DType.int64, [4], CPU_REF),
    ]
    with Graph("module", input_types=types_) as g:
        g.output(*RejectionSampler(CPU_REF)(*(v.tensor for v in g.inputs)))
    reference = [o.to_numpy() for o in session.load(g).execute(draft_tokens, draft_logits, target, offsets)]
    ours = [
        o.to_numpy()
        for o in session.load(rejection_sampler(CPU_REF)).execute(draft_tokens, draft_logits, target, offsets)
    ]
    for a, b in zip(ours, reference):
        np.testing.assert_array_equal(a, b)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_rejection_sampler_with_residuals_matches_numpy_and_the_nn_module(session):
    rng = np.random.default_rng(5)
    draft_tokens, target, offsets, rows = _spec_inputs(rng)
    all_draft = rng.normal(size=(4, 3, 9)).astype(np.float32)
    draft_logits = np.take_along_axis(all_draft.transpose(1, 0, 2), draft_tokens[..., None], -1)[..., 0]
    u = rng.uniform(size=(3, 4)).astype(np.float32)
    r = rng.uniform(size=(3, 4, 9)).astype(np.float32)
    inputs = (draft_tokens, draft_logits, target, offsets, all_draft, u, r)
    first, recovered, bonus = (
        o.to_numpy() for o in session.load(rejection_sampler_with_residuals(CPU_REF, debug=True)).execute(*inputs)
    )
    p, q = _softmax(target[rows].astype(np.float64)), _softmax(all_draft.transpose(1, 0, 2).astype(np.float64))
    idx = (np.arange(3)[:, None], np.arange(4)[None, :], draft_tokens)
    rejected = u >= np.minimum(p[idx] / (q[idx] + 1e-10), 1.0)
    expected_first = [int(np.argmax(row)) if row.any() else 4 for row in rejected]
    residual = np.maximum(p - q, np.finfo(np.float32).tiny)
    residual /= residual.sum(-1, keepdims=True)
    expected_recovered = np.argmax(residual / -np.log(np.maximum(r, np.finfo(np.float32).eps)), -1)
    assert first.tolist() == expected_first
    np.testing.assert_array_equal(recovered, expected_recovered)
    assert bonus[:, 0].tolist() == target[offsets[1:] - 1].argmax(-1).tolist()
    types_ = [
        TensorType(DType.int64, [3, 4], CPU_REF),
        TensorType(DType.float32, [3, 4], CPU_REF),
        TensorType(DType.float32, [15, 9], CPU_REF),
        TensorType(DType.int64, [4], CPU_REF),
        TensorType(DType.float32, [4, 3, 9], CPU_REF),
        TensorType(DType.float32, [3, 4], CPU_REF),
        TensorType(DType.float32, [3, 4, 9], CPU_REF),
    ]
    with Graph("module", input_types=types_) as g:
        g.output(*RejectionSamplerWithResiduals(CPU_REF)(*(v.tensor for v in g.inputs)))
    reference = [o.to_numpy() for o in session.load(g).execute(*inputs)]
    for a, b in zip((first, recovered, bonus), reference):
        np.testing.assert_array_equal(a, b)


def test_rejection_sampler_with_residuals_accepts_identical_distributions(session):
    rng = np.random.default_rng(6)
    draft_tokens, target, offsets, rows = _spec_inputs(rng)
    all_draft = target[rows].transpose(1, 0, 2).copy()  # the draft model predicts exactly the target's distribution
    draft_logits = target[rows, draft_tokens]
    model = session.load(rejection_sampler_with_residuals(CPU_REF, seed=11))
    first, recovered, bonus = (
        o.to_numpy() for o in model.execute(draft_tokens, draft_logits, target, offsets, all_draft)
    )
    assert first.tolist() == [4, 4, 4] and recovered.shape == (3, 4) and bonus.shape == (3, 1)
    assert ((0 <= recovered) & (recovered < 9)).all()


def test_kv_params_helper_matches_the_cache_layout():
    from maxfx.pipelines.lib.interfaces.kv_cache import kv_cache_bytes_per_token

    params = KVCacheParams(DType.bfloat16, n_kv_heads=4, head_dim=8, page_size=16)
    assert kv_cache_bytes_per_token(params, 3) == 2 * 3 * 4 * 8 * 2
