"""max.pipelines.lib.registry and max.pipelines.architectures: lookups, checks, tokenizers and pipeline factories."""

import asyncio
import importlib
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import maxfx.pipelines as pipelines
from maxfx.graph.weights import WeightsFormat
from maxfx.interfaces import PipelineTask, RequestID, SamplingParams, TextGenerationRequest
from maxfx.models import GPT2LMHeadModel, LlamaForCausalLM
from maxfx.nn.kv_cache import KVCacheStrategy
from maxfx.pipelines import PipelineConfig, RopeType, SupportedEncoding
from maxfx.pipelines.architectures import (
    ARCHITECTURES,
    EMBEDDINGS_ARCHITECTURES,
    TEXT_GENERATION_ARCHITECTURES,
    register_all_models,
)
from maxfx.pipelines.lib.config import ConfigError
from maxfx.pipelines.lib.hf_utils import HuggingFaceRepo
from maxfx.pipelines.lib.registry import (
    PIPELINE_REGISTRY,
    PipelineRegistry,
    SupportedArchitecture,
    get_pipeline_for_task,
)
from maxfx.pipelines.lib.tokenizer import TextTokenizer

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests/data/models"
LLAMA = str(MODELS / "tiny_llama")
FAMILIES = {
    "tiny_llama": "LlamaForCausalLM",
    "tiny_qwen2": "Qwen2ForCausalLM",
    "tiny_qwen3": "Qwen3ForCausalLM",
    "tiny_mistral": "MistralForCausalLM",
    "tiny_phi3": "Phi3ForCausalLM",
    "tiny_gemma": "GemmaForCausalLM",
    "tiny_gpt2": "GPT2LMHeadModel",
}
TEXT = PipelineTask.TEXT_GENERATION
EMBED = PipelineTask.EMBEDDINGS_GENERATION


def _builtin_registry():
    registry = PipelineRegistry([])
    for arch in ARCHITECTURES:
        registry.register(arch)
    return registry


def _arch(name="CustomForCausalLM", task=TEXT, **kwargs):
    fields = dict(
        name=name,
        example_repo_ids=["org/custom"],
        default_encoding="float32",
        supported_encodings={"float32": ["paged"]},
        pipeline_model=LlamaForCausalLM,
        task=task,
        tokenizer=TextTokenizer,
        default_weights_format="safetensors",
    )
    return SupportedArchitecture(**{**fields, **kwargs})


def _with_tokenizer(tmp_path, family):
    """A copy of a family fixture (config + weights) with tiny_llama's tokenizer (the family fixtures have none)."""
    folder = tmp_path / family
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(MODELS / family / name, folder / name)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(MODELS / "tiny_llama" / name, folder / name)
    return str(folder)


# ─── SupportedArchitecture ────────────────────────────────────────────────────


def test_supported_architecture_converts_strings_and_defaults():
    arch = _arch(
        supported_encodings={"float32": ["paged"], "q4_0": ["paged"]}, rope_type="neox", weight_adapters={"gguf": len}
    )
    assert (
        arch.task is TEXT
        and arch.default_encoding is SupportedEncoding.float32
        and arch.default_weights_format is WeightsFormat.safetensors
    )
    assert arch.supported_encodings == {
        SupportedEncoding.float32: [KVCacheStrategy.PAGED],
        SupportedEncoding.q4_0: [KVCacheStrategy.PAGED],
    }
    assert arch.rope_type is RopeType.neox and arch.weight_adapters == {WeightsFormat.gguf: len}
    plain = _arch()
    assert (
        plain.rope_type,
        plain.weight_adapters,
        plain.multi_gpu_supported,
        plain.required_arguments,
        plain.context_validators,
        plain.supports_empty_batches,
    ) == (
        RopeType.none,
        {},
        False,
        {},
        [],
        False,
    )
    assert plain.tokenizer_cls is TextTokenizer and _arch(tokenizer=lambda **kw: None).tokenizer_cls is TextTokenizer
    assert _arch(supported_encodings={"float32"}).supported_encodings == {
        SupportedEncoding.float32: []
    }  # later MAX's set form
    assert _arch() == _arch() and _arch() != _arch(task=EMBED)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"name": ""}, ValueError, "non-empty"),
        ({"default_encoding": "bfloat16"}, ValueError, "must be one of supported_encodings"),
        ({"supported_encodings": {"float33": []}}, ValueError, "float33"),
        ({"task": "dance"}, ValueError, "task"),
        ({"tokenizer": "TextTokenizer"}, TypeError, "callable"),
        ({"context_validators": [1]}, TypeError, "context_validators"),
    ],
)
def test_supported_architecture_rejects_bad_fields(kwargs, error, message):
    with pytest.raises(error, match=message):
        _arch(**kwargs)


