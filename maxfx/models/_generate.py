"""`CausalLM`: the forward pass and the generation API shared by the model classes.

``generate`` and ``stream`` run on the generation engine (`maxfx.generation`): each
prompt is a request of a `Scheduler` over a `ModelRunner` (the paged KV cache, the
decode step dispatched one step ahead of the host, a small fixed set of compiled
shapes from the shared bounded cache), the same code `LLM`, the pipelines and
``maxfx serve`` run, so a prompt gets the same tokens through any of them.

Sampling is the engine's (`maxfx.generation.choose`): greedy (``temperature=0``) is
``argmax``; otherwise the logits are divided by the temperature, cut to ``top_k`` and
``top_p`` and sampled from a key of the row's seed and step, so a seed reproduces a
generation exactly (row ``i`` of a batch uses ``seed + i``).

Compilation is timed apart from running: `GenerationStats` (``model.last_stats``)
counts tokens/s over execution only.

Text: when the model has a tokenizer (`maxfx.models.Tokenizer`, set by
`load_pretrained`), ``generate`` and ``stream`` also take a prompt string (or a list
of them) and return text; the config's EOS token then ends a row.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from lowering.dtypes import DType
from lowering.types import DeviceRef, TensorType
from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn import Module
from maxfx.generation import IncrementalText, ModelRunner, Scheduler, TextContext
from maxfx.generation import compile_counts as engine_compile_counts
from maxfx.interfaces import SamplingParams
from maxfx.models._layers import positions
from maxfx.models._source import RandomSource
from maxfx.models._tokenizer import Tokenizer, model_extras

__all__ = ["CausalLM", "GenerationStats", "compile_counts"]


class CausalLM(Module):
    """Base of the decoder-only language models in `maxfx.models`.

    Subclasses define ``hidden(ids, qpos, caches)`` (final hidden states and new
    caches), ``head(h)`` (logits), ``num_layers``, ``kv_shape()`` and
    ``from_source``; this class adds ``forward``, ``random`` and ``generate``.
    """

    config: Any

    # -- construction ------------------------------------------------------
    @classmethod
    def random(cls, config: Any, seed: int = 0, dtype: DType = DType.float32) -> CausalLM:
        """A randomly initialised model (numpy normal init, reproducible from ``seed``)."""
        return cls.from_source(config, RandomSource(seed, dtype))

    # -- forward -----------------------------------------------------------
    def forward(self, input_ids: Any) -> Tensor:
        """Logits ``[B, T, vocab]`` (float32) of int token ids ``[B, T]`` (causal, no cache).

        ``input_ids``: a Tensor, a numpy or JAX array, or nested lists of ints.

        Raises:
            ValueError: not ``[batch, seq]`` integer ids, or ``seq`` longer than the
                model's context (``max_position_embeddings``).
        """
        input_ids = token_tensor(input_ids, self.device, type(self).__name__)
        if input_ids.rank != 2:
            raise ValueError(f"{type(self).__name__}: input_ids must be [batch, seq] token ids, got {input_ids.type}")
        if input_ids.dtype not in (DType.int32, DType.int64, DType.uint32, DType.uint64):
            raise ValueError(f"{type(self).__name__}: input_ids must be integer token ids, got {input_ids.type}")
        check_context(type(self).__name__, self.config, input_ids.shape[1])
        h, _ = self.hidden(input_ids, positions(input_ids), None)
        logits = self.head(h)
        return logits if logits.dtype is DType.float32 else F.cast(logits, DType.float32)

    def input_types(self) -> tuple[TensorType, ...]:
        """``int64 [batch, seq]`` on the model's device, for `compile`."""
        return (TensorType(DType.int64, ["batch", "seq"], DeviceRef.from_device(self.device)),)

    def compile(self, *input_types: TensorType, weights: Any = None, use_subgraphs: bool = True) -> Any:
        """`Module.compile`, with ``use_subgraphs=True`` by default: the decoder layers are
        identical blocks, compiled once as a subgraph called per layer, so compile time
        does not grow with depth. Pass ``use_subgraphs=False`` to compile one program
        (longer compile, XLA fuses across layers).
        """
        return super().compile(*input_types, weights=weights, use_subgraphs=use_subgraphs)

    # -- text and timings --------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer | None:
        """The checkpoint's `Tokenizer` (set by `load_pretrained`), or None when it has none.

        Kept outside the module's fields, so it is not part of the model's pytree.
        """
        return model_extras(self).tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Tokenizer | None) -> None:
        if value is not None and not isinstance(value, Tokenizer):
            raise TypeError(
                f"{type(self).__name__}.tokenizer: expected a maxfx.models.Tokenizer or None, got "
                f"{type(value).__name__}"
            )
        extras = model_extras(self)
        extras.tokenizer = value
        extras.why_no_tokenizer = "its tokenizer was set to None"

    @property
    def last_stats(self) -> GenerationStats | None:
        """The `GenerationStats` of the latest ``generate`` / ``stream`` call (filled in as a stream runs), or None."""
        return model_extras(self).last_stats

    def _text_tokenizer(self, where: str) -> Tokenizer:
        tok = self.tokenizer
        if tok is None:
            reason = model_extras(self).why_no_tokenizer
            raise ValueError(
                f"{type(self).__name__}.{where}: a text prompt needs a tokenizer, and this model has none ({reason}); "
                "pass token ids instead"
            )
        return tok

    def _eos_ids(self, explicit: int | Iterable[int] | None, tok: Tokenizer) -> tuple[int, ...]:
        if explicit is not None:
            return _as_ids(explicit)
        ids = _as_ids(getattr(self.config, "eos_token_id", None))
        return ids + tuple(i for i in tok.eos_token_ids if i not in ids)

    # -- generation --------------------------------------------------------
    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        stream: Callable[[Any], Any] | None = None,
        progress: bool | None = None,
        eos_token_id: int | Iterable[int] | None = None,
        return_stats: bool = False,
    ) -> Any:
        """Generate up to ``max_new_tokens`` tokens after each prompt with a KV cache.

        Args:
            input_ids: token ids ``[B, T]`` (a Tensor, numpy or JAX array, or nested
                lists), a list of B id lists of different lengths; or, when the model
                has a `tokenizer`, a prompt string or a list of them.
            max_new_tokens: tokens to append per prompt (>= 1).
            temperature: 0 for greedy decoding; > 0 samples from ``softmax(logits / temperature)``.
            top_k: sample only among the k most likely tokens.
            top_p: sample only from the smallest set of tokens whose probability reaches top_p.
            seed: makes sampling reproducible (default: a fresh random seed).
            stream: called after every step with the new tokens ``int64 [B]`` (text
                prompts: with the new text, a str, or a list of str for a list of prompts).
            progress: show a tqdm bar over the steps; None (default): only for long
                generations (``LONG_GENERATION`` tokens or more) on a terminal or in a notebook.
            eos_token_id: one id or several; a row that emits one keeps emitting it and
                generation stops early once every row has. Text prompts default to the
                config's (and GGUF tokenizer's) EOS; token ids to none.
            return_stats: also return the `GenerationStats` (also kept as `last_stats`).

        Returns:
            token ids: int64 ``[B, max_new_tokens]``, the new tokens only (rows that
            stopped are padded with their EOS). A prompt string: the completion text
            (without the prompt and the EOS); a list of strings: a list of completions.

        Raises:
            ValueError: bad arguments, token ids outside the vocabulary, a prompt longer
                than the model's context, or a text prompt for a model without a tokenizer.

        Example:
            >>> out = model.generate([[1, 2, 3]], max_new_tokens=8)  # doctest: +SKIP
            >>> model.generate("the graph compiles", max_new_tokens=16)  # doctest: +SKIP
        """
        if _is_text(input_ids):
            texts = self.stream(input_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id=eos_token_id)
            bar = _progress(progress, max_new_tokens)
            for piece in texts:
                if stream is not None:
                    stream(piece)
                bar.update(texts.steps_done - bar.n)
            bar.close()
            result: Any = texts.texts[0] if isinstance(input_ids, str) else texts.texts
            return (result, texts.stats) if return_stats else result
        steps = self.stream(input_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id=eos_token_id)
        bar = _progress(progress, max_new_tokens)
        out: list[np.ndarray] = []
        for tokens in steps:
            out.append(tokens)
            if stream is not None:
                stream(tokens)
            bar.update(1)
        bar.close()
        result = np.stack(out, axis=1)
        if result.shape[1] < max_new_tokens:  # stopped early: every row finished
            pad = np.repeat(out[-1][:, None], max_new_tokens - result.shape[1], axis=1)  # each row's own EOS
            result = np.concatenate([result, pad], axis=1)
        return (result, steps.stats) if return_stats else result

    def stream(
        self,
        input_ids: Any,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        eos_token_id: int | Iterable[int] | None = None,
    ) -> Iterator[Any]:
        """An iterator over the generation, step by step (arguments as `generate`).

        Token ids in: each item is the new tokens ``int64 [B]``. A prompt string in:
        each item is a non-empty str, the next piece of the completion; a list of
        strings in: a list of B pieces per step ('' where a row has nothing new).
        Pieces are decoded incrementally and never split a multi-byte character;
        joined, they are the text `generate` returns. Its ``stats`` attribute (also
        `last_stats`) fills in as it runs.

        Example:
            >>> for piece in model.stream("the graph compiles", max_new_tokens=16):  # doctest: +SKIP
            ...     print(piece, end="", flush=True)
        """
        if _is_text(input_ids):
            tok = self._text_tokenizer("generate")
            prompts = [input_ids] if isinstance(input_ids, str) else list(input_ids)
            ids = [tok.encode(p) for p in prompts]
            for i, row in enumerate(ids):
                if not row:
                    raise ValueError(
                        f"{type(self).__name__}.generate: prompt {i} ({prompts[i]!r}) encodes to no tokens"
                    )
            eos = self._eos_ids(eos_token_id, tok)
            steps = _Steps(self, ids, max_new_tokens, temperature, top_k, top_p, seed, eos or None)
            return _TextSteps(steps, tok, eos, single=isinstance(input_ids, str))
        return _Steps(self, input_ids, max_new_tokens, temperature, top_k, top_p, seed, _as_ids(eos_token_id) or None)


