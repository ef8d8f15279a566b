"""`Scheduler`: the one place generation is scheduled (continuous batching over a `ModelRunner`).

Each iteration (`Scheduler.step`):

1. takes new requests and cancellations from its inbox (thread-safe `submit` /
   `cancel`);
2. admits waiting requests in arrival order while a batch row is free and the
   page pool can hold the request's tokens (prefix-cached pages count as held):
   admission never over-commits pages;
3. runs one prefill chunk (at most ``prefill_chunk_size`` tokens) of the oldest
   request still encoding its prompt (of up to ``max_prefill_rows`` of them, within
   ``max_prefill_tokens``), so a long prompt joins in pieces and the
   running requests keep decoding between them;
4. runs one decode step over every request past its prompt. When the pool has no
   page for a request's next token, the most recently admitted request is
   preempted: its pages are freed, its context `reset` (every token goes back to
   be prefilled), and it waits at the head of the queue. It is never dropped;
5. appends each sampled token, applies the stop rules (the context's EOS and
   length rules, and stop strings on the decoded text), streams the new tokens
   and text to the request's `RequestStream`, and frees finished requests' pages.

When an iteration has no prefill and the same decode rows as the last one, and no
row needs inputs computed on the host from its tokens (penalties, a grammar's
mask; `ModelRunner.can_run_ahead`), the next decode step is dispatched *before*
the last one's tokens are read back: it takes them on the device, so the model
never waits for the host's bookkeeping (step 5 runs while the next step
computes). A row that finishes meanwhile has one extra token computed and
dropped; the results are the same as without running ahead.

Run it in the caller's thread (`run_until_idle`) or on a background thread
(`start`; `LLM` and the server do).

Example:
    >>> sched = Scheduler(ModelRunner(model, max_batch_size=4), tokenizer=tok)  # doctest: +SKIP
    >>> stream = sched.submit(TextContext(max_length=64, tokens=ids))  # doctest: +SKIP
    >>> sched.run_until_idle(); stream.result().tokens  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from maxfx.generation._context import TextContext
from maxfx.generation._detok import IncrementalText
from maxfx.generation._grammar import GrammarMatcher, advance, compile_json_schema
from maxfx.generation._pages import OutOfPagesError
from maxfx.generation._runner import ModelRunner, PendingStep
from maxfx.interfaces import GenerationStatus, LogProbabilities, RequestID

__all__ = ["GenerationResult", "QueueFullError", "RequestStream", "Scheduler", "SchedulerStats", "StreamEvent"]

log = logging.getLogger("maxfx.generation")


class QueueFullError(RuntimeError):
    """The scheduler's waiting queue is full; the request was not taken (a server answers 503)."""


@dataclass
class StreamEvent:
    """What one iteration produced for one request: new tokens, their text, and the status after them."""

    request_id: RequestID
    tokens: list[int]
    text: str
    status: GenerationStatus
    log_probabilities: list[LogProbabilities] | None = None
    error: BaseException | None = None

    @property
    def is_done(self) -> bool:
        """The request finished with this event."""
        return self.status.is_done or self.error is not None

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's finish_reason: "stop" (EOS or a stop string), "length", "cancelled", or None while running."""
        return _FINISH.get(self.status) if self.is_done else None


_FINISH = {
    GenerationStatus.END_OF_SEQUENCE: "stop",
    GenerationStatus.MAXIMUM_LENGTH: "length",
    GenerationStatus.CANCELLED: "cancelled",
}


@dataclass
class GenerationResult:
    """A finished request: every generated token, the text, and how it ended."""

    request_id: RequestID
    tokens: list[int]
    text: str
    status: GenerationStatus
    prompt_tokens: int
    cached_tokens: int
    log_probabilities: list[LogProbabilities] = field(default_factory=list)
    stop_string: str | None = None

    @property
    def finish_reason(self) -> str | None:
        """As `StreamEvent.finish_reason`."""
        return _FINISH.get(self.status)