# ─── registering ──────────────────────────────────────────────────────────────


def test_register_refuses_duplicates_unless_overridden(caplog):
    registry = PipelineRegistry([_arch()])
    with pytest.raises(
        ValueError,
        match="Refusing to override existing architecture for 'CustomForCausalLM' with task 'text_generation'",
    ):
        registry.register(_arch())
    replacement = _arch(example_repo_ids=["org/other"])
    with caplog.at_level(logging.WARNING, logger="max.pipelines"):
        registry.register(replacement, allow_override=True)
    assert registry.architectures["CustomForCausalLM"] is replacement and "Overriding" in caplog.text
    embed = _arch(task=EMBED, supported_encodings={"float32": []})
    registry.register(embed)  # the same name for another task is a second record
    assert registry.architectures["CustomForCausalLM"] is replacement
    assert {a.task for a in registry.architectures_for("CustomForCausalLM")} == {TEXT, EMBED}
    with pytest.raises(TypeError, match="SupportedArchitecture"):
        registry.register("CustomForCausalLM")
    registry.reset()
    assert registry.architectures == {} and registry.retrieve_architecture("CustomForCausalLM") is None


def test_the_shared_registry_holds_the_builtins_and_register_all_models_is_idempotent():
    assert pipelines.PIPELINE_REGISTRY is PIPELINE_REGISTRY and pipelines.register_all_models is register_all_models
    assert set(PIPELINE_REGISTRY.architectures) >= set(FAMILIES.values())
    for name in FAMILIES.values():
        assert {a.task for a in PIPELINE_REGISTRY.architectures_for(name)} == {TEXT, EMBED}
    register_all_models()
    register_all_models()
    assert len([a for a in ARCHITECTURES if a.name == "GPT2LMHeadModel"]) == 2
    assert len(TEXT_GENERATION_ARCHITECTURES) == len(EMBEDDINGS_ARCHITECTURES) == 7


def test_register_all_models_keeps_a_users_record():
    code = (
        "from maxfx.pipelines import PIPELINE_REGISTRY, register_all_models\n"
        "from maxfx.pipelines.architectures import TEXT_GENERATION_ARCHITECTURES as T\n"
        "import dataclasses\n"
        "PIPELINE_REGISTRY.reset()\n"
        "mine = dataclasses.replace(T[0], example_repo_ids=['me/mine'])\n"
        "PIPELINE_REGISTRY.register(mine)\n"
        "register_all_models()\n"
        "print(PIPELINE_REGISTRY.architectures['LlamaForCausalLM'] is mine, len(PIPELINE_REGISTRY.architectures))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=300
    ).stdout.split()
    assert out == ["True", "7"]


def test_the_builtin_records():
    by_key = {(a.name, a.task): a for a in ARCHITECTURES}
    llama = by_key[("LlamaForCausalLM", TEXT)]
    assert (
        llama.pipeline_model is LlamaForCausalLM
        and llama.rope_type is RopeType.normal
        and llama.tokenizer is TextTokenizer
    )
    assert set(llama.supported_encodings) == {
        SupportedEncoding.float32,
        SupportedEncoding.bfloat16,
        SupportedEncoding.q4_0,
        SupportedEncoding.q4_k,
        SupportedEncoding.q6_k,
        SupportedEncoding.q8_0,
    }
    assert all(s == [KVCacheStrategy.PAGED] for s in llama.supported_encodings.values())
    gpt2 = by_key[("GPT2LMHeadModel", TEXT)]
    assert (
        gpt2.pipeline_model is GPT2LMHeadModel
        and gpt2.rope_type is RopeType.none
        and set(gpt2.supported_encodings) == {SupportedEncoding.float32, SupportedEncoding.bfloat16}
    )
    assert by_key[("Qwen3ForCausalLM", TEXT)].rope_type is RopeType.neox
    assert all(
        s == [] for a in EMBEDDINGS_ARCHITECTURES for s in a.supported_encodings.values()
    )  # embeddings keep no KV cache


