"""Structured output: JSON schemas enforced while decoding, by llguidance (the one module that imports it).

A request with ``TextContext.json_schema`` gets a `GrammarMatcher` at
`Scheduler.submit` (`compile_json_schema`, in the caller's thread, so a bad
schema is a ValueError there: a server's HTTP 400). Then, per step:

1. `apply_token_masks` (called by the runner while it builds the step's additive
   ``bias [B, V]``): each constrained row gets ``-inf`` on every token the grammar
   does not allow next; llguidance fills one bitmask for all rows at once.
2. `advance` (called by the scheduler after ``ctx.update``): the sampled token goes
   into the matcher; tokens the grammar forces next are appended with
   ``ctx.jump_ahead`` and left uncached, so the next step runs them through the model
   together (as a prefill chunk) instead of sampling each; a grammar that is complete
   (only EOS left) ends the request with END_OF_SEQUENCE.

The llguidance tokenizer (token id -> bytes, built from the Hugging Face
``tokenizer.json`` of a `maxfx.models.Tokenizer`) is built once per tokenizer and
EOS set and cached.

Example:
    >>> from maxfx.models import Tokenizer
    >>> tok = Tokenizer.from_file("tests/data/models/tiny_llama/tokenizer.json")
    >>> g = compile_json_schema(tok, '{"type": "object"}', eos_token_ids=[2])
    >>> bytes(int(t) for t in g.allowed_tokens()).decode()  # a JSON object must open first
    '{'
    >>> g.consume(ord("{")), g.consume(ord("}")), g.is_stopped()
    (True, True, True)
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask_par

from lowering.sampling_math import packed_bits
from maxfx.interfaces import GenerationStatus

__all__ = ["JSON_DEFAULTS", "GrammarMatcher", "advance", "apply_token_masks", "compile_json_schema", "ll_tokenizer"]

# llguidance's JSON options, before the schema's own "x-guidance" ones. Whitespace
# between JSON tokens is at most one space: llguidance's default (any run of
# whitespace) lets a weak model emit spaces and newlines until max_length.
JSON_DEFAULTS: dict[str, Any] = {"whitespace_pattern": r"[ ]?"}

_CACHE_LOCK = threading.Lock()
_CACHE: collections.OrderedDict[tuple[int, tuple[int, ...]], tuple[Any, Any]] = collections.OrderedDict()
_CACHE_SIZE = 16
_EXECUTOR: Any = None


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "unknown error"


def _tokenizer_json(tokenizer: Any) -> str:
    """The ``tokenizer.json`` text of a `maxfx.models.Tokenizer`, a ``TextTokenizer``, a transformers fast tokenizer, or
    a ``tokenizers.Tokenizer``.
    """
    obj = getattr(tokenizer, "delegate", tokenizer)  # maxfx.pipelines TextTokenizer
    for attr in ("backend", "backend_tokenizer"):  # maxfx.models.Tokenizer / transformers' fast tokenizers
        obj = getattr(obj, attr, obj)
    to_str = getattr(obj, "to_str", None)
    if not callable(to_str):
        raise ValueError(
            "structured output (json_schema) needs a tokenizer backed by Hugging Face tokenizers "
            f"(maxfx.models.Tokenizer); got {type(tokenizer).__name__}"
        )
    return to_str()


def ll_tokenizer(tokenizer: Any, eos_token_ids: Iterable[int] = ()) -> Any:
    """The ``llguidance.LLTokenizer`` of ``tokenizer`` with these EOS ids (cached: building one takes ~1 s for a large
    vocabulary).

    The grammar allows the EOS ids only where the JSON is complete. Without any
    (``ignore_eos``), the tokenizer's own ``eos_token_ids`` are used, else llguidance's guess.
    """
    eos = tuple(
        sorted({int(t) for t in eos_token_ids} or {int(t) for t in getattr(tokenizer, "eos_token_ids", ()) or ()})
    )
    key = (id(tokenizer), eos)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None and hit[0] is tokenizer:
            _CACHE.move_to_end(key)
            return hit[1]
    text = _tokenizer_json(tokenizer)
    try:
        llt = llguidance.LLTokenizer(text, eos_token=list(eos) or None)
    except Exception as err:  # noqa: BLE001 - the Rust extension raises bare exceptions for tokenizers it cannot read
        raise ValueError(f"structured output (json_schema): llguidance cannot use this tokenizer: {err}") from None
    with _CACHE_LOCK:
        _CACHE[key] = (tokenizer, llt)  # holding the tokenizer keeps its id from being reused by another object
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return llt


class GrammarMatcher:
    """One request's grammar state: an ``llguidance.LLMatcher`` and the size of its tokenizer's vocabulary.

    Made by `compile_json_schema` (or `from_matcher` for a grammar compiled
    elsewhere); installed with ``ctx.set_matcher``. Only the engine thread uses it
    once the request is submitted.

    Example:
        >>> g = compile_json_schema(tok, '{"type": "integer"}', eos_token_ids=[2])  # doctest: +SKIP
        >>> g.consume(ord("7")), g.is_accepting()  # doctest: +SKIP
        (True, True)
    """

    def __init__(self, matcher: Any, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = int(vocab_size)

    @classmethod
    def from_matcher(cls, matcher: Any, tokenizer: Any) -> GrammarMatcher:
        """Wrap an ``LLMatcher`` built with ``tokenizer``'s llguidance tokenizer."""
        return cls(matcher, int(tokenizer.vocab_size))

    @property
    def error(self) -> str | None:
        """llguidance's error (first line) when the matcher is in its error state, else None."""
        return _first_line(self.matcher.get_error()) if self.matcher.is_error() else None

    def is_stopped(self) -> bool:
        """The grammar is complete: no token but EOS may follow."""
        return bool(self.matcher.is_stopped())

    def is_accepting(self) -> bool:
        """The output so far is a complete match (EOS may come now)."""
        return bool(self.matcher.is_accepting())

    def consume(self, token: int) -> bool:
        """Advance by one token; False (and the error state) when the grammar does not allow it."""
        return bool(self.matcher.consume_token(int(token)))

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (possibly none)."""
        return [int(t) for t in self.matcher.compute_ff_tokens()]

    def allowed(self, vocab_size: int | None = None) -> np.ndarray:
        """The tokens allowed next as a bool array over ``vocab_size`` ids (default the tokenizer's)."""
        words = -(-self.vocab_size // 32)
        mask = np.full((1, words), -1, np.int32)
        fill_next_token_bitmask_par(_executor(), [(self.matcher, 0)], mask)
        return _unpack(mask, self.vocab_size, self.vocab_size if vocab_size is None else int(vocab_size))[0]

    def allowed_tokens(self) -> np.ndarray:
        """The ids of the tokens allowed next (``int64``)."""
        return np.nonzero(self.allowed())[0]

    def __repr__(self) -> str:
        state = (
            "error"
            if self.matcher.is_error()
            else "stopped"
            if self.matcher.is_stopped()
            else "accepting"
            if self.matcher.is_accepting()
            else "running"
        )
        return f"GrammarMatcher(vocab_size={self.vocab_size}, {state})"


def compile_json_schema(
    tokenizer: Any, schema: str | dict[str, Any], *, eos_token_ids: Iterable[int] = ()
) -> GrammarMatcher:
    """A `GrammarMatcher` for output that is one JSON value following ``schema`` (JSON text or a dict).

    ``{"type": "object"}`` is OpenAI's ``json_object``. The schema may carry llguidance's
    ``"x-guidance"`` options (e.g. ``{"whitespace_flexible": true}``), applied over `JSON_DEFAULTS`.

    Raises:
        ValueError: the schema is not JSON, or llguidance cannot compile it (the message
            names ``json_schema`` and carries llguidance's error), or the tokenizer is not
            backed by Hugging Face tokenizers.

    Example:
        >>> compile_json_schema(tok, '{"type": "objekt"}')  # doctest: +SKIP
        Traceback (most recent call last):
        ValueError: json_schema cannot be used for structured output: Invalid type: objekt
    """
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError as err:
            raise ValueError(f"json_schema is not valid JSON: {err}") from None
    else:
        parsed = schema
    if not isinstance(parsed, dict):
        raise ValueError(f"json_schema must be a JSON object (a schema), got {type(parsed).__name__}")
    llt = ll_tokenizer(tokenizer, eos_token_ids)
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(parsed), defaults=JSON_DEFAULTS)
    except ValueError as err:
        raise ValueError(f"json_schema cannot be used for structured output: {err}") from None
    matcher = llguidance.LLMatcher(
        llt, grammar, log_level=0, limits=llguidance.LLParserLimits(verbose_errors=False)
    )  # errors go to clients: no parser dumps
    if matcher.is_error():  # llguidance reports schema errors (unknown types, bad $ref, bad regex) here
        raise ValueError(f"json_schema cannot be used for structured output: {_first_line(matcher.get_error())}")
    return GrammarMatcher(matcher, llt.vocab_size)


def _executor() -> Any:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = llguidance.LLExecutor()
    return _EXECUTOR


def _unpack(mask: np.ndarray, tokenizer_vocab: int, vocab_size: int) -> np.ndarray:
    """llguidance's int32 bitmask ``[n, words]`` (bit ``t % 32`` of word ``t // 32`` = token t) as bool ``[n,
    vocab_size]``.

    Ids past the tokenizer's vocabulary (a model's padded embedding rows) are disallowed.
    """
    n = min(tokenizer_vocab, vocab_size)
    out = np.zeros((mask.shape[0], vocab_size), bool)
    out[:, :n] = packed_bits(mask, n)
    return out


def apply_token_masks(contexts: Sequence[Any], bias: np.ndarray) -> None:
    """Set ``bias[i, t] = -inf`` for every token t that row i's grammar does not allow next (rows without a matcher
    untouched).

    The runner's step adds ``bias`` to the logits before sampling, so a constrained row
    can only sample an allowed token (greedy or not, whatever its filters).
    """
    rows = [(i, c.matcher) for i, c in enumerate(contexts) if c.matcher is not None]
    if not rows:
        return
    vocab = bias.shape[1]
    by_size: dict[int, list[tuple[int, GrammarMatcher]]] = {}
    for i, g in rows:
        by_size.setdefault(g.vocab_size, []).append((i, g))
    for size, group in by_size.items():
        mask = np.full((len(group), -(-size // 32)), -1, np.int32)
        fill_next_token_bitmask_par(_executor(), [(g.matcher, k) for k, (_, g) in enumerate(group)], mask)
        allowed = _unpack(mask, size, vocab)
        idx = np.array([i for i, _ in group])
        bias[idx] = np.where(allowed, bias[idx], -np.inf)


def advance(ctx: Any, token: int) -> str | None:
    """After ``ctx.update(token)``: feed the grammar, fast-forward forced tokens, end a complete grammar. Returns an
    error message, or None.

    Forced tokens are appended with ``ctx.jump_ahead`` and the cursor put back at the
    sampled token, so the next step runs the sampled and forced tokens through the model
    at once (``needs_ce``: as a prefill chunk) and samples after the last of them. A
    message means the grammar rejected a token (its error state): the caller fails this
    request only.
    """
    g: GrammarMatcher = ctx.matcher
    if g.matcher.is_error():
        return f"structured output: the grammar is in an error state: {g.error}"
    if ctx.status is GenerationStatus.END_OF_SEQUENCE and int(token) in ctx.eos_token_ids:
        return None  # the grammar allowed EOS: the JSON is complete
    if not g.consume(token):
        return f"structured output: token {int(token)} does not follow the json_schema: {g.error}"
    if ctx.is_done:
        return None
    uncached = ctx.end_idx - 1  # the sampled token: the next step runs it
    for t in g.forced_tokens():
        if not g.consume(t):
            return f"structured output: forced token {t} rejected: {g.error}"
        ctx.jump_ahead(t)
        if ctx.is_done:
            return None
    ctx.set_token_indices(start_idx=uncached)  # jump_ahead marks only the newest token uncached
    if g.is_stopped():
        ctx.status = GenerationStatus.END_OF_SEQUENCE
    return None
