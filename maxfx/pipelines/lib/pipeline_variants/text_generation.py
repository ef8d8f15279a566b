"""`TextGenerationPipeline`: MAX's token-generation pipeline, on maxfx's engine (`maxfx.generation`).

``execute(inputs)`` runs the batch it is given for ``inputs.num_steps`` steps:
contexts it has not seen get KV pages (`prepare_batch`), a context still encoding
its prompt runs one prefill chunk, the others decode; sampled tokens are written
into the contexts (`update_context_and_prepare_responses`) and each request's new
tokens come back as a `TextGenerationOutput`. ``release(request_id)`` frees its
pages. Deciding *which* contexts run together is the caller's job (MAX's
scheduler); `generate` (from `GenerateMixin`) hands that to maxfx's `Scheduler`.

Example:
    >>> import asyncio
    >>> from maxfx.interfaces import RequestID, SamplingParams, TextGenerationInputs, TextGenerationRequest
    >>> from maxfx.pipelines import PipelineConfig
    >>> from maxfx.pipelines.lib.tokenizer import TextTokenizer
    >>> config = PipelineConfig(model_path="tests/data/models/tiny_llama", max_batch_size=2)
    >>> tok = TextTokenizer(config.model_config.model_path, pipeline_config=config)
    >>> pipe = TextGenerationPipeline(config, None, tok.eos, {}, tok)
    >>> req = TextGenerationRequest(request_id=RequestID(), model_name="tiny", prompt="hello",
    ...     sampling_params=SamplingParams(top_k=1, max_new_tokens=3))
    >>> ctx = asyncio.run(tok.new_context(req))
    >>> out = pipe.execute(TextGenerationInputs(batches=[{ctx.request_id: ctx}], num_steps=3))
    >>> len(out[ctx.request_id].tokens), out[ctx.request_id].is_done
    (3, True)
    >>> pipe.release(ctx.request_id)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from maxfx.generation import ModelRunner, OutOfPagesError, Scheduler, TextContext
from maxfx.interfaces import LogProbabilities, Pipeline, RequestID, TextGenerationOutput
from maxfx.pipelines.lib._engine_setup import build_runner, load_model
from maxfx.pipelines.lib.interfaces._generate import BatchInfo, GenerateMixin

__all__ = ["BatchInfo", "TextGenerationPipeline"]

log = logging.getLogger("maxfx.pipelines")


class TextGenerationPipeline(GenerateMixin, Pipeline):
    """MAX's ``TextGenerationPipeline(pipeline_config, pipeline_model, eos_token_id, weight_adapters, tokenizer)``.

    Args:
        pipeline_config: the `PipelineConfig` (model, batch size, lengths, KV pages).
        pipeline_model: MAX's model class; maxfx loads the model itself (any of
            its seven families), so this may be None or the `maxfx.models` class.
        eos_token_id: the tokenizer's EOS id (kept; each context carries its EOS set).
        weight_adapters: MAX's checkpoint converters (maxfx's loaders read every format; kept).
        tokenizer: the `TextTokenizer` (its ``delegate`` decodes text for stop strings).
        model: an already loaded `maxfx.models.CausalLM` to use instead of loading one.
    """

    def __init__(
        self,
        pipeline_config: Any,
        pipeline_model: Any,
        eos_token_id: int | None,
        weight_adapters: Any,
        tokenizer: Any,
        *,
        model: Any = None,
    ):
        self._pipeline_config = pipeline_config
        self._pipeline_model = pipeline_model
        self._eos_token_id = eos_token_id
        self._weight_adapters = dict(weight_adapters or {})
        self._tokenizer = tokenizer
        self.model = model if model is not None else load_model(pipeline_config.model_config)
        self.runner: ModelRunner = build_runner(pipeline_config, self.model)
        self._scheduler: Scheduler | None = None

    # ── MAX's properties (pipeline_config, tokenizer and kv_managers come from GenerateMixin) ──
    @property
    def scheduler(self) -> Scheduler:
        """The `maxfx.generation.Scheduler` over this pipeline's runner (what `generate` and `LLM` use)."""
        if self._scheduler is None:
            text = getattr(self._tokenizer, "delegate", None)
            # MAX's max_ce_batch_size: requests per prefill batch; its prefill_chunk_size: the batch's tokens.
            self._scheduler = Scheduler(
                self.runner, tokenizer=text if hasattr(text, "decode") else None,
                max_prefill_rows=min(int(self.pipeline_config.max_ce_batch_size), self.runner.max_batch_size),
                max_prefill_tokens=max(int(self.pipeline_config.prefill_chunk_size), self.runner.prefill_chunk_size),
            )  # fmt: skip
        return self._scheduler

    def warmup(self) -> int:
        """Compile every step the scheduler can run with greedy requests (`ModelRunner.warmup`); returns the programs
        compiled.
        """
        s = self.scheduler
        return self.runner.warmup(prefill_rows=s.max_prefill_rows, prefill_tokens=s.max_prefill_tokens)

    # ── one call ──
    def calculate_num_steps(self, num_steps: int, context: TextContext) -> int:
        """``num_steps`` cut to what the context may still generate; ValueError when it is already at its limit."""
        left = min(context.max_length - context.current_length, context.max_new_tokens - context.num_generated)
        if left <= 0:
            raise ValueError(
                f"TextGenerationPipeline: request {context.request_id} is at its length limit "
                f"({context.current_length} of max_length {context.max_length})"
            )
        return max(1, min(int(num_steps), left))

    def prepare_batch(
        self, batches: Sequence[dict[RequestID, TextContext]], num_steps: int
    ) -> tuple[list[TextContext], int]:
        """Flatten the replicas' batches, give new contexts KV pages, and cut ``num_steps`` to what every context
        allows.

        Raises:
            RuntimeError: the KV pool cannot hold a new context (nothing is taken for it).
        """
        flat = [ctx for batch in batches for ctx in batch.values()]
        for ctx in flat:
            if not self.runner.has(ctx.request_id):
                try:
                    self.runner.claim(ctx)
                except OutOfPagesError as err:
                    raise RuntimeError(
                        f"TextGenerationPipeline.execute: no KV pages for request {ctx.request_id}: {err}; release "
                        "finished requests or lower max_batch_size"
                    ) from None
        steps = min((self.calculate_num_steps(num_steps, c) for c in flat if not c.is_done), default=0)
        return flat, steps

    def initialize_bitmask(self, batch: Sequence[TextContext]) -> np.ndarray | None:
        """A ``[B, vocab]`` token mask (True = allowed) when some context has a grammar matcher, else None."""
        if not any(c.matcher is not None for c in batch):
            return None
        return np.ones((len(batch), self.runner.vocab_size), bool)

    def update_for_structured_output(self, context: TextContext, bitmask: np.ndarray, index: int) -> None:
        """Fill row ``index`` of ``bitmask`` with the tokens ``context``'s grammar matcher allows next."""
        matcher = context.matcher
        if matcher is None:
            return
        allowed = matcher.allowed_tokens() if hasattr(matcher, "allowed_tokens") else None
        if allowed is not None:
            bitmask[index] = False
            bitmask[index, np.asarray(allowed, np.int64)] = True

    def update_context_and_prepare_responses(
        self,
        generated_tokens_host: np.ndarray,
        batch_log_probabilities: list[list[LogProbabilities | None]] | None,
        flat_batch: Sequence[TextContext],
        num_steps: int,
        enable_log_probs: bool,
    ) -> dict[RequestID, TextGenerationOutput]:
        """Write ``generated_tokens_host [B, num_steps]`` (-1: nothing this step) into the contexts; their outputs by
        request id.
        """
        for i, ctx in enumerate(flat_batch):
            for step in range(int(num_steps)):
                token = int(generated_tokens_host[i, step])
                if token < 0 or ctx.is_done:
                    continue
                lp = batch_log_probabilities[i][step] if (enable_log_probs and batch_log_probabilities) else None
                ctx.update(token, lp)
        return {ctx.request_id: ctx.to_generation_output() for ctx in flat_batch}
