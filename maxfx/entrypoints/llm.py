"""`LLM`: MAX's offline front door, ``LLM(PipelineConfig(...)).generate(prompts)``.

The constructor resolves the config through `PIPELINE_REGISTRY` (tokenizer and
pipeline), loads the model and starts the pipeline's `Scheduler` on a background
thread. ``generate`` turns each prompt into its own request and waits for all of
them; requests of concurrent calls (from several threads) join the same batches,
so the method is thread-safe and concurrent callers share the model.

Sampling follows MAX: only ``max_new_tokens`` is set per call; everything else
comes from the model's ``generation_config.json``, else from `SamplingParams`'
defaults (temperature 1, whole vocabulary, a fresh seed): **it samples unless
the model's generation config says otherwise**.

Example:
    >>> from maxfx.entrypoints.llm import LLM
    >>> from maxfx.pipelines import PipelineConfig
    >>> llm = LLM(PipelineConfig(model_path="tests/data/models/tiny_llama", max_batch_size=4))
    >>> texts = llm.generate(["hello", "the graph"], max_new_tokens=4, use_tqdm=False)
    >>> len(texts), all(isinstance(t, str) for t in texts)
    (2, True)
    >>> llm.close()
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from maxfx.interfaces import PipelineTask, RequestID, SamplingParams, SamplingParamsInput, TextGenerationRequest
from maxfx.pipelines.lib._sync import run_sync
from maxfx.pipelines.lib.registry import PIPELINE_REGISTRY

__all__ = ["LLM"]


class LLM:
    """Offline batch generation over maxfx's continuous-batching engine (see the module docstring).

    Args:
        pipeline_config: a `maxfx.pipelines.PipelineConfig`.
    """

    def __init__(self, pipeline_config: Any):
        self.pipeline_config = pipeline_config
        self.tokenizer, self.pipeline = PIPELINE_REGISTRY.retrieve(pipeline_config, task=PipelineTask.TEXT_GENERATION)
        self._defaults = pipeline_config.model_config.sampling_params_defaults
        self._model_name = pipeline_config.model_config.model_name
        try:
            self._scheduler = self.pipeline.scheduler
        except NotImplementedError:  # speculative decoding: the pipeline runs its own rounds (`generate`)
            self._scheduler = None
        else:
            self._scheduler.start()
        self._closed = False
        self._lock = threading.Lock()

    def _sampling(self, max_new_tokens: int | None) -> SamplingParams:
        return SamplingParams.from_input_and_generation_config(
            SamplingParamsInput(max_new_tokens=max_new_tokens), self._defaults
        )

    def generate(
        self, prompts: str | Sequence[str], max_new_tokens: int | None = 100, use_tqdm: bool = True
    ) -> list[str]:
        """Generate a completion for each prompt; returns the completions (without the prompts), in order.

        Raises:
            ValueError: an empty prompt list, a prompt that is not a non-empty string,
                a prompt longer than ``max_length``, or ``max_new_tokens`` < 1.
            RuntimeError: the model failed on a request, or the LLM was closed.
        """
        if self._closed:
            raise RuntimeError("LLM.generate: this LLM was closed")
        items = [prompts] if isinstance(prompts, str) else list(prompts)
        if not items:
            raise ValueError("LLM.generate: prompts is empty; pass a string or a list of strings")
        for i, p in enumerate(items):
            if not isinstance(p, str) or not p:
                raise ValueError(f"LLM.generate: prompt {i} must be a non-empty string, got {p!r}")
        if max_new_tokens is not None and (
            not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1
        ):
            raise ValueError(f"LLM.generate: max_new_tokens must be a positive int or None, got {max_new_tokens!r}")
        requests = [
            TextGenerationRequest(
                request_id=RequestID(),
                model_name=self._model_name,
                prompt=p,
                sampling_params=self._sampling(max_new_tokens),
            )
            for p in items
        ]
        if self._scheduler is None:
            return self._generate_with_pipeline(requests, use_tqdm)
        contexts = run_sync(lambda: _contexts(self.tokenizer, requests))
        streams = [self._scheduler.submit(c) for c in contexts]
        texts: list[str] = []
        with tqdm(total=len(streams), desc="generating", unit="prompt", disable=not use_tqdm) as bar:
            for s in streams:
                try:
                    texts.append(s.result().text)
                except Exception as err:
                    raise RuntimeError(f"LLM.generate: request {s.request_id} failed: {err}") from err
                bar.update(1)
        return texts

    def _generate_with_pipeline(self, requests: list[TextGenerationRequest], use_tqdm: bool) -> list[str]:
        """A pipeline without a scheduler (speculative decoding): its own `generate`, one call at a time."""
        with self._lock, tqdm(total=len(requests), desc="generating", unit="prompt", disable=not use_tqdm) as bar:
            outputs = self.pipeline.generate(requests)
            bar.update(len(requests))
        text = self.tokenizer.delegate
        eos = {int(self.tokenizer.eos)}
        return [text.decode([t for t in o.tokens if t not in eos], skip_special_tokens=True) for o in outputs]

    def close(self) -> None:
        """Finish the running requests and stop the background scheduler."""
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._scheduler is not None:
                    self._scheduler.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


async def _contexts(tokenizer: Any, requests: Sequence[TextGenerationRequest]) -> list[Any]:
    return list(await asyncio.gather(*(tokenizer.new_context(r) for r in requests)))