@dataclass
class GenerationStats:
    """Timings of one `CausalLM.generate` / `CausalLM.stream` call (``model.last_stats``).

    Seconds; tokens are counted over the batch. Compilation is timed apart
    (``compile_s``), so the tokens/s figures are execution only. ``load_s`` is the
    `load_pretrained` time of the model (0 for a model built in memory).

    Example:
        >>> text = model.generate("hello", max_new_tokens=16)  # doctest: +SKIP
        >>> s = model.last_stats  # doctest: +SKIP
        >>> print(f"compile {s.compile_s:.2f}s, decode {s.decode_tokens_per_s:.0f} tok/s")  # doctest: +SKIP
    """

    load_s: float = 0.0
    compile_s: float = 0.0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    prefill_tokens_per_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    batch: int = 0
    new_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        """Same as ``prefill_tokens`` (the prompts' tokens, summed over the batch)."""
        return self.prefill_tokens

    def _refresh(self) -> None:
        # Decode steps produce every token after the first of each row.
        self.decode_tokens = max(0, self.new_tokens - self.batch)
        self.prefill_tokens_per_s = self.prefill_tokens / self.prefill_s if self.prefill_s else 0.0
        self.decode_tokens_per_s = self.decode_tokens / self.decode_s if self.decode_s else 0.0


