"""`ServedModel`: what ``maxfx serve`` serves: one model's tokenizer, engine and embeddings pipeline.

Built from a `ServeConfig` through `maxfx.pipelines` (the registry's tokenizer
and `TextGenerationPipeline`), so the server runs the same engine and sampling
code as `LLM.generate`. The engine's `Scheduler` runs on its own thread; the HTTP
event loop only tokenizes, submits and reads `RequestStream` events.

Example:
    >>> served = ServedModel(ServeConfig(model="tests/data/models/tiny_llama", max_batch_size=4))  # doctest: +SKIP
    >>> served.name  # doctest: +SKIP
    'tiny_llama'
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from maxfx.generation import RequestStream, compile_counts
from maxfx.interfaces import (
    EmbeddingsGenerationInputs,
    PipelineTask,
    RequestID,
    SamplingParams,
    SamplingParamsInput,
    TextGenerationRequest,
)
from maxfx.pipelines import PIPELINE_REGISTRY, EmbeddingsPipeline, PipelineConfig
from maxfx.pipelines.lib.embeddings_pipeline import EmbeddingsRequestContext

__all__ = ["ServeConfig", "ServedModel"]

log = logging.getLogger("maxfx.serve")


@dataclass
class ServeConfig:
    """The settings of ``maxfx serve`` (one per command-line flag; see ``maxfx serve --help``).

    Args:
        model: what `maxfx.models.load_pretrained` takes (a folder or a GGUF file).
        host, port: where the HTTP server listens.
        served_model_name: the name clients pass as ``model`` (default: the folder's or file's name).
        max_batch_size: sequences per decode step.
        max_length: the longest sequence, prompt + output (default: the model's context).
        max_queue_size: requests that may wait for a batch row; more get HTTP 503.
        enable_structured_output: accept ``response_format`` JSON schemas (and named tool choices).
        api_key: when set, requests need ``Authorization: Bearer <api_key>``.
        metrics_port: serve ``/metrics`` on this port too (it is always on the main port).
        chat_template: a file whose Jinja template replaces the model's.
        prefill_chunk_size: most prompt tokens one prefill step runs.
        enable_prefix_caching: reuse the KV pages of repeated prompt prefixes.
        kv_cache_format: the dtype the KV cache is stored in (None: the model's; see `KVCacheConfig`).
        warmup: compile the engine's steps before accepting requests.
    """

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    max_batch_size: int = 16
    max_length: int | None = None
    max_queue_size: int = 256
    enable_structured_output: bool = False
    api_key: str | None = None
    metrics_port: int | None = None
    chat_template: str | None = None
    # 1024: 16 prompts of 128 tokens arriving together take two prefill steps, so the rows already
    # decoding wait once, not three times (with 512, 16 rows' inter-token p99 was 17x the median).
    prefill_chunk_size: int = 1024
    enable_prefix_caching: bool = True
    kv_cache_format: str | None = None
    warmup: bool = True


class ServedModel:
    """One model behind the server: its tokenizer, the engine's scheduler (on a thread) and embeddings."""

    def __init__(self, config: ServeConfig):
        self.config = config
        start = time.perf_counter()
        kwargs: dict[str, Any] = {
            "model_path": config.model,
            "max_batch_size": config.max_batch_size,
            "enable_prefix_caching": config.enable_prefix_caching,
        }
        if config.max_length is not None:
            kwargs["max_length"] = config.max_length
        if config.chat_template is not None:
            kwargs["chat_template"] = Path(config.chat_template)
        kwargs["prefill_chunk_size"] = config.prefill_chunk_size
        kwargs["kv_cache_format"] = config.kv_cache_format
        self.pipeline_config = PipelineConfig(**kwargs)
        self.tokenizer, self.pipeline = PIPELINE_REGISTRY.retrieve(
            self.pipeline_config, task=PipelineTask.TEXT_GENERATION
        )
        self.name = config.served_model_name or Path(config.model.rstrip("/")).name
        self.created = int(time.time())
        self.max_length = int(self.pipeline.runner.max_length)
        self._defaults = self.pipeline_config.model_config.sampling_params_defaults
        self.scheduler = self.pipeline.scheduler
        self.scheduler.max_queue_size = int(config.max_queue_size)
        self.load_s = time.perf_counter() - start
        self.warmup_s = 0.0
        if config.warmup:
            t = time.perf_counter()
            self.pipeline.warmup()
            self.warmup_s = time.perf_counter() - t
        self.scheduler.start()
        self._embeddings: Any = None
        self._embed_lock = threading.Lock()
        log.info(
            "maxfx serve: %s loaded in %.1f s, warmed up in %.1f s (%d compiled programs)",
            self.name,
            self.load_s,
            self.warmup_s,
            compile_counts()["compiles"],
        )

    # ── text generation ──
    @property
    def vocab_size(self) -> int:
        """The model's vocabulary (token ids must be below it)."""
        return int(self.pipeline.runner.vocab_size)

    def sampling_params(self, given: SamplingParamsInput) -> SamplingParams:
        """A request's `SamplingParams`: its fields, else the model's generation config, else MAX's defaults
        (ValueError/TypeError naming a bad field).
        """
        return SamplingParams.from_input_and_generation_config(given, self._defaults)

    async def submit(self, request: TextGenerationRequest, stop: list[str]) -> RequestStream:
        """Tokenize ``request`` (here, on the event loop) and queue it on the engine; its stream yields on this loop.

        Raises:
            ValueError: the request cannot become a context (empty prompt, too long, bad ids, bad schema).
            maxfx.generation.QueueFullError: too many requests wait already.
        """
        ctx = await self.tokenizer.new_context(request)
        return self.scheduler.submit(ctx, stop=stop or None, loop=asyncio.get_running_loop())

    def cancel(self, request_id: RequestID) -> None:
        """Stop a request (a client went away): its pages are freed at the next engine iteration."""
        self.scheduler.cancel(request_id)

    # ── embeddings ──
    def embed(self, token_rows: list[list[int]]) -> list[Any]:
        """Mean- or last-token-pooled embeddings of token-id rows (blocking; run it off the event loop)."""
        with self._embed_lock:
            if self._embeddings is None:
                self._embeddings = EmbeddingsPipeline(
                    self.pipeline_config, None, self.tokenizer.eos, {}, self.tokenizer, model=self.pipeline.model
                )
            contexts = [EmbeddingsRequestContext(row, request_id=f"emb-{i}") for i, row in enumerate(token_rows)]
            out = self._embeddings.execute(EmbeddingsGenerationInputs([{c.request_id: c for c in contexts}]))
            return [out[c.request_id].embeddings for c in contexts]

    def close(self, finish_running: bool = True) -> None:
        """Stop the engine thread; with ``finish_running`` the admitted and queued requests finish first."""
        self.scheduler.shutdown(finish_running=finish_running)
