"""`CausalLM`: the forward pass and KV-cache generation shared by the model classes.

Generation runs two jitted pure functions of ``(model pytree, cache, tokens,
positions)``: ``prefill`` (the whole prompt once, filling a cache preallocated
to the bucketed maximum length) and ``decode`` (one token per row per step,
writing its keys/values at the row's position). Positions, temperature, top-p
and the random key are arrays, so every step of a generation reuses one
compiled program; prompts are right-padded to a power-of-two bucket and the
cache length is rounded up, so nearby lengths share programs too.

Sampling happens inside the step: greedy (``temperature=0``) is ``argmax``;
otherwise the logits are divided by the temperature, cut to ``top_k`` and
``top_p`` and sampled with the Gumbel-max trick from a key ``(seed, step)``,
so a seed reproduces a generation exactly.

Each step program is compiled ahead of its first run (``jit(...).lower(...).compile()``,
cached per input signature) so the time spent compiling is reported apart from the
time spent running: `GenerationStats` (``model.last_stats``) counts tokens/s over
execution only.

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
from lowering.x64 import x64
from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn import Module
from maxfx.generation import IncrementalText
from maxfx.graph import ops
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
            raise TypeError(f"{type(self).__name__}.tokenizer: expected a maxfx.models.Tokenizer or None, got {type(value).__name__}")
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
            raise ValueError(f"{type(self).__name__}.{where}: a text prompt needs a tokenizer, and this model has none ({reason}); pass token ids instead")
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
                    raise ValueError(f"{type(self).__name__}.generate: prompt {i} ({prompts[i]!r}) encodes to no tokens")
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
    """``input_ids`` (Tensor, numpy or JAX array, nested lists of ints) as a Tensor on ``device``; integer arrays keep their dtype.

    Example:
        >>> token_tensor([[1, 2, 3]], CPU(), "model").dtype  # doctest: +SKIP
        <DType.int64: ...>
    """
    if isinstance(input_ids, Tensor):
        return input_ids
    if isinstance(input_ids, jax.Array):  # also a tracer, when the model is called inside jax.jit
        return Tensor.from_dlpack(input_ids)
    if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, (np.ndarray, np.generic, Sequence)):
        raise ValueError(f"{where}: input_ids must be [batch, seq] token ids (a Tensor, numpy or JAX array, or nested lists), got {type(input_ids).__name__}")
    try:
        arr = np.asarray(input_ids)
    except ValueError:
        raise ValueError(f"{where}: input_ids must be a rectangular [batch, seq] array of token ids (rows of one length)") from None
    if arr.dtype == object or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{where}: input_ids must be integer token ids, got {arr.dtype}")
    with x64():
        return Tensor(arr if arr.size else arr.astype(np.int64), device=device)


def check_context(where: str, config: Any, length: Any) -> None:
    """ValueError naming ``where`` when a sequence of ``length`` tokens exceeds the model's context (``max_position_embeddings``)."""
    limit = getattr(config, "max_position_embeddings", None)
    try:
        n = int(length)
    except (TypeError, ValueError):  # a symbolic dim while compiling: checked when it runs
        return
    if limit is not None and n > int(limit):
        raise ValueError(f"{where}: the input has {n} tokens, more than the model's context of {int(limit)} positions (max_position_embeddings)")


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
    elif isinstance(input_ids, Sequence) and input_ids and all(isinstance(r, (Sequence, np.ndarray)) for r in input_ids):
        rows = [np.asarray(r) for r in input_ids]
    elif isinstance(input_ids, Sequence) and input_ids:
        rows = [np.asarray(input_ids)]
    else:
        raise ValueError(f"generate: input_ids must be a [batch, seq] array or a list of prompts, got {type(input_ids).__name__}")
    for i, r in enumerate(rows):
        if r.ndim != 1 or r.size == 0 or not np.issubdtype(r.dtype, np.integer):
            raise ValueError(f"generate: prompt {i} must be a non-empty 1-D list of int token ids, got {r.dtype} shape {list(r.shape)}")
    return [r.astype(np.int64) for r in rows]


def prompt_rows(where: str, input_ids: Any, vocab: int) -> list[np.ndarray]:
    """The prompts of ``input_ids`` as int64 rows (see `CausalLM.generate`); ValueError naming ``where`` for ids outside ``[0, vocab)``."""
    if isinstance(input_ids, np.ndarray) and input_ids.ndim == 2 and input_ids.size and np.issubdtype(input_ids.dtype, np.integer):
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


