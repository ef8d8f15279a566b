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
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Sequence
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
from maxfx.graph import ops
from maxfx.models._config import GPT2Config
from maxfx.models._layers import positions
from maxfx.models._source import RandomSource

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
    def forward(self, input_ids: Tensor) -> Tensor:
        """Logits ``[B, T, vocab]`` (float32) of int token ids ``[B, T]`` (causal, no cache)."""
        if input_ids.rank != 2:
            raise ValueError(f"{type(self).__name__}: input_ids must be [batch, seq] token ids, got {input_ids.type}")
        if input_ids.dtype not in (DType.int32, DType.int64, DType.uint32, DType.uint64):
            raise ValueError(f"{type(self).__name__}: input_ids must be integer token ids, got {input_ids.type}")
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

    # -- generation --------------------------------------------------------
    def generate(
        self,
        input_ids: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        stream: Callable[[np.ndarray], Any] | None = None,
        progress: bool = False,
        eos_token_id: int | None = None,
        return_stats: bool = False,
    ) -> np.ndarray | tuple[np.ndarray, GenerationStats]:
        """Generate ``max_new_tokens`` tokens after each prompt with a KV cache.

        Args:
            input_ids: ``[B, T]`` token ids (array, Tensor or nested list), or a
                list of B prompts of different lengths.
            max_new_tokens: tokens to append per prompt (>= 1).
            temperature: 0 for greedy decoding; > 0 samples from ``softmax(logits / temperature)``.
            top_k: sample only among the k most likely tokens.
            top_p: sample only from the smallest set of tokens whose probability reaches top_p.
            seed: makes sampling reproducible (default: a fresh random seed).
            stream: called after every step with the new tokens ``int64 [B]``.
            progress: show a tqdm bar over the steps.
            eos_token_id: a row that emits it keeps emitting it; generation stops
                early once every row has.
            return_stats: also return a `GenerationStats` (timings, tokens/s).

        Returns:
            int64 ``[B, max_new_tokens]``: the new tokens only.

        Example:
            >>> out = model.generate([[1, 2, 3]], max_new_tokens=8)  # doctest: +SKIP
        """
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
            pad = np.full((result.shape[0], max_new_tokens - result.shape[1]), eos_token_id, np.int64)
            result = np.concatenate([result, pad], axis=1)
        return (result, steps.stats) if return_stats else result

    def stream(
        self,
        input_ids: Any,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        *,
        eos_token_id: int | None = None,
    ) -> _Steps:
        """An iterator over generation steps, each the new tokens ``int64 [B]`` (arguments as `generate`).

        Its ``stats`` attribute fills in as it runs.
        """
        return _Steps(self, input_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id)


