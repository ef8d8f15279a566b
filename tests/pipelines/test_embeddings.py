"""`EmbeddingsPipeline` on the tiny fixtures: embeddings vs an independent numpy forward, batching, pooling kinds,
errors.

The reference hidden states come from a numpy re-implementation of the fixtures'
architectures (Llama, Qwen3 with its q/k norms, GPT-2) read straight from
``model.safetensors``; its logits are checked against the Hugging Face goldens
first, so the reference is transformers' own computation.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from maxfx.interfaces import (
    EmbeddingsContext,
    EmbeddingsGenerationInputs,
    EmbeddingsGenerationOutput,
    RequestID,
    TextGenerationRequest,
)
from maxfx.models import load_pretrained
from maxfx.pipelines import PipelineConfig
from maxfx.pipelines.lib import embeddings_pipeline as ep
from maxfx.pipelines.lib.embeddings_pipeline import POOLING_KINDS, EmbeddingsPipeline, EmbeddingsRequestContext
from maxfx.pipelines.lib.tokenizer import TextTokenizer

DATA = Path(__file__).resolve().parents[1] / "data" / "models"
ARCHS = ("tiny_llama", "tiny_qwen3", "tiny_gpt2")
ATOL = 2e-5  # maxfx (XLA) vs numpy float32 forward; hidden states are O(1)
LENGTHS = (3, 12, 7, 1, 20, 9)  # spans the 8, 16 and 32 length buckets


# ─── an independent numpy forward ────────────────────────────────────────────


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _causal_attention(q, k, v):
    """q [H, T, D], k/v [H, T, D] -> [T, H*D]."""
    t, d = q.shape[1], q.shape[2]
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(d)
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    return (_softmax(scores) @ v).transpose(1, 0, 2).reshape(t, -1)


def _rope(x, theta):
    """Hugging Face rotate-half RoPE of x [H, T, D] at positions 0..T-1."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(x.shape[1])[:, None] * inv[None]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    half = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


def _llama_hidden(w, cfg, ids):
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    x = w["model.embed_tokens.weight"][ids].astype(np.float64)
    t = len(ids)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, nh, hd).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, nkv, hd).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, nkv, hd).transpose(1, 0, 2)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3: RMSNorm per head before RoPE
            q, k = _rms(q, w[p + "self_attn.q_norm.weight"], eps), _rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = _rope(q, theta), _rope(k, theta)
        rep = nh // nkv
        x = x + _causal_attention(q, np.repeat(k, rep, 0), np.repeat(v, rep, 0)) @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return _rms(x, w["model.norm.weight"], eps)


def _gelu_new(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _gpt2_hidden(w, cfg, ids):
    eps, nh = cfg["layer_norm_epsilon"], cfg["n_head"]
    t = len(ids)
    x = (w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:t]).astype(np.float64)
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        h = _layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (a.reshape(t, nh, -1).transpose(1, 0, 2) for a in np.split(qkv, 3, -1))
        x = x + _causal_attention(q, k, v) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = _layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        x = (
            x
            + _gelu_new(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]) @ w[p + "mlp.c_proj.weight"]
            + w[p + "mlp.c_proj.bias"]
        )
    return _layer_norm(x, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)


@functools.cache
def _fixture(arch: str) -> tuple[dict, dict]:
    return load_file(str(DATA / arch / "model.safetensors")), json.loads((DATA / arch / "config.json").read_text())


def reference_hidden(arch: str, ids) -> np.ndarray:
    """Final hidden states [T, hidden] (float64) of one unpadded prompt, in numpy."""
    w, cfg = _fixture(arch)
    ids = np.asarray(ids, np.int64)
    return _gpt2_hidden(w, cfg, ids) if cfg["model_type"] == "gpt2" else _llama_hidden(w, cfg, ids)


def reference_pool(h: np.ndarray, kind: str) -> np.ndarray:
    return {"mean": h.mean(0), "last_token": h[-1], "cls": h[0]}[kind]


def _head(arch: str, h: np.ndarray) -> np.ndarray:
    w, _ = _fixture(arch)
    return h @ w.get("lm_head.weight", w.get("transformer.wte.weight")).T


@pytest.mark.parametrize("arch", ARCHS)
def test_the_numpy_reference_reproduces_the_transformers_golden(arch):
    """The reference is sound: its logits equal Hugging Face transformers' (golden.npz)."""
    with np.load(DATA / arch / "golden.npz") as g:
        ids, logits = g["input_ids"], g["logits"]
    for row, want in zip(ids, logits):
        np.testing.assert_allclose(_head(arch, reference_hidden(arch, row)), want, rtol=0, atol=1e-4)