def check_generation(where: str, max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any, vocab: int, seed: Any = None) -> None:
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
            f"{where}: the prompt ({prompt} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context of {int(limit)} positions (max_position_embeddings); lower max_new_tokens"
        )


def _bucket(n: int, least: int = 8) -> int:
    return max(least, 1 << (n - 1).bit_length())


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


# ─── the jitted steps ─────────────────────────────────────────────────────


def _sample(logits: Tensor, key: Tensor, temperature: Tensor, top_p: Tensor, greedy: bool, top_k: int | None, use_top_p: bool) -> Tensor:
    x = F.cast(logits, DType.float32)
    if greedy:
        return F.squeeze(F.argmax(x, axis=-1), -1)
    x = x / temperature
    if top_k is not None:
        kth = F.top_k(x, top_k, axis=-1)[0][:, top_k - 1 :]
        x = F.where(x < kth, float("-inf"), x)
    if use_top_p:
        ranked = F.top_k(x, int(x.shape[-1]), axis=-1)[0]
        before = F.cumsum(F.softmax(ranked, axis=-1), axis=-1, exclusive=True)
        cutoff = F.min(F.where(before < top_p, ranked, float("inf")), axis=-1)
        x = F.where(x < cutoff, float("-inf"), x)
    u = ops.random_uniform(key, [int(d) for d in x.shape], DType.float32, DeviceRef.from_device(x.device), 1e-20, 1.0)
    return F.squeeze(F.argmax(x - F.log(-F.log(u)), axis=-1), -1)


def _prefill(model, ids, last, key, temperature, top_p, *, length, greedy, top_k, use_top_p):
    h, caches = model.hidden(ids, positions(ids), [("fresh", length)] * model.num_layers)
    logits = model.head(F.gather_nd(h, F.unsqueeze(last, -1), batch_dims=1))  # [B, vocab] at each prompt's end
    return _sample(logits, key, temperature, top_p, greedy, top_k, use_top_p), caches


def _decode(model, caches, tokens, pos, key, temperature, top_p, *, greedy, top_k, use_top_p):
    h, caches = model.hidden(F.unsqueeze(tokens, -1), F.unsqueeze(pos, -1), caches)
    logits = model.head(F.squeeze(h, 1))
    return _sample(logits, key, temperature, top_p, greedy, top_k, use_top_p), caches


def _wrap(x: Any) -> Tensor:
    return Tensor.from_dlpack(x)


def _next_key(key: Any) -> Any:
    """The sampling key ``[seed, step]`` of the following step."""
    return key + np.array([0, 1], np.uint32)


_COMPILE_LOCK = threading.Lock()

# The structure of the caches the prefill being traced returns (it returns their
# arrays only, so no Tensor is rebuilt per call); `_ahead` keeps it beside the program.
_traced = threading.local()


# The steps a generation runs take and return plain JAX arrays only: the model as
# its flat list of arrays (its structure is static), the caches likewise, and the
# position and sampling key, which each step advances on the device. A step's
# host cost is then one C++ flatten of lists of arrays, however deep the model;
# flattening the Module tree itself costs ~10 us per leaf in Python.
def _prefill_arrays(weights, ids, last, key, temperature, top_p, *, model_tree, length, greedy, top_k, use_top_p):
    model = jax.tree_util.tree_unflatten(model_tree, weights)
    tokens, caches = _prefill(model, _wrap(ids), _wrap(last), _wrap(key), _wrap(temperature), _wrap(top_p),
                              length=length, greedy=greedy, top_k=top_k, use_top_p=use_top_p)  # fmt: skip
    arrays, _traced.cache_tree = jax.tree_util.tree_flatten(caches)
    return tokens._array(), arrays, last + 1, _next_key(key)


def _decode_arrays(weights, caches, tokens, pos, key, temperature, top_p, *, model_tree, cache_tree, greedy, top_k, use_top_p):
    model = jax.tree_util.tree_unflatten(model_tree, weights)
    cache = jax.tree_util.tree_unflatten(cache_tree, caches)
    tokens, cache = _decode(model, cache, _wrap(tokens), _wrap(pos), _wrap(key), _wrap(temperature), _wrap(top_p),
                            greedy=greedy, top_k=top_k, use_top_p=use_top_p)  # fmt: skip
    return tokens._array(), jax.tree_util.tree_leaves(cache), pos + 1, _next_key(key)


