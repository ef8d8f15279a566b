"""maxfx.pipelines.lib.config: MAX's defaults, flat-kwarg routing, resolve()'s checks and derived values."""

import dataclasses
import json
import logging
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lowering.quantization import QuantizationEncoding
from maxfx.driver import DeviceSpec
from maxfx.dtype import DType
from maxfx.engine import GPUProfilingMode
from maxfx.interfaces import SamplingParamsGenerationConfigDefaults
from maxfx.nn.kv_cache import KVCacheStrategy
from maxfx.pipelines.lib.config import (
    AudioGenerationConfig,
    ConfigError,
    KVCacheConfig,
    LoRAConfig,
    MAXModelConfig,
    PipelineConfig,
    PipelineRole,
    PrependPromptSpeechTokens,
    ProfilingConfig,
    PrometheusMetricsMode,
    RopeType,
    SamplingConfig,
    SpeculativeConfig,
    SpeculativeMethod,
    SupportedEncoding,
    UnknownConfigOptionError,
)
from maxfx.pipelines.lib.config._base import options
from maxfx.pipelines.lib.hf_utils import RepoNotAvailableOfflineError

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "data" / "models"
LLAMA = str(MODELS / "tiny_llama")
GPT2 = str(MODELS / "tiny_gpt2")


@pytest.fixture(autouse=True)
def _no_profiling_env(monkeypatch):
    monkeypatch.delenv("MODULAR_ENABLE_PROFILING", raising=False)


def _copy_model(src: str, dst: Path, *names: str) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(Path(src) / name, dst / name)
    return dst


# ─── defaults ─────────────────────────────────────────────────────────────────


def test_pipeline_config_defaults_are_maxs():
    defaults = {
        f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
        for f in options(PipelineConfig)
    }
    expected = {
        "max_length": None,
        "pipeline_role": PipelineRole.PrefillAndDecode,
        "max_batch_size": None,
        "max_ce_batch_size": 192,
        "max_queue_size_tg": None,
        "min_batch_size_tg": None,
        "ep_size": 1,
        "ce_delay_ms": 0.0,
        "enable_prioritize_first_decode": False,
        "experimental_background_queue": False,
        "enable_chunked_prefill": True,
        "enable_in_flight_batching": False,
        "max_num_steps": -1,
        "prefill_chunk_size": 8192,
        "enable_echo": False,
        "pool_embeddings": True,
        "chat_template": None,
        "use_experimental_kernels": "false",
        "use_vendor_blas": "false",
        "pdl_level": "0",
        "custom_architectures": [],
        "execute_empty_batches": False,
        "max_batch_context_length": None,
        "force": False,
    }
    zmq = defaults.pop("zmq_endpoint_base")
    assert defaults == expected
    assert (
        zmq.startswith("ipc://") and zmq != PipelineConfig.__dataclass_fields__["zmq_endpoint_base"].default_factory()
    )


def test_nested_config_defaults_are_maxs():
    kv = KVCacheConfig()
    assert kv.kv_cache_format is None and KVCacheConfig(kv_cache_format="DType.float16").kv_cache_format == "float16"
    assert (
        kv.cache_strategy,
        kv.kv_cache_page_size,
        kv.enable_prefix_caching,
        kv.enable_kvcache_swapping_to_host,
        kv.device_memory_utilization,
        kv.host_kvcache_swap_space_gb,
    ) == (
        KVCacheStrategy.MODEL_DEFAULT,
        128,
        False,
        False,
        0.9,
        50.0,
    )
    s = SamplingConfig()
    assert (
        s.in_dtype,
        s.out_dtype,
        s.enable_structured_output,
        s.enable_variable_logits,
        s.enable_penalties,
        s.do_penalties,
        s.enable_min_tokens,
    ) == (
        DType.float32,
        DType.float32,
        False,
        False,
        False,
        False,
        False,
    )
    lora = LoRAConfig()
    assert (lora.enable_lora, lora.lora_paths, lora.max_lora_rank, lora.max_num_loras) == (False, [], 16, 100)
    assert ProfilingConfig().gpu_profiling is GPUProfilingMode.OFF
    spec = SpeculativeConfig()
    assert (spec.speculative_method, spec.num_speculative_tokens) == (SpeculativeMethod.STANDALONE, 2)
    m = MAXModelConfig()
    assert (
        m.model_path,
        m.served_model_name,
        m.weight_path,
        m.quantization_encoding,
        m.huggingface_model_revision,
        m.huggingface_weight_revision,
    ) == ("", None, [], None, "main", "main")
    assert (
        m.trust_remote_code,
        m.force_download,
        m.rope_type,
        m.use_subgraphs,
        m.data_parallel_degree,
        m.vision_config_overrides,
    ) == (False, False, None, True, 1, {})
    assert (
        m.device_specs == [DeviceSpec.cpu()]
        and isinstance(m.kv_cache, KVCacheConfig)
        and m.kv_cache_config is m.kv_cache
    )


