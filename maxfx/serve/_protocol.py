"""The OpenAI request bodies ``maxfx serve`` accepts, as pydantic models.

Types are checked here (a string where a number belongs is a 400 that names the
field); value ranges are checked once, by `maxfx.interfaces.SamplingParams`, so
the server, `LLM` and the pipelines reject the same values with the same words.
Unknown fields are ignored, as OpenAI-compatible servers do.

Example:
    >>> req = CompletionRequest(prompt="hello", max_tokens=4, temperature=0, some_new_openai_field=1)
    >>> req.sampling_input().max_new_tokens, req.sampling_input().temperature
    (4, 0.0)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from maxfx.interfaces import SamplingParamsInput

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "DetokenizeRequest",
    "EmbeddingRequest",
    "StreamOptions",
    "TokenizeRequest",
]

MAX_TOP_LOGPROBS = 20
"""The most alternatives per token a request may ask for (OpenAI's limit)."""


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    """``stream_options``: ``include_usage`` adds one last chunk with ``usage`` and empty ``choices``."""

    include_usage: bool = False


class _Sampling(_Body):
    """The sampling fields completions and chat share (None: the model's generation config, else MAX's defaults)."""

    model: str | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = Field(None, ge=0, le=2)  # OpenAI's range (SamplingParams itself takes any value >= 0)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None
    n: int = 1
    best_of: int | None = None

    def limit(self) -> int | None:
        """The most tokens to generate the request asks for."""
        return self.max_tokens

    def sampling_input(self) -> SamplingParamsInput:
        """The request's sampling fields as MAX's `SamplingParamsInput` (merged with the model's defaults later)."""
        return SamplingParamsInput(
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            temperature=self.temperature,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            max_new_tokens=self.limit(),
            min_new_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos or None,
            stop_token_ids=self.stop_token_ids,
            seed=self.seed,
        )

    @property
    def include_usage(self) -> bool:
        """A streamed response ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def stops(self) -> list[str]:
        """The stop strings, as a list."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: ``prompt`` is a string, a list of strings, token ids, or lists of token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """One entry per choice: each prompt as text or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``: ``messages`` rendered by the model's chat template."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def limit(self) -> int | None:
        """``max_completion_tokens`` (OpenAI's newer name) else ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class EmbeddingRequest(_Body):
    """``POST /v1/embeddings``: ``input`` is a string, a list of strings, token ids, or lists of token ids."""

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class TokenizeRequest(_Body):
    """``POST /tokenize``: ``prompt`` text (or chat ``messages``) to token ids."""

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(_Body):
    """``POST /detokenize``: token ids to text."""

    model: str | None = None
    tokens: list[int] = Field(default_factory=list)
