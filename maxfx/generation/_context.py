"""`TextContext`: one text-generation request's state, as MAX's ``max.pipelines.core.TextContext``.

The tokens live in one growable int64 buffer with three cursors:

- ``[0, start_idx)``: already in the KV cache;
- ``[start_idx, active_idx)``: `next_tokens`, what the next forward runs (a prompt
  chunk during prefill, one token in decode);
- ``[active_idx, end_idx)``: reserved (empty unless a caller set it).

`update` appends a sampled token and applies the stop rules (EOS ids, multi-token
EOS sequences, ``max_length``, ``max_new_tokens``; EOS is ignored until
``min_new_tokens`` tokens exist, and always with ``ignore_eos``); `jump_ahead`
appends a forced token (speculative acceptance, grammar fast-forward); `reset`
puts every token back to be prefilled again (after a preemption); and
`to_generation_output` hands the tokens not yet returned to the caller.

Example:
    >>> import numpy as np
    >>> from maxfx.interfaces import SamplingParams
    >>> ctx = TextContext(max_length=16, tokens=np.array([5, 6, 7]), eos_token_ids={2},
    ...                   sampling_params=SamplingParams(max_new_tokens=4))
    >>> ctx.next_tokens.tolist(), ctx.needs_ce
    ([5, 6, 7], True)
    >>> ctx.update(9); ctx.next_tokens.tolist(), ctx.start_idx
    ([9], 3)
    >>> ctx.update(2); ctx.status.name, ctx.to_generation_output().tokens
    ('END_OF_SEQUENCE', [9, 2])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from maxfx.interfaces import GenerationStatus, LogProbabilities, RequestID, SamplingParams, TextGenerationOutput

__all__ = ["TextContext"]


def _as_tokens(tokens: Any) -> np.ndarray:
    arr = np.asarray(tokens)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"TextContext: tokens must be a non-empty 1-D array of token ids, got shape {list(arr.shape)}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"TextContext: tokens must be integer token ids, got {arr.dtype}")
    return arr.astype(np.int64)


class TextContext:
    """The mutable state of one text request (MAX's ``TextContext``; see the module docstring).

    Args:
        max_length: the longest the sequence may grow (prompt + generated tokens).
        tokens: the prompt's token ids (1-D, non-empty).
        request_id: the request's `RequestID` (default: a fresh one).
        eos_token_ids: ids that end the request (unless ``ignore_eos``).
        eos_sequences: multi-token sequences that end it when generated.
        log_probabilities: top-k log probabilities to return per token (0: none).
        log_probabilities_echo: also return the prompt tokens' log probabilities.
        json_schema: a JSON schema the output must follow (structured output).
        sampling_params: the request's `SamplingParams`.
        model_name: the model the request targets.
        ignore_eos: run to the length limit whatever is generated.
        target_endpoint: routing hint (disaggregated serving; kept, not used).

    Raises:
        ValueError: empty or non-integer tokens, or a prompt already at ``max_length``.
    """

    def __init__(
        self,
        *,
        max_length: int,
        tokens: Any,
        request_id: RequestID | str | None = None,
        eos_token_ids: Iterable[int] | None = None,
        eos_sequences: Sequence[Sequence[int]] | None = None,
        log_probabilities: int = 0,
        log_probabilities_echo: bool = False,
        json_schema: str | None = None,
        sampling_params: SamplingParams | None = None,
        model_name: str = "",
        ignore_eos: bool = False,
        target_endpoint: str | None = None,
    ):
        prompt = _as_tokens(tokens)
        if int(max_length) < 1:
            raise ValueError(f"TextContext: max_length must be >= 1, got {max_length}")
        if len(prompt) >= int(max_length):
            raise ValueError(
                f"TextContext: the prompt has {len(prompt)} tokens; max_length {int(max_length)} leaves no room to "
                "generate"
            )
        if int(log_probabilities) < 0:
            raise ValueError(f"TextContext: log_probabilities must be >= 0, got {log_probabilities}")
        self.request_id = RequestID() if request_id is None else RequestID(str(request_id))
        self.max_length = int(max_length)
        self.sampling_params = sampling_params if sampling_params is not None else SamplingParams()
        self.eos_token_ids = {int(t) for t in (eos_token_ids or ())}
        self.eos_sequences = [list(map(int, s)) for s in (eos_sequences or ()) if len(s)]
        self.log_probabilities = int(log_probabilities)
        self.log_probabilities_echo = bool(log_probabilities_echo)
        self.json_schema = json_schema
        self.model_name = model_name
        self.ignore_eos = bool(ignore_eos) or bool(getattr(self.sampling_params, "ignore_eos", False))
        self.target_endpoint = target_endpoint
        self.status = GenerationStatus.ACTIVE
        self.tokens = np.zeros(max(len(prompt) + 16, 64), np.int64)
        self.tokens[: len(prompt)] = prompt
        self._prompt_len = len(prompt)
        self._start_idx = 0
        self._active_idx = self._end_idx = len(prompt)
        self._returned = len(prompt)  # generated tokens below this index were handed out already
        self._log_probs: dict[int, LogProbabilities] = {}
        # Echo: the log probability of each prompt token given the ones before (None for the first), filled during
        # prefill.
        self.prompt_log_probabilities: list[LogProbabilities | None] = (
            [None] * len(prompt) if self.log_probabilities_echo else []
        )
        self._matcher: Any = None

    # ── cursors ──
    @property
    def start_idx(self) -> int:
        """Tokens already in the KV cache."""
        return self._start_idx

    @property
    def active_idx(self) -> int:
        """End (exclusive) of the tokens the next forward runs."""
        return self._active_idx

    @property
    def end_idx(self) -> int:
        """End (exclusive) of the valid tokens."""
        return self._end_idx

    @property
    def active_length(self) -> int:
        """Tokens the next forward runs (a prompt chunk, or 1 in decode)."""
        return self._active_idx - self._start_idx

    @property
    def current_length(self) -> int:
        """Cached plus active tokens."""
        return self._active_idx

    @property
    def next_tokens(self) -> np.ndarray:
        """The tokens the next forward runs, ``tokens[start_idx:active_idx]``."""
        return self.tokens[self._start_idx : self._active_idx]

    @property
    def all_tokens(self) -> np.ndarray:
        """Prompt and generated tokens, ``tokens[:end_idx]``."""
        return self.tokens[: self._end_idx]

    @property
    def prompt_length(self) -> int:
        """Tokens in the original prompt."""
        return self._prompt_len

    @property
    def prompt_tokens(self) -> np.ndarray:
        """The original prompt."""
        return self.tokens[: self._prompt_len]

    @property
    def generated_tokens(self) -> np.ndarray:
        """The tokens generated after the prompt."""
        return self.tokens[self._prompt_len : self._end_idx]

    @property
    def num_generated(self) -> int:
        """How many tokens were generated."""
        return self._end_idx - self._prompt_len

    @property
    def needs_ce(self) -> bool:
        """True while prompt tokens are still to be encoded (prefill, possibly chunked, not finished)."""
        return self.active_length > 1 or self._start_idx == 0

    @property
    def is_initial_prompt(self) -> bool:
        """No token generated yet."""
        return self.num_generated == 0

    @property
    def min_tokens(self) -> int:
        """Tokens to generate before EOS may end the request (``sampling_params.min_new_tokens``)."""
        return int(getattr(self.sampling_params, "min_new_tokens", 0) or 0)

    @property
    def max_new_tokens(self) -> int:
        """Tokens this request may still add in total: ``sampling_params.max_new_tokens``, capped by ``max_length``."""
        limit = self.max_length - self._prompt_len
        asked = getattr(self.sampling_params, "max_new_tokens", None)
        return limit if asked is None else min(int(asked), limit)

    @property
    def is_done(self) -> bool:
        """The request finished (EOS, a limit, or cancelled)."""
        return self.status.is_done

    def set_token_indices(
        self, start_idx: int | None = None, active_idx: int | None = None, end_idx: int | None = None
    ) -> None:
        """Set the cursors; ValueError unless ``0 <= start_idx <= active_idx <= end_idx <= len(tokens)``."""
        s = self._start_idx if start_idx is None else int(start_idx)
        a = self._active_idx if active_idx is None else int(active_idx)
        e = self._end_idx if end_idx is None else int(end_idx)
        if end_idx is not None and e > len(self.tokens):
            self._grow(e)
        if not 0 <= s <= a <= e <= len(self.tokens):
            raise ValueError(
                f"TextContext.set_token_indices: need 0 <= start_idx ({s}) <= active_idx ({a}) <= end_idx ({e}) <= "
                f"{len(self.tokens)}"
            )
        self._start_idx, self._active_idx, self._end_idx = s, a, e

    def bump_token_indices(self, start_idx: int = 0, active_idx: int = 0, end_idx: int = 0) -> None:
        """Move the cursors by these deltas (checked as `set_token_indices`)."""
        self.set_token_indices(self._start_idx + start_idx, self._active_idx + active_idx, self._end_idx + end_idx)

    def compute_num_available_steps(self, max_seq_len: int) -> int:
        """Decode steps left before the sequence reaches ``max_seq_len``."""
        return int(max_seq_len) - self._end_idx

    # ── tokens ──
    def _grow(self, need: int) -> None:
        if need > len(self.tokens):
            self.tokens = np.concatenate(
                [self.tokens, np.zeros(max(need - len(self.tokens), len(self.tokens)), np.int64)]
            )

    def _append(self, token: int) -> None:
        self._grow(self._end_idx + 1)
        self.tokens[self._end_idx] = int(token)
        self._end_idx += 1
        self._start_idx, self._active_idx = self._end_idx - 1, self._end_idx  # the new token runs next

    def update(self, new_token: int, log_probabilities: LogProbabilities | None = None) -> None:
        """Append a sampled token (the tokens that were active are now cached) and apply the stop rules."""
        if self.is_done:
            raise ValueError(f"TextContext.update: request {self.request_id} is already {self.status.name}")
        self._append(new_token)
        if log_probabilities is not None:
            self._log_probs[self._end_idx - 1] = log_probabilities
        self._check_stop(int(new_token))

    def jump_ahead(self, new_token: int) -> None:
        """Append a forced token (accepted draft token, grammar fast-forward); stop rules apply as in `update`."""
        self.update(new_token)

    def _check_stop(self, token: int) -> None:
        n = self.num_generated
        if not self.ignore_eos and n >= self.min_tokens:
            if token in self.eos_token_ids:
                self.status = GenerationStatus.END_OF_SEQUENCE
                return
            tail = self.tokens[: self._end_idx]
            for seq in self.eos_sequences:
                if len(seq) <= n and tail[-len(seq) :].tolist() == seq:
                    self.status = GenerationStatus.END_OF_SEQUENCE
                    return
        if n >= self.max_new_tokens or self._end_idx >= self.max_length:
            self.status = GenerationStatus.MAXIMUM_LENGTH

    def get_last_generated_token(self) -> int:
        """The newest generated token; ValueError when none was generated."""
        if self.num_generated == 0:
            raise ValueError(
                f"TextContext.get_last_generated_token: request {self.request_id} has generated no token yet"
            )
        return int(self.tokens[self._end_idx - 1])

    def get_min_token_logit_mask(self, num_steps: int) -> list[np.ndarray]:
        """Per step, the token ids to mask (EOS) because ``min_new_tokens`` is not reached yet (empty arrays after)."""
        eos = np.array(sorted(self.eos_token_ids), np.int32)
        empty = np.zeros(0, np.int32)
        return [
            eos if self.num_generated + i < self.min_tokens and not self.ignore_eos else empty
            for i in range(int(num_steps))
        ]

    def reset(self) -> None:
        """Put every token back to be prefilled again (after the request's KV pages were taken away)."""
        self._start_idx = 0
        self._active_idx = self._end_idx
        if self.status is not GenerationStatus.CANCELLED:
            self.status = GenerationStatus.ACTIVE

    def cancel(self) -> None:
        """Mark the request cancelled (it returns what it has and frees its pages)."""
        self.status = GenerationStatus.CANCELLED

    # ── structured output ──
    @property
    def matcher(self) -> Any:
        """The grammar constraining this request (a `maxfx.generation.GrammarMatcher`, set by `Scheduler.submit` from
        ``json_schema``), or None.
        """
        return self._matcher

    def set_matcher(self, matcher: Any) -> None:
        """Install the grammar matcher for structured output."""
        self._matcher = matcher

    # ── output ──
    def to_generation_output(self) -> TextGenerationOutput:
        """The tokens (and log probabilities) not handed out yet, as a `TextGenerationOutput`."""
        start, end = self._returned, self._end_idx
        self._returned = end
        tokens = self.tokens[start:end].tolist()
        logprobs = (
            [self._log_probs.pop(i) for i in range(start, end) if i in self._log_probs] if self._log_probs else None
        )
        return TextGenerationOutput(
            request_id=self.request_id, tokens=tokens, final_status=self.status, log_probabilities=logprobs or None
        )

    def __repr__(self) -> str:
        return (
            f"TextContext(request_id={self.request_id!s}, prompt={self._prompt_len}, generated={self.num_generated}, "
            f"start_idx={self._start_idx}, active_idx={self._active_idx}, end_idx={self._end_idx}, "
            f"status={self.status.name})"
        )