def test_enums_have_maxs_members():
    assert [e.value for e in SupportedEncoding] == [
        "float32",
        "bfloat16",
        "q4_k",
        "q4_0",
        "q6_k",
        "q8_0",
        "float8_e4m3fn",
        "float4_e2m1fnx2",
        "gptq",
    ]
    assert [e.value for e in RopeType] == ["none", "normal", "neox", "longrope", "yarn"]
    assert [e.value for e in PipelineRole] == ["prefill_and_decode", "prefill_only", "decode_only"]
    assert PipelineRole.DecodeOnly.uses_dispatch_service and not PipelineRole.PrefillAndDecode.uses_dispatch_service
    assert [e.value for e in PrometheusMetricsMode] == ["instrument_only", "launch_server", "launch_multiproc_server"]
    assert [e.value for e in PrependPromptSpeechTokens] == ["never", "once", "rolling"]
    assert SupportedEncoding.parse_from_file_name("Llama-3-Q4_K_M.gguf") is SupportedEncoding.q4_k
    assert SupportedEncoding.parse_from_file_name("m-q8_0.gguf") is SupportedEncoding.q8_0
    assert SupportedEncoding.parse_from_file_name("model.gguf") is None
    assert SupportedEncoding.q4_0.dtype is DType.uint8 and SupportedEncoding.bfloat16.cache_dtype is DType.bfloat16
    assert SupportedEncoding.q8_0.supported_on(DeviceSpec.cpu()) and SupportedEncoding.bfloat16.supported_on(
        DeviceSpec.accelerator(0)
    )


def test_option_names_never_overlap_between_configs():
    groups = [
        PipelineConfig,
        MAXModelConfig,
        KVCacheConfig,
        SamplingConfig,
        LoRAConfig,
        ProfilingConfig,
        SpeculativeConfig,
    ]
    seen = {}
    for cls in groups:
        for f in options(cls):
            if f.metadata.get("nested"):
                continue
            assert f.name not in seen, f"{f.name} is in {seen.get(f.name)} and {cls.__name__}"
            seen[f.name] = cls.__name__


# ─── routing ──────────────────────────────────────────────────────────────────


def test_flat_kwargs_reach_the_config_that_owns_them():
    config = PipelineConfig(
        model_path=LLAMA,
        max_length=64,
        max_batch_size=16,
        prefill_chunk_size=32,
        kv_cache_page_size=16,
        enable_prefix_caching=True,
        device_memory_utilization=0.5,
        quantization_encoding="q8_0",
        enable_penalties=True,
        enable_min_tokens=True,
        top_k=5,
        enable_structured_output=True,
        gpu_profiling="on",
        served_model_name="tiny",
    )
    assert (config.max_length, config.max_batch_size, config.prefill_chunk_size) == (64, 16, 32)
    m = config.model_config
    assert (m.kv_cache.kv_cache_page_size, m.kv_cache.enable_prefix_caching, m.kv_cache.device_memory_utilization) == (
        16,
        True,
        0.5,
    )
    assert m.quantization_encoding is SupportedEncoding.q8_0 and m.served_model_name == "tiny" == m.model_name
    s = config.sampling_config
    assert (s.enable_penalties, s.enable_min_tokens, s.top_k, s.enable_structured_output) == (True, True, 5, True)
    assert config.profiling_config.gpu_profiling is GPUProfilingMode.ON
    assert config.lora_config is None and config.draft_model_config is None and config.speculative_config is None