# ─── finding architectures ────────────────────────────────────────────────────


@pytest.mark.parametrize(("family", "name"), sorted(FAMILIES.items()))
def test_retrieve_architecture_from_config_json(family, name):
    registry = _builtin_registry()
    folder = str(MODELS / family)
    for source in (HuggingFaceRepo(folder), folder, PipelineConfig(model_path=folder)):
        arch = registry.retrieve_architecture(source)
        assert arch.name == name and arch.task is TEXT
    assert registry.retrieve_architecture(folder, task=EMBED).task is EMBED


def test_retrieve_architecture_from_gguf_metadata(tmp_path):
    registry = _builtin_registry()
    gguf = MODELS / "tiny_llama/tiny_llama-q8_0.gguf"
    assert registry.retrieve_architecture(str(gguf)).name == "LlamaForCausalLM"
    folder = tmp_path / "only_gguf"
    folder.mkdir()
    shutil.copy(gguf, folder / gguf.name)
    repo = HuggingFaceRepo(str(folder))
    assert registry.retrieve_architecture(repo).name == "LlamaForCausalLM"
    assert registry.get_active_huggingface_config(repo) is registry.get_active_huggingface_config(repo)  # cached
    assert registry.get_active_huggingface_config(repo).architectures == ["LlamaForCausalLM"]
    config = PipelineConfig(model_path=str(gguf))
    assert registry.retrieve_architecture(config).name == "LlamaForCausalLM"


def test_deeply_nested_config_json_is_a_value_error_naming_it(tmp_path):
    """Issue 35: the pipelines' config readers turn json's RecursionError into a ValueError naming the file."""
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "x": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}"
    )
    with pytest.raises(ValueError, match=r"config\.json: JSON nested too deeply"):
        _builtin_registry().retrieve_architecture(str(tmp_path))
    with pytest.raises(ValueError, match=r"HuggingFaceRepo: .*config\.json.*JSON nested too deeply"):
        HuggingFaceRepo(str(tmp_path)).supported_encodings  # noqa: B018 - the property reads config.json (quantization_config)


def test_retrieve_architecture_of_an_unknown_model_is_none(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["BertModel"], "model_type": "bert"}')
    registry = _builtin_registry()
    assert registry.retrieve_architecture(str(tmp_path)) is None
    (tmp_path / "config.json").write_text("{}")
    registry.reset()
    assert registry.retrieve_architecture(HuggingFaceRepo(str(tmp_path))) is None
    with pytest.raises(FileNotFoundError, match="no config.json"):
        registry.get_active_huggingface_config(HuggingFaceRepo(str(tmp_path / "..")))
    with pytest.raises(TypeError, match="HuggingFaceRepo"):
        registry.retrieve_architecture(42)


def test_get_active_tokenizer_is_cached():
    registry = PipelineRegistry([])
    repo = HuggingFaceRepo(LLAMA)
    tokenizer = registry.get_active_tokenizer(repo)
    assert tokenizer is registry.get_active_tokenizer(repo) and tokenizer.decode(tokenizer.encode("hi")) == "hi"
    with pytest.raises(ValueError, match="no tokenizer"):
        registry.get_active_tokenizer(HuggingFaceRepo(str(MODELS / "tiny_gpt2")))


