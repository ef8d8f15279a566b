"""The FastAPI application of ``maxfx serve``: OpenAI's routes over one `ServedModel`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/embeddings``,
``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health`` and ``/v1/health``,
``POST /tokenize``, ``POST /detokenize``, ``GET /metrics``.

A generation request is tokenized on the event loop, checked whole (every
prompt of a list, the length limit, the schema) before anything is queued, then
handed to the engine's scheduler, which runs on its own thread; the route reads
the request's `RequestStream` and writes JSON or server-sent events. A client
that goes away cancels its requests (the engine frees their pages at its next
iteration). Errors are OpenAI's error bodies (`APIError`).

Example:
    >>> app = create_app(ServedModel(ServeConfig(model="tests/data/models/tiny_llama")))  # doctest: +SKIP
    >>> uvicorn.run(app, host="127.0.0.1", port=8000)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from maxfx import __version__
from maxfx.generation import QueueFullError, RequestStream, StreamEvent
from maxfx.interfaces import RequestID, TextGenerationRequest
from maxfx.serve import _responses as R
from maxfx.serve._errors import APIError, bad_request
from maxfx.serve._metrics import CONTENT_TYPE, Metrics
from maxfx.serve._model import ServedModel
from maxfx.serve._protocol import (
    MAX_TOP_LOGPROBS,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
    _Sampling,
)
from maxfx.serve._tools import ToolPlan, forced_call, parse_tool_calls, plan_tools

__all__ = ["create_app"]

log = logging.getLogger("maxfx.serve")

_OPEN_PATHS = ("/health", "/v1/health", "/metrics")  # no API key needed
_DISCONNECT_POLL_S = 0.25


@dataclass
class _Choice:
    """One prompt's generation inside a response (``choices[index]``)."""

    index: int
    stream: RequestStream
    echo: str = ""
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    finish_reason: str | None = None

    def add(self, event: StreamEvent) -> None:
        self.tokens += event.tokens
        self.text.append(event.text)
        self.logprobs += _per_token(event)
        if event.is_done:
            self.finish_reason = event.finish_reason


def _per_token(event: StreamEvent) -> list[Any]:
    """One `LogProbabilities` per token of an event (the engine sends one per sampled token)."""
    return list(event.log_probabilities or [])


class _Generation:
    """The requests of one HTTP call: submitted together, cancelled together, timed for the metrics."""

    def __init__(self, served: ServedModel, metrics: Metrics, choices: list[_Choice]):
        self.served, self.metrics, self.choices = served, metrics, choices
        self.started = time.perf_counter()
        self._done = False

    @property
    def prompt_tokens(self) -> int:
        return sum(c.stream.prompt_tokens for c in self.choices)

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.choices)

    def usage(self) -> dict[str, Any]:
        return R.usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=sum(c.stream.cached_tokens for c in self.choices),
        )

    async def events(self) -> AsyncIterator[tuple[_Choice, StreamEvent]]:
        """Every choice's events as they arrive (an engine error ends the call with a 500)."""
        if len(self.choices) == 1:
            c = self.choices[0]
            last = time.perf_counter()
            async for event in _checked(c.stream):
                now = time.perf_counter()
                if c.tokens and event.tokens:
                    self.metrics.itl.observe((now - last) * 1e3)
                last = now
                c.add(event)
                yield c, event
            return
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump(c: _Choice) -> None:
            try:
                async for event in _checked(c.stream):
                    await queue.put((c, event))
            except BaseException as err:  # noqa: BLE001 - handed to the reader
                await queue.put((c, err))

        tasks = [asyncio.create_task(pump(c)) for c in self.choices]
        try:
            left = len(self.choices)
            while left:
                c, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                c.add(item)
                left -= item.is_done
                yield c, item
        finally:
            for t in tasks:
                t.cancel()

    def cancel(self) -> None:
        """Cancel the choices that have not finished (a client went away)."""
        gone = [c for c in self.choices if c.finish_reason is None]
        for c in gone:
            self.served.cancel(c.stream.request_id)
        if gone:
            self.metrics.cancelled.inc(len(gone))

    def finish(self) -> None:
        if self._done:
            return
        self._done = True
        first = [c.stream.first_token_at for c in self.choices if c.stream.first_token_at is not None]
        ttft = min(first) - self.started if first else None
        self.metrics.generation_done(
            seconds=time.perf_counter() - self.started,
            ttft_s=ttft,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.completion_tokens,
        )