# ─── pipelines (one model load per fixture) ──────────────────────────────────


@functools.cache
def _model(arch: str):
    return load_pretrained(DATA / arch)


def make_pipeline(
    arch: str = "tiny_llama", *, pool_embeddings: bool = True, max_batch_size: int | None = None, **kwargs
) -> EmbeddingsPipeline:
    config = PipelineConfig(model_path=str(DATA / arch), pool_embeddings=pool_embeddings, max_batch_size=max_batch_size)
    return EmbeddingsPipeline(config, None, None, {}, None, model=_model(arch), **kwargs)


def _prompts(lengths=LENGTHS, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, n) for n in lengths]


def _inputs(prompts) -> tuple[list[RequestID], EmbeddingsGenerationInputs]:
    ctxs = [EmbeddingsRequestContext(p, request_id=f"req-{i}") for i, p in enumerate(prompts)]
    return [c.request_id for c in ctxs], EmbeddingsGenerationInputs([{c.request_id: c for c in ctxs}])


def _embed(pipeline, prompts) -> list[np.ndarray]:
    ids, inputs = _inputs(prompts)
    out = pipeline.execute(inputs)
    assert list(out) == ids
    for o in out.values():
        assert isinstance(o, EmbeddingsGenerationOutput) and o.is_done and o.embeddings.dtype == np.float32
    return [out[i].embeddings for i in ids]


@pytest.mark.parametrize("kind", POOLING_KINDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_pooled_embeddings_equal_numpy_pooling_of_the_reference(arch, kind):
    prompts = _prompts()
    got = _embed(make_pipeline(arch, pooling=kind), prompts)
    for p, g in zip(prompts, got):
        assert g.shape == (64,)
        np.testing.assert_allclose(g, reference_pool(reference_hidden(arch, p), kind), rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_per_token_states_with_pool_embeddings_false(arch):
    """pool_embeddings=False: [T, hidden] per request (padding removed), the reference's hidden states."""
    prompts = _prompts()
    got = _embed(make_pipeline(arch, pool_embeddings=False), prompts)
    for p, g in zip(prompts, got):
        assert g.shape == (len(p), 64)
        np.testing.assert_allclose(g, reference_hidden(arch, p), rtol=0, atol=ATOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_batch_gives_each_prompt_its_alone_result(arch):
    """Prompts of different lengths batched (padded) equal each prompt run alone, unpadded, batch 1, through
    model.hidden (eager).
    """
    from maxfx.models._generate import token_tensor
    from maxfx.models._layers import positions

    model = _model(arch)
    prompts = _prompts((3, 12, 1, 20), seed=1)  # lengths in three buckets
    alone = []
    for p in prompts:
        ids = token_tensor(p[None], model.device, "test")
        alone.append(np.asarray(model.hidden(ids, positions(ids), None)[0].to_numpy())[0])
    for kind in ("mean", "last_token"):
        for a, g in zip(alone, _embed(make_pipeline(arch, pooling=kind), prompts)):
            np.testing.assert_allclose(g, reference_pool(a, kind), rtol=0, atol=1e-5)
    for a, g in zip(alone, _embed(make_pipeline(arch, pool_embeddings=False), prompts)):
        np.testing.assert_allclose(g, a, rtol=0, atol=1e-5)


def test_default_pooling_kind_per_architecture():
    """Mean pooling by default; last-token for Qwen3 (Qwen3-Embedding style)."""
    assert make_pipeline("tiny_llama").pooling == "mean"
    assert make_pipeline("tiny_gpt2").pooling == "mean"
    assert make_pipeline("tiny_qwen3").pooling == "last_token"
    assert make_pipeline("tiny_qwen3", pooling="mean").pooling == "mean"
    assert not make_pipeline("tiny_qwen3").normalize


def _st_copy(tmp_path, pooling: dict, normalize: bool) -> Path:
    """tiny_llama with sentence-transformers modules.json and 1_Pooling/config.json."""
    folder = tmp_path / "st_llama"
    shutil.copytree(DATA / "tiny_llama", folder, ignore=shutil.ignore_patterns("*.gguf", "*.bin", "*.npz"))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **pooling}))
    return folder