class RequestStream:
    """The events of one request, for a thread (iterate it) or an asyncio task (``async for``).

    Created by `Scheduler.submit`; ``loop`` (an asyncio loop) makes the events
    arrive on that loop, for ``async for``.
    """

    def __init__(self, ctx: TextContext, loop: asyncio.AbstractEventLoop | None = None):
        self.context = ctx
        self.request_id = ctx.request_id
        self.prompt_tokens = ctx.end_idx
        self.cached_tokens = 0
        self.submitted = time.perf_counter()
        self.first_token_at: float | None = None
        self.stop_string: str | None = None
        self._loop = loop
        self._result: GenerationResult | None = None
        self._seen: list[StreamEvent] = []  # sync streams: every event taken so far (result() after iterating)
        self._done = False
        self._queue: Any = asyncio.Queue() if loop is not None else queue.Queue()

    def _put(self, event: StreamEvent) -> None:
        if self._loop is None:
            self._queue.put(event)
        else:
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
            except RuntimeError:  # the loop closed: nobody listens any more
                pass

    def __iter__(self) -> Iterator[StreamEvent]:
        if self._loop is not None:
            raise TypeError("RequestStream: this stream belongs to an asyncio loop; use `async for`")
        yield from self._seen  # events an earlier iteration already took
        while not self._done:
            event = self._queue.get()
            self._seen.append(event)
            self._done = event.is_done
            if event.error is not None:
                raise event.error
            yield event

    def __aiter__(self):
        return self._aiter()

    async def _aiter(self):
        if self._loop is None:
            raise TypeError("RequestStream: submit with loop= to iterate asynchronously")
        while True:
            event = await self._queue.get()
            if event.error is not None:
                raise event.error
            yield event
            if event.is_done:
                return

    def result(self) -> GenerationResult:
        """Wait for the request to finish (sync streams) and collect its events (once: later calls return the same
        result).
        """
        if self._result is not None:
            return self._result
        tokens: list[int] = []
        text: list[str] = []
        logprobs: list[LogProbabilities] = []
        status = GenerationStatus.ACTIVE
        for event in self:
            tokens += event.tokens
            text.append(event.text)
            logprobs += event.log_probabilities or []
            status = event.status
        self._result = GenerationResult(
            self.request_id,
            tokens,
            "".join(text),
            status,
            self.prompt_tokens,
            self.cached_tokens,
            logprobs,
            self.stop_string,
        )
        return self._result


@dataclass
class SchedulerStats:
    """Counters of a scheduler since it started."""

    requests_finished: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    decode_rows: int = 0


@dataclass
class _Request:
    ctx: TextContext
    stream: RequestStream
    text: IncrementalText | None
    admitted: int = -1  # admission order (preemption picks the newest)


