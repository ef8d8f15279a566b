"""``max.pipelines``: serving LLMs (configs, tokenizers, pipelines, the registry).

Example:
    >>> from maxfx.pipelines import PipelineConfig, SupportedEncoding
    >>> PipelineConfig(model_path="tests/data/models/tiny_llama",
    ...     quantization_encoding="q4_0").model_config.quantization_encoding is SupportedEncoding.q4_0
    True

The registry, the architectures, the model interfaces and the contexts load on first
use (they import JAX), so importing the configs stays cheap.
"""

import importlib
from typing import Any

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

# Loaded on first use: name -> the module defining it.
_LAZY = {
    "PIPELINE_REGISTRY": "maxfx.pipelines.lib.registry",
    "PipelineRegistry": "maxfx.pipelines.lib.registry",
    "SupportedArchitecture": "maxfx.pipelines.lib.registry",
    "get_pipeline_for_task": "maxfx.pipelines.lib.registry",
    "register_all_models": "maxfx.pipelines.architectures",
    "KVCacheMixin": "maxfx.pipelines.lib.interfaces",
    "ModelInputs": "maxfx.pipelines.lib.interfaces",
    "ModelOutputs": "maxfx.pipelines.lib.interfaces",
    "PipelineModel": "maxfx.pipelines.lib.interfaces",
    "TTSContext": "maxfx.pipelines.core",
    "TextAndVisionContext": "maxfx.pipelines.core",
    "TextContext": "maxfx.pipelines.core",
    "GenerateMixin": "maxfx.pipelines.lib.interfaces",
    "TextGenerationPipeline": "maxfx.pipelines.lib.pipeline_variants.text_generation",
    "EmbeddingsPipeline": "maxfx.pipelines.lib.embeddings_pipeline",
    "SpeculativeDecodingTextGenerationPipeline": "maxfx.pipelines.lib.speculative_decoding",
    "TextTokenizer": "maxfx.pipelines.lib.tokenizer",
    "IdentityPipelineTokenizer": "maxfx.pipelines.lib.tokenizer",
    "PreTrainedPipelineTokenizer": "maxfx.pipelines.lib.tokenizer",
    "max_tokens_to_generate": "maxfx.pipelines.lib.tokenizer",
}
# Subpackages loaded on first attribute access (``maxfx.pipelines.core``...).
_SUBMODULES = ("architectures", "core")

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
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"maxfx.pipelines.{name}")
    raise AttributeError(f"module 'maxfx.pipelines' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