LONG_GENERATION = 256
"""From this many new tokens, `generate` shows a progress bar unless told otherwise."""


class _NoBar:
    """What `_progress` returns when no bar shows (a disabled tqdm costs ~70 us to make)."""

    n = 0
    disable = True

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        pass


def _progress(enabled: bool | None, total: int) -> Any:
    # None: tqdm decides (a bar on a terminal or in a notebook, none in logs and pipes).
    disable = (None if total >= LONG_GENERATION else True) if enabled is None else not enabled
    if disable is True:
        return _NoBar()
    return tqdm(total=total, desc="generating", unit="tok", disable=disable, leave=False)


# ─── inputs ───────────────────────────────────────────────────────────────


def _is_text(value: Any) -> bool:
    """A prompt string, or a non-empty list/tuple of them."""
    if isinstance(value, str):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, str) for v in value)


def _as_ids(value: int | Iterable[int] | None) -> tuple[int, ...]:
    """``eos_token_id`` as a tuple of ints (None: empty)."""
    if value is None:
        return ()
    if isinstance(value, (int, np.integer)):
        return (int(value),)
    return tuple(int(v) for v in value)


def token_tensor(input_ids: Any, device: Any, where: str) -> Tensor:
    """``input_ids`` (Tensor, numpy or JAX array, nested lists of ints) as a Tensor on ``device``; integer arrays keep
    their dtype.

    Example:
        >>> token_tensor([[1, 2, 3]], CPU(), "model").dtype  # doctest: +SKIP
        <DType.int64: ...>
    """
    if isinstance(input_ids, Tensor):
        return input_ids
    if isinstance(input_ids, jax.Array):  # also a tracer, when the model is called inside jax.jit
        return Tensor.from_dlpack(input_ids)
    if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, (np.ndarray, np.generic, Sequence)):
        raise ValueError(
            f"{where}: input_ids must be [batch, seq] token ids (a Tensor, numpy or JAX array, or nested lists), got "
            f"{type(input_ids).__name__}"
        )
    try:
        arr = np.asarray(input_ids)
    except ValueError:
        raise ValueError(
            f"{where}: input_ids must be a rectangular [batch, seq] array of token ids (rows of one length)"
        ) from None
    if arr.dtype == object or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{where}: input_ids must be integer token ids, got {arr.dtype}")
    return Tensor(
        arr if arr.size else arr.astype(np.int64), device=device
    )  # an int64 array stays int64 (the transfer keeps it)


