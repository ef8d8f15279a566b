"""``max.pipelines.lib``: the pipeline library (configs, Hugging Face repos, ...).

Example:
    >>> from maxfx.pipelines.lib import PipelineConfig, HuggingFaceRepo
    >>> HuggingFaceRepo("tests/data/models/tiny_llama").repo_type.value
    'local'

The registry, the model interfaces, the log-probability and sampling graphs load on
first use (they import JAX), so importing the configs stays cheap.
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
from maxfx.pipelines.lib.hf_utils import (
    HuggingFaceRepo,
    download_weight_files,
    generate_local_model_path,
    try_to_load_from_cache,
    validate_hf_repo_access,
)

# Loaded on first use: name -> the module defining it.
_LAZY = {
    "PIPELINE_REGISTRY": "maxfx.pipelines.lib.registry",
    "PipelineRegistry": "maxfx.pipelines.lib.registry",
    "SupportedArchitecture": "maxfx.pipelines.lib.registry",
    "get_pipeline_for_task": "maxfx.pipelines.lib.registry",
    "AlwaysSignalBuffersMixin": "maxfx.pipelines.lib.interfaces",
    "KVCacheMixin": "maxfx.pipelines.lib.interfaces",
    "ModelInputs": "maxfx.pipelines.lib.interfaces",
    "ModelOutputs": "maxfx.pipelines.lib.interfaces",
    "PipelineModel": "maxfx.pipelines.lib.interfaces",
    "get_paged_manager": "maxfx.pipelines.lib.interfaces",
    "compute_log_probabilities_ragged": "maxfx.pipelines.lib.log_probabilities",
    "log_probabilities_ragged_graph": "maxfx.pipelines.lib.log_probabilities",
    "token_sampler": "maxfx.pipelines.lib.sampling",
    "rejection_sampler": "maxfx.pipelines.lib.sampling",
    "rejection_sampler_with_residuals": "maxfx.pipelines.lib.sampling",
}
# Submodules loaded on first attribute access (``maxfx.pipelines.lib.registry``...).
_SUBMODULES = ("interfaces", "log_probabilities", "registry", "sampling")

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
    "download_weight_files",
    "generate_local_model_path",
    "try_to_load_from_cache",
    "validate_hf_repo_access",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"maxfx.pipelines.lib.{name}")
    raise AttributeError(f"module 'maxfx.pipelines.lib' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
