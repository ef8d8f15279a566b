"""``max.pipelines.lib``: the pipeline library (configs, Hugging Face repos, ...).

Example:
    >>> from maxfx.pipelines.lib import PipelineConfig, HuggingFaceRepo
    >>> HuggingFaceRepo("tests/data/models/tiny_llama").repo_type.value
    'local'
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
from maxfx.pipelines.lib.hf_utils import HuggingFaceRepo, download_weight_files, generate_local_model_path, try_to_load_from_cache, validate_hf_repo_access

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
]
