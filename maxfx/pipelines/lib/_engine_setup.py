"""From a `PipelineConfig` to the engine's parts: the loaded model, its `ModelRunner` and tokenizer.

The one place a pipeline's configuration becomes engine settings, shared by the
text-generation, speculative-decoding pipelines and `maxfx.entrypoints.llm.LLM`.
"""

from __future__ import annotations

import os
from typing import Any

from maxfx.generation import ModelRunner
from maxfx.models import load_pretrained

__all__ = ["DEFAULT_MAX_BATCH_SIZE", "build_runner", "load_model", "cache_budget_bytes"]

DEFAULT_MAX_BATCH_SIZE = 16
"""Sequences per decode step when ``PipelineConfig.max_batch_size`` is None."""


def load_model(model_config: Any) -> Any:
    """The `maxfx.models.CausalLM` of a `MAXModelConfig` (its local folder or GGUF file)."""
    return load_pretrained(model_config.local_model_path)


def cache_budget_bytes(kv_config: Any) -> int:
    """Host memory the KV pool may take: ``device_memory_utilization`` of the physical memory, less a quarter for
    everything else.
    """
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 8 << 30
    return int(total * float(getattr(kv_config, "device_memory_utilization", 0.9)) * 0.25)


def build_runner(pipeline_config: Any, model: Any, model_config: Any = None) -> ModelRunner:
    """The `ModelRunner` a pipeline's config asks for (batch size, length, pages, chunked prefill, prefix caching).

    ``num_pages`` is what ``max_batch_size`` sequences of ``max_length`` need, cut to
    `cache_budget_bytes` (then the scheduler preempts instead of running out).
    """
    model_config = model_config or pipeline_config.model_config
    kv = model_config.kv_cache
    batch = int(pipeline_config.max_batch_size or DEFAULT_MAX_BATCH_SIZE)
    page = int(kv.kv_cache_page_size)
    chunk = (
        int(pipeline_config.prefill_chunk_size) if getattr(pipeline_config, "enable_chunked_prefill", True) else None
    )
    return ModelRunner(
        model,
        max_batch_size=batch,
        max_length=pipeline_config.max_length,
        page_size=page,
        prefill_chunk_size=chunk or (pipeline_config.max_length or 1 << 30),
        enable_prefix_caching=bool(kv.enable_prefix_caching),
        max_cache_bytes=cache_budget_bytes(kv),
        kv_cache_dtype=kv.kv_cache_format,
    )