@dataclass
class GenerationStats:
    """Timings of one `CausalLM.generate` call (seconds; tokens counted over the batch)."""

    batch: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens after the first (each step is one token per row) per second of decoding."""
        n = self.new_tokens - self.batch
        return n / self.decode_s if self.decode_s else 0.0


def _progress(enabled: bool, total: int) -> Any:
    return tqdm(total=total, desc="generating", unit="tok", disable=not enabled, leave=False)


# ─── inputs ───────────────────────────────────────────────────────────────


def _rows(input_ids: Any) -> list[np.ndarray]:
    if isinstance(input_ids, Tensor):
        input_ids = input_ids.to_numpy()
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
    rows = _rows(input_ids)
    for i, r in enumerate(rows):
        if r.min() < 0 or r.max() >= vocab:
            raise ValueError(f"{where}: prompt {i} has token ids outside [0, {vocab})")
    return rows


def check_generation(where: str, max_new_tokens: Any, temperature: Any, top_k: Any, top_p: Any, vocab: int) -> None:
    """The argument rules every model's ``generate`` follows; ValueError naming ``where`` and the argument."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"{where}: max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise ValueError(f"{where}: temperature must be >= 0, got {temperature!r}")
    if top_k is not None and not (isinstance(top_k, (int, np.integer)) and 1 <= top_k <= vocab):
        raise ValueError(f"{where}: top_k must be an int in [1, {vocab}], got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"{where}: top_p must be in (0, 1], got {top_p!r}")


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


_STATIC = ("greedy", "top_k", "use_top_p")
prefill_step = jax.jit(_prefill, static_argnames=("length", *_STATIC))
decode_step = jax.jit(_decode, static_argnames=_STATIC, donate_argnums=(1,))


def compile_counts() -> dict[str, int]:
    """Programs compiled so far by the shared prefill and decode functions (for tests and benchmarks)."""
    return {"prefill": prefill_step._cache_size(), "decode": decode_step._cache_size()}


def _const(value: Any, dtype: Any, device: Any) -> Tensor:
    with x64():
        return Tensor.from_dlpack(jax.device_put(np.asarray(value, dtype), device.jax_device))


class _Steps(Iterator[np.ndarray]):
    """The token-by-token iterator behind `CausalLM.generate` / `CausalLM.stream`."""

    def __init__(self, model, input_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id):
        name = type(model).__name__
        check_generation(f"{name}.generate", max_new_tokens, temperature, top_k, top_p, _vocab(model))
        rows = prompt_rows(f"{name}.generate", input_ids, _vocab(model))
        lengths = np.array([len(r) for r in rows], np.int64)
        need = int(lengths.max()) + int(max_new_tokens)
        limit = getattr(model.config, "max_position_embeddings", None)
        if isinstance(model.config, GPT2Config) and need > limit:
            raise ValueError(f"{name}.generate: prompt ({int(lengths.max())}) + max_new_tokens ({max_new_tokens}) exceeds the {limit} learned positions")
        t = _bucket(int(lengths.max()))
        self._length = _round_up(max(t, need), 64)
        ids = np.zeros((len(rows), t), np.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        self._model, self._ids, self._lengths = model, ids, lengths
        self._remaining = int(max_new_tokens)
        self._greedy = temperature == 0
        self._static = {"greedy": self._greedy, "top_k": None if self._greedy else (None if top_k is None else int(top_k)),
                        "use_top_p": (not self._greedy) and top_p is not None and top_p < 1}
        self._seed = (secrets.randbits(32) if seed is None else int(seed)) & 0xFFFFFFFF
        self._temperature, self._top_p = float(temperature or 1.0), float(top_p or 1.0)
        self._eos = eos_token_id
        self._done = np.zeros(len(rows), bool)
        self._step = 0
        self._caches = None
        self._last = None
        self.stats = GenerationStats(batch=len(rows), prompt_tokens=int(lengths.sum()))

    def __iter__(self) -> _Steps:
        return self

    def __next__(self) -> np.ndarray:
        if self._remaining <= 0 or (self._eos is not None and self._done.all()):
            raise StopIteration
        device = self._model.device
        key = _const([self._seed, self._step], np.uint32, device)
        scalars = (_const(self._temperature, np.float32, device), _const(self._top_p, np.float32, device))
        start = time.perf_counter()
        with x64():
            if self._caches is None:
                ids = _const(self._ids, np.int64, device)
                last = _const(self._lengths - 1, np.int64, device)
                tokens, self._caches = prefill_step(self._model, ids, last, key, *scalars, length=self._length, **self._static)
            else:
                pos = _const(self._lengths + self._step - 1, np.int64, device)
                tokens, self._caches = decode_step(self._model, self._caches, self._last, pos, key, *scalars, **self._static)
        self._last = tokens
        out = np.asarray(tokens.to_numpy(), np.int64)
        elapsed = time.perf_counter() - start
        if self._step == 0:
            self.stats.prefill_s += elapsed
        else:
            self.stats.decode_s += elapsed
        self.stats.new_tokens += len(out)
        if self._eos is not None:
            out = np.where(self._done, self._eos, out)
            self._done |= out == self._eos
        self._step += 1
        self._remaining -= 1
        return out


def _vocab(model: Any) -> int:
    return int(model.config.vocab_size)
