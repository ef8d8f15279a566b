"""The text-generation context protocol and the token-buffer state its default members work on."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from ._context import BaseContext, context_state, register_state_types
from ._log_probabilities import LogProbabilities
from ._request import RequestID
from ._sampling import SamplingParams
from ._status import GenerationStatus
from ._text_generation import TextGenerationOutput

__all__ = ["CHUNK_SIZE", "TextGenerationContext", "TextGenerationContextType", "init_text_generation_state"]

CHUNK_SIZE = 128
"""The token buffer grows in multiples of this many slots."""


def init_text_generation_state(
    ctx: object,
    *,
    request_id: RequestID | str,
    tokens: npt.ArrayLike,
    max_length: int | None = None,
    sampling_params: SamplingParams | None = None,
    eos_token_ids: Iterable[int] = (),
    log_probabilities: int = 0,
    log_probabilities_echo: bool = False,
    json_schema: str | None = None,
    matcher: Any | None = None,
    model_name: str = "",
) -> None:
    """Store the canonical state the :class:`TextGenerationContext` defaults read, for a fresh prompt.

    ``tokens`` is the prompt; the buffer is padded to a multiple of
    :data:`CHUNK_SIZE`. The whole prompt is the first ``next_tokens`` window.

    Example::

        >>> class Ctx(TextGenerationContext):
        ...     def __init__(self, **kw):
        ...         init_text_generation_state(self, **kw)
        >>> c = Ctx(request_id="r", tokens=[1, 2, 3], eos_token_ids={0})
        >>> c.next_tokens.tolist(), c.needs_ce, len(c.tokens)
        ([1, 2, 3], True, 128)
    """
    prompt = np.asarray(tokens, dtype=np.int32).reshape(-1)
    if prompt.size == 0:
        raise ValueError("a text generation context needs at least one prompt token")
    if max_length is not None and prompt.size > max_length:
        raise ValueError(f"prompt has {prompt.size} tokens, more than max_length={max_length}")
    n = prompt.size
    buf = np.zeros(-(-n // CHUNK_SIZE) * CHUNK_SIZE, dtype=np.int32)
    buf[:n] = prompt
    state = {
        "request_id": RequestID(request_id) if not isinstance(request_id, RequestID) else request_id,
        "status": GenerationStatus.ACTIVE,
        "tokens": buf,
        "start_idx": 0,
        "active_idx": n,
        "end_idx": n,
        "prompt_len": n,
        "is_initial_prompt": True,
        "output_idx": n,
        "pending_log_probabilities": [],
        "max_length": max_length,
        "sampling_params": sampling_params if sampling_params is not None else SamplingParams(),
        "eos_token_ids": {int(t) for t in eos_token_ids},
        "log_probabilities": int(log_probabilities),
        "log_probabilities_echo": bool(log_probabilities_echo),
        "json_schema": json_schema,
        "matcher": matcher,
        "model_name": model_name,
    }
    for name, value in state.items():
        setattr(ctx, "_" + name, value)


def _append_token(ctx: TextGenerationContext, token: int) -> None:
    buf = ctx.tokens
    end = ctx.end_idx
    if end >= len(buf):
        grown = np.zeros(len(buf) + CHUNK_SIZE, dtype=buf.dtype)
        grown[: len(buf)] = buf
        ctx._tokens = buf = grown
    buf[end] = token
    ctx._end_idx = end + 1
    ctx._is_initial_prompt = False
    matcher = ctx.matcher
    if matcher is not None and hasattr(matcher, "consume_token"):
        matcher.consume_token(token)


def _update_status(ctx: TextGenerationContext, token: int) -> None:
    if ctx.status.is_done:
        return
    params = ctx.sampling_params
    generated = len(ctx.generated_tokens)
    if not params.ignore_eos and token in ctx.eos_token_ids:
        ctx.status = GenerationStatus.END_OF_SEQUENCE
    elif params.stop_token_ids and token in params.stop_token_ids:
        ctx.status = GenerationStatus.END_OF_SEQUENCE
    elif params.max_new_tokens is not None and generated >= params.max_new_tokens:
        ctx.status = GenerationStatus.MAXIMUM_LENGTH
    elif ctx.max_length is not None and ctx.end_idx >= ctx.max_length:
        ctx.status = GenerationStatus.MAXIMUM_LENGTH


@runtime_checkable
class TextGenerationContext(BaseContext, Protocol):
    """Protocol of a text request's mutable state: a token buffer with three cursors.

    ``[0, start_idx)`` is already in the KV cache, ``[start_idx, active_idx)`` is
    ``next_tokens`` (a prompt chunk during prefill, usually one token in
    decode), ``[active_idx, end_idx)`` are valid tokens not yet scheduled, and
    the buffer past ``end_idx`` is preallocated.

    Every member has a default working on the state written by
    :func:`init_text_generation_state` (``_tokens``, ``_start_idx``, ...), so a
    subclass that calls it is a complete context; other implementations
    override the members.

    Example::

        >>> class Ctx(TextGenerationContext):
        ...     def __init__(self, **kw):
        ...         init_text_generation_state(self, **kw)
        >>> c = Ctx(request_id="r", tokens=[1, 2, 3], eos_token_ids={0},
        ...     sampling_params=SamplingParams(max_new_tokens=4))
        >>> c.update(7); c.next_tokens.tolist(), c.start_idx, c.generated_tokens.tolist()
        ([7], 3, [7])
        >>> c.update(0); c.status, c.to_generation_output().tokens
        (<GenerationStatus.END_OF_SEQUENCE: 'end_of_sequence'>, [7, 0])
    """

    # -- cursors and token views ------------------------------------------------

    @property
    def tokens(self) -> npt.NDArray[np.integer[Any]]:
        """The whole token buffer, preallocated slots included (prefer :attr:`all_tokens`)."""
        return context_state(self, "tokens")

    @property
    def start_idx(self) -> int:
        """End of the tokens already encoded (in the KV cache); start of :attr:`next_tokens`."""
        return context_state(self, "start_idx")

    @property
    def active_idx(self) -> int:
        """End (exclusive) of :attr:`next_tokens`."""
        return context_state(self, "active_idx")

    @property
    def end_idx(self) -> int:
        """End (exclusive) of the valid tokens."""
        return context_state(self, "end_idx")

    @property
    def active_length(self) -> int:
        """Tokens processed in this step: the prompt (chunk) during prefill, usually 1 in decode."""
        return self.active_idx - self.start_idx

    @property
    def current_length(self) -> int:
        """Encoded plus active tokens."""
        return self.start_idx + self.active_length

    @property
    def next_tokens(self) -> npt.NDArray[np.integer[Any]]:
        """The tokens to feed on the next forward pass (``active_length`` of them)."""
        return self.tokens[self.start_idx : self.active_idx]

    @property
    def all_tokens(self) -> npt.NDArray[np.integer[Any]]:
        """Prompt and generated tokens, without the preallocated slots."""
        return self.tokens[: self.end_idx]

    @property
    def prompt_tokens(self) -> npt.NDArray[np.integer[Any]]:
        """The original prompt tokens."""
        return self.tokens[: context_state(self, "prompt_len")]

    @property
    def generated_tokens(self) -> npt.NDArray[np.integer[Any]]:
        """Tokens produced after the prompt."""
        return self.tokens[context_state(self, "prompt_len") : self.end_idx]

    @property
    def is_initial_prompt(self) -> bool:
        """True until the first token is appended (and again after :meth:`reset`)."""
        return context_state(self, "is_initial_prompt")

    @property
    def needs_ce(self) -> bool:
        """Whether prompt tokens remain to be encoded (prefill, possibly chunked, is pending)."""
        return self.start_idx < context_state(self, "prompt_len")

    def get_last_generated_token(self) -> int:
        """The newest generated token; ``ValueError`` if none was generated yet."""
        generated = self.generated_tokens
        if generated.size == 0:
            raise ValueError(f"request {self.request_id!r} has not generated any token yet")
        return int(generated[-1])

    def set_token_indices(
        self, start_idx: int | None = None, active_idx: int | None = None, end_idx: int | None = None
    ) -> None:
        """Set the cursors to absolute values (``None`` keeps one); keeps ``0 <= start <= active <= end <=
        len(tokens)``.
        """
        start = self.start_idx if start_idx is None else start_idx
        active = self.active_idx if active_idx is None else active_idx
        end = self.end_idx if end_idx is None else end_idx
        if not 0 <= start <= active <= end <= len(self.tokens):
            raise ValueError(
                f"token indices must satisfy 0 <= start_idx <= active_idx <= end_idx <= {len(self.tokens)}, got "
                f"start_idx={start}, active_idx={active}, end_idx={end}"
            )
        self._start_idx, self._active_idx, self._end_idx = start, active, end

    def bump_token_indices(self, start_idx: int = 0, active_idx: int = 0, end_idx: int = 0) -> None:
        """Move the cursors by the given deltas (same invariants as :meth:`set_token_indices`)."""
        self.set_token_indices(self.start_idx + start_idx, self.active_idx + active_idx, self.end_idx + end_idx)

    def compute_num_available_steps(self, max_seq_len: int) -> int:
        """Decode steps that fit before the KV cache holds ``max_seq_len`` positions.

        The first step encodes :attr:`next_tokens`; every further step adds one position.
        """
        return max_seq_len - self.current_length + 1

    # -- request settings ---------------------------------------------------------

    @property
    def sampling_params(self) -> SamplingParams:
        """The request's :class:`SamplingParams`."""
        return context_state(self, "sampling_params")

    @property
    def eos_token_ids(self) -> set[int]:
        """Token ids that end the request."""
        return context_state(self, "eos_token_ids")

    @property
    def max_length(self) -> int | None:
        """Sequence length limit (prompt + generated), or ``None``."""
        return context_state(self, "max_length")

    @property
    def min_tokens(self) -> int:
        """Tokens to generate before EOS may end the request (``sampling_params.min_new_tokens``)."""
        return self.sampling_params.min_new_tokens

    @property
    def log_probabilities(self) -> int:
        """Top-k log probabilities to return per token; 0 = off."""
        return context_state(self, "log_probabilities")

    @property
    def log_probabilities_echo(self) -> bool:
        """Whether prompt tokens get log probabilities too."""
        return context_state(self, "log_probabilities_echo")

    @property
    def json_schema(self) -> str | None:
        """JSON schema for constrained decoding, or ``None``."""
        return context_state(self, "json_schema")

    @property
    def matcher(self) -> Any | None:
        """The grammar matcher (e.g. an llguidance ``LLMatcher``), or ``None``."""
        return context_state(self, "matcher")

    def set_matcher(self, matcher: Any) -> None:
        """Install a grammar matcher for constrained decoding."""
        self._matcher = matcher

    def get_min_token_logit_mask(self, num_steps: int) -> list[npt.NDArray[np.int32]]:
        """Per step, the token ids to mask to -inf: the EOS ids while fewer than :attr:`min_tokens` were generated.

        Example::

            >>> class Ctx(TextGenerationContext):
            ...     def __init__(self, **kw):
            ...         init_text_generation_state(self, **kw)
            >>> c = Ctx(request_id="r", tokens=[1], eos_token_ids={2}, sampling_params=SamplingParams(min_new_tokens=1))
            >>> [m.tolist() for m in c.get_min_token_logit_mask(2)]
            [[2], []]
        """
        generated = len(self.generated_tokens)
        eos = np.array(sorted(self.eos_token_ids), dtype=np.int32)
        empty = np.zeros(0, dtype=np.int32)
        return [eos.copy() if generated + step < self.min_tokens else empty.copy() for step in range(num_steps)]

    # -- mutation -------------------------------------------------------------------

    def update(self, new_token: int, log_probabilities: LogProbabilities | None = None) -> None:
        """Append a sampled token: it becomes :attr:`next_tokens`, then the stop rules update :attr:`status`.

        Stop rules: an EOS id (unless ``ignore_eos``), a ``stop_token_ids`` id,
        ``max_new_tokens`` generated, or ``max_length`` reached. Stop strings
        need text and are left to the detokenizing layer.
        """
        self._start_idx = self.active_idx
        _append_token(self, int(new_token))
        self._active_idx = self.end_idx
        if log_probabilities is not None:
            context_state(self, "pending_log_probabilities").append(log_probabilities)
        _update_status(self, int(new_token))

    def jump_ahead(self, new_token: int) -> None:
        """Append a forced token (grammar fast-forward, accepted draft token) to the tokens to run next."""
        _append_token(self, int(new_token))
        self._active_idx = self.end_idx
        _update_status(self, int(new_token))

    def reset(self) -> None:
        """Fold everything into a new prompt to encode again (after the request's KV pages were evicted)."""
        self._start_idx = 0
        self._active_idx = self.end_idx
        self._is_initial_prompt = True

    def to_generation_output(self) -> TextGenerationOutput:
        """The tokens (and log probabilities) not handed out yet, as a :class:`TextGenerationOutput`."""
        start, end = context_state(self, "output_idx"), self.end_idx
        pending = context_state(self, "pending_log_probabilities")
        out = TextGenerationOutput(
            request_id=self.request_id,
            tokens=[int(t) for t in self.tokens[start:end]],
            final_status=self.status,
            log_probabilities=list(pending) if pending else None,
        )
        self._output_idx = end
        pending.clear()
        return out


register_state_types(
    TextGenerationContext,
    {
        "_tokens": np.ndarray,
        "_start_idx": int,
        "_active_idx": int,
        "_end_idx": int,
        "_prompt_len": int,
        "_is_initial_prompt": bool,
        "_output_idx": int,
        "_pending_log_probabilities": list[LogProbabilities],
        "_max_length": int | None,
        "_sampling_params": SamplingParams,
        "_eos_token_ids": set[int],
        "_log_probabilities": int,
        "_log_probabilities_echo": bool,
        "_json_schema": str | None,
        "_model_name": str,
    },
)

TextGenerationContextType = TypeVar("TextGenerationContextType", bound=TextGenerationContext)
"""Type variable for any :class:`TextGenerationContext` implementation."""
