"""``max.pipelines.architectures``: maxfx's built-in architectures and `register_all_models`.

Example:
    >>> from maxfx.pipelines import PIPELINE_REGISTRY
    >>> register_all_models()
    >>> sorted({a.task.value for a in PIPELINE_REGISTRY.architectures_for("Qwen3ForCausalLM")})
    ['embeddings_generation', 'text_generation']
"""

from __future__ import annotations

import logging

from maxfx.pipelines.architectures._families import (
    ARCHITECTURES,
    EMBEDDINGS_ARCHITECTURES,
    TEXT_GENERATION_ARCHITECTURES,
)
from maxfx.pipelines.lib.registry import PIPELINE_REGISTRY

__all__ = ["ARCHITECTURES", "EMBEDDINGS_ARCHITECTURES", "TEXT_GENERATION_ARCHITECTURES", "register_all_models"]

logger = logging.getLogger("max.pipelines")


def register_all_models() -> None:
    """Register maxfx's built-in architectures in `PIPELINE_REGISTRY` (the seven families, text generation and
    embeddings).

    Safe to call again: records already there are skipped, and a different record a
    user registered under the same name and task is kept (it wins over the built-in).
    `PIPELINE_REGISTRY` calls this itself the first time it is used.
    """
    for arch in ARCHITECTURES:
        existing = [a for a in PIPELINE_REGISTRY.architectures_for(arch.name) if a.task is arch.task]
        if not existing:
            PIPELINE_REGISTRY.register(arch)
        elif existing[0] is not arch:
            logger.debug(
                "register_all_models: keeping the registered %s for %s over the built-in one",
                arch.name,
                arch.task.value,
            )