def test_retrieve_pipeline_task():
    registry = _builtin_registry()
    assert (
        registry.retrieve_pipeline_task(PipelineConfig(model_path=LLAMA)) is TEXT
    )  # text generation wins when a name serves both
    only = PipelineRegistry([_arch(name="LlamaForCausalLM", task=EMBED, supported_encodings={"float32": []})])
    assert only.retrieve_pipeline_task(PipelineConfig(model_path=LLAMA)) is EMBED
    with pytest.raises(
        ValueError, match="architecture LlamaForCausalLM of .* is not supported; supported: \\(none registered\\)"
    ):
        PipelineRegistry([]).retrieve_pipeline_task(PipelineConfig(model_path=LLAMA))


# ─── tokenizers ───────────────────────────────────────────────────────────────


def test_retrieve_tokenizer_builds_the_architectures_tokenizer(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    config = PipelineConfig(model_path=LLAMA, max_length=40, chat_template=str(template))
    tokenizer = _builtin_registry().retrieve_tokenizer(config)
    assert isinstance(tokenizer, TextTokenizer) and tokenizer.max_length == 40 and tokenizer.eos == 2
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "<user>hi"


def test_context_validators_run_on_new_contexts():
    seen = []

    def reject_long(ctx):
        seen.append(ctx.request_id)
        if len(ctx.prompt_tokens) > 3:
            raise ValueError("too long for this model")

    registry = PipelineRegistry([_arch(name="LlamaForCausalLM", context_validators=[reject_long])])
    tokenizer = registry.retrieve_tokenizer(PipelineConfig(model_path=LLAMA))
    request = TextGenerationRequest(
        request_id=RequestID("a"), model_name="m", prompt="hey", sampling_params=SamplingParams(max_new_tokens=2)
    )
    assert asyncio.run(tokenizer.new_context(request)).prompt_tokens.tolist() == [104, 101, 121]
    with pytest.raises(ValueError, match="too long"):
        asyncio.run(
            tokenizer.new_context(
                TextGenerationRequest(
                    request_id=RequestID("b"),
                    model_name="m",
                    prompt="hello",
                    sampling_params=SamplingParams(max_new_tokens=2),
                )
            )
        )
    assert seen == ["a", "b"]

    class Plain(TextTokenizer):  # a factory that does not take context_validators: new_context is wrapped
        def __init__(self, model_path, *, max_length=None, **unused):
            super().__init__(model_path, max_length=max_length)

    registry = PipelineRegistry(
        [
            _arch(
                name="LlamaForCausalLM",
                tokenizer=lambda model_path, revision, max_length, trust_remote_code, pipeline_config, chat_template: (
                    Plain(model_path, max_length=max_length)
                ),
                context_validators=[reject_long],
            )
        ]
    )
    tokenizer = registry.retrieve_tokenizer(PipelineConfig(model_path=LLAMA))
    with pytest.raises(ValueError, match="too long"):
        asyncio.run(
            tokenizer.new_context(
                TextGenerationRequest(
                    request_id=RequestID("c"),
                    model_name="m",
                    prompt="hello",
                    sampling_params=SamplingParams(max_new_tokens=2),
                )
            )
        )


def test_mistral_and_phi3_get_the_llama_whitespace_fix(tmp_path, monkeypatch):
    calls = []
    original = TextTokenizer.__init__

    def spy(self, model_path, **kwargs):
        calls.append(kwargs.get("enable_llama_whitespace_fix", False))
        original(self, model_path, **kwargs)

    monkeypatch.setattr(TextTokenizer, "__init__", spy)
    registry = _builtin_registry()
    for family in ("tiny_mistral", "tiny_phi3", "tiny_qwen2"):
        registry.retrieve_tokenizer(PipelineConfig(model_path=_with_tokenizer(tmp_path, family)))
    assert calls == [True, True, False]


# ─── checks against the architecture ──────────────────────────────────────────


def test_unknown_architectures_are_named_with_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"architectures": ["BertModel"], "model_type": "bert", "max_position_embeddings": 16}'
    )
    shutil.copy(MODELS / "tiny_llama/model.safetensors", tmp_path / "model.safetensors")
    config = PipelineConfig(model_path=str(tmp_path))
    with pytest.raises(
        ValueError,
        match=(
            "architecture BertModel of .* is not supported; supported: GPT2LMHeadModel, GemmaForCausalLM, "
            "LlamaForCausalLM"
        ),
    ):
        _builtin_registry().retrieve_factory(config)
    with pytest.raises(ValueError, match="override_architecture 'NopeForCausalLM' is not registered"):
        _builtin_registry().retrieve_factory(config, override_architecture="NopeForCausalLM")