def test_do_penalties_is_the_old_name_of_enable_penalties():
    config = PipelineConfig(model_path=LLAMA, do_penalties=True)
    assert config.sampling_config.enable_penalties and config.sampling_config.do_penalties


def test_model_is_an_alias_of_model_path():
    assert PipelineConfig(model=LLAMA).model_config.model_path == LLAMA
    with pytest.raises(ConfigError, match="model and model_path"):
        MAXModelConfig(model=LLAMA, model_path=GPT2)


def test_whole_nested_configs_are_taken_and_flat_options_win():
    sampling = SamplingConfig(enable_min_tokens=True)
    config = PipelineConfig(
        model_config=MAXModelConfig(model_path=LLAMA, kv_cache=KVCacheConfig(kv_cache_page_size=32)),
        sampling_config=sampling,
        enable_penalties=True,
    )
    assert config.model_config.kv_cache.kv_cache_page_size == 32
    assert config.sampling_config.enable_min_tokens and config.sampling_config.enable_penalties
    with pytest.raises(ConfigError, match="sampling_config must be a SamplingConfig"):
        PipelineConfig(model_path=LLAMA, sampling_config={"enable_penalties": True})


def test_unknown_kwarg_names_it_and_suggests_the_closest_option():
    with pytest.raises(UnknownConfigOptionError, match=r"'max_batchsize' \(did you mean 'max_batch_size'\?\)") as info:
        PipelineConfig(model_path=LLAMA, max_batchsize=4)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    with pytest.raises(UnknownConfigOptionError, match=r"'kv_page_size' \(did you mean 'kv_cache_page_size'\?\)"):
        PipelineConfig(model_path=LLAMA, kv_page_size=16)
    with pytest.raises(UnknownConfigOptionError, match="'zzz'; PipelineConfig.help"):
        PipelineConfig(model_path=LLAMA, zzz=1)


def test_option_paths_say_where_each_option_lands():
    paths = PipelineConfig.option_paths()
    assert paths["max_batch_size"] == "max_batch_size"
    assert paths["kv_cache_page_size"] == "model_config.kv_cache.kv_cache_page_size"
    assert paths["enable_prefix_caching"] == "model_config.kv_cache.enable_prefix_caching"
    assert paths["quantization_encoding"] == "model_config.quantization_encoding"
    assert paths["enable_penalties"] == paths["do_penalties"] == "sampling_config.enable_penalties"
    assert paths["draft_model_path"] == "draft_model_config.model_path"
    assert paths["draft_kv_cache_page_size"] == "draft_model_config.kv_cache.kv_cache_page_size"
    assert paths["num_speculative_tokens"] == "speculative_config.num_speculative_tokens"
    assert paths["max_lora_rank"] == "lora_config.max_lora_rank"
    config = PipelineConfig(model_path=LLAMA, draft_model_path=LLAMA, enable_lora=True)
    for path in paths.values():
        obj = config
        for part in path.split("."):
            obj = getattr(obj, part)  # every path exists on a built config


def test_help_documents_every_option():
    docs = PipelineConfig.help()
    assert set(PipelineConfig.option_paths()) <= set(docs)
    assert all(isinstance(text, str) and text for text in docs.values())
    assert "192" in docs["max_ce_batch_size"] and "8192" in docs["prefill_chunk_size"]
    assert docs["draft_model_path"].startswith("Draft model:")
    assert KVCacheConfig.help()["device_memory_utilization"].startswith("Share of free device memory")
    assert "audio_decoder" in AudioGenerationConfig.help() and "max_length" in AudioGenerationConfig.help()