async def _checked(stream: RequestStream) -> AsyncIterator[StreamEvent]:
    try:
        async for event in stream:
            yield event
    except (
        ValueError,
        TypeError,
    ) as err:  # the request was rejected inside the engine (a grammar error, a pool too small)
        raise bad_request(str(err)) from err
    except Exception as err:
        log.exception("maxfx serve: request %s failed in the engine", stream.request_id)
        raise APIError(500, f"the engine failed on request {stream.request_id}: {err}") from err


_DONE = b"data: [DONE]\n\n"


def _sse_response(
    gen: _Generation,
    choice_chunks: AsyncIterator[bytes],
    obj: str,
    rid: str,
    model: str,
    created: int,
    include_usage: bool,
) -> StreamingResponse:
    """A server-sent-event response: the choices' chunks, then (``include_usage``) the usage chunk and ``[DONE]``.

    An engine error ends the stream with OpenAI's error body; however the stream ends
    (done, error, client gone), the generation's unfinished requests are cancelled.
    """

    async def stream() -> AsyncIterator[bytes]:
        try:
            async with contextlib.aclosing(choice_chunks) as chunks:
                async for data in chunks:
                    yield data
            gen.finish()
            if include_usage:
                yield _sse(R.usage_chunk(rid, model, created, obj, gen.usage()))
            yield _DONE
        except APIError as err:
            yield _sse(err.body())
            yield _DONE
        finally:
            gen.cancel()

    return StreamingResponse(
        stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


# ─── the application ──────────────────────────────────────────────────────


def create_app(served: ServedModel, metrics: Metrics | None = None) -> FastAPI:
    """The ASGI application over ``served`` (see the module docstring); its shutdown stops ``served``'s engine."""
    metrics = metrics or Metrics(served.name, served.scheduler)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        # uvicorn has stopped taking connections and waited for the open ones: stop the engine.
        await asyncio.to_thread(served.close, False)
        log.info("maxfx serve: engine stopped")

    app = FastAPI(
        title="maxfx serve",
        description="OpenAI-compatible text generation and embeddings on maxfx's engine.",
        version=__version__,
        lifespan=lifespan,
    )
    app.state.served, app.state.metrics = served, metrics
    text_of = R.TokenText(served.tokenizer.delegate)
    api_key = served.config.api_key

    # ── errors, auth and counting ──
    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return JSONResponse(_validation_error(err).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(APIError(err.status_code, str(err.detail)).body(), status_code=err.status_code)

    @app.middleware("http")
    async def _auth_and_count(request: Request, call_next: Any) -> Response:
        path = request.url.path
        if api_key and path not in _OPEN_PATHS and request.headers.get("authorization") != f"Bearer {api_key}":
            response: Response = JSONResponse(
                APIError(
                    401, "Incorrect API key provided: pass it as 'Authorization: Bearer <key>'", code="invalid_api_key"
                ).body(),
                status_code=401,
            )
        else:
            try:
                response = await call_next(request)
            except Exception as err:  # a bug in a route: an OpenAI error body, and the server goes on
                log.exception("maxfx serve: %s failed", path)
                response = JSONResponse(
                    APIError(500, f"internal error: {type(err).__name__}: {err}").body(), status_code=500
                )
        route = request.scope.get("route")
        metrics.request_done(getattr(route, "path", "other"), response.status_code)
        return response

    # ── models and health ──
    def model_card() -> dict[str, Any]:
        return {
            "id": served.name,
            "object": "model",
            "created": served.created,
            "owned_by": "maxfx",
            "root": served.config.model,
            "max_model_len": served.max_length,
        }

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        _check_model(served, model_id)
        return model_card()

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": served.name,
            "running": served.scheduler.num_running,
            "waiting": served.scheduler.num_waiting,
        }

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    # ── tokenizer ──
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        _check_model(served, body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give exactly one of prompt (text) and messages (chat)", param="prompt")
        try:
            if body.messages is not None:
                text = served.tokenizer.apply_chat_template(body.messages)
                ids = await served.tokenizer.encode(text, add_special_tokens=False)
            else:
                ids = await served.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        except ValueError as err:
            raise bad_request(str(err), param="messages" if body.messages is not None else "prompt") from err
        tokens = [int(t) for t in ids]
        return {"tokens": tokens, "count": len(tokens), "max_model_len": served.max_length}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        _check_model(served, body.model)
        try:
            return {"prompt": await served.tokenizer.decode(body.tokens, skip_special_tokens=False)}
        except ValueError as err:
            raise bad_request(str(err), param="tokens") from err

    # ── embeddings ──
    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
        _check_model(served, body.model)
        rows = await _embedding_rows(served, body.input)
        vectors = await asyncio.to_thread(served.embed, rows)
        if body.dimensions is not None:
            if not 1 <= body.dimensions <= len(vectors[0]):
                raise bad_request(
                    f"dimensions must be in [1, {len(vectors[0])}], got {body.dimensions}", param="dimensions"
                )
            vectors = [v[: body.dimensions] for v in vectors]
        data = [
            {"object": "embedding", "index": i, "embedding": _encode_vector(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        n = sum(len(r) for r in rows)
        return {"object": "list", "data": data, "model": served.name, "usage": {"prompt_tokens": n, "total_tokens": n}}

    # ── completions ──
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        _check_common(served, body)
        if body.logprobs is not None and not 0 <= body.logprobs <= MAX_TOP_LOGPROBS:
            raise bad_request(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {body.logprobs}", param="logprobs")
        if body.suffix:
            raise bad_request("suffix is not supported", param="suffix")
        prompts = body.prompts()
        if not prompts:
            raise bad_request("prompt is empty", param="prompt")
        k = body.logprobs or 0
        reqs = [
            _text_request(
                served, body, prompt=p, logprobs=(max(k, 1) if body.logprobs is not None else 0), echo=body.echo
            )
            for p in prompts
        ]
        gen = await _start(served, metrics, reqs, body.stops())
        if body.echo:
            for c, p in zip(gen.choices, prompts):
                c.echo = p if isinstance(p, str) else await served.tokenizer.decode(p, skip_special_tokens=False)
        rid, created = R.new_id("cmpl"), R.now()

        def logprobs_of(c: _Choice, tokens: list[int], lps: list[Any], offset: int) -> Any:
            return R.completion_logprobs(tokens, lps, k, text_of, offset) if body.logprobs is not None else None

        def echo_logprobs(c: _Choice) -> Any:
            """The prompt's entries (its first token has none), recorded by the engine during prefill."""
            ctx = c.stream.context
            return logprobs_of(c, ctx.prompt_tokens.tolist(), list(ctx.prompt_log_probabilities), 0)

        if body.stream:

            async def chunks() -> AsyncIterator[bytes]:
                offsets = {c.index: 0 for c in gen.choices}
                echoed: set[int] = set()
                async for c, event in gen.events():
                    if (
                        c.echo and c.index not in echoed
                    ):  # at the first event: the prompt's log probabilities exist by then
                        echoed.add(c.index)
                        yield _sse(
                            R.completion_chunk(rid, served.name, created, c.index, c.echo, None, echo_logprobs(c))
                        )
                        offsets[c.index] = len(c.echo)
                    lp = logprobs_of(c, event.tokens, _per_token(event), offsets[c.index])
                    offsets[c.index] += len(event.text)
                    if event.text or event.is_done or lp is not None:
                        yield _sse(
                            R.completion_chunk(
                                rid,
                                served.name,
                                created,
                                c.index,
                                event.text,
                                event.finish_reason if event.is_done else None,
                                lp,
                            )
                        )

            return _sse_response(gen, chunks(), "text_completion", rid, served.name, created, body.include_usage)

        await _collect(gen, request)
        choices = []
        for c in gen.choices:
            text = "".join(c.text)
            lp = logprobs_of(c, c.tokens, c.logprobs, len(c.echo))
            if lp is not None and c.echo:
                head = echo_logprobs(c)
                lp = {key: head[key] + lp[key] for key in lp}
            choices.append({"index": c.index, "text": c.echo + text, "logprobs": lp, "finish_reason": c.finish_reason})
        return JSONResponse(
            {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": served.name,
                "choices": choices,
                "usage": gen.usage(),
            }
        )

    # ── chat ──
    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        _check_common(served, body)
        if body.top_logprobs is not None:
            if not body.logprobs:
                raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
            if not 0 <= body.top_logprobs <= MAX_TOP_LOGPROBS:
                raise bad_request(
                    f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {body.top_logprobs}", param="top_logprobs"
                )
        if not body.messages:
            raise bad_request("messages is empty", param="messages")
        plan = plan_tools(body.tools, body.tool_choice)
        if plan.schema is not None and not served.config.enable_structured_output:
            raise bad_request(
                "tool_choice 'required' or a named function constrains the output: start the server with "
                "--enable-structured-output",
                param="tool_choice",
            )
        k = body.top_logprobs or 0
        fmt = (
            {"type": "json_schema", "json_schema": {"name": "tool_call", "schema": plan.schema}}
            if plan.schema is not None
            else body.response_format
        )
        req = _text_request(
            served,
            body,
            messages=body.messages,
            logprobs=max(k, 1) if body.logprobs else 0,
            tools=plan.tools,
            response_format=fmt,
        )
        gen = await _start(served, metrics, [req], body.stops())
        rid, created = R.new_id("chatcmpl"), R.now()
        buffered = bool(plan.names)  # tool calls are parsed from the whole text, so it is sent at the end

        def finish_message(c: _Choice) -> tuple[dict[str, Any], str | None]:
            text = "".join(c.text)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            reason = c.finish_reason
            calls = _tool_calls(plan, text, reason)
            if calls is not None:
                message["tool_calls"], message["content"] = calls
                message["content"] = message["content"] or None
                reason = "tool_calls"
            return message, reason

        if body.stream:

            async def chunks() -> AsyncIterator[bytes]:
                yield _sse(R.chat_chunk(rid, served.name, created, {"role": "assistant", "content": ""}, None))
                async for c, event in gen.events():
                    lp = R.chat_logprobs(event.tokens, _per_token(event), k, text_of) if body.logprobs else None
                    if buffered:
                        if event.is_done:
                            message, reason = finish_message(c)
                            delta = {k2: v for k2, v in message.items() if k2 != "role" and v is not None}
                            if "tool_calls" in delta:
                                delta["tool_calls"] = [
                                    dict(call, index=i) for i, call in enumerate(delta["tool_calls"])
                                ]
                            yield _sse(R.chat_chunk(rid, served.name, created, delta, reason, lp))
                    elif event.text or lp is not None or event.is_done:
                        delta = {"content": event.text} if event.text else {}
                        yield _sse(
                            R.chat_chunk(
                                rid, served.name, created, delta, event.finish_reason if event.is_done else None, lp
                            )
                        )

            return _sse_response(gen, chunks(), "chat.completion.chunk", rid, served.name, created, body.include_usage)

        await _collect(gen, request)
        c = gen.choices[0]
        message, reason = finish_message(c)
        lp = R.chat_logprobs(c.tokens, c.logprobs, k, text_of) if body.logprobs else None
        choice = {"index": 0, "message": message, "logprobs": lp, "finish_reason": reason}
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": served.name,
                "choices": [choice],
                "usage": gen.usage(),
            }
        )

    return app


# ─── request handling ─────────────────────────────────────────────────────


def _check_model(served: ServedModel, model: str | None) -> None:
    if model is not None and model not in (served.name, served.config.model):
        raise APIError(
            404,
            f"The model '{model}' does not exist; this server serves '{served.name}'",
            param="model",
            code="model_not_found",
        )


def _check_common(served: ServedModel, body: _Sampling) -> None:
    _check_model(served, body.model)
    if body.n != 1:
        raise bad_request(f"n must be 1 (maxfx serve returns one choice per prompt), got {body.n}", param="n")
    if body.best_of not in (None, 1):
        raise bad_request(f"best_of must be 1, got {body.best_of}", param="best_of")
    if (
        body.response_format
        and body.response_format.get("type") not in (None, "text")
        and not served.config.enable_structured_output
    ):
        raise bad_request(
            "response_format needs structured output: start the server with --enable-structured-output",
            param="response_format",
        )
    for s in body.stops():
        if not s:
            raise bad_request("stop strings must not be empty", param="stop")


def _text_request(served: ServedModel, body: _Sampling, **fields: Any) -> TextGenerationRequest:
    try:
        sampling = served.sampling_params(body.sampling_input())
    except (ValueError, TypeError) as err:
        raise bad_request(str(err).replace("SamplingParams.", ""), param=_field_of(str(err))) from err
    if sampling.seed < 0 or sampling.seed >= 1 << 63:
        raise bad_request(f"seed must be in [0, 2**63), got {sampling.seed}", param="seed")
    return TextGenerationRequest(
        request_id=RequestID(), model_name=served.name, sampling_params=sampling, stop=body.stops() or None, **fields
    )


def _field_of(message: str) -> str | None:
    name = message.split("SamplingParams.", 1)[-1].split(" ", 1)[0] if "SamplingParams." in message else None
    return {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}.get(name, name) if name else None


async def _start(
    served: ServedModel, metrics: Metrics, requests: Sequence[TextGenerationRequest], stop: list[str]
) -> _Generation:
    """Build every request's context (all or none), then queue them on the engine."""
    contexts = []
    for req in requests:
        where = "messages" if req.messages is not None else "prompt"
        try:
            ctx = await served.tokenizer.new_context(req)
        except (ValueError, TypeError) as err:
            raise bad_request(str(err).replace("TextTokenizer.new_context: ", ""), param=where) from err
        asked = req.sampling_params.max_new_tokens
        if asked is not None and ctx.end_idx + asked > served.max_length:
            raise bad_request(
                f"This model's maximum context length is {served.max_length} tokens. However, you requested "
                f"{ctx.end_idx + asked} tokens "
                f"({ctx.end_idx} in the {where}, {asked} for the completion). Please reduce the length of the {where} "
                "or max_tokens.",
                param="max_tokens",
            )
        contexts.append(ctx)
    choices: list[_Choice] = []
    try:
        for i, ctx in enumerate(contexts):
            choices.append(_Choice(i, served.scheduler.submit(ctx, stop=stop or None, loop=asyncio.get_running_loop())))
    except QueueFullError as err:
        for c in choices:
            served.cancel(c.stream.request_id)
        raise APIError(503, f"the server is busy: {err}; retry later", code="queue_full") from err
    except ValueError as err:  # a schema the grammar compiler rejects, a context longer than the engine holds
        for c in choices:
            served.cancel(c.stream.request_id)
        raise bad_request(str(err), param="response_format" if "schema" in str(err) else None) from err
    return _Generation(served, metrics, choices)


async def _collect(gen: _Generation, request: Request) -> None:
    """Run a non-streamed generation to its end; a client that disconnects cancels it."""

    async def drain() -> None:
        async for _ in gen.events():
            pass

    task = asyncio.create_task(drain())
    try:
        while not task.done():
            await asyncio.wait([task], timeout=_DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                gen.cancel()
                await task
                raise APIError(499, "the client closed the request")
        task.result()
        gen.finish()
    finally:
        if not task.done():
            task.cancel()
        gen.cancel()


def _tool_calls(plan: ToolPlan, text: str, reason: str | None) -> tuple[list[dict[str, Any]], str] | None:
    """(calls, remaining content) when the output holds tool calls, else None."""
    if plan.forced is not None:
        return forced_call(plan.forced, text), ""
    if not plan.parses:
        return None
    calls, content = parse_tool_calls(text, plan.names)
    return (calls, content) if calls else None


async def _embedding_rows(served: ServedModel, given: Any) -> list[list[int]]:
    items = (
        [given]
        if isinstance(given, str) or (isinstance(given, list) and given and all(isinstance(x, int) for x in given))
        else list(given)
    )
    if not items:
        raise bad_request("input is empty", param="input")
    rows = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise bad_request(f"input[{i}] is an empty string", param="input")
            ids = [int(t) for t in await served.tokenizer.encode(item, add_special_tokens=True)]
        else:
            ids = [int(t) for t in item]
            bad = [t for t in ids if not 0 <= t < served.vocab_size]
            if bad:
                raise bad_request(
                    f"input[{i}] has token ids outside [0, {served.vocab_size}): {bad[:5]}", param="input"
                )
        if not ids:
            raise bad_request(f"input[{i}] has no tokens", param="input")
        if len(ids) > served.max_length:
            raise bad_request(
                f"input[{i}] has {len(ids)} tokens; this model's maximum context length is {served.max_length}",
                param="input",
            )
        rows.append(ids)
    return rows


def _encode_vector(v: Any, encoding_format: str) -> Any:
    """A list of floats, or (``base64``, what the ``openai`` client asks for by default) the float32 little-endian bytes
    in base64.
    """
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode()
    return [float(x) for x in v]


def _validation_error(err: RequestValidationError) -> APIError:
    """A 400 that names the fields pydantic rejected (or says the body is not JSON)."""
    problems = err.errors()
    if any(p.get("type") == "json_invalid" for p in problems):
        detail = next(p for p in problems if p.get("type") == "json_invalid")
        return APIError(
            400,
            f"the request body is not valid JSON: {detail.get('ctx', {}).get('error', detail.get('msg'))}",
            code="invalid_json",
        )
    parts, first = [], None
    for p in problems:
        loc = [str(x) for x in p.get("loc", ()) if x != "body"]
        name = ".".join(loc) or "body"
        first = first or name
        parts.append(f"{name}: {p.get('msg')}")
    return APIError(400, "invalid request: " + "; ".join(parts), param=first, code="invalid_request")