def test_an_encoding_the_architecture_does_not_run_is_refused():
    registry = PipelineRegistry(
        [_arch(name="LlamaForCausalLM", default_encoding="bfloat16", supported_encodings={"bfloat16": ["paged"]})]
    )
    with pytest.raises(
        ValueError,
        match="architecture LlamaForCausalLM does not support the encoding 'float32' of .*; supported: bfloat16",
    ):
        registry.retrieve_factory(PipelineConfig(model_path=LLAMA))
    gguf = PipelineConfig(model_path=LLAMA, quantization_encoding="q4_0")
    with pytest.raises(ValueError, match="architecture GPT2LMHeadModel does not support the encoding 'q4_0'"):
        _builtin_registry().retrieve_factory(gguf, override_architecture="GPT2LMHeadModel")


def test_kv_cache_strategy_resolution():
    registry = PipelineRegistry(
        [
            _arch(name="LlamaForCausalLM", supported_encodings={"float32": ["paged"]}),
            _arch(name="LlamaForCausalLM", task=EMBED, supported_encodings={"float32": []}),
        ]
    )
    config = PipelineConfig(model_path=LLAMA)
    assert config.model_config.kv_cache.cache_strategy is KVCacheStrategy.MODEL_DEFAULT
    registry._validate(registry._architecture(config, TEXT, None), config)
    assert (
        config.model_config.kv_cache.cache_strategy is KVCacheStrategy.PAGED
    )  # model_default becomes the architecture's
    embed_config = PipelineConfig(model_path=LLAMA)
    registry._validate(registry._architecture(embed_config, EMBED, None), embed_config)
    assert embed_config.model_config.kv_cache.cache_strategy is KVCacheStrategy.MODEL_DEFAULT  # no KV cache: left alone


def test_required_arguments(caplog):
    arch = _arch(
        name="LlamaForCausalLM", required_arguments={"enable_prefix_caching": True, "enable_chunked_prefill": False}
    )
    registry = PipelineRegistry([arch])
    config = PipelineConfig(model_path=LLAMA)
    with caplog.at_level(logging.INFO, logger="max.pipelines"):
        registry._validate(arch, config)  # both at their defaults: set to what the architecture needs
    assert config.model_config.kv_cache.enable_prefix_caching is True and config.enable_chunked_prefill is False
    assert "requires enable_prefix_caching=True" in caplog.text
    strict = _arch(name="LlamaForCausalLM", required_arguments={"max_num_steps": 4})
    with pytest.raises(
        ConfigError,
        match="architecture LlamaForCausalLM requires max_num_steps=4, got 2 \\(force=True skips this check\\)",
    ):
        PipelineRegistry([strict])._validate(strict, PipelineConfig(model_path=LLAMA, max_num_steps=2))
    forced = PipelineConfig(model_path=LLAMA, max_num_steps=2, force=True)
    PipelineRegistry([strict])._validate(strict, forced)
    assert forced.max_num_steps == 2
    bogus = _arch(name="LlamaForCausalLM", required_arguments={"no_such_option": 1})
    with pytest.raises(ValueError, match="which no config has"):
        PipelineRegistry([bogus])._validate(bogus, PipelineConfig(model_path=LLAMA))


def test_a_task_the_architecture_does_not_serve():
    registry = PipelineRegistry([_arch(name="LlamaForCausalLM")])
    with pytest.raises(ValueError, match="registered for the task 'text_generation', not 'embeddings_generation'"):
        registry.retrieve_factory(PipelineConfig(model_path=LLAMA), task=EMBED)
    with pytest.raises(ValueError, match="no pipeline for the task 'audio_generation'"):
        PipelineRegistry([_arch(name="LlamaForCausalLM", task="audio_generation")]).retrieve_factory(
            PipelineConfig(model_path=LLAMA), task="audio_generation"
        )