# ─── resolve(): checks ────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_length": 0}, r"PipelineConfig\.max_length must be an int >= 1 or None, got 0"),
        ({"max_batch_size": 0}, r"PipelineConfig\.max_batch_size must be an int >= 1 or None, got 0"),
        ({"max_ce_batch_size": 0}, r"PipelineConfig\.max_ce_batch_size must be an int >= 1, got 0"),
        ({"prefill_chunk_size": 0}, r"PipelineConfig\.prefill_chunk_size must be an int >= 1, got 0"),
        ({"max_num_steps": 0}, r"PipelineConfig\.max_num_steps must be an int >= 1 or -1, got 0"),
        ({"max_length": "64"}, r"PipelineConfig\.max_length must be an int >= 1 or None, got '64'"),
        ({"ce_delay_ms": -1.0}, r"PipelineConfig\.ce_delay_ms must be a number >= 0.0, got -1.0"),
        (
            {"pipeline_role": "both"},
            r"PipelineConfig\.pipeline_role must be one of 'prefill_and_decode', 'prefill_only', 'decode_only', got "
            r"'both'",
        ),
        ({"kv_cache_page_size": 0}, r"KVCacheConfig\.kv_cache_page_size must be an int >= 1, got 0"),
        (
            {"device_memory_utilization": 0.0},
            r"KVCacheConfig\.device_memory_utilization must be a number > 0.0 and <= 1.0, got 0.0",
        ),
        (
            {"device_memory_utilization": 1.5},
            r"KVCacheConfig\.device_memory_utilization must be a number > 0.0 and <= 1.0, got 1.5",
        ),
        (
            {"cache_strategy": "continuous"},
            r"KVCacheConfig\.cache_strategy must be one of 'model_default', 'paged', got 'continuous'",
        ),
        (
            {"kv_cache_format": "int8"},
            r"KVCacheConfig\.kv_cache_format must be one of \('float32', 'float16', 'bfloat16'\) or None, got 'int8'",
        ),
        ({"quantization_encoding": "q3"}, r"MAXModelConfig\.quantization_encoding must be one of 'float32'.*got 'q3'"),
        (
            {"quantization_encoding": "q4_k"},
            r"MAXModelConfig\.quantization_encoding must be an encoding the weights of .* come in \(q4_0, q8_0, "
            r"float32\), got 'q4_k'",
        ),
        ({"data_parallel_degree": 0}, r"MAXModelConfig\.data_parallel_degree must be an int >= 1, got 0"),
        ({"max_lora_rank": 0, "enable_lora": True}, r"LoRAConfig\.max_lora_rank must be an int >= 1, got 0"),
        ({"enable_penalties": "maybe"}, r"SamplingConfig\.enable_penalties must be a bool, got 'maybe'"),
        ({"device_specs": "gpu:7"}, r"MAXModelConfig\.device_specs must name devices of this machine"),
        (
            {"device_specs": "tpu"},
            r"MAXModelConfig\.device_specs must be DeviceSpecs or 'cpu', 'gpu', 'gpu:0,1', got 'tpu'",
        ),
        (
            {"max_length": 512},
            r"PipelineConfig\.max_length must be at most the model's max_position_embeddings \(128\).*got 512",
        ),
    ],
)
def test_invalid_values_raise_a_config_error_naming_the_option(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        PipelineConfig(model_path=LLAMA, **kwargs)


def test_config_errors_are_value_errors():
    with pytest.raises(ValueError):
        PipelineConfig(model_path=LLAMA, max_length=-1)


def test_model_path_is_required():
    with pytest.raises(
        ConfigError,
        match=(
            r"MAXModelConfig\.model_path must be a local folder, a \.gguf file "
            r"or a Hugging Face repo id in the local cache, got ''"
        ),
    ):
        PipelineConfig()


def test_a_repo_id_that_is_not_cached_is_not_available_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(
        RepoNotAvailableOfflineError,
        match=r"MAXModelConfig\.model_path: 'some-org/some-model' \(revision 'main'\) is not available offline",
    ):
        PipelineConfig(model_path="some-org/some-model")


def test_max_length_over_the_models_limit_is_kept_with_force(caplog):
    with caplog.at_level(logging.WARNING, logger="max.pipelines"):
        config = PipelineConfig(model_path=LLAMA, max_length=512, force=True)
    assert config.max_length == 512 and "exceeds the model's limit 128" in caplog.text


def test_resolve_checks_again_after_a_change():
    config = PipelineConfig(model_path=LLAMA)
    config.max_batch_size = 0
    with pytest.raises(ConfigError, match="max_batch_size"):
        config.resolve()
    config.max_batch_size = 8
    config.model_config.kv_cache.kv_cache_page_size = -4
    with pytest.raises(ConfigError, match="kv_cache_page_size"):
        config.resolve()


# ─── resolve(): derived values ────────────────────────────────────────────────


def test_resolve_fills_in_length_steps_encoding_and_weights():
    config = PipelineConfig(model_path=LLAMA)
    m = config.model_config
    assert config.max_length == 128 and config.max_num_steps == 1  # the CPU's default
    assert m.quantization_encoding is SupportedEncoding.float32 and m.weight_path == [Path("model.safetensors")]
    assert m.resolved_weight_paths() == [Path(LLAMA) / "model.safetensors"] and m.local_model_path == Path(LLAMA)
    assert m.weights_size() == (Path(LLAMA) / "model.safetensors").stat().st_size
    assert m.served_model_name == LLAMA == m.model_name and m.default_device_spec == DeviceSpec.cpu()
    assert (
        m.huggingface_config.architectures == ["LlamaForCausalLM"]
        and m.huggingface_config.max_position_embeddings == 128
    )
    assert m.huggingface_model_repo.repo_id == LLAMA == m.huggingface_weight_repo_id
    assert PipelineConfig(model_path=GPT2).max_length == 128  # GPT-2's n_positions


@pytest.mark.parametrize(
    ("encoding", "weights", "graph"),
    [
        ("q8_0", "tiny_llama-q8_0.gguf", None),
        ("q4_0", "tiny_llama-q4_0.gguf", QuantizationEncoding.Q4_0),
        ("float32", "model.safetensors", None),
    ],
)
def test_an_encoding_picks_its_weight_files(encoding, weights, graph):
    config = PipelineConfig(model_path=LLAMA, quantization_encoding=encoding)
    assert config.model_config.weight_path == [Path(weights)]
    assert config.graph_quantization_encoding is graph
    expected = Path(LLAMA) / weights if weights.endswith(".gguf") else Path(LLAMA)
    assert config.model_config.local_model_path == expected


def test_graph_quantization_encoding_needs_an_encoding():
    with pytest.raises(ConfigError, match="quantization_encoding must be set"):
        MAXModelConfig(model_path=LLAMA).graph_quantization_encoding


def test_a_gguf_model_path_is_its_own_weights():
    gguf = str(MODELS / "tiny_llama" / "tiny_llama-q4_0.gguf")
    config = PipelineConfig(model_path=gguf)
    m = config.model_config
    assert (
        m.quantization_encoding is SupportedEncoding.q4_0
        and m.weight_path == [Path(gguf)]
        and m.local_model_path == Path(gguf)
    )
    assert m.huggingface_config.architectures == ["LlamaForCausalLM"]  # the folder's config.json


def test_a_lone_gguf_describes_itself(tmp_path):
    gguf = shutil.copy(
        MODELS / "tiny_llama" / "tiny_llama-q8_0.gguf", tmp_path / "model.gguf"
    )  # no encoding in the name, no config.json
    config = PipelineConfig(model_path=str(gguf))
    cfg = config.model_config.huggingface_config
    assert config.model_config.quantization_encoding is SupportedEncoding.q8_0  # from general.file_type
    assert (
        cfg.architectures,
        cfg.model_type,
        cfg.max_position_embeddings,
        cfg.num_key_value_heads,
        cfg.vocab_size,
    ) == (["LlamaForCausalLM"], "llama", 128, 2, 256)
    assert config.max_length == 128


def test_a_weight_path_alone_gives_the_model_path():
    config = PipelineConfig(weight_path=[str(MODELS / "tiny_llama" / "tiny_llama-q8_0.gguf")])
    assert (
        config.model_config.model_path == LLAMA and config.model_config.quantization_encoding is SupportedEncoding.q8_0
    )


def test_a_weight_path_must_agree_with_the_encoding():
    with pytest.raises(ConfigError, match=r"quantization_encoding must match the weights' encoding 'q8_0'.*got 'q4_0'"):
        PipelineConfig(model_path=LLAMA, weight_path=["tiny_llama-q8_0.gguf"], quantization_encoding="q4_0")
    with pytest.raises(
        ConfigError, match=r"weight_path entry '.*missing\.safetensors' must be an existing weight file"
    ):
        PipelineConfig(model_path=LLAMA, weight_path=["missing.safetensors"])


def test_float32_weights_load_as_bfloat16_only_when_casting_is_allowed():
    with pytest.raises(ConfigError, match="come in"):
        PipelineConfig(model_path=GPT2, quantization_encoding="bfloat16")
    with pytest.raises(ConfigError, match="quantization_encoding must be set when allow_safetensors"):
        PipelineConfig(model_path=GPT2, allow_safetensors_weights_fp32_bf6_bidirectional_cast=True)
    m = PipelineConfig(
        model_path=GPT2, quantization_encoding="bfloat16", allow_safetensors_weights_fp32_bf6_bidirectional_cast=True
    ).model_config
    assert (
        m.quantization_encoding is SupportedEncoding.bfloat16
        and m._applied_dtype_cast_from is SupportedEncoding.float32
    )
    assert m.weight_path == [Path("model.safetensors")]


def test_generation_config_sets_sampling_defaults_and_switches(tmp_path):
    folder = _copy_model(LLAMA, tmp_path / "m", "config.json", "model.safetensors")
    (folder / "generation_config.json").write_text(
        json.dumps({"temperature": 0.7, "top_k": 50, "repetition_penalty": 1.1, "min_new_tokens": 2, "eos_token_id": 2})
    )
    config = PipelineConfig(model_path=str(folder))
    defaults = config.model_config.sampling_params_defaults
    assert isinstance(defaults, SamplingParamsGenerationConfigDefaults)
    assert defaults.values_to_update == {
        "temperature": 0.7,
        "repetition_penalty": 1.1,
        "min_new_tokens": 2,
    }  # top_k 50 is transformers' default
    assert config.sampling_config.enable_penalties and config.sampling_config.enable_min_tokens
    explicit = PipelineConfig(model_path=str(folder), enable_penalties=False)
    assert not explicit.sampling_config.enable_penalties
    assert MAXModelConfig(model_path=LLAMA).sampling_params_defaults.values_to_update == {}


def test_echo_switches_on_variable_logits():
    assert PipelineConfig(model_path=LLAMA, enable_echo=True).sampling_config.enable_variable_logits
    assert not PipelineConfig(model_path=LLAMA).sampling_config.enable_variable_logits


# ─── draft model, LoRA ────────────────────────────────────────────────────────


def test_draft_options_build_the_draft_model(caplog):
    with caplog.at_level(logging.WARNING, logger="max.pipelines"):
        config = PipelineConfig(
            model_path=LLAMA,
            draft_model_path=LLAMA,
            draft_quantization_encoding="q4_0",
            num_speculative_tokens=3,
            enable_penalties=True,
            enable_prefix_caching=True,
        )
    draft = config.draft_model_config
    assert draft.model_path == LLAMA and draft.quantization_encoding is SupportedEncoding.q4_0
    assert config.speculative_config.num_speculative_tokens == 3 and config.speculative_config.is_standalone()
    assert config.sampling_config.enable_variable_logits
    assert not config.sampling_config.enable_penalties and not config.model_config.kv_cache.enable_prefix_caching
    assert config.model_config.kv_cache.device_memory_utilization == pytest.approx(
        0.63
    ) and draft.kv_cache.device_memory_utilization == pytest.approx(0.27)
    assert "penalties are not supported with speculative decoding" in caplog.text
    kept = PipelineConfig(
        model_path=LLAMA,
        draft_model_path=LLAMA,
        enable_prefix_caching=True,
        force=True,
        draft_device_memory_utilization=0.2,
    )
    assert (
        kept.model_config.kv_cache.enable_prefix_caching
        and kept.draft_model_config.kv_cache.device_memory_utilization == 0.2
    )


def test_draft_model_rules():
    with pytest.raises(ConfigError, match=r"draft_model_path must be set to use draft_quantization_encoding"):
        PipelineConfig(model_path=LLAMA, draft_quantization_encoding="q4_0")
    with pytest.raises(
        ConfigError, match=r"draft_model_path must be set for speculative decoding options \(num_speculative_tokens\)"
    ):
        PipelineConfig(model_path=LLAMA, num_speculative_tokens=3)
    with pytest.raises(ConfigError, match=r"enable_echo must be False with speculative decoding"):
        PipelineConfig(model_path=LLAMA, draft_model_path=LLAMA, enable_echo=True)
    with pytest.raises(ConfigError, match=r"enable_structured_output must be False with speculative decoding"):
        PipelineConfig(model_path=LLAMA, draft_model_path=LLAMA, enable_structured_output=True)
    with pytest.raises(
        ConfigError, match=r"draft_model_path must name a model with the target's architecture \(\['LlamaForCausalLM'\]"
    ):
        PipelineConfig(model_path=LLAMA, draft_model_path=GPT2)


def test_lora_config_exists_only_with_enable_lora(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    config = PipelineConfig(model_path=LLAMA, enable_lora=True, lora_paths=[f"chat={adapter}"], max_num_loras=4)
    assert config.lora_config.adapter_paths() == {"chat": adapter} and config.lora_config.max_num_loras == 4
    with pytest.raises(ConfigError, match=r"enable_lora must be True to use lora_paths"):
        PipelineConfig(model_path=LLAMA, lora_paths=[str(adapter)])
    with pytest.raises(ConfigError, match=r"lora_paths entry .* must be an existing LoRA adapter path"):
        PipelineConfig(model_path=LLAMA, enable_lora=True, lora_paths=[str(tmp_path / "nope")])


# ─── other members ────────────────────────────────────────────────────────────


def test_chat_template_file(tmp_path):
    plain = tmp_path / "t.jinja"
    plain.write_text("{{ messages }}")
    wrapped = tmp_path / "t.json"
    wrapped.write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert PipelineConfig(model_path=LLAMA, chat_template=str(plain)).retrieve_chat_template() == "{{ messages }}"
    assert PipelineConfig(model_path=LLAMA, chat_template=wrapped).retrieve_chat_template() == "{{ x }}"
    assert PipelineConfig(model_path=LLAMA).retrieve_chat_template() is None
    with pytest.raises(ConfigError, match=r"chat_template must be an existing template file"):
        PipelineConfig(model_path=LLAMA, chat_template=str(tmp_path / "missing.jinja"))


def test_custom_architectures_are_imported(tmp_path, monkeypatch):
    (tmp_path / "my_arch.py").write_text("ARCHITECTURES = ['arch-a']\n")
    (tmp_path / "empty_arch.py").write_text("ARCHITECTURES = []\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    config = PipelineConfig(model_path=LLAMA, custom_architectures=[f"{tmp_path}:my_arch"])
    assert config.custom_architecture_list == ["arch-a"]
    with pytest.raises(ConfigError, match=r"must expose a non-empty ARCHITECTURES list"):
        PipelineConfig(model_path=LLAMA, custom_architectures=[f"{tmp_path}:empty_arch"])
    with pytest.raises(ConfigError, match=r"must be an importable module: ModuleNotFoundError"):
        PipelineConfig(model_path=LLAMA, custom_architectures=["no_such_module_xyz"])


def test_logging_and_session(caplog):
    config = PipelineConfig(model_path=LLAMA, max_batch_size=2, gpu_profiling="detailed")
    with caplog.at_level(logging.INFO, logger="max.pipelines"):
        config.log_basic_config()
        config.log_pipeline_info()
    assert (
        "LlamaForCausalLM" in caplog.text and "max_batch_size=2" in caplog.text and "kv_cache_page_size" in caplog.text
    )

    class Session:
        modes = []

        def gpu_profiling(self, mode):
            self.modes.append(mode)

    session = Session()
    config.configure_session(session)
    assert session.modes == [GPUProfilingMode.DETAILED]


@pytest.mark.parametrize(
    ("env", "mode"),
    [
        ("1", GPUProfilingMode.ON),
        ("on", GPUProfilingMode.ON),
        ("detailed", GPUProfilingMode.DETAILED),
        ("0", GPUProfilingMode.OFF),
    ],
)
def test_profiling_follows_the_environment(monkeypatch, env, mode):
    monkeypatch.setenv("MODULAR_ENABLE_PROFILING", env)
    assert ProfilingConfig().gpu_profiling is mode


def test_profiling_environment_must_be_a_mode(monkeypatch):
    monkeypatch.setenv("MODULAR_ENABLE_PROFILING", "loud")
    with pytest.raises(ConfigError, match="MODULAR_ENABLE_PROFILING must be one of"):
        ProfilingConfig()


def test_audio_generation_config():
    config = AudioGenerationConfig.from_flags(
        {"audio_decoder": "dac", "chunk_size": "10,20", "buffer": "4", "prepend_prompt_speech_tokens": "rolling"},
        model_path=LLAMA,
        max_batch_size=2,
    )
    assert (config.audio_decoder, config.chunk_size, config.buffer, config.max_batch_size) == ("dac", [10, 20], 4, 2)
    assert (
        config.prepend_prompt_speech_tokens is PrependPromptSpeechTokens.ROLLING
        and config.prometheus_metrics_mode is PrometheusMetricsMode.INSTRUMENT_ONLY
    )
    assert AudioGenerationConfig("dac", model_path=LLAMA).block_causal is False
    with pytest.raises(ConfigError, match=r"AudioGenerationConfig\.audio_decoder must name"):
        AudioGenerationConfig("", model_path=LLAMA)
    with pytest.raises(ConfigError, match=r"AudioGenerationConfig\.chunk_size must be ints >= 1"):
        AudioGenerationConfig("dac", model_path=LLAMA, chunk_size="a,b")
    with pytest.raises(ConfigError, match=r"audio_flags must only hold audio options"):
        AudioGenerationConfig.from_flags({"audio_decoder": "dac", "max_length": 3}, model_path=LLAMA)


def test_a_config_pickles():
    config = PipelineConfig(model_path=LLAMA, kv_cache_page_size=16, draft_model_path=LLAMA)
    again = pickle.loads(pickle.dumps(config))
    assert (
        again == config
        and again.model_config.kv_cache.kv_cache_page_size == 16
        and again.draft_model_config.model_path == LLAMA
    )


def test_importing_the_configs_does_not_load_jax():
    code = "import sys, maxfx.pipelines.lib.config; print('jax' in sys.modules, 'maxfx.models' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True, timeout=120
    ).stdout.split()
    assert out == ["False", "False"]