def check_context(where: str, config: Any, length: Any) -> None:
    """ValueError naming ``where`` when a sequence of ``length`` tokens exceeds the model's context
    (``max_position_embeddings``).
    """
    limit = getattr(config, "max_position_embeddings", None)
    try:
        n = int(length)
    except (TypeError, ValueError):  # a symbolic dim while compiling: checked when it runs
        return
    if limit is not None and n > int(limit):
        raise ValueError(
            f"{where}: the input has {n} tokens, more than the model's context of {int(limit)} positions "
            "(max_position_embeddings)"
        )


def _rows(input_ids: Any) -> list[np.ndarray]:
    if isinstance(input_ids, Tensor):
        input_ids = input_ids.to_numpy()
    elif isinstance(input_ids, jax.Array):
        input_ids = np.asarray(input_ids)
    if isinstance(input_ids, np.ndarray):
        if input_ids.ndim == 1:
            input_ids = input_ids[None]
        if input_ids.ndim != 2:
            raise ValueError(f"generate: input_ids must be [batch, seq] token ids, got shape {list(input_ids.shape)}")
        rows = list(input_ids)
    elif (
        isinstance(input_ids, Sequence) and input_ids and all(isinstance(r, (Sequence, np.ndarray)) for r in input_ids)
    ):
        rows = [np.asarray(r) for r in input_ids]
    elif isinstance(input_ids, Sequence) and input_ids:
        rows = [np.asarray(input_ids)]
    else:
        raise ValueError(
            f"generate: input_ids must be a [batch, seq] array or a list of prompts, got {type(input_ids).__name__}"
        )
    for i, r in enumerate(rows):
        if r.ndim != 1 or r.size == 0 or not np.issubdtype(r.dtype, np.integer):
            raise ValueError(
                f"generate: prompt {i} must be a non-empty 1-D list of int token ids, got {r.dtype} shape "
                f"{list(r.shape)}"
            )
    return [r.astype(np.int64) for r in rows]


def prompt_rows(where: str, input_ids: Any, vocab: int) -> list[np.ndarray]:
    """The prompts of ``input_ids`` as int64 rows (see `CausalLM.generate`); ValueError naming ``where`` for ids outside
    ``[0, vocab)``.
    """
    if (
        isinstance(input_ids, np.ndarray)
        and input_ids.ndim == 2
        and input_ids.size
        and np.issubdtype(input_ids.dtype, np.integer)
    ):
        # The common case, a [batch, seq] id array: one range check (rows named only on failure).
        if input_ids.min() >= 0 and input_ids.max() < vocab:
            return list(input_ids.astype(np.int64, copy=False))
    rows = _rows(input_ids)
    for i, r in enumerate(rows):
        if r.min() < 0 or r.max() >= vocab:
            raise ValueError(f"{where}: prompt {i} has token ids outside [0, {vocab})")
    return rows


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def check_generation(
    where: str, max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any, vocab: int, seed: Any = None
) -> None:
    """The argument rules every model's ``generate`` follows; ValueError naming ``where`` and the argument.

    Example:
        >>> check_generation("model.generate", 8, "hot", None, None, 256)
        Traceback (most recent call last):
        ...
        ValueError: model.generate: temperature must be a number >= 0, got 'hot'
    """
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"{where}: max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not _is_number(temperature) or not temperature >= 0 or not np.isfinite(temperature):
        raise ValueError(f"{where}: temperature must be a number >= 0, got {temperature!r}")
    if top_k is not None and not (_is_int(top_k) and 1 <= top_k <= vocab):
        raise ValueError(f"{where}: top_k must be an int in [1, {vocab}], got {top_k!r}")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise ValueError(f"{where}: top_p must be a number in (0, 1], got {top_p!r}")
    if seed is not None and not _is_int(seed):
        raise ValueError(f"{where}: seed must be an int or None, got {seed!r}")