def test_a_tokenizer_without_eos_is_refused():
    class NoEos(TextTokenizer):
        @property
        def eos(self):
            return None

    registry = PipelineRegistry(
        [_arch(name="LlamaForCausalLM", task=EMBED, supported_encodings={"float32": []}, tokenizer=NoEos)]
    )
    with pytest.raises(ValueError, match="no EOS token"):
        registry.retrieve_factory(PipelineConfig(model_path=LLAMA), task=EMBED)


# ─── pipelines ────────────────────────────────────────────────────────────────


def test_get_pipeline_for_task():
    embeddings = importlib.import_module("maxfx.pipelines.lib.embeddings_pipeline").EmbeddingsPipeline
    assert get_pipeline_for_task(EMBED, PipelineConfig(model_path=LLAMA)) is embeddings
    assert pipelines.get_pipeline_for_task("embeddings_generation", None) is embeddings
    for task in ("audio_generation", "speech_token_generation"):
        with pytest.raises(ValueError, match="no pipeline for the task"):
            get_pipeline_for_task(task, None)
    with pytest.raises(ValueError, match="unknown task 'painting'"):
        get_pipeline_for_task("painting", None)


def test_a_missing_pipeline_module_is_an_import_error(monkeypatch):
    registry_module = importlib.import_module("maxfx.pipelines.lib.registry")
    monkeypatch.setitem(
        registry_module._PIPELINE_CLASSES, "embeddings", ("maxfx.no_such_pipeline_module", "EmbeddingsPipeline")
    )
    with pytest.raises(ImportError, match="maxfx.no_such_pipeline_module.EmbeddingsPipeline is not available"):
        get_pipeline_for_task(EMBED, None)


def test_get_pipeline_for_text_generation():
    text = pytest.importorskip("maxfx.pipelines.lib.pipeline_variants.text_generation")
    assert get_pipeline_for_task(TEXT, PipelineConfig(model_path=LLAMA)) is text.TextGenerationPipeline


def test_get_pipeline_for_speculative_decoding():
    spec = pytest.importorskip("maxfx.pipelines.lib.speculative_decoding")
    config = PipelineConfig(model_path=LLAMA, draft_model_path=LLAMA)
    assert get_pipeline_for_task(TEXT, config) is spec.SpeculativeDecodingTextGenerationPipeline
    _, factory = _builtin_registry().retrieve_factory(config)  # a draft model picks the speculative pipeline
    assert (
        factory.func is spec.SpeculativeDecodingTextGenerationPipeline
        and factory.keywords["pipeline_model"] is LlamaForCausalLM
    )


def test_retrieve_factory_builds_an_embeddings_pipeline_lazily(tmp_path):
    from maxfx.interfaces import EmbeddingsGenerationInputs
    from maxfx.pipelines.lib.embeddings_pipeline import EmbeddingsPipeline, EmbeddingsRequestContext

    registry = _builtin_registry()
    config = PipelineConfig(model_path=_with_tokenizer(tmp_path, "tiny_qwen3"))
    tokenizer, factory = registry.retrieve_factory(config, task="embeddings_generation")
    assert isinstance(tokenizer, TextTokenizer) and callable(factory)
    assert (
        factory.keywords["pipeline_model"] is LlamaForCausalLM
        and factory.keywords["eos_token_id"] == tokenizer.eos == 2
    )
    assert (
        factory.keywords["weight_adapters"] == {}
        and factory.keywords["tokenizer"] is tokenizer
        and factory.keywords["pipeline_config"] is config
    )
    pipeline = factory()
    assert isinstance(pipeline, EmbeddingsPipeline) and pipeline.pooling == "last_token"  # Qwen3-Embedding style
    ctx = EmbeddingsRequestContext(asyncio.run(tokenizer.encode("hello")))
    out = pipeline.execute(EmbeddingsGenerationInputs([{ctx.request_id: ctx}]))
    assert out[ctx.request_id].embeddings.shape == (64,)
    tokenizer2, llama = registry.retrieve(PipelineConfig(model_path=LLAMA), task=EMBED)
    assert isinstance(llama, EmbeddingsPipeline) and llama.pooling == "mean" and tokenizer2.eos == 2


