"""maxfx's generation engine: continuous batching over a paged KV cache.

- `TextContext` (MAX's ``max.pipelines.core.TextContext``): one request's tokens and cursors.
- `ModelRunner`: a `maxfx.models.CausalLM` run in fixed-shape compiled steps over
  KV pages (`PagePool`, with prefix caching), sampling per row inside the step.
- `Scheduler`: the one place generation is scheduled: admission, chunked
  prefill, decode, preemption, stop strings, streams.
- Structured output: a context's ``json_schema`` is compiled by llguidance at
  `Scheduler.submit` (`compile_json_schema`; ValueError for a bad schema) into a
  `GrammarMatcher` whose token mask is added to the row's logits each step.

`maxfx.pipelines` (``TextGenerationPipeline``, ``LLM``) and ``maxfx serve`` run on these.

Example:
    >>> from maxfx.generation import ModelRunner, Scheduler, TextContext  # doctest: +SKIP
    >>> sched = Scheduler(ModelRunner(model, max_batch_size=8, max_length=256))  # doctest: +SKIP
    >>> streams = [sched.submit(TextContext(max_length=256, tokens=p)) for p in prompts]  # doctest: +SKIP
    >>> sched.run_until_idle(); [s.result().tokens for s in streams]  # doctest: +SKIP
"""

from maxfx.generation._context import TextContext
from maxfx.generation._detok import IncrementalText
from maxfx.generation._grammar import GrammarMatcher, compile_json_schema
from maxfx.generation._paged_cache import PagedLayerCache
from maxfx.generation._pages import OutOfPagesError, PagePool, PrefixCacheStats
from maxfx.generation._runner import ModelRunner, StepOutput, compile_counts
from maxfx.generation._scheduler import (
    GenerationResult,
    QueueFullError,
    RequestStream,
    Scheduler,
    SchedulerStats,
    StreamEvent,
)

__all__ = [
    "GenerationResult",
    "GrammarMatcher",
    "IncrementalText",
    "ModelRunner",
    "OutOfPagesError",
    "PagePool",
    "PagedLayerCache",
    "PrefixCacheStats",
    "QueueFullError",
    "RequestStream",
    "Scheduler",
    "SchedulerStats",
    "StepOutput",
    "StreamEvent",
    "TextContext",
    "compile_counts",
    "compile_json_schema",
]