class Scheduler:
    """Continuous batching of text requests over a `ModelRunner` (see the module docstring).

    Args:
        runner: the `ModelRunner` (model, KV pages, compiled steps).
        tokenizer: decodes text for streams and stop strings (anything with
            ``decode(ids, skip_special_tokens=True)``); None: tokens only.
        max_queue_size: most requests waiting for admission (None: unbounded);
            `submit` raises `QueueFullError` beyond it.
        max_prefill_rows: most requests one prefill step encodes together. 1 (default)
            keeps the compiled prefill shapes to one row each (what `ModelRunner.warmup`
            compiles); a batch of prompts submitted at once (`CausalLM.generate`) prefills
            in one step with more.
        max_prefill_tokens: most tokens (padding included) one prefill step computes
            (default: the runner's ``prefill_chunk_size``).
    """

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Any = None,
        *,
        max_queue_size: int | None = None,
        max_prefill_rows: int = 1,
        max_prefill_tokens: int | None = None,
    ):
        if int(max_prefill_rows) < 1:
            raise ValueError(f"Scheduler: max_prefill_rows must be >= 1, got {max_prefill_rows}")
        self.max_prefill_tokens = runner.prefill_chunk_size if max_prefill_tokens is None else int(max_prefill_tokens)
        if self.max_prefill_tokens < runner.prefill_chunk_size:
            raise ValueError(
                f"Scheduler: max_prefill_tokens ({self.max_prefill_tokens}) must be at least the runner's "
                f"prefill_chunk_size ({runner.prefill_chunk_size})"
            )
        self.runner = runner
        self.tokenizer = tokenizer
        self.max_queue_size = max_queue_size
        self.max_prefill_rows = int(max_prefill_rows)
        self.stats = SchedulerStats()
        self._inbox: collections.deque[Any] = collections.deque()
        self._waiting: collections.deque[_Request] = collections.deque()
        self._running: list[_Request] = []
        self._known: dict[RequestID, _Request] = {}
        self._admissions = 0
        self._pending: tuple[list[_Request], PendingStep] | None = None  # a decode step dispatched, not collected yet
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._draining = False

    # ── the outside ──
    @property
    def num_running(self) -> int:
        """Requests admitted (holding pages)."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission (including the inbox)."""
        return len(self._waiting) + len(self._inbox)

    def submit(
        self, ctx: TextContext, *, stop: Sequence[str] | None = None, loop: asyncio.AbstractEventLoop | None = None
    ) -> RequestStream:
        """Queue a request; returns its `RequestStream`. Thread-safe.

        Raises:
            ValueError: the context needs more than the runner's ``max_length``; or its
                ``json_schema`` cannot be compiled (or there is no tokenizer to compile it with).
            QueueFullError: ``max_queue_size`` requests are already waiting.
            RuntimeError: the scheduler is shutting down.
        """
        if ctx.max_length > self.runner.max_length:
            raise ValueError(
                f"Scheduler.submit: request {ctx.request_id} has max_length {ctx.max_length}; the engine holds at most "
                f"{self.runner.max_length} tokens per sequence"
            )
        if stop and self.tokenizer is None:
            raise ValueError("Scheduler.submit: stop strings need a tokenizer to decode the text")
        self._attach_grammar(ctx)
        stream = RequestStream(ctx, loop)
        text = IncrementalText(self.tokenizer, stop, skip_ids=()) if self.tokenizer is not None else None
        with self._cond:
            if self._stopping or self._draining:
                raise RuntimeError("Scheduler.submit: the scheduler is shutting down")
            if self.max_queue_size is not None and self.num_waiting >= self.max_queue_size:
                raise QueueFullError(
                    f"Scheduler.submit: {self.num_waiting} requests are waiting (max_queue_size={self.max_queue_size})"
                )
            self._inbox.append(("add", _Request(ctx, stream, text)))
            self._cond.notify()
        return stream

    def _attach_grammar(self, ctx: TextContext) -> None:
        """Structured output: compile ``ctx.json_schema`` here, in the caller's thread, so a bad schema is the caller's
        ValueError.
        """
        if ctx.matcher is not None and not isinstance(
            ctx.matcher, GrammarMatcher
        ):  # it would fail the whole batch's step later
            raise ValueError(
                f"Scheduler.submit: request {ctx.request_id}: ctx.matcher must be a GrammarMatcher, got "
                f"{type(ctx.matcher).__name__}"
            )
        if ctx.json_schema is None or ctx.matcher is not None:
            return
        if self.tokenizer is None:
            raise ValueError(
                f"Scheduler.submit: request {ctx.request_id} has a json_schema; structured output needs the "
                "scheduler's tokenizer (Scheduler(runner, tokenizer=...))"
            )
        try:
            ctx.set_matcher(compile_json_schema(self.tokenizer, ctx.json_schema, eos_token_ids=ctx.eos_token_ids))
        except ValueError as err:
            raise ValueError(f"Scheduler.submit: request {ctx.request_id}: {err}") from None

    def cancel(self, request_id: RequestID) -> None:
        """Cancel a request: it stops at the next iteration and its pages are freed. Thread-safe; unknown ids are
        ignored.
        """
        with self._cond:
            self._inbox.append(("cancel", request_id))
            self._cond.notify()

    def has_work(self) -> bool:
        """Requests are queued, waiting or running (or a step's results are still to be collected)."""
        return bool(self._inbox or self._waiting or self._running or self._pending)

    def run_until_idle(self) -> None:
        """Iterate in this thread until no request is left."""
        while self.has_work():
            self.step()

    def start(self) -> None:
        """Run the iterations on a background thread (daemon) until `shutdown`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="maxfx-scheduler", daemon=True)
        self._thread.start()

    def shutdown(self, wait: bool = True, *, finish_running: bool = True) -> None:
        """Stop the background thread; with ``finish_running`` the admitted and queued requests finish first."""
        with self._cond:
            self._draining = True
            if not finish_running:
                for r in list(self._running) + list(self._waiting):
                    self._inbox.append(("cancel", r.ctx.request_id))
            self._cond.notify()
        if self._thread is not None and wait:
            while self.has_work() and self._thread.is_alive():
                time.sleep(0.01)
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None and wait:
            self._thread.join()
        self._thread = None

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self.has_work() and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self.has_work():
                    return
            try:
                self.step()
            except Exception as err:  # a bug in a step: fail what ran, keep serving
                log.exception("maxfx scheduler: an iteration failed")
                self._pending = None
                for r in list(self._running):
                    self._fail(r, err)

    # ── one iteration ──
    def step(self) -> None:
        """One scheduler iteration (see the module docstring)."""
        self._take_inbox()
        self._admit()
        prefills = self._prefill_batch()
        decode = [r for r in self._running if not r.ctx.needs_ce]
        if self._pending is not None:
            rows, pending = self._pending
            self._pending = None
            if (
                not prefills
                and len(rows) == len(decode)
                and all(a is b for a, b in zip(rows, decode))
                and all(self.runner.can_run_ahead(r.ctx) for r in rows)
            ):
                try:
                    self._pending = (rows, self.runner.dispatch([r.ctx for r in rows], after=pending))
                except OutOfPagesError:
                    pass  # no page for the step after: collect first, then the plain path preempts
            self._apply(rows, self.runner.collect(pending), prefill=False)
            if self._pending is not None:
                return
            prefills = self._prefill_batch()
            decode = [r for r in self._running if not r.ctx.needs_ce]
        if prefills:
            self._run(prefills, prefill=True)
        if decode:
            self._run(decode, prefill=False, ahead=not prefills)

    def _prefill_batch(self) -> list[_Request]:
        """The oldest requests still encoding their prompts, up to ``max_prefill_rows`` of them while the
        step's padded tokens stay within ``max_prefill_tokens`` (`ModelRunner.step_tokens`)."""
        chunk = self.runner.prefill_chunk_size
        batch: list[_Request] = []
        counts: list[int] = []
        for r in self._running:
            if not r.ctx.needs_ce:
                continue
            n = min(r.ctx.active_length, chunk)
            if batch and (
                len(batch) >= self.max_prefill_rows or self.runner.step_tokens([*counts, n]) > self.max_prefill_tokens
            ):
                break
            batch.append(r)
            counts.append(n)
        return batch

    def _take_inbox(self) -> None:
        with self._cond:
            items = list(self._inbox)
            self._inbox.clear()
        for kind, item in items:
            if kind == "add":
                self._known[item.ctx.request_id] = item
                self._waiting.append(item)
            else:
                r = self._known.get(item)
                if r is not None and not r.ctx.is_done:
                    r.ctx.cancel()
                    self._finish(r)

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.runner.max_batch_size:
            r = self._waiting[0]
            try:
                cached = self.runner.claim(r.ctx)
            except OutOfPagesError:
                if not self._running:
                    self._waiting.popleft()
                    self._fail(
                        r,
                        ValueError(
                            f"request {r.ctx.request_id} needs {self.runner.pages_needed(r.ctx)} KV pages; the pool "
                            f"has {self.runner.pool.num_pages - 1}"
                        ),
                    )
                    continue
                return
            except ValueError as err:
                self._waiting.popleft()
                self._fail(r, err)
                continue
            self._waiting.popleft()
            if r.stream.cached_tokens == 0 and r.ctx.num_generated == 0:
                r.stream.cached_tokens = cached
                self.stats.prompt_tokens += r.ctx.end_idx
                self.stats.cached_prompt_tokens += cached
            r.admitted = self._admissions
            self._admissions += 1
            self._running.append(r)

    def _preempt_for(self, needy: _Request) -> bool:
        """Free pages by preempting the newest admitted request other than ``needy``; False when there is none."""
        victims = [r for r in self._running if r is not needy]
        if not victims:
            return False
        victim = max(victims, key=lambda r: r.admitted)
        self.runner.release(victim.ctx.request_id)
        victim.ctx.reset()
        self._running.remove(victim)
        self._waiting.appendleft(victim)
        self.stats.preemptions += 1
        log.info(
            "maxfx scheduler: preempted request %s (KV pages exhausted); it will be prefilled again",
            victim.ctx.request_id,
        )
        return True

    def _run(self, batch: list[_Request], prefill: bool, ahead: bool = False) -> None:
        """Run a step over ``batch``; with ``ahead`` (decode, every row can run ahead) leave its results pending."""
        # Reserve every row's pages first, preempting until the batch fits.
        for r in list(batch):
            if r not in self._running:
                continue
            n = min(r.ctx.active_length, self.runner.prefill_chunk_size)
            while True:
                try:
                    self.runner.reserve(r.ctx, n)
                    break
                except OutOfPagesError:
                    if not self._preempt_for(r):
                        self._fail(
                            r,
                            RuntimeError(
                                f"request {r.ctx.request_id}: the KV page pool is too small for its "
                                f"{r.ctx.start_idx + n} tokens"
                            ),
                        )
                        break
        batch = [r for r in batch if r in self._running]
        if not batch:
            return
        if ahead and all(self.runner.can_run_ahead(r.ctx) for r in batch):
            self._pending = (batch, self.runner.dispatch([r.ctx for r in batch]))
            return
        self._apply(batch, self.runner.execute([r.ctx for r in batch]), prefill)

    def _apply(self, batch: list[_Request], results: dict[RequestID, Any], prefill: bool) -> None:
        """Append each row's sampled token (and the grammar's forced ones), then stream and stop-check it."""
        if prefill:
            self.stats.prefill_steps += 1
        else:
            self.stats.decode_steps += 1
            self.stats.decode_rows += len(batch)
        now = time.perf_counter()
        for r in batch:
            out = results.get(r.ctx.request_id)
            if out is None or r not in self._running:
                continue
            before = r.ctx.end_idx
            r.ctx.update(out.token, out.log_probabilities)
            if r.ctx.matcher is not None and (err := advance(r.ctx, out.token)) is not None:
                self._fail(r, RuntimeError(f"request {r.ctx.request_id}: {err}"))
                continue
            if r.stream.first_token_at is None:
                r.stream.first_token_at = now
            self.stats.generated_tokens += r.ctx.end_idx - before  # the sampled token and any the grammar forced
            self._emit(r)

    def _emit(self, r: _Request) -> None:
        ctx = r.ctx
        output = ctx.to_generation_output()
        tokens = output.tokens
        text = ""
        if r.text is not None:
            shown = [
                t
                for t in tokens
                if not (ctx.status is GenerationStatus.END_OF_SEQUENCE and t in ctx.eos_token_ids and t == tokens[-1])
            ]
            text = r.text.add(shown)
            if r.text.stopped and not ctx.is_done:
                ctx.status = GenerationStatus.END_OF_SEQUENCE
                r.stream.stop_string = r.text.stop_string
            if ctx.is_done:
                text += r.text.finish()
        event = StreamEvent(ctx.request_id, tokens, text, ctx.status, output.log_probabilities)
        if ctx.is_done:
            self._release(r)
            self.stats.requests_finished += 1
        r.stream._put(event)

    def _finish(self, r: _Request) -> None:
        """End a cancelled request: free it and send what it has."""
        self._release(r)
        if r in self._waiting:
            self._waiting.remove(r)
        self.stats.requests_cancelled += 1
        output = r.ctx.to_generation_output()
        r.stream._put(
            StreamEvent(r.ctx.request_id, output.tokens, "", GenerationStatus.CANCELLED, output.log_probabilities)
        )

    def _fail(self, r: _Request, err: BaseException) -> None:
        self._release(r)
        if r in self._waiting:
            self._waiting.remove(r)
        self.stats.requests_failed += 1
        r.ctx.cancel()
        r.stream._put(StreamEvent(r.ctx.request_id, [], "", GenerationStatus.CANCELLED, error=err))

    def _release(self, r: _Request) -> None:
        self.runner.release(r.ctx.request_id)
        if r in self._running:
            self._running.remove(r)
        self._known.pop(r.ctx.request_id, None)
