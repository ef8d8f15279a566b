"""``max.pipelines``: serving LLMs (configs, tokenizers, pipelines, the registry).

Example:
    >>> from maxfx.pipelines import PipelineConfig, SupportedEncoding
    >>> PipelineConfig(model_path="tests/data/models/tiny_llama", quantization_encoding="q4_0").model_config.quantization_encoding is SupportedEncoding.q4_0
    True
"""

from maxfx.pipelines.lib.config import (
    AudioGenerationConfig,
    KVCacheConfig,
    LoRAConfig,
    MAXModelConfig,
    PipelineConfig,
    PipelineRole,
    PrependPromptSpeechTokens,
    ProfilingConfig,
    PrometheusMetricsMode,
    RepoType,
    RopeType,
    SamplingConfig,
    SpeculativeConfig,
    SupportedEncoding,
)
from maxfx.pipelines.lib.hf_utils import HuggingFaceRepo

__all__ = [
    "AudioGenerationConfig",
    "HuggingFaceRepo",
    "KVCacheConfig",
    "LoRAConfig",
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
    "SupportedEncoding",
]
