"""``max.pipelines.lib.config``: `PipelineConfig` and the configs nested in it.

`PipelineConfig(**kwargs)` routes each flat option to the config that owns it
(`PipelineConfig.option_paths` lists where each lands) and resolves them:

- `MAXModelConfig` (``config.model_config``): model path, weights, encoding, devices;
  its `KVCacheConfig` is ``config.model_config.kv_cache``.
- `SamplingConfig` (``config.sampling_config``): sampling-graph switches.
- `LoRAConfig` (``config.lora_config``, None unless ``enable_lora``).
- `ProfilingConfig` (``config.profiling_config``), `SpeculativeConfig` and the draft
  model's `MAXModelConfig` (``config.draft_model_config``, from ``draft_*`` options).

Importing this package is cheap: JAX-backed modules load when a config is built.

Example:
    >>> config = PipelineConfig(model_path="tests/data/models/tiny_llama", max_length=64, enable_prefix_caching=True)
    >>> config.max_length, config.model_config.kv_cache.enable_prefix_caching, config.lora_config
    (64, True, None)
"""

from maxfx.pipelines.lib.config._base import ConfigError, MAXConfig, UnknownConfigOptionError
from maxfx.pipelines.lib.config._enums import (
    PipelineRole,
    PrependPromptSpeechTokens,
    PrometheusMetricsMode,
    RepoType,
    RopeType,
    SupportedEncoding,
)
from maxfx.pipelines.lib.config._model_files import HuggingFaceConfig
from maxfx.pipelines.lib.config.audio_generation_config import AudioGenerationConfig
from maxfx.pipelines.lib.config.kv_cache_config import KVCacheConfig
from maxfx.pipelines.lib.config.lora_config import LoRAConfig
from maxfx.pipelines.lib.config.model_config import MAXModelConfig
from maxfx.pipelines.lib.config.pipeline_config import DEFAULT_PREFILL_CHUNK_SIZE, PipelineConfig
from maxfx.pipelines.lib.config.profiling_config import ProfilingConfig
from maxfx.pipelines.lib.config.sampling_config import SamplingConfig
from maxfx.pipelines.lib.config.speculative_config import SpeculativeConfig, SpeculativeMethod

__all__ = [
    "DEFAULT_PREFILL_CHUNK_SIZE",
    "AudioGenerationConfig",
    "ConfigError",
    "HuggingFaceConfig",
    "KVCacheConfig",
    "LoRAConfig",
    "MAXConfig",
    "MAXModelConfig",
    "PipelineConfig",
    "PipelineRole",
    "PrependPromptSpeechTokens",
    "ProfilingConfig",
    "PrometheusMetricsMode",
    "RepoType",
    "RopeType",
    "SamplingConfig",
    "SpeculativeConfig",
    "SpeculativeMethod",
    "SupportedEncoding",
    "UnknownConfigOptionError",
]