def check_length(where: str, config: Any, prompt: int, max_new_tokens: int) -> None:
    """ValueError when the prompt plus the new tokens need more positions than the model's context.

    The last new token is sampled, never fed back, so a generation fills
    ``prompt + max_new_tokens - 1`` positions. The KV cache is allocated for the whole
    generation up front, so this is checked before anything is allocated
    (``max_new_tokens=10**9`` fails at once).
    """
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and prompt + max_new_tokens - 1 > int(limit):
        raise ValueError(
            f"{where}: the prompt ({prompt} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context of "
            f"{int(limit)} positions (max_position_embeddings); lower max_new_tokens"
        )


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# ─── generation on the engine ─────────────────────────────────────────────

_RUNNER_LOCK = threading.Lock()


def compile_counts() -> dict[str, int]:
    """Programs compiled so far for generation: ``generate`` and ``stream`` run on the engine, whose
    compiled steps are counted once for every caller (`maxfx.generation.compile_counts`)."""
    return {"compiles": engine_compile_counts()["compiles"]}


def _borrow_runner(model: Any, batch: int, length: int) -> ModelRunner:
    """A `ModelRunner` of ``model`` for ``batch`` rows of ``length`` tokens: the model's idle one when it has
    that shape (its pools are reused), else a new one. One caller at a time holds a runner."""
    extras = model_extras(model)
    with _RUNNER_LOCK:
        idle, extras.idle_runner = extras.idle_runner, None
    if idle is not None and idle.max_batch_size == batch and idle.max_length == length:
        return idle
    return ModelRunner(model, max_batch_size=batch, max_length=length, page_size=16, prefill_chunk_size=512)


def _return_runner(model: Any, runner: ModelRunner) -> None:
    """Keep ``runner`` as the model's idle one (the next call of that shape reuses its pools)."""
    with _RUNNER_LOCK:
        model_extras(model).idle_runner = runner