def test_retrieve_builds_a_text_generation_pipeline_that_generates_the_golden_tokens():
    pytest.importorskip("maxfx.pipelines.lib.pipeline_variants.text_generation")
    from maxfx.interfaces import TextGenerationInputs

    config = PipelineConfig(model_path=LLAMA, max_length=64, max_batch_size=2)
    tokenizer, pipeline = PIPELINE_REGISTRY.retrieve(config)  # SERVING.md section 2's loop
    assert type(pipeline).__name__ == "TextGenerationPipeline" and isinstance(tokenizer, TextTokenizer)
    assert config.model_config.kv_cache.cache_strategy is KVCacheStrategy.PAGED
    golden = np.load(MODELS / "tiny_llama/golden.npz")
    prompt, expected = golden["input_ids"][0].tolist(), golden["greedy_ids"][0].tolist()
    request = TextGenerationRequest(
        request_id=RequestID(),
        model_name="tiny",
        prompt=prompt,
        sampling_params=SamplingParams(top_k=1, max_new_tokens=len(expected), ignore_eos=True),
    )
    ctx = asyncio.run(tokenizer.new_context(request))
    tokens = []
    for _ in range(64):
        out = pipeline.execute(TextGenerationInputs(batches=[{ctx.request_id: ctx}], num_steps=4))[ctx.request_id]
        tokens += out.tokens
        if out.is_done:
            break
    pipeline.release(ctx.request_id)
    assert tokens == expected


def test_custom_architectures_from_the_config(tmp_path):
    module = tmp_path / "my_custom_arch.py"
    module.write_text(
        "from maxfx.models import LlamaForCausalLM\n"
        "from maxfx.pipelines.lib.registry import SupportedArchitecture\n"
        "from maxfx.pipelines.lib.tokenizer import TextTokenizer\n"
        "ARCHITECTURES = [SupportedArchitecture(name='LlamaForCausalLM', example_repo_ids=['me/custom'], "
        "default_encoding='float32',\n"
        "    supported_encodings={'float32': []}, pipeline_model=LlamaForCausalLM, task='embeddings_generation',\n"
        "    tokenizer=TextTokenizer, default_weights_format='safetensors')]\n"
    )
    registry = PipelineRegistry([])
    config = PipelineConfig(model_path=LLAMA, custom_architectures=[f"{tmp_path}:my_custom_arch"])
    tokenizer, factory = registry.retrieve_factory(config, task=EMBED)
    assert registry.architectures["LlamaForCausalLM"].example_repo_ids == ["me/custom"] and tokenizer.eos == 2
    registry.retrieve_factory(config, task=EMBED)  # registering it again is a no-op
    assert len(registry.architectures_for("LlamaForCausalLM")) == 1


def test_importing_the_pipelines_package_does_not_load_jax():
    code = (
        "import sys, maxfx.pipelines, maxfx.pipelines.lib; "
        "print('jax' in sys.modules, 'maxfx.pipelines.lib.registry' in sys.modules, "
        "'PIPELINE_REGISTRY' in dir(maxfx.pipelines))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=120
    ).stdout.split()
    assert out == ["False", "False", "True"]
    assert {"core", "architectures", "PipelineModel", "TextContext", "SupportedArchitecture"} <= set(dir(pipelines))
    assert {"registry", "interfaces", "log_probabilities", "sampling", "token_sampler"} <= set(dir(pipelines.lib))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        pipelines.nope  # noqa: B018


def test_the_shared_registry_answers_with_its_own_records():
    arch = PIPELINE_REGISTRY.retrieve_architecture(HuggingFaceRepo(LLAMA))
    assert arch is PIPELINE_REGISTRY.architectures["LlamaForCausalLM"]
    assert np.all([a.default_encoding in a.supported_encodings for a in ARCHITECTURES])
