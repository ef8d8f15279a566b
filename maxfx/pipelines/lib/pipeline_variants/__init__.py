"""MAX's ``max.pipelines.lib.pipeline_variants``: the pipeline classes by task."""

from maxfx.pipelines.lib.pipeline_variants.text_generation import BatchInfo, TextGenerationPipeline

__all__ = ["BatchInfo", "TextGenerationPipeline"]
