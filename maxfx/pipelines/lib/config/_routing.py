"""Routing `PipelineConfig`'s flat keyword arguments to the config that owns each option.

An option belongs to exactly one config (their option names never overlap);
``draft_<name>`` goes to the draft model's `MAXModelConfig` or its KV cache. An
unknown name raises `UnknownConfigOptionError`, suggesting the closest valid one.

Example:
    >>> from maxfx.pipelines.lib.config import PipelineConfig
    >>> routed = route_options(PipelineConfig, {"max_length": 64, "kv_cache_page_size": 16, "draft_model_path": "d"})
    >>> routed.pipeline, routed.kv_cache, routed.draft_model
    ({'max_length': 64}, {'kv_cache_page_size': 16}, {'model_path': 'd'})
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from maxfx.pipelines.lib.config._base import UnknownConfigOptionError, options
from maxfx.pipelines.lib.config.kv_cache_config import KVCacheConfig
from maxfx.pipelines.lib.config.lora_config import LoRAConfig
from maxfx.pipelines.lib.config.model_config import MAXModelConfig
from maxfx.pipelines.lib.config.profiling_config import ProfilingConfig
from maxfx.pipelines.lib.config.sampling_config import SamplingConfig
from maxfx.pipelines.lib.config.speculative_config import SpeculativeConfig

__all__ = ["NESTED_CONFIGS", "RoutedOptions", "option_paths", "route_options"]

# Nested config objects PipelineConfig also takes whole (maxfx addition), keyword -> attribute.
NESTED_CONFIGS = {
    "model_config": MAXModelConfig,
    "draft_model_config": MAXModelConfig,
    "sampling_config": SamplingConfig,
    "lora_config": LoRAConfig,
    "profiling_config": ProfilingConfig,
    "speculative_config": SpeculativeConfig,
}
# Older names of options, keyword -> (group, option).
_ALIASES = {"do_penalties": ("sampling", "enable_penalties")}
# Group -> (config class, where PipelineConfig keeps it).
_GROUPS = {
    "model": (MAXModelConfig, "model_config"),
    "kv_cache": (KVCacheConfig, "model_config.kv_cache"),
    "sampling": (SamplingConfig, "sampling_config"),
    "lora": (LoRAConfig, "lora_config"),
    "profiling": (ProfilingConfig, "profiling_config"),
    "speculative": (SpeculativeConfig, "speculative_config"),
}
_DRAFT_GROUPS = {
    "draft_model": (MAXModelConfig, "draft_model_config"),
    "draft_kv_cache": (KVCacheConfig, "draft_model_config.kv_cache"),
}


def _names(cls: type) -> set[str]:
    return {f.name for f in options(cls) if not f.metadata.get("nested")}


@dataclass
class RoutedOptions:
    """The keyword arguments of one `PipelineConfig`, split by the config that owns them."""

    pipeline: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    kv_cache: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] = field(default_factory=dict)
    profiling: dict[str, Any] = field(default_factory=dict)
    speculative: dict[str, Any] = field(default_factory=dict)
    draft_model: dict[str, Any] = field(default_factory=dict)
    draft_kv_cache: dict[str, Any] = field(default_factory=dict)
    objects: dict[str, Any] = field(default_factory=dict)


def route_options(pipeline_cls: type, kwargs: dict[str, Any]) -> RoutedOptions:
    """Split ``kwargs`` by owner: ``pipeline_cls``'s own options, then each nested config's, then ``draft_*``.

    Raises:
        UnknownConfigOptionError: names no config has (each with the closest valid name).
    """
    routed = RoutedOptions()
    own = _names(pipeline_cls)
    groups = {group: _names(cls) for group, (cls, _) in _GROUPS.items()}
    unknown = []
    for key, value in kwargs.items():
        if key in NESTED_CONFIGS:
            routed.objects[key] = value
        elif key in own:
            routed.pipeline[key] = value
        elif key in _ALIASES:
            group, name = _ALIASES[key]
            getattr(routed, group)[name] = value
        elif group := next((g for g, names in groups.items() if key in names), None):
            getattr(routed, group)[key] = value
        elif key.startswith("draft_") and key[6:] in groups["model"]:
            routed.draft_model[key[6:]] = value
        elif key.startswith("draft_") and key[6:] in groups["kv_cache"]:
            routed.draft_kv_cache[key[6:]] = value
        else:
            unknown.append(key)
    if unknown:
        valid = sorted(option_paths(pipeline_cls))
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise UnknownConfigOptionError(
            f"{pipeline_cls.__name__} got unknown option(s) {', '.join(hints)}; {pipeline_cls.__name__}.help() lists "
            "every option"
        )
    return routed


def option_paths(pipeline_cls: type) -> dict[str, str]:
    """Every flat option -> the attribute of a resolved `PipelineConfig` that holds it.

    Example:
        >>> from maxfx.pipelines.lib.config import PipelineConfig
        >>> paths = option_paths(PipelineConfig)
        >>> paths["kv_cache_page_size"], paths["enable_penalties"], paths["draft_model_path"]
        ... # doctest: +NORMALIZE_WHITESPACE
        ('model_config.kv_cache.kv_cache_page_size', 'sampling_config.enable_penalties',
         'draft_model_config.model_path')
    """
    paths = {name: name for name in _names(pipeline_cls)}
    for cls, where in _GROUPS.values():
        paths.update({name: f"{where}.{name}" for name in _names(cls)})
    for cls, where in _DRAFT_GROUPS.values():
        paths.update({f"draft_{name}": f"{where}.{name}" for name in _names(cls)})
    for alias, (group, name) in _ALIASES.items():
        paths[alias] = f"{_GROUPS[group][1]}.{name}"
    paths.update({name: name for name in NESTED_CONFIGS})
    return paths