_STATIC = ("greedy", "top_k", "use_top_p")
prefill_step = jax.jit(_prefill_arrays, static_argnames=("model_tree", "length", *_STATIC))
decode_step = jax.jit(_decode_arrays, static_argnames=("model_tree", "cache_tree", *_STATIC), donate_argnums=(1,))

# Executables compiled ahead by `generate` (lower + compile, timed apart from running),
# per step kind and input signature.
_AHEAD: dict[str, dict[Any, Any]] = {"prefill": {}, "decode": {}}
# The entry of _AHEAD last used per step kind and static arguments (see `_ahead`).
_LAST: dict[str, dict[Any, Any]] = {"prefill": {}, "decode": {}}


def compile_counts() -> dict[str, int]:
    """Programs compiled so far by the shared prefill and decode functions (for tests and benchmarks)."""
    return {
        "prefill": prefill_step._cache_size() + len(_AHEAD["prefill"]),
        "decode": decode_step._cache_size() + len(_AHEAD["decode"]),
    }


def _signature(args: tuple, static: dict[str, Any]) -> Any:
    """What a compiled step depends on: each array's type and placement, the static arguments (structures included)."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    # A JAX array's aval is an attribute read, ~6x cheaper than jax.typeof (which also takes numpy).
    types = tuple((x.aval, x.sharding) if isinstance(x, jax.Array) else (jax.typeof(x), None) for x in leaves)
    return treedef, types, tuple(sorted(static.items(), key=lambda kv: kv[0]))


def _ahead(kind: str, step: Any, args: tuple, static: dict[str, Any], *, exact: bool = False) -> tuple[Any, Any, float]:
    """The compiled ``step`` for ``args``, the structure of the caches it returns (prefill) and the
    seconds spent compiling it now (0 when cached). Call inside ``x64()``.

    Without ``exact`` the executable last used with these static arguments is returned
    unchecked: calling it checks the arrays' types and shardings (`_launch` retries
    with ``exact`` when that check fails), which saves hashing them per call.
    """
    static_key = tuple(sorted(static.items(), key=lambda kv: kv[0]))
    last = _LAST[kind]
    if not exact and (hit := last.get(static_key)) is not None:
        return *hit, 0.0
    cache = _AHEAD[kind]
    key = _signature(args, static)
    hit = cache.get(key)
    compile_s = 0.0
    if hit is None:
        # One compile at a time: a second thread lowering the same step would hit jax's
        # trace cache, never run the traced function, and so never learn the cache tree.
        with _COMPILE_LOCK:
            hit = cache.get(key)
            if hit is None:
                start = time.perf_counter()
                _traced.cache_tree = None
                exe = step.lower(*args, **static).compile()
                hit = cache[key] = (exe, _traced.cache_tree)
                compile_s = time.perf_counter() - start
    last[static_key] = hit
    return *hit, compile_s


def _launch(kind: str, step: Any, args: tuple, static: dict[str, Any]) -> tuple[Any, Any, float, float]:
    """Dispatch the compiled ``step`` on ``args``: ``(outputs, cache structure, compile seconds, dispatch time)``."""
    exe, tree, compile_s = _ahead(kind, step, args, static)
    dispatched = time.perf_counter()
    try:
        return exe(*args), tree, compile_s, dispatched
    except (TypeError, ValueError):  # other array types or devices under the same static arguments (a cast or moved model)
        if compile_s:
            raise  # compiled for these very arguments: a genuine error
    exe, tree, compile_s = _ahead(kind, step, args, static, exact=True)
    dispatched = time.perf_counter()
    return exe(*args), tree, compile_s, dispatched


@dataclass
class _InFlight:
    """A dispatched step: its tokens (still computing) and when it was dispatched."""

    tokens: Any
    dispatched: float


class _Steps(Iterator[np.ndarray]):
    """The token-by-token iterator behind `CausalLM.generate` / `CausalLM.stream` (token ids).

    The state of a generation (caches, last tokens, positions, sampling key) stays
    on the device, each step computing the next. One step runs ahead: step i + 1
    is dispatched before step i's tokens are read back, so the device never waits
    for the host to hand it the next step.
    """

    def __init__(self, model, input_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_ids):
        name = type(model).__name__
        check_generation(f"{name}.generate", max_new_tokens, temperature, top_k, top_p, _vocab(model), seed)
        rows = prompt_rows(f"{name}.generate", input_ids, _vocab(model))
        lengths = np.array([len(r) for r in rows], np.int64)
        limit = getattr(model.config, "max_position_embeddings", None)
        longest = int(np.argmax(lengths))
        if limit is not None and lengths[longest] > limit:
            raise ValueError(f"{name}.generate: prompt {longest} has {int(lengths[longest])} tokens, more than the model's context of {int(limit)} positions (max_position_embeddings)")
        check_length(f"{name}.generate", model.config, int(lengths.max()), int(max_new_tokens))
        need = int(lengths.max()) + int(max_new_tokens)
        t = _bucket(int(lengths.max()))
        self._length = _round_up(max(t, need), 64)
        ids = np.zeros((len(rows), t), np.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        self._model, self._ids, self._lengths = model, ids, lengths
        self._max = int(max_new_tokens)
        greedy = temperature == 0
        self._static = {"greedy": greedy, "top_k": None if greedy else (None if top_k is None else int(top_k)), "use_top_p": (not greedy) and top_p is not None and top_p < 1}
        fresh = 0 if greedy else secrets.randbits(32)  # greedy steps never read the key
        self._seed = (fresh if seed is None else int(seed)) & 0xFFFFFFFF
        self._temperature, self._top_p = float(temperature or 1.0), float(top_p or 1.0)
        self._eos = None if not eos_token_ids else np.asarray(eos_token_ids, np.int64)
        self._done = np.zeros(len(rows), bool)
        self._step = 0  # steps returned
        self._dispatched = 0
        self._state: tuple | None = None  # (cache arrays, tokens, positions, key) after the latest dispatched step
        self._decode = None  # the compiled decode step, looked up once per generation
        self._pending: _InFlight | None = None
        self._ready = 0.0  # when the previous step's tokens were read
        extras = model_extras(model)
        self.stats = GenerationStats(load_s=extras.load_s, batch=len(rows), prefill_tokens=int(lengths.sum()))
        extras.last_stats = self.stats

    def __iter__(self) -> _Steps:
        return self

    def _dispatch(self) -> _InFlight:
        """Start the next step (compiling it first if needed) without waiting for it."""
        compile_s = 0.0
        with x64():
            if self._state is None:
                self._weights, self._model_tree = jax.tree_util.tree_flatten(self._model)  # the arrays of its Tensors
                # numpy in: the compiled step copies host arrays to its device itself,
                # ~10x cheaper than a device_put before the call.
                ids, last, key = self._ids, self._lengths - 1, np.array([self._seed, 0], np.uint32)
                self._scalars = (np.float32(self._temperature), np.float32(self._top_p))
                args = (self._weights, ids, last, key, *self._scalars)
                static = {"model_tree": self._model_tree, "length": self._length, **self._static}
                (tokens, caches, pos, key), self._cache_tree, compile_s, dispatched = _launch("prefill", prefill_step, args, static)
            else:
                caches, tokens, pos, key = self._state
                args = (self._weights, caches, tokens, pos, key, *self._scalars)
                if self._decode is None:
                    static = {"model_tree": self._model_tree, "cache_tree": self._cache_tree, **self._static}
                    self._decode, _, compile_s = _ahead("decode", decode_step, args, static, exact=True)
                dispatched = time.perf_counter()
                tokens, caches, pos, key = self._decode(*args)
        self._state = (caches, tokens, pos, key)
        self._dispatched += 1
        self.stats.compile_s += compile_s
        return _InFlight(tokens, dispatched)

    def __next__(self) -> np.ndarray:
        if self._step >= self._max or (self._eos is not None and self._done.all()):
            raise StopIteration
        step = self._pending or self._dispatch()
        # Run one decode step ahead (not past the prefill, whose time is reported on its own).
        self._pending = self._dispatch() if self._step >= 1 and self._dispatched < self._max else None
        out = np.asarray(step.tokens, np.int64)  # waits for the step
        ready = time.perf_counter()
        elapsed = ready - max(step.dispatched, self._ready)  # the steps run one after another on the device
        self._ready = ready
        if self._step == 0:
            self.stats.prefill_s += elapsed
        else:
            self.stats.decode_s += elapsed
        self.stats.new_tokens += len(out)
        self.stats._refresh()
        if self._eos is not None:
            out = np.where(self._done, self._eos[0], out)
            self._done |= np.isin(out, self._eos)
        self._step += 1
        return out


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
