"""Text generation: the request (+ its message/tool/format dicts), the step inputs and the per-request output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, Literal, TypedDict, TypeVar

from ._log_probabilities import LogProbabilities
from ._pipeline import PipelineInputs
from ._request import Request, RequestID
from ._sampling import SamplingParams
from ._status import GenerationStatus

__all__ = [
    "BatchType",
    "TextGenerationInputs",
    "TextGenerationOutput",
    "TextGenerationRequest",
    "TextGenerationRequestFunction",
    "TextGenerationRequestMessage",
    "TextGenerationRequestTool",
    "TextGenerationResponseFormat",
]

MessageRole = Literal["system", "user", "assistant", "tool", "function"]
_ROLES = ("system", "user", "assistant", "tool", "function")


class TextGenerationRequestFunction(TypedDict):
    """A function inside a tool definition (OpenAI shape): name, description, JSON-schema parameters."""

    name: str
    description: str | None
    parameters: dict[str, Any]


class TextGenerationRequestTool(TypedDict):
    """A tool definition: ``{"type": "function", "function": TextGenerationRequestFunction}``."""

    type: str
    function: TextGenerationRequestFunction


class TextGenerationResponseFormat(TypedDict):
    """Structured-output request: ``{"type": "json_schema" | "json_object", "json_schema": {...}}``."""

    type: str
    json_schema: dict[str, Any]


class TextGenerationRequestMessage(TypedDict):
    """One chat message: a role and either a string or a list of typed parts (``text``, ``image_url``, ...)."""

    role: MessageRole
    content: str | list[dict[str, Any]]


def _check_message(i: int, message: Any) -> None:
    if not isinstance(message, dict):
        raise TypeError(
            f"TextGenerationRequest.messages[{i}] must be a dict with 'role' and 'content', got "
            f"{type(message).__name__}"
        )
    role = message.get("role")
    if role not in _ROLES:
        raise ValueError(f"TextGenerationRequest.messages[{i}]['role'] must be one of {_ROLES}, got {role!r}")
    content = message.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise TypeError(
            f"TextGenerationRequest.messages[{i}]['content'] must be a str or a list of parts, got "
            f"{type(content).__name__}"
        )


@dataclass(frozen=True)
class TextGenerationRequest(Request):
    """The normalized request the tokenizer and pipeline consume.

    Give ``prompt`` (completions: text or token ids) or ``messages`` (chat), not both.

    Example::

        >>> req = TextGenerationRequest(request_id=RequestID("r1"), model_name="m", prompt="Hello",
        ...                             sampling_params=SamplingParams(top_k=1, max_new_tokens=8))
        >>> req.sampling_params.max_new_tokens, req.logprobs, req.request_path
        (8, 0, '/')
    """

    model_name: str
    """Served model name."""
    prompt: str | Sequence[int] | None = None
    """Text or token ids (completions API)."""
    messages: list[TextGenerationRequestMessage] | None = None
    """Chat messages (chat completions API)."""
    images: list[bytes] | None = None
    """Image bytes for multimodal prompts."""
    tools: list[TextGenerationRequestTool] | None = None
    """Tool definitions for function calling."""
    response_format: TextGenerationResponseFormat | None = None
    """Structured output specification (JSON schema)."""
    timestamp_ns: int = 0
    """Arrival time in nanoseconds (metrics)."""
    request_path: str = "/"
    """Endpoint path (routing, logging)."""
    logprobs: int = 0
    """Top-k log probabilities to return per token; 0 = none."""
    echo: bool = False
    """Return the prompt along with the completion."""
    stop: str | list[str] | None = None
    """Stop string(s), as in OpenAI's API."""
    chat_template_options: dict[str, Any] | None = None
    """Extra keyword arguments for the chat template (e.g. ``enable_thinking``)."""
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    """Sampling settings of this request."""
    target_endpoint: str | None = None
    """Routing target in disaggregated serving."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.model_name, str):
            raise TypeError(f"TextGenerationRequest.model_name must be a str, got {type(self.model_name).__name__}")
        if self.prompt is not None and not isinstance(self.prompt, str):
            if not isinstance(self.prompt, Sequence) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in self.prompt
            ):
                raise TypeError("TextGenerationRequest.prompt must be a str or a sequence of int token ids")
        if self.messages is not None:
            for i, message in enumerate(self.messages):
                _check_message(i, message)
        if self.prompt and self.messages:
            raise ValueError("TextGenerationRequest takes prompt or messages, not both")
        if self.images and isinstance(self.prompt, str):
            raise ValueError("TextGenerationRequest: images need messages (with image parts), not a string prompt")
        if isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int) or self.logprobs < 0:
            raise ValueError(f"TextGenerationRequest.logprobs must be an int >= 0, got {self.logprobs!r}")
        if not isinstance(self.sampling_params, SamplingParams):
            raise TypeError(
                "TextGenerationRequest.sampling_params must be a SamplingParams, got "
                f"{type(self.sampling_params).__name__}"
            )

    def __str__(self) -> str:
        return str(self.request_id)


@dataclass
class TextGenerationOutput:
    """Per-request result of one ``execute`` step: the new token ids since the previous output.

    Example::

        >>> out = TextGenerationOutput(RequestID("r"), [5, 6], GenerationStatus.MAXIMUM_LENGTH)
        >>> out.is_done, out.log_probabilities
        (True, None)
    """

    request_id: RequestID
    """The request this output belongs to."""
    tokens: list[int]
    """Token ids generated since the previous output."""
    final_status: GenerationStatus
    """Status after this step."""
    log_probabilities: list[LogProbabilities] | None = None
    """Log probabilities per token, when requested."""

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, RequestID):
            self.request_id = RequestID(self.request_id)
        self.final_status = GenerationStatus(self.final_status)

    @property
    def is_done(self) -> bool:
        """Whether the request finished (``final_status`` is not ACTIVE)."""
        return self.final_status.is_done

    @classmethod
    def merge(cls, outputs: Sequence[TextGenerationOutput]) -> TextGenerationOutput:
        """Concatenate the chunks of one request into one output (status of the last chunk).

        Example::

            >>> a = TextGenerationOutput("r", [1], GenerationStatus.ACTIVE)
            >>> b = TextGenerationOutput("r", [2, 3], GenerationStatus.END_OF_SEQUENCE)
            >>> TextGenerationOutput.merge([a, b]).tokens
            [1, 2, 3]
        """
        if not outputs:
            raise ValueError("TextGenerationOutput.merge needs at least one output")
        ids = {o.request_id for o in outputs}
        if len(ids) != 1:
            raise ValueError(f"TextGenerationOutput.merge: outputs belong to different requests {sorted(ids)}")
        with_lp = [o.log_probabilities is not None for o in outputs]
        if any(with_lp) and not all(with_lp):
            raise ValueError("TextGenerationOutput.merge: some outputs have log_probabilities and some do not")
        return cls(
            request_id=outputs[0].request_id,
            tokens=[t for o in outputs for t in o.tokens],
            final_status=outputs[-1].final_status,
            log_probabilities=[lp for o in outputs for lp in o.log_probabilities] if all(with_lp) else None,
        )


class BatchType(str, Enum):
    """Context-encoding (prefill) batch or token-generation (decode) batch."""

    CE = "CE"
    """Context encoding (prefill)."""
    TG = "TG"
    """Token generation (decode)."""


_ContextT = TypeVar("_ContextT")


def _merge_batches(batches: list[dict[RequestID, Any]]) -> dict[RequestID, Any]:
    merged: dict[RequestID, Any] = {}
    for replica, batch in enumerate(batches):
        for rid, ctx in batch.items():
            if rid in merged:
                raise ValueError(f"request {rid!r} appears in more than one replica batch (again in replica {replica})")
            merged[rid] = ctx
    return merged


@dataclass(eq=True)
class TextGenerationInputs(PipelineInputs, Generic[_ContextT]):  # noqa: UP046 - typing.get_type_hints (msgpack decoding) must resolve the type variables on 3.12
    """One scheduler step: per-replica ``{RequestID: context}`` batches, the decode steps to run, CE or TG.

    Several batches only with data parallelism (one per replica).

    Example::

        >>> from types import SimpleNamespace as NS
        >>> a = NS(log_probabilities=0, log_probabilities_echo=False)
        >>> b = NS(log_probabilities=5, log_probabilities_echo=True)
        >>> inp = TextGenerationInputs(batches=[{RequestID("a"): a}, {RequestID("b"): b}], num_steps=4)
        >>> list(inp.batch), inp.batch_top_log_probs, inp.enable_log_probs, inp.enable_echo, inp.batch_type
        ([RequestID('a'), RequestID('b')], [0, 5], True, True, <BatchType.TG: 'TG'>)
    """

    batches: list[dict[RequestID, _ContextT]]
    """Per-replica batches mapping request ids to contexts."""
    num_steps: int
    """Decode steps to run in this call."""
    input_tokens: int = -1
    """Number of input tokens in the batch; -1 = unknown."""
    batch_type: BatchType = BatchType.TG
    """CE (prefill) or TG (decode)."""

    def __post_init__(self) -> None:
        if isinstance(self.batches, dict):
            raise TypeError(
                "TextGenerationInputs.batches must be a list of per-replica dicts, e.g. batches=[{request_id: context}]"
            )
        self.batches = list(self.batches)
        for i, batch in enumerate(self.batches):
            if not isinstance(batch, dict):
                raise TypeError(
                    f"TextGenerationInputs.batches[{i}] must be a dict {{RequestID: context}}, got "
                    f"{type(batch).__name__}"
                )
        if isinstance(self.num_steps, bool) or not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(f"TextGenerationInputs.num_steps must be an int >= 1, got {self.num_steps!r}")
        self.batch_type = BatchType(self.batch_type)

    @property
    def batch(self) -> dict[RequestID, _ContextT]:
        """All replica batches merged into one dict (replica order, then insertion order)."""
        return _merge_batches(self.batches)

    @property
    def batch_top_log_probs(self) -> list[int]:
        """Requested top-k log probabilities of each context, in :attr:`batch` order."""
        return [int(ctx.log_probabilities) for ctx in self.batch.values()]

    @property
    def batch_echo(self) -> list[bool]:
        """Whether each context wants prompt log probabilities (echo), in :attr:`batch` order."""
        return [bool(ctx.log_probabilities_echo) for ctx in self.batch.values()]

    @property
    def enable_log_probs(self) -> bool:
        """True if any context requests log probabilities."""
        return any(n > 0 for n in self.batch_top_log_probs)

    @property
    def enable_echo(self) -> bool:
        """True if any context has echo enabled."""
        return any(self.batch_echo)
