"""`GenerateMixin`: requests in, finished `TextGenerationOutput`s out, on top of a pipeline's `execute`.

The requests run through maxfx's `Scheduler` (continuous batching over the
pipeline's runner), so ``generate`` on many requests batches them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from maxfx.interfaces import RequestID, SamplingParams, TextGenerationOutput, TextGenerationRequest
from maxfx.pipelines.lib._sync import run_sync


@dataclass
class BatchInfo:
    """What one `execute` ran: each context's cached length before it, the tokens it ran, and the steps."""

    past_seq_lens: list[int]
    seq_lens: list[int]
    num_steps: int


__all__ = ["BatchInfo", "GenerateMixin"]


class GenerateMixin:
    """MAX's ``GenerateMixin``: ``generate(prompts)`` / ``generate_async(prompts)`` over ``execute``.

    A class using it provides ``runner`` (a `maxfx.generation.ModelRunner`),
    ``scheduler`` (a `maxfx.generation.Scheduler` over it), ``prepare_batch`` and
    the ``_pipeline_config`` / ``_tokenizer`` it was built with.

    Example:
        >>> outs = pipeline.generate([TextGenerationRequest(request_id=RequestID(), model_name="m",
        ...     prompt="hi")])  # doctest: +SKIP
        >>> outs[0].tokens  # doctest: +SKIP
    """

    @property
    def pipeline_config(self) -> Any:
        """The `PipelineConfig` (the class using the mixin sets it)."""
        return self._pipeline_config

    @property
    def tokenizer(self) -> Any:
        """The `PipelineTokenizer`."""
        return self._tokenizer

    @property
    def kv_managers(self) -> list[Any]:
        """The KV page pools (the runner's)."""
        return [self.runner.pool]

    def execute(self, inputs: Any) -> dict[RequestID, TextGenerationOutput]:
        """Run ``inputs.num_steps`` steps of the batch on the engine's runner.

        Contexts not seen before get KV pages (``prepare_batch``); a context still
        encoding its prompt runs one prefill chunk (and the call returns after that
        step, as MAX's context-encoding batches do); the others decode. The sampled
        tokens go into the contexts; each request's new tokens come back.
        """
        flat, steps = self.prepare_batch(inputs.batches, inputs.num_steps)
        self.last_batch_info = BatchInfo([c.start_idx for c in flat], [c.active_length for c in flat], steps)
        for _ in range(steps):
            live = [c for c in flat if not c.is_done]
            if not live:
                break
            results = self.runner.execute(live)
            for c in live:
                out = results[c.request_id]
                if out is not None:
                    c.update(out.token, out.log_probabilities)
            if any(c.needs_ce for c in live):
                break
        return {c.request_id: c.to_generation_output() for c in flat}

    def release(self, request_id: RequestID) -> None:
        """Free the request's KV pages (unknown ids are ignored)."""
        self.runner.release(request_id)

    @staticmethod
    def _requests(prompts: Any) -> list[TextGenerationRequest]:
        items = [prompts] if isinstance(prompts, (str, TextGenerationRequest)) else list(prompts)
        out = []
        for p in items:
            if isinstance(p, str):
                p = TextGenerationRequest(
                    request_id=RequestID(), model_name="", prompt=p, sampling_params=SamplingParams()
                )
            if not isinstance(p, TextGenerationRequest):
                raise TypeError(
                    f"GenerateMixin.generate: expected TextGenerationRequest or str prompts, got {type(p).__name__}"
                )
            out.append(p)
        return out

    async def generate_async(
        self, prompts: TextGenerationRequest | str | Sequence[TextGenerationRequest | str]
    ) -> list[TextGenerationOutput]:
        """Run the requests to completion together; one merged `TextGenerationOutput` per request, in order."""
        requests = self._requests(prompts)
        contexts = [await self.tokenizer.new_context(r) for r in requests]
        sched = self.scheduler
        streams = [sched.submit(c, stop=_stops(r)) for c, r in zip(contexts, requests)]
        if sched._thread is None:
            await asyncio.to_thread(sched.run_until_idle)
        results = [await asyncio.to_thread(s.result) for s in streams]
        return [
            TextGenerationOutput(
                request_id=c.request_id,
                tokens=res.tokens,
                final_status=res.status,
                log_probabilities=res.log_probabilities or None,
            )
            for c, res in zip(contexts, results)
        ]

    def generate(
        self, prompts: TextGenerationRequest | str | Sequence[TextGenerationRequest | str]
    ) -> list[TextGenerationOutput]:
        """`generate_async` from synchronous code (also from a notebook cell, whose event loop is running)."""
        return run_sync(lambda: self.generate_async(prompts))


def _stops(request: TextGenerationRequest) -> list[str]:
    stops = list(getattr(request.sampling_params, "stop", None) or [])
    extra = request.stop
    stops += [extra] if isinstance(extra, str) else list(extra or [])
    return [s for s in stops if s]
