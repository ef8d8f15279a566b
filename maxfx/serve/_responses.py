"""OpenAI response bodies: completions, chat completions, their stream chunks, usage and log probabilities.

Plain dicts in OpenAI's field order, so the official client parses them and the
JSON stays cheap to write. `TokenText` turns token ids into the strings the
log-probability fields show (one decode per id, cached).

Example:
    >>> usage(prompt_tokens=3, completion_tokens=2, cached_tokens=0)
    {'prompt_tokens': 3, 'completion_tokens': 2, 'total_tokens': 5, 'prompt_tokens_details': {'cached_tokens': 0}}
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

__all__ = ["TokenText", "chat_chunk", "chat_logprobs", "completion_chunk", "completion_logprobs", "new_id", "usage"]


def new_id(prefix: str) -> str:
    """An OpenAI-style response id (``cmpl-...``, ``chatcmpl-...``)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(*, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's ``usage`` object (``prompt_tokens_details.cached_tokens``: prompt tokens served from prefix-cached KV
    pages).
    """
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class TokenText:
    """The text of single tokens, for log-probability fields (a token that is part of a UTF-8 character shows
    U+FFFD).
    """

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self._cache.get(token)
        if text is None:
            text = self._cache[token] = self._tokenizer.decode([int(token)], skip_special_tokens=False)
        return text


def completion_logprobs(
    tokens: Sequence[int], logprobs: Sequence[Any], k: int, text_of: TokenText, offset: int = 0
) -> dict[str, Any]:
    """``choices[i].logprobs`` of ``/v1/completions``: ``tokens``, ``token_logprobs``, ``top_logprobs`` (k per token),
    ``text_offset``.

    ``logprobs`` holds one `LogProbabilities` (or None, e.g. an echoed first prompt token) per token.
    """
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    pos = offset
    for tok, lp in zip(tokens, logprobs):
        text = text_of(tok)
        out["tokens"].append(text)
        out["text_offset"].append(pos)
        pos += len(text)
        if lp is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(float(lp.token_log_probabilities[0]))
        top = sorted(lp.top_log_probabilities[0].items(), key=lambda kv: -kv[1])[:k]
        out["top_logprobs"].append({text_of(t): float(v) for t, v in top})
    return out


def _entry(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tokens: Sequence[int], logprobs: Sequence[Any], k: int, text_of: TokenText) -> dict[str, Any]:
    """``choices[0].logprobs`` of ``/v1/chat/completions``: ``content``, one entry per token with ``top_logprobs``
    (k).
    """
    content = []
    for tok, lp in zip(tokens, logprobs):
        if lp is None:
            continue
        entry = _entry(text_of(tok), float(lp.token_log_probabilities[0]))
        top = sorted(lp.top_log_probabilities[0].items(), key=lambda kv: -kv[1])[:k]
        entry["top_logprobs"] = [_entry(text_of(t), float(v)) for t, v in top]
        content.append(entry)
    return {"content": content}


def completion_chunk(
    rid: str, model: str, created: int, index: int, text: str, finish_reason: str | None, logprobs: Any = None
) -> dict[str, Any]:
    """One streamed ``text_completion`` chunk."""
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def chat_chunk(
    rid: str, model: str, created: int, delta: dict[str, Any], finish_reason: str | None, logprobs: Any = None
) -> dict[str, Any]:
    """One streamed ``chat.completion.chunk``."""
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}


def usage_chunk(rid: str, model: str, created: int, obj: str, use: dict[str, Any]) -> dict[str, Any]:
    """The last chunk of a stream with ``stream_options.include_usage``: empty ``choices``, the ``usage``."""
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": use}


def now() -> int:
    """Seconds since the epoch (OpenAI's ``created``)."""
    return int(time.time())