def test_sentence_transformers_pooling_config_and_normalize(tmp_path):
    """A checkpoint's 1_Pooling/config.json picks the kind; a Normalize module makes the vectors unit length."""
    folder = _st_copy(tmp_path, {"pooling_mode_mean_tokens": False, "pooling_mode_lasttoken": True}, normalize=True)
    pipeline = EmbeddingsPipeline(PipelineConfig(model_path=str(folder)), None, None, {}, None)
    assert (pipeline.pooling, pipeline.normalize) == ("last_token", True)
    prompts = _prompts()
    for p, g in zip(prompts, _embed(pipeline, prompts)):
        want = reference_hidden("tiny_llama", p)[-1]
        np.testing.assert_allclose(g, want / np.linalg.norm(want), rtol=0, atol=ATOL)
        assert abs(np.linalg.norm(g) - 1) < 1e-5
    # The keywords override the checkpoint's choice.
    plain = EmbeddingsPipeline(
        PipelineConfig(model_path=str(folder)),
        None,
        None,
        {},
        None,
        pooling="mean",
        normalize=False,
        model=pipeline.model,
    )
    np.testing.assert_allclose(
        _embed(plain, prompts[:1])[0], reference_hidden("tiny_llama", prompts[0]).mean(0), rtol=0, atol=ATOL
    )


def test_unsupported_sentence_transformers_pooling_is_refused(tmp_path):
    folder = _st_copy(tmp_path, {"pooling_mode_max_tokens": True}, normalize=False)
    with pytest.raises(ValueError, match=r"pooling_mode_max_tokens.*pooling="):
        EmbeddingsPipeline(PipelineConfig(model_path=str(folder)), None, None, {}, None, model=_model("tiny_llama"))
    assert (
        EmbeddingsPipeline(
            PipelineConfig(model_path=str(folder)), None, None, {}, None, pooling="cls", model=_model("tiny_llama")
        ).pooling
        == "cls"
    )


def test_normalize_keyword_on_pooled_output():
    prompts = _prompts()
    for p, g in zip(prompts, _embed(make_pipeline("tiny_gpt2", normalize=True), prompts)):
        want = reference_hidden("tiny_gpt2", p).mean(0)
        np.testing.assert_allclose(g, want / np.linalg.norm(want), rtol=0, atol=ATOL)


def test_the_pipeline_loads_the_configured_checkpoint_folder_and_gguf():
    """No model= given: the pipeline loads pipeline_config.model_config.local_model_path itself (a folder, a GGUF
    file).
    """
    prompt = _prompts()[1]
    folder = EmbeddingsPipeline(PipelineConfig(model_path=str(DATA / "tiny_qwen3")), None, None, {}, None)
    np.testing.assert_allclose(
        _embed(folder, [prompt])[0], reference_hidden("tiny_qwen3", prompt)[-1], rtol=0, atol=ATOL
    )
    gguf = EmbeddingsPipeline(
        PipelineConfig(model_path=str(DATA / "tiny_llama" / "tiny_llama-q8_0.gguf")), None, None, {}, None
    )
    got = _embed(gguf, [prompt])[0]
    assert got.shape == (64,)
    # Q8_0 weights: close to the float model, not equal.
    np.testing.assert_allclose(got, reference_hidden("tiny_llama", prompt).mean(0), rtol=0, atol=0.05)


def test_a_text_tokenizer_context_embeds_its_prompt_tokens():
    """TextTokenizer.new_context gives a TextContext (whose token buffer is preallocated): its prompt tokens are
    embedded.
    """
    config = PipelineConfig(model_path=str(DATA / "tiny_llama"))
    tok = TextTokenizer(str(DATA / "tiny_llama"), pipeline_config=config)
    ctx = asyncio.run(
        tok.new_context(TextGenerationRequest(request_id=RequestID("t"), model_name="tiny", prompt="hello embeddings"))
    )
    assert len(ctx.tokens) > len(ctx.all_tokens)
    pipeline = EmbeddingsPipeline(config, None, tok.eos, {}, tok, model=_model("tiny_llama"))
    out = pipeline.execute(EmbeddingsGenerationInputs([{ctx.request_id: ctx}]))
    np.testing.assert_allclose(
        out[RequestID("t")].embeddings, reference_hidden("tiny_llama", ctx.all_tokens).mean(0), rtol=0, atol=ATOL
    )
    assert pipeline.tokenizer is tok and pipeline.eos_token_id == tok.eos


def test_few_programs_compile_for_many_lengths():
    """Lengths pad to power-of-two buckets: every length of a bucket reuses one program."""
    pipeline = make_pipeline("tiny_llama")
    _embed(pipeline, _prompts((3, 5)))
    before = ep.compiled_programs()
    for lengths in ((1, 8), (6, 7), (2, 4)):
        _embed(pipeline, _prompts(lengths))
    assert ep.compiled_programs() == before


