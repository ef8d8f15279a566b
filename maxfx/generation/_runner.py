"""`ModelRunner`: a `maxfx.models.CausalLM` run step by step over a paged KV cache, in fixed shapes.

A step is one compiled program of ``(weights, KV pools, tokens [B, T], positions,
slots, page table, sampling arrays)`` that writes the new tokens' keys and
values into their pages, attends over each row's pages and returns each row's
next token (and, when asked, log probabilities). Its shapes come from a small
set of buckets: ``B`` a power of two up to ``max_batch_size``, ``T`` 1 (decode)
or a power of two up to ``prefill_chunk_size`` (prefill chunks), and the pages
read per row a power of two from ``min_context`` tokens up to ``max_length``.
So a warmed-up runner never compiles again (`compile_counts` shows it).

The model is the eager model itself (`CausalLM.hidden` / ``head``): its
attention layers see a `maxfx.models._layers.PagedLayerCache` per layer, so no
architecture is written twice for the engine.

Example:
    >>> runner = ModelRunner(model, max_batch_size=4, max_length=128)  # doctest: +SKIP
    >>> ctx = TextContext(max_length=128, tokens=np.array([5, 6, 7]))  # doctest: +SKIP
    >>> runner.claim(ctx); runner.execute([ctx])  # prefill, samples the first token  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.dtypes import DType
from lowering.executables import EXECUTABLES
from lowering.logs import compiling
from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.generation._context import TextContext
from maxfx.generation._grammar import apply_token_masks
from maxfx.generation._paged_cache import PagedLayerCache
from maxfx.generation._pages import OutOfPagesError, PagePool
from maxfx.generation._sampling import SamplingRows, choose, sampling_probs, top_logprobs
from maxfx.interfaces import LogProbabilities, RequestID

__all__ = ["ModelRunner", "PendingStep", "StepOutput", "compile_counts", "kv_dtype"]

_COUNTS = {"compiles": 0, "steps": 0}
_COUNT_LOCK = threading.Lock()


def compile_counts() -> dict[str, int]:
    """Programs the engine compiled so far in this process (``compiles``) and steps it ran (``steps``)."""
    return dict(_COUNTS)


def _bucket(n: int, least: int = 1) -> int:
    return max(least, 1 << max(0, int(n) - 1).bit_length())


def _wrap(x: Any) -> Tensor:
    return Tensor.from_dlpack(x)


# ─── the compiled step ────────────────────────────────────────────────────


def _step(
    weights,
    pools,
    tokens,
    pos,
    slots,
    pages,
    last,
    params,
    bias,
    repetition,
    seen,
    *,
    model_tree,
    page_size,
    sample,
    filters,
    n_logprobs,
    all_logits,
):
    model = jax.tree_util.tree_unflatten(model_tree, weights)
    caches = [PagedLayerCache(_wrap(k), _wrap(v), _wrap(slots), _wrap(pages), page_size) for k, v in pools]
    h, caches = model.hidden(_wrap(tokens), _wrap(pos), caches)
    new_pools = [(c.k._array(), c.v._array()) for c in caches]
    if all_logits:
        every = F.cast(model.head(h), DType.float32)._array()  # [B, T, V]
        logits = jnp.take_along_axis(every, last[:, None, None], axis=1)[:, 0]
    else:
        h_last = F.gather_nd(h, F.unsqueeze(_wrap(last), -1), batch_dims=1)  # [B, D] at each row's last token
        logits = F.cast(model.head(h_last), DType.float32)._array()
    out = {
        "tokens": choose(logits, params, filters=filters, sample=sample, bias=bias, repetition=repetition, seen=seen)
    }
    out["next_input"] = out["tokens"][:, None].astype(jnp.int32)  # what a run-ahead decode step takes as its tokens
    if n_logprobs:
        out["logprob"], out["top_values"], out["top_ids"] = top_logprobs(logits, out["tokens"], n_logprobs)
    if all_logits:
        b, t, v = every.shape
        out["all_logprobs"] = jax.nn.log_softmax(every, axis=-1)
        rep = [jnp.repeat(p, t, axis=0) for p in params]
        out["all_probs"] = sampling_probs(every.reshape(b * t, v), rep, filters=filters).reshape(b, t, v)
    return out, new_pools


_STEP = jax.jit(
    _step,
    static_argnames=("model_tree", "page_size", "sample", "filters", "n_logprobs", "all_logits"),
    donate_argnums=(1,),
)


@dataclass
class StepOutput:
    """What one step returns per row: the next token, its log probabilities, and (all_logits) per-position arrays."""

    token: int
    log_probabilities: LogProbabilities | None = None
    all_logprobs: np.ndarray | None = None  # [T, V] log_softmax of the raw logits at each input position
    all_probs: np.ndarray | None = None  # [T, V] the sampling distribution at each input position


@dataclass
class PendingStep:
    """A dispatched step whose results are not collected yet (`ModelRunner.dispatch` / `collect`)."""

    contexts: list[TextContext]
    starts: list[int]  # each row's first position in this step
    counts: list[int]  # tokens each row runs
    out: dict[str, Any]  # device arrays
    n_logprobs: int
    all_logits: bool


def _record_prompt_logprobs(c: TextContext, start: int, n: int, logprobs: np.ndarray) -> None:
    """Echo: the log probability of each prompt token this chunk predicts (position p's logits predict token p + 1)."""
    k = max(1, c.log_probabilities)
    for j in range(n):
        p = start + j + 1
        if p >= c.prompt_length:
            break
        row = logprobs[j]
        top = np.argpartition(-row, k - 1)[:k]
        top = top[np.argsort(-row[top])]
        c.prompt_log_probabilities[p] = LogProbabilities(
            token_log_probabilities=[float(row[c.tokens[p]])],
            top_log_probabilities=[{int(t): float(row[t]) for t in top}],
        )


class _PenaltyState:
    """Token counts of one request for the penalties: generated ``counts`` and ``seen`` (prompt or generated)."""

    def __init__(self, ctx: TextContext, vocab: int):
        self.counts = np.zeros(vocab, np.int32)
        self.seen = np.zeros(vocab, bool)
        self.seen[ctx.prompt_tokens] = True
        np.add.at(self.counts, ctx.generated_tokens, 1)
        self.seen[ctx.generated_tokens] = True
        self.synced = ctx.end_idx

    def sync(self, ctx: TextContext) -> None:
        new = ctx.tokens[self.synced : ctx.end_idx]
        if len(new):
            np.add.at(self.counts, new, 1)
            self.seen[new] = True
            self.synced = ctx.end_idx


def kv_dtype(value: Any, where: str = "kv_cache_dtype") -> np.dtype:
    """The numpy dtype a KV-cache dtype setting names: a `DType`, a numpy dtype or a name (``"float16"``).

    Raises:
        ValueError: not a float dtype, naming ``where``.

    Example:
        >>> kv_dtype("float16")
        dtype('float16')
    """
    try:
        if isinstance(value, DType):
            dt = value.to_numpy()
        else:
            dt = jnp.dtype(value.removeprefix("DType.") if isinstance(value, str) else value)
    except (TypeError, ValueError, AttributeError):
        dt = None
    if dt is None or not jnp.issubdtype(dt, jnp.floating):
        raise ValueError(
            f"{where}: the KV cache dtype must be a float dtype such as 'float32', 'float16' or 'bfloat16', got "
            f"{value!r}"
        )
    return np.dtype(dt)


def _cache_spec(model: Any) -> tuple[int, int, Any]:
    """(KV heads, head dim, dtype) of the model's cache, from tracing a one-token prefill abstractly."""
    n_kv, head_dim = model.kv_shape()

    def probe(weights):
        m = jax.tree_util.tree_unflatten(tree, weights)
        _, caches = m.hidden(
            _wrap(jnp.zeros((1, 1), jnp.int32)), _wrap(jnp.zeros((1, 1), jnp.int32)), [("fresh", 1)] * m.num_layers
        )
        return caches[0][0]._array()

    weights, tree = jax.tree_util.tree_flatten(model)
    return int(n_kv), int(head_dim), jax.eval_shape(probe, weights).dtype


class ModelRunner:
    """Runs a `CausalLM` over a paged KV cache (see the module docstring).

    Args:
        model: a `maxfx.models.CausalLM` (any of the seven families).
        max_batch_size: rows per decode step.
        max_length: the longest sequence (prompt + generated); default the model's context.
        page_size: token slots per KV page.
        num_pages: pages in the pool (default: enough for ``max_batch_size`` sequences of
            ``max_length``, plus the scratch page, cut to ``max_cache_bytes``); fewer makes the
            scheduler preempt.
        prefill_chunk_size: most prompt tokens one prefill step runs.
        enable_prefix_caching: reuse the pages of identical prompt prefixes.
        min_context: the narrowest page window a step reads (tokens), bounding the buckets.
        max_cache_bytes: the most memory the default-sized pool may take (None: no limit).
        kv_cache_dtype: the float dtype the KV pages are stored in (a `DType`, a numpy dtype
            or a name such as ``"float16"``); default the model's. ``float16`` halves the
            pool's memory and the bytes a decode step reads (llama.cpp's default); keys and
            values are rounded to it when written, attention still computes in float32.
    """

    def __init__(
        self,
        model: Any,
        *,
        max_batch_size: int = 16,
        max_length: int | None = None,
        page_size: int = 16,
        num_pages: int | None = None,
        prefill_chunk_size: int = 512,
        enable_prefix_caching: bool = False,
        min_context: int = 128,
        max_cache_bytes: int | None = None,
        kv_cache_dtype: Any = None,
    ):
        name = "ModelRunner"
        context = int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
        self.max_length = int(max_length or context or 2048)
        # The last token of a sequence is sampled, never fed back: a sequence may be one token past the context.
        if context is not None and self.max_length > context + 1:
            raise ValueError(
                f"{name}: max_length {self.max_length} exceeds the model's context of {context} positions "
                "(max_position_embeddings) by more than the last, unfed token"
            )
        for field, value in (
            ("max_batch_size", max_batch_size),
            ("page_size", page_size),
            ("prefill_chunk_size", prefill_chunk_size),
            ("max_length", self.max_length),
        ):
            if int(value) < 1:
                raise ValueError(f"{name}: {field} must be >= 1, got {value}")
        self.model = model
        self.vocab_size = int(model.config.vocab_size)
        self.max_batch_size, self.page_size = int(max_batch_size), int(page_size)
        self.prefill_chunk_size = min(int(prefill_chunk_size), self.max_length)
        self.max_pages_per_seq = -(-self.max_length // self.page_size)
        self.min_pages = min(self.max_pages_per_seq, _bucket(-(-int(min_context) // self.page_size)))
        n_kv, head_dim, dtype = _cache_spec(model)
        if kv_cache_dtype is not None:
            dtype = kv_dtype(kv_cache_dtype, f"{name} kv_cache_dtype")
        if num_pages is None:
            num_pages = self.max_batch_size * self.max_pages_per_seq + 1
            if max_cache_bytes is not None:  # K and V of every layer for one page
                page_bytes = 2 * model.num_layers * self.page_size * n_kv * head_dim * np.dtype(dtype).itemsize
                num_pages = max(2, min(num_pages, int(max_cache_bytes) // page_bytes))
        self.pool = PagePool(int(num_pages), self.page_size, enable_prefix_caching)
        shape = (self.pool.num_pages, self.page_size, n_kv, head_dim)  # what the paged attention kernels read
        self._pools = [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(model.num_layers)]
        self._weights, self._tree = jax.tree_util.tree_flatten(model)
        self._pages: dict[RequestID, list[int]] = {}
        self._sealed: dict[RequestID, int] = {}
        self._penalties: dict[RequestID, _PenaltyState] = {}
        self._lock = threading.Lock()  # one step at a time: steps donate the pools
        self.compile_s = 0.0  # seconds this runner spent compiling steps (`last_compile_s`: the latest)
        self._pool_spec = (len(self._pools), self._pools[0][0].shape, str(self._pools[0][0].dtype))
        self.cache_bytes = 2 * sum(k.size * k.dtype.itemsize for k, _ in self._pools)

    # ── pages ──
    def has(self, request_id: RequestID) -> bool:
        """The request holds pages here."""
        return request_id in self._pages

    def pages_needed(self, ctx: TextContext) -> int:
        """Pages a new request needs to be admitted: its tokens so far plus one (ignoring the prefix cache)."""
        return self.pool.pages_for(ctx.end_idx + 1)

    def claim(self, ctx: TextContext) -> int:
        """Give ``ctx`` pages for all its tokens, reusing cached prefix pages; returns the tokens found cached.

        Sets ``ctx.start_idx`` past the cached tokens. OutOfPagesError, with nothing
        taken, when the pool cannot hold the request.
        """
        if ctx.request_id in self._pages:
            raise ValueError(f"ModelRunner.claim: request {ctx.request_id} already holds pages")
        if ctx.end_idx > self.max_length:
            raise ValueError(
                f"ModelRunner.claim: request {ctx.request_id} has {ctx.end_idx} tokens, more than max_length "
                f"{self.max_length}"
            )
        tokens = ctx.all_tokens.tolist()
        cached = self.pool.match_prefix(tokens)
        try:
            fresh = self.pool.allocate(self.pool.pages_for(ctx.end_idx) - len(cached))
        except OutOfPagesError:
            self.pool.release(cached)
            raise
        self._pages[ctx.request_id] = cached + fresh
        self._sealed[ctx.request_id] = len(cached)
        ctx.set_token_indices(start_idx=len(cached) * self.page_size, active_idx=ctx.end_idx)
        return len(cached) * self.page_size

    def reserve(self, ctx: TextContext, num_tokens: int) -> None:
        """Make room for ``num_tokens`` more tokens after ``ctx.start_idx``; OutOfPagesError (nothing taken)
        otherwise.
        """
        self._reserve_at(ctx, ctx.start_idx + int(num_tokens))

    def _reserve_at(self, ctx: TextContext, num_tokens: int) -> None:
        """Pages for the request's first ``num_tokens`` token slots."""
        pages = self._pages[ctx.request_id]
        need = self.pool.pages_for(num_tokens) - len(pages)
        if need > 0:
            pages.extend(self.pool.allocate(need))

    def release(self, request_id: RequestID) -> None:
        """Free a request's pages (sealed ones stay in the prefix cache); unknown ids are ignored."""
        pages = self._pages.pop(request_id, None)
        self._sealed.pop(request_id, None)
        self._penalties.pop(request_id, None)
        if pages:
            self.pool.release(pages)

    # ── steps ──
    def execute(
        self, contexts: Sequence[TextContext], *, all_logits: bool = False
    ) -> dict[RequestID, StepOutput | None]:
        """Run one step: each context's next tokens (``ctx.next_tokens``, at most ``prefill_chunk_size``).

        A context whose tokens are all processed by this step gets its next token
        sampled (`StepOutput`); a prefill chunk that leaves prompt tokens for later
        gets None. The contexts' cursors and pages are updated; the caller appends
        the sampled tokens (`TextContext.update`). Pages must have been claimed.
        """
        return self.collect(self.dispatch(contexts, all_logits=all_logits))

    def step_tokens(self, counts: Sequence[int]) -> int:
        """Tokens a step over rows running ``counts`` tokens each computes, padding included (its ``B x T`` bucket)."""
        return _bucket(len(counts)) * self._chunk_bucket(max(counts))

    @staticmethod
    def _chunk_bucket(n: int) -> int:
        """A step's ``T``: 1 for decode, else a power of two from 16."""
        return 1 if n == 1 else _bucket(n, 16)

    def can_run_ahead(self, ctx: TextContext) -> bool:
        """Whether ``ctx``'s next decode step may be dispatched before its last sampled token reaches the host.

        True when no step input is computed from the tokens on the host (penalties,
        ``min_new_tokens``' EOS mask, a grammar's mask, echo) and the step after the
        pending one is not past the request's limits.
        """
        sp = ctx.sampling_params
        return (
            not ctx.needs_ce and ctx.matcher is None and not _has_bias(ctx) and float(sp.repetition_penalty) == 1.0
            and ctx.num_generated + 1 < ctx.max_new_tokens and ctx.end_idx + 1 < min(ctx.max_length, self.max_length)
        )  # fmt: skip

    def dispatch(
        self, contexts: Sequence[TextContext], *, all_logits: bool = False, after: PendingStep | None = None
    ) -> PendingStep:
        """Start one step (as `execute`) without waiting for it; `collect` its results.

        With ``after`` (a decode step of exactly these contexts, dispatched and not
        collected yet) each row's input token is the one ``after`` samples, taken on
        the device: the step runs behind ``after`` with no host round trip between
        them, the position one past ``after``'s. The caller collects ``after`` first,
        then this step (rows that finished in ``after`` are skipped by `collect`).

        Raises:
            OutOfPagesError: a row's next token has no page (nothing was started).
        """
        if not contexts:
            return PendingStep([], [], [], {}, 0, False)
        if len(contexts) > self.max_batch_size:
            raise ValueError(f"ModelRunner.execute: {len(contexts)} contexts; max_batch_size is {self.max_batch_size}")
        if after is not None:
            if [c.request_id for c in after.contexts] != [c.request_id for c in contexts]:
                raise ValueError(
                    "ModelRunner.dispatch: after= must be a pending step of the same contexts, in the same order"
                )
            counts, starts = (
                [1] * len(contexts),
                [c.end_idx for c in contexts],
            )  # the token `after` samples lands at end_idx
        else:
            counts, starts = (
                [min(c.active_length, self.prefill_chunk_size) for c in contexts],
                [c.start_idx for c in contexts],
            )
        for c, s, n in zip(contexts, starts, counts):
            if n < 1:
                raise ValueError(f"ModelRunner.execute: request {c.request_id} has no tokens to run")
            self._reserve_at(c, s + n)
        t = self._chunk_bucket(max(counts))
        b = _bucket(len(contexts))
        width = self._width(t, max(self.pool.pages_for(s + n) for s, n in zip(starts, counts)))
        arrays = self._inputs(contexts, starts, counts, b, t, width)
        if after is not None:
            arrays = (after.out["next_input"], *arrays[1:])  # device tokens [b, 1]: no host sync
        rows = [self._sampling(c) for c in contexts] + [{}] * (b - len(contexts))
        steps = [c.num_generated + (after is not None) for c in contexts] + [0] * (b - len(contexts))
        params = SamplingRows.build(rows, steps)
        extras = self._penalty_inputs(contexts, b) if after is None else (None, None, None)
        n_logprobs = max((c.log_probabilities for c in contexts), default=0)
        n_logprobs = 0 if n_logprobs == 0 else (5 if n_logprobs <= 5 else 20)
        all_logits = all_logits or any(c.log_probabilities_echo and c.needs_ce for c in contexts)
        static = dict(
            model_tree=self._tree,
            page_size=self.page_size,
            sample=params.sample,
            filters=params.filters,
            n_logprobs=n_logprobs,
            all_logits=all_logits,
        )
        with self._lock:
            out = self._run(arrays, params.arrays(), extras, static)
        return PendingStep(list(contexts), starts, counts, out, n_logprobs, all_logits)

    def collect(self, step: PendingStep) -> dict[RequestID, StepOutput | None]:
        """Wait for a dispatched step; update its contexts' cursors and return each row's `StepOutput` (as `execute`).

        Rows whose request finished or was released meanwhile are left out.
        """
        if not step.contexts:
            return {}
        host = {k: np.asarray(v) for k, v in step.out.items() if k != "next_input"}
        results: dict[RequestID, StepOutput | None] = {}
        for i, (c, s, n) in enumerate(zip(step.contexts, step.starts, step.counts)):
            if c.is_done or c.request_id not in self._pages:
                continue
            finishes = s + n == c.end_idx
            self._seal(c, s + n)
            c.set_token_indices(start_idx=s + n)
            if step.all_logits and c.log_probabilities_echo:
                _record_prompt_logprobs(c, s, n, host["all_logprobs"][i, :n])
            if not finishes:
                results[c.request_id] = None
                continue
            lp = None
            if step.n_logprobs and c.log_probabilities:
                k = c.log_probabilities
                top = {int(tok): float(v) for tok, v in zip(host["top_ids"][i, :k], host["top_values"][i, :k])}
                lp = LogProbabilities(token_log_probabilities=[float(host["logprob"][i])], top_log_probabilities=[top])
            extra = {}
            if step.all_logits:
                extra = {"all_logprobs": host["all_logprobs"][i, :n], "all_probs": host["all_probs"][i, :n]}
            results[c.request_id] = StepOutput(int(host["tokens"][i]), lp, **extra)
        return results

    def _run(self, arrays: tuple, params: tuple, extras: tuple, static: dict[str, Any]) -> dict[str, Any]:
        args = (self._weights, self._pools, *arrays, params, *extras)
        key = (
            "engine",
            self._tree,
            self._pool_spec,
            tuple(sorted((k, v) for k, v in static.items() if k != "model_tree")),
            jax.tree_util.tree_structure(extras),
            tuple((a.shape, a.dtype) for a in jax.tree_util.tree_leaves((arrays, params, extras))),
        )
        exe = EXECUTABLES.get(key)
        if exe is None:
            start = time.perf_counter()
            with compiling("engine step", f"B={arrays[0].shape[0]} T={arrays[0].shape[1]} pages={arrays[3].shape[1]}"):
                exe = _STEP.lower(*args, **static).compile()
            EXECUTABLES.put(key, exe)
            with _COUNT_LOCK:
                _COUNTS["compiles"] += 1
            self.last_compile_s = time.perf_counter() - start
            self.compile_s += self.last_compile_s
        out, self._pools = exe(*args)
        _COUNTS["steps"] += 1
        return out

    def _width(self, t: int, pages: int) -> int:
        """Pages a step reads per row: decode steps a power of two from ``min_context`` up; prefill chunks
        (whose cost is the chunk's matmuls, not the page window) always the whole ``max_length``."""
        if t > 1:
            return self.max_pages_per_seq
        return min(self.max_pages_per_seq, max(self.min_pages, _bucket(pages)))

    def _inputs(
        self, contexts: Sequence[TextContext], starts: Sequence[int], counts: Sequence[int], b: int, t: int, width: int
    ) -> tuple[np.ndarray, ...]:
        """``(tokens, positions, slots, pages, last)`` of a step: padding rows and pages point at the scratch page 0."""
        ps = self.page_size
        tokens = np.zeros((b, t), np.int32)
        pos = np.zeros((b, t), np.int32)
        slots = np.zeros((b, t), np.int32)
        pages = np.zeros((b, width), np.int32)
        last = np.zeros(b, np.int32)
        steps = np.arange(t)
        for i, (c, s, n) in enumerate(zip(contexts, starts, counts)):
            seg = c.tokens[s : s + n]  # empty for a run-ahead row (its token is still on the device)
            tokens[i, : len(seg)] = seg
            pos[i] = s + np.minimum(steps, n - 1)  # padded queries repeat the last position
            held = self._pages[c.request_id][:width]
            pages[i, : len(held)] = held
            new = np.arange(s, s + n)
            slots[i, :n] = pages[i, new // ps] * ps + new % ps
            last[i] = n - 1
        return tokens, pos, slots, pages, last

    def _sampling(self, c: TextContext) -> dict[str, Any]:
        sp = c.sampling_params
        temperature = float(sp.temperature)
        if int(sp.top_k) == 1:  # MAX: top_k 1 is greedy
            temperature = 0.0
        return {
            "temperature": temperature,
            "top_k": int(sp.top_k),
            "top_p": float(sp.top_p),
            "min_p": float(sp.min_p),
            "seed": int(sp.seed or 0),
        }

    def _penalty_inputs(self, contexts: Sequence[TextContext], b: int) -> tuple[Any, Any, Any]:
        """``(bias, repetition, seen)`` for the step (None where no row needs them)."""
        need_bias = any(_has_bias(c) or c.matcher is not None for c in contexts)  # a matcher: the grammar's token mask
        need_rep = any(float(c.sampling_params.repetition_penalty) != 1.0 for c in contexts)
        if not (need_bias or need_rep):
            return None, None, None
        v = self.vocab_size
        bias = np.zeros((b, v), np.float32) if need_bias else None
        rep = np.ones(b, np.float32) if need_rep else None
        seen = np.zeros((b, v), bool) if need_rep else None
        for i, c in enumerate(contexts):
            sp = c.sampling_params
            state = self._penalties.get(c.request_id)
            if state is None:
                state = self._penalties[c.request_id] = _PenaltyState(c, v)
            state.sync(c)
            if need_bias:
                bias[i] -= float(sp.frequency_penalty) * state.counts + float(sp.presence_penalty) * (state.counts > 0)
                eos = c.get_min_token_logit_mask(1)[0]
                bias[i, eos[(eos >= 0) & (eos < v)]] = -np.inf
            if need_rep:
                rep[i] = float(sp.repetition_penalty)
                seen[i] = state.seen
        if need_bias:
            apply_token_masks(contexts, bias)  # structured output: -inf where the row's grammar forbids the token
        return bias, rep, seen

    def _seal(self, c: TextContext, cached: int) -> None:
        """Key the request's pages that became full (prefix caching)."""
        if not self.pool.enable_prefix_caching:
            return
        rid = c.request_id
        full = cached // self.page_size
        if full > self._sealed[rid]:
            self._sealed[rid] = self.pool.seal(
                self._pages[rid][:full], c.tokens[: full * self.page_size].tolist(), self._sealed[rid]
            )

    def warmup(
        self,
        *,
        prefill: bool = True,
        decode: bool = True,
        progress: bool = False,
        prefill_rows: int = 1,
        prefill_tokens: int | None = None,
    ) -> int:
        """Compile every bucket the scheduler can use (greedy sampling); returns the programs compiled now.

        ``prefill_rows`` / ``prefill_tokens``: the scheduler's ``max_prefill_rows`` and
        ``max_prefill_tokens``; prefill steps of up to that many rows within that many
        padded tokens are compiled too (one row: every chunk bucket).
        """
        before = _COUNTS["compiles"]
        widths = sorted({self._width(1, n) for n in range(1, self.max_pages_per_seq + 1)})
        budget = self.prefill_chunk_size if prefill_tokens is None else int(prefill_tokens)
        shapes = []
        if decode:
            shapes += [
                (b, 1, w) for b in sorted({_bucket(n) for n in range(1, self.max_batch_size + 1)}) for w in widths
            ]
        if prefill:
            rows = sorted({_bucket(n) for n in range(1, min(int(prefill_rows), self.max_batch_size) + 1)})
            chunks = sorted({_bucket(n, 16) for n in range(2, self.prefill_chunk_size + 1)})
            # The scheduler's rule (`Scheduler._prefill_batch`): a step's first row always runs; more only within the
            # budget.
            shapes += [
                (b, t, self.max_pages_per_seq)
                for b in rows
                for t in chunks
                if b == 1 or self.step_tokens([t] * b) <= budget
            ]
        for b, t, w in shapes:
            arrays = (
                np.zeros((b, t), np.int32),
                np.zeros((b, t), np.int32),
                np.zeros((b, t), np.int32),
                np.zeros((b, w), np.int32),
                np.zeros(b, np.int32),
            )
            params = SamplingRows.build([{}] * b, [0] * b)
            static = dict(
                model_tree=self._tree,
                page_size=self.page_size,
                sample=False,
                filters=False,
                n_logprobs=0,
                all_logits=False,
            )
            with self._lock:
                self._run(arrays, params.arrays(), (None, None, None), static)
        return _COUNTS["compiles"] - before


def _has_bias(c: TextContext) -> bool:
    sp = c.sampling_params
    return (
        float(sp.frequency_penalty) != 0.0
        or float(sp.presence_penalty) != 0.0
        or (c.min_tokens > 0 and c.num_generated < c.min_tokens and bool(c.eos_token_ids) and not c.ignore_eos)
    )