class _Steps(Iterator[np.ndarray]):
    """The token-by-token iterator behind `CausalLM.generate` / `CausalLM.stream` (token ids).

    The prompts run as requests of the generation engine (a `maxfx.generation.Scheduler`
    over a `ModelRunner`: paged KV cache, bucketed compiled steps, decode run one step
    ahead of the host), the same code as `LLM` and the server. Step ``j`` is yielded once
    every row has its ``j``-th new token; a row that ended (EOS) is padded with the EOS.
    Row ``i`` samples with the seed ``seed + i``, so a seed reproduces the whole batch.
    """

    def __init__(self, model, input_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_ids):
        name = type(model).__name__
        check_generation(f"{name}.generate", max_new_tokens, temperature, top_k, top_p, _vocab(model), seed)
        rows = prompt_rows(f"{name}.generate", input_ids, _vocab(model))
        lengths = np.array([len(r) for r in rows], np.int64)
        limit = getattr(model.config, "max_position_embeddings", None)
        longest = int(np.argmax(lengths))
        if limit is not None and lengths[longest] > limit:
            raise ValueError(
                f"{name}.generate: prompt {longest} has {int(lengths[longest])} tokens, more than the model's context "
                f"of {int(limit)} positions (max_position_embeddings)"
            )
        check_length(f"{name}.generate", model.config, int(lengths.max()), int(max_new_tokens))
        self._model, self._lengths, self._max = model, lengths, int(max_new_tokens)
        self._eos = None if not eos_token_ids else np.asarray(eos_token_ids, np.int64)
        # The last new token is sampled, never fed back: a sequence may be one past the context.
        need = int(lengths.max()) + self._max
        length = _round_up(need, 64) if limit is None else min(_round_up(need, 64), int(limit) + 1)
        self._runner = _borrow_runner(model, len(rows), length)
        # The prompts arrive together: one prefill step for all of them (a chunk each).
        self._sched = Scheduler(
            self._runner,
            max_prefill_rows=len(rows),
            max_prefill_tokens=self._runner.step_tokens([self._runner.prefill_chunk_size] * len(rows)),
        )
        base = (secrets.randbits(32) if seed is None else int(seed)) & 0xFFFFFFFF
        sampling = {
            "temperature": float(temperature),
            "top_k": -1 if top_k is None else int(top_k),
            "top_p": 1.0 if top_p is None else float(top_p),
        }
        self._contexts = []
        for i, row in enumerate(rows):
            params = SamplingParams(
                **sampling, seed=(base + i) & 0xFFFFFFFF, max_new_tokens=self._max, ignore_eos=self._eos is None
            )
            ctx = TextContext(
                max_length=len(row) + self._max,
                tokens=row,
                eos_token_ids=() if self._eos is None else self._eos.tolist(),
                sampling_params=params,
            )
            self._sched.submit(ctx)
            self._contexts.append(ctx)
        self._step = 0  # steps returned
        self._compiled = self._runner.compile_s
        self._clock = time.perf_counter()
        extras = model_extras(model)
        self.stats = GenerationStats(load_s=extras.load_s, batch=len(rows), prefill_tokens=int(lengths.sum()))
        extras.last_stats = self.stats

    def __iter__(self) -> _Steps:
        return self

    def _available(self) -> int:
        """Steps every row has a token for (an ended row has all of them)."""
        return min(self._max if c.is_done else c.num_generated for c in self._contexts)

    def _ended(self) -> bool:
        """Every row ended before the limit (EOS), and every step up to the last real token was returned."""
        return (
            self._eos is not None
            and all(c.is_done for c in self._contexts)
            and self._step >= max(c.num_generated for c in self._contexts)
        )

    def _finish(self) -> None:
        if self._runner is not None:
            for c in self._contexts:
                if not c.is_done:
                    self._sched.cancel(c.request_id)
            self._sched.run_until_idle()  # collects a step still running ahead, frees every page
            _return_runner(self._model, self._runner)
            self._runner = None

    def __next__(self) -> np.ndarray:
        if self._step >= self._max or self._ended():
            self._finish()
            raise StopIteration
        while self._available() <= self._step:
            self._sched.step()
        compiled, self._compiled = self._runner.compile_s - self._compiled, self._runner.compile_s
        now = time.perf_counter()
        elapsed = now - self._clock - compiled  # compiling is timed apart
        self._clock = now
        self.stats.compile_s += compiled
        if self._step == 0:
            self.stats.prefill_s += elapsed
        else:
            self.stats.decode_s += elapsed
        out = np.array([self._token(c) for c in self._contexts], np.int64)
        self.stats.new_tokens += len(out)
        self.stats._refresh()
        self._step += 1
        if self._step >= self._max or self._ended():
            self._finish()
        return out

    def _token(self, c: TextContext) -> int:
        generated = c.generated_tokens
        return int(generated[self._step]) if self._step < len(generated) else int(self._eos[0])


class _TextSteps(Iterator[Any]):
    """Text pieces of a generation: each row's new tokens decoded incrementally (`maxfx.generation.IncrementalText`,
    the engine's decoder: a multi-byte character waits for its last token)."""

    def __init__(self, steps: _Steps, tok: Tokenizer, eos: Sequence[int], *, single: bool):
        self.stats = steps.stats
        self._steps, self._tok, self._eos, self._single = steps, tok, set(eos), single
        n = len(steps._lengths)
        self._ids: list[list[int]] = [[] for _ in range(n)]
        self._ended = [False] * n
        self._text = [IncrementalText(tok) for _ in range(n)]
        self._finished = False
        self.steps_done = 0

    @property
    def texts(self) -> list[str]:
        """Each row's completion so far: its new ids up to its EOS, decoded at once."""
        return [self._tok.decode(ids, skip_special_tokens=True) for ids in self._ids]

    def __iter__(self) -> _TextSteps:
        return self

    def __next__(self) -> Any:
        while True:
            if self._finished:
                raise StopIteration
            try:
                tokens = next(self._steps)
            except StopIteration:
                self._finished = True
                pieces = [text.finish() for text in self._text]
            else:
                self.steps_done += 1
                pieces = []
                for i, t in enumerate(tokens.tolist()):
                    new = []
                    if not self._ended[i]:
                        if t in self._eos:
                            self._ended[i] = True
                        else:
                            self._ids[i].append(t)
                            new = [t]
                    pieces.append(self._text[i].add(new))
            if not self._single:
                if self._finished and not any(pieces):
                    raise StopIteration
                return pieces
            if pieces[0]:
                return pieces[0]


def _vocab(model: Any) -> int:
    return int(model.config.vocab_size)