def test_max_batch_size_splits_the_batch():
    """max_batch_size=2: six requests run as three programs' worth of rows; results as one batch."""
    prompts = _prompts()
    whole = _embed(make_pipeline("tiny_qwen3"), prompts)
    split_pipeline = make_pipeline("tiny_qwen3", max_batch_size=2)
    assert split_pipeline.max_batch_size == 2
    assert [len(g) for g in split_pipeline._groups(sorted(LENGTHS))] == [2, 2, 2]
    for a, b in zip(whole, _embed(split_pipeline, prompts)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_replica_batches_are_merged_in_order():
    prompts = _prompts((4, 2, 9))
    ctxs = [EmbeddingsRequestContext(p, request_id=f"r{i}") for i, p in enumerate(prompts)]
    inputs = EmbeddingsGenerationInputs([{ctxs[0].request_id: ctxs[0]}, {c.request_id: c for c in ctxs[1:]}])
    out = make_pipeline("tiny_gpt2").execute(inputs)
    assert list(out) == [RequestID("r0"), RequestID("r1"), RequestID("r2")]
    for p, rid in zip(prompts, out):
        np.testing.assert_allclose(out[rid].embeddings, reference_hidden("tiny_gpt2", p).mean(0), rtol=0, atol=ATOL)
    assert make_pipeline("tiny_gpt2").execute(EmbeddingsGenerationInputs([{}])) == {}


def test_bad_requests_name_the_request():
    pipeline = make_pipeline("tiny_llama")
    assert pipeline.max_length == 128

    def run(tokens, rid="bad-one"):
        good = EmbeddingsRequestContext([1, 2, 3], request_id="good")
        bad = EmbeddingsRequestContext(tokens, request_id=rid)
        return pipeline.execute(EmbeddingsGenerationInputs([{good.request_id: good, bad.request_id: bad}]))

    with pytest.raises(ValueError, match=r"request 'bad-one': no tokens to embed"):
        run([])
    with pytest.raises(ValueError, match=r"request 'bad-one' has 129 tokens, more than max_length 128"):
        run(np.ones(129, np.int64))
    run(np.ones(128, np.int64))  # exactly the context: fine
    with pytest.raises(
        ValueError, match=r"request 'bad-one': token ids must be in \[0, 256\); got \[256, -1\] at positions \[1, 2\]"
    ):
        run([5, 256, -1])

    class NoTokens:
        request_id = RequestID("x")

    with pytest.raises(TypeError, match=r"request 'x': the context \(NoTokens\) has no tokens"):
        pipeline.execute(EmbeddingsGenerationInputs([{RequestID("x"): NoTokens()}]))

    class FloatTokens:
        tokens = np.array([1.0, 2.0])

    with pytest.raises(ValueError, match=r"request 'f': tokens must be integer token ids, got float64"):
        pipeline.execute(EmbeddingsGenerationInputs([{RequestID("f"): FloatTokens()}]))
    with pytest.raises(TypeError, match="expected EmbeddingsGenerationInputs"):
        pipeline.execute({RequestID("a"): EmbeddingsRequestContext([1])})


def test_max_length_of_the_config_bounds_requests():
    config = PipelineConfig(model_path=str(DATA / "tiny_llama"), max_length=16)
    pipeline = EmbeddingsPipeline(config, None, None, {}, None, model=_model("tiny_llama"))
    assert pipeline.max_length == 16
    with pytest.raises(ValueError, match=r"request 'long' has 17 tokens, more than max_length 16"):
        pipeline.execute(
            EmbeddingsGenerationInputs([{RequestID("long"): EmbeddingsRequestContext(np.ones(17, np.int64))}])
        )


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match=r"pooling must be one of \['mean', 'last_token', 'cls'\] or None, got 'max'"):
        make_pipeline("tiny_llama", pooling="max")
    with pytest.raises(ValueError, match="normalize must be a bool"):
        make_pipeline("tiny_llama", normalize="yes")
    with pytest.raises(TypeError, match="must be a maxfx.models.CausalLM"):
        EmbeddingsPipeline(PipelineConfig(model_path=str(DATA / "tiny_llama")), None, None, {}, None, model=object())


def test_release_and_contexts():
    pipeline = make_pipeline("tiny_llama")
    assert pipeline.release(RequestID("never-seen")) is None
    with pytest.raises(TypeError, match="request_id must be a RequestID"):
        pipeline.release(3)
    ctx = EmbeddingsRequestContext([5, 6, 7], request_id="c", model_name="tiny")
    assert isinstance(ctx, EmbeddingsContext)
    assert (ctx.request_id, ctx.tokens.dtype, ctx.active_length, ctx.model_name, ctx.is_done) == (
        RequestID("c"),
        np.int64,
        3,
        "tiny",
        False,
    )
    with pytest.raises(ValueError, match="tokens must be a 1-D sequence of int token ids"):
        EmbeddingsRequestContext([[1, 2]])
    assert pipeline.pipeline_config.pool_embeddings is True
