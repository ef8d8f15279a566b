"""`SpeculativeDecodingTextGenerationPipeline`: MAX's draft-model speculative decoding, on maxfx's engine.

A small *draft* model proposes ``k = num_speculative_tokens`` tokens, the *target*
model scores all of them in one forward, and rejection sampling (Leviathan et al.,
2023; Chen et al., 2023) keeps a prefix, so the tokens come out distributed exactly
as the target alone would sample them, a variable number per call.

Each model has its own `maxfx.generation.ModelRunner` (its own KV page pool). The
request's `TextContext` is the target's; the draft's KV state differs from it (the
draft cached tokens the target rejected), so the pipeline keeps a *shadow*
`TextContext` per request for the draft: the same tokens, its own cursors, created
when the request is first seen and freed by `release`.

One ``execute(inputs)`` call, per context:

- still encoding its prompt: one prefill chunk on the target (the last one samples
  the first token) and on the draft (fills the draft's cache), as
  `TextGenerationPipeline` does;
- decoding: one speculative round.

  1. `generate_draft_tokens`: ``k_eff`` single-token draft steps (``k_eff = min(k,
     remaining - 1)``: never more drafts than the request may still emit); each
     records ``q_i`` (the distribution the request's `SamplingParams` sample from,
     the runner's ``all_probs``) and draws ``d_i ~ q_i`` (`sample_draft_logits`).
  2. `verify_draft_tokens_with_target_model`: the drafts are written into the target
     context beyond ``end_idx``; ONE target forward over ``[last token, d_1..d_k]``
     gives ``p_1..p_{k+1}``; `rejection_sample` accepts ``d_i`` with probability
     ``min(1, p_i(d_i) / q_i(d_i))``, samples the first rejected position from the
     residual ``normalize(max(0, p_i - q_i))`` and, when every draft is accepted, a
     bonus token from ``p_{k+1}``. Greedy requests (one-hot ``p`` and ``q``) thus
     accept while the draft equals the target's argmax, and the replacement/bonus is
     the target's argmax.
  3. `update_contexts`: the cursors go back to the state before the drafts and each
     accepted token and the final one are appended with ``ctx.update`` (which applies
     EOS and the length limits: nothing is appended past a stop). The target's KV of
     the accepted tokens is already written, so ``start_idx = end_idx - 1`` is exact;
     the draft's shadow keeps the cached prefix that still matches the tokens.

The uniform draws of a round come from a numpy ``Generator`` seeded with the
request's seed and its number of generated tokens, so seeded runs reproduce
whatever batch they run in. `metrics` counts proposals, acceptances, bonus tokens
and rounds (`SpeculativeDecodingMetrics`). `generate` / `generate_async` loop
``execute`` until every request is done (MAX's scheduler does not drive speculative
pipelines either).

Example:
    >>> from maxfx.interfaces import RequestID, SamplingParams, TextGenerationRequest
    >>> from maxfx.pipelines import PipelineConfig
    >>> from maxfx.pipelines.lib.tokenizer import TextTokenizer
    >>> config = PipelineConfig(model_path="tests/data/models/tiny_llama",
    ...     draft_model_path="tests/data/models/tiny_llama", max_batch_size=2)
    >>> tok = TextTokenizer(config.model_config.model_path, pipeline_config=config)
    >>> pipe = SpeculativeDecodingTextGenerationPipeline(config, None, tok.eos, {}, tok)
    >>> req = TextGenerationRequest(request_id=RequestID(), model_name="tiny", prompt="hello",
    ...     sampling_params=SamplingParams(top_k=1, max_new_tokens=6, ignore_eos=True))
    >>> [len(out.tokens) for out in pipe.generate([req])], pipe.metrics.acceptance_rate
    ([6], 1.0)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from maxfx.generation import ModelRunner, OutOfPagesError, TextContext
from maxfx.interfaces import (
    LogProbabilities,
    Pipeline,
    RequestID,
    TextGenerationInputs,
    TextGenerationOutput,
    TextGenerationRequest,
)
from maxfx.pipelines.lib._engine_setup import build_runner, load_model
from maxfx.pipelines.lib.interfaces._generate import BatchInfo, GenerateMixin

__all__ = [
    "DraftInputs",
    "SpeculativeDecodingMetrics",
    "SpeculativeDecodingTextGenerationPipeline",
    "rejection_sample",
    "sample_from",
]

log = logging.getLogger("maxfx.pipelines")

_NAME = "SpeculativeDecodingTextGenerationPipeline"


# ─── the sampling math (numpy; what the tests check against the definition) ─────


def sample_from(probs: np.ndarray, u: float) -> int:
    """The token the uniform draw ``u`` in ``[0, 1)`` picks from the (unnormalized, non-negative) weights ``probs [V]``.

    Inverse CDF: the first token whose cumulative weight exceeds ``u * sum``; tokens of
    weight 0 are never picked. All-zero weights pick the argmax (token 0).
    """
    w = np.asarray(probs, np.float64)
    c = np.cumsum(w)
    total = c[-1]
    if not total > 0:
        return int(np.argmax(w))
    return int(min(np.searchsorted(c, float(u) * total, side="right"), len(w) - 1))


def rejection_sample(
    draft_tokens: Sequence[int],
    draft_probs: np.ndarray,
    target_probs: np.ndarray,
    accept_draws: Sequence[float],
    final_draw: float,
) -> tuple[int, int]:
    """Speculative sampling of one sequence: ``(accepted, token)``.

    Args:
        draft_tokens: the ``k`` drafted tokens ``d_1..d_k`` (``k`` may be 0).
        draft_probs: ``q [k, V]``: the draft distribution each ``d_i`` was drawn from.
        target_probs: ``p [k + 1, V]``: the target's distribution at each position.
        accept_draws: ``k`` uniforms in ``[0, 1)``: ``d_i`` is accepted when ``u_i * q_i(d_i) < p_i(d_i)``,
            i.e. with probability ``min(1, p_i(d_i) / q_i(d_i))``.
        final_draw: the uniform that samples the final token.

    Returns:
        ``accepted``: how many drafts are kept (the index of the first rejection, ``k``
        when none is rejected); ``token``: at a rejection, the replacement drawn from
        ``normalize(max(0, p_i - q_i))`` (``p_i`` itself where that is all zero);
        otherwise the bonus token drawn from ``p_{k+1}``.
    """
    k = len(draft_tokens)
    p = np.asarray(target_probs, np.float64)
    q = np.asarray(draft_probs, np.float64).reshape(k, -1) if k else np.zeros((0, p.shape[-1]))
    if p.shape[0] != k + 1:
        raise ValueError(f"rejection_sample: target_probs needs k + 1 = {k + 1} rows for {k} drafts, got {p.shape[0]}")
    for i, d in enumerate(draft_tokens):
        d = int(d)
        if float(accept_draws[i]) * q[i, d] < p[i, d]:
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        return i, sample_from(residual if residual.sum() > 0 else p[i], final_draw)
    return k, sample_from(p[k], final_draw)


def _forbid(probs: np.ndarray, logprobs: np.ndarray | None, ids: Sequence[int]) -> np.ndarray:
    """``probs [V]`` with ``ids`` removed and renormalized (min_new_tokens keeps EOS out); the best other raw token when
    nothing is left.
    """
    out = np.array(probs, np.float64)
    out[list(ids)] = 0.0
    if out.sum() > 0:
        return out / out.sum()
    raw = np.array(logprobs if logprobs is not None else probs, np.float64)
    raw[list(ids)] = -np.inf
    out[:] = 0.0
    out[int(np.argmax(raw))] = 1.0
    return out


# ─── metrics ───────────────────────────────────────────────────────────────────


@dataclass
class SpeculativeDecodingMetrics:
    """Acceptance statistics of a speculative pipeline (MAX's counters, names and ``get_stats``).

    ``draft_tokens_generated``: drafts proposed; ``draft_tokens_accepted``: drafts the
    target accepted; ``bonus_tokens_used``: rounds whose drafts were all accepted (so a
    bonus token came from ``p_{k+1}``); ``total_acceptance_lengths`` / ``num_generations``:
    accepted drafts summed over the speculative rounds and the number of rounds (one
    per request per call that proposed at least one draft).
    """

    bonus_tokens_used: int = 0
    draft_tokens_accepted: int = 0
    draft_tokens_generated: int = 0
    total_acceptance_lengths: int = 0
    num_generations: int = 0

    def update(
        self,
        draft_tokens_generated: int,
        draft_tokens_accepted: int,
        bonus_tokens_used: int,
        acceptance_lengths: Sequence[int],
    ) -> None:
        """Add one batch's counts (``acceptance_lengths``: accepted drafts per speculative row)."""
        self.draft_tokens_generated += int(draft_tokens_generated)
        self.draft_tokens_accepted += int(draft_tokens_accepted)
        self.bonus_tokens_used += int(bonus_tokens_used)
        self.total_acceptance_lengths += int(sum(acceptance_lengths))
        self.num_generations += len(acceptance_lengths)

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed drafts (0.0 before any proposal)."""
        return self.draft_tokens_accepted / self.draft_tokens_generated if self.draft_tokens_generated else 0.0

    @property
    def avg_acceptance_length(self) -> float:
        """Drafts accepted per speculative round (0.0 before any round)."""
        return self.total_acceptance_lengths / self.num_generations if self.num_generations else 0.0

    @property
    def rounds(self) -> int:
        """Speculative rounds so far (``num_generations``)."""
        return self.num_generations

    def get_stats(self) -> dict[str, float]:
        """MAX's dictionary: acceptance rate, counts and average acceptance length."""
        return {
            "acceptance_rate": self.acceptance_rate,
            "bonus_tokens_used": self.bonus_tokens_used,
            "draft_tokens_accepted": self.draft_tokens_accepted,
            "draft_tokens_generated": self.draft_tokens_generated,
            "avg_acceptance_length": self.avg_acceptance_length,
        }

    def reset(self) -> None:
        """Zero every counter."""
        self.bonus_tokens_used = self.draft_tokens_accepted = self.draft_tokens_generated = (
            self.total_acceptance_lengths
        ) = self.num_generations = 0

    def __str__(self) -> str:
        return (
            f"SpeculativeDecodingMetrics(acceptance_rate={self.acceptance_rate:.2%}, "
            f"avg_acceptance_length={self.avg_acceptance_length:.2f}, "
            f"bonus_tokens_used={self.bonus_tokens_used}, "
            f"draft_tokens_accepted={self.draft_tokens_accepted}/{self.draft_tokens_generated})"
        )


@dataclass
class DraftInputs:
    """What `prepare_batch` builds for the draft (MAX's draft ``ModelInputs``), row by row.

    ``contexts``: the draft's shadow contexts; ``num_draft_tokens``: drafts each row may
    propose (``k_eff``); ``uniforms [B, 2k + 1]``: the round's draws (``k`` for the
    drafts, ``k`` for the acceptance tests, one for the final token).
    """

    contexts: list[TextContext]
    num_draft_tokens: np.ndarray
    uniforms: np.ndarray
    target_logprobs: dict[RequestID, np.ndarray] = field(default_factory=dict)


# ─── the pipeline ──────────────────────────────────────────────────────────────


class SpeculativeDecodingTextGenerationPipeline(GenerateMixin, Pipeline):
    """MAX's ``SpeculativeDecodingTextGenerationPipeline(pipeline_config, pipeline_model, eos_token_id, weight_adapters,
    tokenizer)``.

    See the module docstring for the algorithm.

    Args:
        pipeline_config: the `PipelineConfig`; ``draft_model_config`` names the draft
            (``draft_model_path=``), ``speculative_config.num_speculative_tokens`` is ``k``.
        pipeline_model: MAX's model class (maxfx loads its models itself; kept).
        eos_token_id: the tokenizer's EOS id (kept; each context carries its EOS set).
        weight_adapters: MAX's checkpoint converters (kept).
        tokenizer: the `TextTokenizer`.
        model: an already loaded target `maxfx.models.CausalLM`.
        draft_model: an already loaded draft `CausalLM` (same vocabulary as the target).

    Raises:
        ValueError: no draft model, or draft and target vocabularies differ.
    """

    def __init__(
        self,
        pipeline_config: Any,
        pipeline_model: Any,
        eos_token_id: int | None,
        weight_adapters: Any,
        tokenizer: Any,
        *,
        model: Any = None,
        draft_model: Any = None,
    ):
        self._pipeline_config = pipeline_config
        self._pipeline_model = pipeline_model
        self._eos_token_id = eos_token_id
        self._weight_adapters = dict(weight_adapters or {})
        self._tokenizer = tokenizer
        draft_config = getattr(pipeline_config, "draft_model_config", None)
        if draft_model is None and draft_config is None:
            raise ValueError(
                f"{_NAME}: a draft model is needed: set PipelineConfig(draft_model_path=...) or pass draft_model="
            )
        self.model = model if model is not None else load_model(pipeline_config.model_config)
        self.draft_model = draft_model if draft_model is not None else load_model(draft_config)
        target_vocab, draft_vocab = int(self.model.config.vocab_size), int(self.draft_model.config.vocab_size)
        if target_vocab != draft_vocab:
            raise ValueError(
                f"{_NAME}: the draft model's vocabulary ({draft_vocab} tokens) must be the target's ({target_vocab} "
                "tokens)"
            )
        self.vocab_size = target_vocab
        self.runner: ModelRunner = build_runner(pipeline_config, self.model)
        self.draft_runner: ModelRunner = build_runner(
            pipeline_config, self.draft_model, draft_config or pipeline_config.model_config
        )
        for r in (self.runner, self.draft_runner):
            if r.pool.enable_prefix_caching:  # sealing pages would key them by draft tokens the target may reject
                log.warning("%s: prefix caching is not supported with speculative decoding; turned off", _NAME)
                r.pool.enable_prefix_caching = False
        if min(self.runner.prefill_chunk_size, self.draft_runner.prefill_chunk_size) < 2:
            raise ValueError(
                f"{_NAME}: prefill_chunk_size must be at least 2 (a verify step runs the last token and the drafts), "
                f"got {self.runner.prefill_chunk_size}"
            )
        spec = getattr(pipeline_config, "speculative_config", None)
        k = int(getattr(spec, "num_speculative_tokens", 2) or 2)
        self._num_draft_steps = max(1, min(k, self.runner.prefill_chunk_size - 1, self.draft_runner.prefill_chunk_size))
        self._metrics = SpeculativeDecodingMetrics()
        self._shadows: dict[RequestID, TextContext] = {}

    # ── MAX's properties (pipeline_config and tokenizer come from GenerateMixin) ──
    @property
    def kv_managers(self) -> list[Any]:
        """The KV page pools: the target's, then the draft's."""
        return [self.runner.pool, self.draft_runner.pool]

    @property
    def kv_manager(self) -> Any:
        """The target model's KV page pool (MAX's ``kv_manager``)."""
        return self.runner.pool

    @property
    def metrics(self) -> SpeculativeDecodingMetrics:
        """The acceptance statistics so far."""
        return self._metrics

    @property
    def scheduler(self) -> Any:
        """maxfx's `Scheduler` runs one model; a speculative pipeline is driven by `generate` or by calling
        `execute`.
        """
        raise NotImplementedError(
            f"{_NAME}: the engine's Scheduler does not drive speculative decoding; use pipeline.generate(requests) or "
            "call execute() in a loop"
        )

    @property
    def num_speculative_tokens(self) -> int:
        """``k``: drafts proposed per round (``speculative_config.num_speculative_tokens``, cut to the prefill
        chunk).
        """
        return self._num_draft_steps

    # ── steps allowed ──
    def calculate_num_steps(
        self, model: Any, huggingface_config: Any, num_steps: int, context: TextContext, is_draft: bool = False
    ) -> int:
        """``num_steps`` cut to the tokens ``context`` may still emit (its ``max_new_tokens``, ``max_length`` and the
        runner's).

        ``model`` is a `ModelRunner` (or a model with ``config.max_position_embeddings``);
        ``huggingface_config`` is kept for MAX's signature. For the target the result is
        the tokens one verify may emit (``k_eff + 1``), and a context at its limit is a
        ValueError; ``is_draft`` keeps one token back for the target, so it is ``k_eff``
        (possibly 0).
        """
        limit = (
            getattr(model, "max_length", None)
            or int(getattr(getattr(model, "config", None), "max_position_embeddings", 0) or 0)
            or context.max_length
        )
        left = min(
            int(limit) - context.end_idx,
            context.max_length - context.end_idx,
            context.max_new_tokens - context.num_generated,
        )
        if is_draft:
            return max(0, min(int(num_steps), left - 1))
        if left <= 0:
            raise ValueError(
                f"{_NAME}: request {context.request_id} is at its length limit ({context.end_idx} tokens, "
                f"{context.num_generated} generated)"
            )
        return max(1, min(int(num_steps), left))

    # ── the draft's shadow contexts ──
    def _shadow(self, ctx: TextContext) -> TextContext:
        """The draft's context of ``ctx`` (created, and given draft pages, on first sight)."""
        shadow = self._shadows.get(ctx.request_id)
        if shadow is None:
            shadow = TextContext(
                max_length=ctx.max_length,
                tokens=ctx.all_tokens.copy(),
                request_id=ctx.request_id,
                sampling_params=ctx.sampling_params,
                ignore_eos=True,
            )
            try:
                self.draft_runner.claim(shadow)
            except OutOfPagesError as err:
                raise RuntimeError(
                    f"{_NAME}.execute: no draft KV pages for request {ctx.request_id}: {err}; release finished "
                    "requests or lower max_batch_size"
                ) from None
            self._shadows[ctx.request_id] = shadow
        return shadow

    def _sync_shadow(self, ctx: TextContext) -> TextContext:
        """Give the shadow ``ctx``'s tokens; its cache keeps the longest prefix that still matches them."""
        shadow = self._shadow(ctx)
        end = ctx.end_idx
        n = min(shadow.start_idx, end)
        diff = np.flatnonzero(shadow.tokens[:n] != ctx.tokens[:n])
        cached = int(diff[0]) if diff.size else n
        shadow.set_token_indices(end_idx=max(end, shadow.end_idx))  # grows the buffer
        shadow.tokens[:end] = ctx.tokens[:end]
        shadow.set_token_indices(start_idx=min(cached, end - 1), active_idx=end, end_idx=end)
        return shadow

    def _uniforms(self, ctx: TextContext) -> np.ndarray:
        """The round's ``2k + 1`` draws, from the request's seed and its generated-token count."""
        seed = int(getattr(ctx.sampling_params, "seed", 0) or 0) & 0xFFFFFFFFFFFFFFFF
        return np.random.default_rng((seed, ctx.num_generated)).random(2 * self._num_draft_steps + 1)

    # ── MAX's steps ──
    def prepare_batch(
        self,
        model: ModelRunner,
        batch: Sequence[TextContext],
        num_steps: int,
        return_n_logits: int = 1,
        is_draft: bool = False,
        draft_inputs: DraftInputs | None = None,
        merged_draft_tokens: np.ndarray | None = None,
        merged_draft_offsets: np.ndarray | None = None,
    ) -> tuple[Any, int]:
        """The inputs of one model for ``batch`` (target contexts), and the steps they allow.

        - ``is_draft``: the shadows, synced to the contexts (created with draft pages when
          new), as `DraftInputs` with each row's ``k_eff`` and the round's draws; the steps
          are the largest ``k_eff``.
        - target: pages for contexts not seen before; with ``merged_draft_tokens`` (MAX's
          ragged ``[last token, d_1..d_k]`` per row, rows split at ``merged_draft_offsets``)
          the drafts are written into each context beyond ``end_idx`` and its cursors set
          so its next tokens are those ``k_eff + 1``. Returns the contexts and
          ``num_steps`` cut to what every context allows.

        ``return_n_logits`` is kept for MAX's signature (the runner returns every
        position's distribution when asked). Raises RuntimeError when a pool cannot hold
        a new request.
        """
        if is_draft:
            shadows = [self._sync_shadow(c) for c in batch]
            kd = np.array([self.calculate_num_steps(model, None, num_steps, c, is_draft=True) for c in batch], np.int64)
            uniforms = (
                np.stack([self._uniforms(c) for c in batch]) if batch else np.zeros((0, 2 * self._num_draft_steps + 1))
            )
            return DraftInputs(shadows, kd, uniforms), int(kd.max(initial=0))
        for c in batch:
            if not c.is_done and not model.has(c.request_id):
                try:
                    model.claim(c)
                except OutOfPagesError as err:
                    raise RuntimeError(
                        f"{_NAME}.execute: no KV pages for request {c.request_id}: {err}; release finished requests or "
                        "lower max_batch_size"
                    ) from None
        if merged_draft_tokens is not None:
            merged, offsets = np.asarray(merged_draft_tokens, np.int64), np.asarray(merged_draft_offsets, np.int64)
            for b, c in enumerate(batch):
                row = merged[offsets[b] : offsets[b + 1]]
                end = c.end_idx
                if c.start_idx != end - 1 or int(row[0]) != int(c.tokens[end - 1]):
                    raise ValueError(
                        f"{_NAME}.prepare_batch: request {c.request_id} is not decoding from its last token"
                    )
                c.set_token_indices(end_idx=end + len(row) - 1)
                c.tokens[end : end + len(row) - 1] = row[1:]
                c.set_token_indices(active_idx=end + len(row) - 1)
        live = [c for c in batch if not c.is_done]
        steps = min(
            (self.calculate_num_steps(model, None, num_steps, c) for c in live if c.active_length <= 1),
            default=int(num_steps),
        )
        return list(batch), steps

    def sample_draft_logits(
        self,
        batch: Sequence[TextContext],
        model_outputs: Any,
        prev_tokens: np.ndarray,
        prev_logits: np.ndarray,
        top_k: Any = None,
        max_k: Any = None,
        temperature: Any = None,
        top_p: Any = None,
        min_top_p: Any = None,
        seed: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw each row's next draft token from its draft distribution ``q``.

        Args:
            batch: the rows' contexts.
            model_outputs: ``q [B, V]``: the distribution each row samples from (the draft
                runner's ``all_probs``, which already apply the row's temperature, top-k,
                top-p and min-p: so ``top_k``, ``max_k``, ``temperature``, ``top_p`` and
                ``min_top_p`` are kept for MAX's signature only).
            prev_tokens: ``[B, s]`` the drafts so far; prev_logits: ``[B, s]`` their ``q``.
            seed: ``[B]`` uniform draws in ``[0, 1)`` (default: from each row's seeded generator).

        Returns:
            ``(new_tokens [B], tokens [B, s + 1], probs [B, s + 1])``: the drawn tokens, the
            drafts with them appended, and each draft's ``q`` of itself.
        """
        q = np.asarray(model_outputs, np.float64)
        draws = np.asarray(seed, np.float64) if seed is not None else np.array([self._uniforms(c)[0] for c in batch])
        new = np.array([sample_from(q[b], draws[b]) for b in range(len(batch))], np.int64)
        picked = q[np.arange(len(batch)), new] if len(batch) else np.zeros(0)
        prev_tokens = np.asarray(prev_tokens, np.int64).reshape(len(batch), -1)
        prev_logits = np.asarray(prev_logits, np.float64).reshape(len(batch), -1)
        return (
            new,
            np.concatenate([prev_tokens, new[:, None]], axis=1),
            np.concatenate([prev_logits, picked[:, None]], axis=1),
        )

    def _min_token_mask(
        self, ctx: TextContext, probs: np.ndarray, logprobs: np.ndarray | None, step: int
    ) -> np.ndarray:
        """``probs`` without EOS when the token ``step`` tokens ahead would come before ``min_new_tokens``."""
        if ctx.ignore_eos or not ctx.eos_token_ids or ctx.num_generated + step >= ctx.min_tokens:
            return probs
        return _forbid(probs, logprobs, [t for t in ctx.eos_token_ids if 0 <= t < len(probs)])

    def generate_draft_tokens(
        self, batch: Sequence[TextContext], num_steps: int, model_inputs: DraftInputs
    ) -> tuple[int, np.ndarray, np.ndarray, DraftInputs, np.ndarray]:
        """Run the draft ``num_steps`` single-token steps (row ``b`` only its ``k_eff``), drawing ``d_i ~ q_i``.

        Returns MAX's tuple ``(num_steps, draft_tokens [B, num_steps], draft_logits [B,
        num_steps], model_inputs, all_draft_logits [num_steps, B, V])``: the drafts (-1
        past a row's ``k_eff``), each draft's ``q_i(d_i)``, and the distributions ``q_i``
        (maxfx returns probabilities, not logits). The shadows end with the drafts
        appended, all but the last in the draft's cache.
        """
        b = len(batch)
        shadows, kd, uniforms = model_inputs.contexts, model_inputs.num_draft_tokens, model_inputs.uniforms
        tokens = np.full((b, num_steps), -1, np.int64)
        picked = np.zeros((b, num_steps), np.float64)
        all_q = np.zeros((num_steps, b, self.vocab_size), np.float64)
        for i in range(num_steps):
            rows = [r for r in range(b) if kd[r] > i]
            outs: dict[RequestID, Any] = {}
            pending = rows
            while pending:  # a shadow behind by more than a prefill chunk catches up first
                res = self.draft_runner.execute([shadows[r] for r in pending], all_logits=True)
                outs.update({k: v for k, v in res.items() if v is not None})
                pending = [r for r in pending if shadows[r].request_id not in outs]
            if not rows:
                break
            q = np.stack([outs[shadows[r].request_id].all_probs[-1] for r in rows]).astype(np.float64)
            q = np.stack(
                [
                    self._min_token_mask(batch[r], q[j], outs[shadows[r].request_id].all_logprobs[-1], i)
                    for j, r in enumerate(rows)
                ]
            )
            new, _, _ = self.sample_draft_logits(
                [batch[r] for r in rows], q, np.zeros((len(rows), 0)), np.zeros((len(rows), 0)), seed=uniforms[rows, i]
            )
            for j, r in enumerate(rows):
                tokens[r, i], picked[r, i], all_q[i, r] = new[j], q[j, new[j]], q[j]
                s = shadows[r]
                e = s.end_idx
                s.set_token_indices(end_idx=e + 1)
                s.tokens[e] = new[j]
                s.set_token_indices(active_idx=e + 1)
        return num_steps, tokens, picked, model_inputs, all_q

    def verify_draft_tokens_with_target_model(
        self,
        draft_inputs: DraftInputs,
        context_batch: Sequence[TextContext],
        num_draft_tokens_generated: int,
        draft_tokens: np.ndarray,
        draft_logits: np.ndarray,
        merged_draft_tokens: np.ndarray,
        merged_draft_offsets: np.ndarray,
        all_draft_logits: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One target forward over each row's ``[last token, d_1..d_k]``, then `rejection_sample`.

        Returns MAX's ``(first_rejected_tokens [B], recovered_tokens [B, num_steps + 1],
        bonus_tokens [B, 1])``: the accepted drafts per row, the replacement at the first
        rejected position (-1 elsewhere) and the bonus token (-1 unless every draft was
        accepted). The contexts' cursors are back where they were before the drafts; the
        target's KV of ``[last token, d_1..d_k]`` is written.
        """
        ctxs, _ = self.prepare_batch(
            self.runner,
            context_batch,
            num_draft_tokens_generated + 1,
            num_draft_tokens_generated + 1,
            False,
            draft_inputs,
            merged_draft_tokens,
            merged_draft_offsets,
        )
        outs = self.runner.execute(ctxs, all_logits=True)
        b = len(ctxs)
        first_rejected = np.zeros(b, np.int64)
        recovered = np.full((b, num_draft_tokens_generated + 1), -1, np.int64)
        bonus = np.full((b, 1), -1, np.int64)
        offsets = np.asarray(merged_draft_offsets, np.int64)
        k = self._num_draft_steps
        for r, c in enumerate(ctxs):
            n_drafts = int(offsets[r + 1] - offsets[r] - 1)
            old_end = c.end_idx - n_drafts
            c.set_token_indices(start_idx=old_end - 1, active_idx=old_end, end_idx=old_end)
            out = outs[c.request_id]
            lp = np.asarray(out.all_logprobs, np.float64)
            p = np.stack(
                [
                    self._min_token_mask(c, np.asarray(out.all_probs[j], np.float64), lp[j], j)
                    for j in range(n_drafts + 1)
                ]
            )
            draft_inputs.target_logprobs[c.request_id] = lp
            u = draft_inputs.uniforms[r]
            accepted, token = rejection_sample(
                draft_tokens[r, :n_drafts], all_draft_logits[:n_drafts, r], p, u[k : k + n_drafts], u[2 * k]
            )
            first_rejected[r] = accepted
            if accepted == n_drafts:
                bonus[r, 0] = token
            else:
                recovered[r, accepted] = token
        return first_rejected, recovered, bonus

    def update_contexts(
        self,
        context_batch: Sequence[TextContext],
        first_rejected_tokens: np.ndarray,
        recovered_tokens: np.ndarray,
        bonus_tokens: np.ndarray | None,
        draft_tokens: np.ndarray,
        num_draft_tokens_generated: int,
        target_logprobs: Mapping[RequestID, np.ndarray] | None = None,
    ) -> None:
        """Append each row's accepted drafts, then its replacement or bonus token (``ctx.update``: stops apply); update
        `metrics`.

        A row's drafts are its ``draft_tokens`` entries that are not -1. With
        ``target_logprobs`` (per request ``[k_eff + 1, V]``) requests that asked for log
        probabilities get them for every appended token. The draft shadows keep the
        cached prefix that matches the new tokens.
        """
        generated = accepted_total = bonus_used = 0
        lengths = []
        for r, c in enumerate(context_batch):
            n_drafts = int((np.asarray(draft_tokens[r]) >= 0).sum()) if num_draft_tokens_generated else 0
            n = int(first_rejected_tokens[r])
            final = (
                int(bonus_tokens[r, 0]) if (n == n_drafts and bonus_tokens is not None) else int(recovered_tokens[r, n])
            )
            emitted = [int(t) for t in draft_tokens[r, :n]] + [final]
            lp = target_logprobs.get(c.request_id) if target_logprobs else None
            for j, token in enumerate(emitted):
                if c.is_done:
                    break
                c.update(token, self._log_probs(c, lp, j, token))
            if n_drafts:
                generated += n_drafts
                accepted_total += n
                bonus_used += int(n == n_drafts)
                lengths.append(n)
            if c.request_id in self._shadows:
                self._sync_shadow(c)
        self._metrics.update(generated, accepted_total, bonus_used, lengths)

    @staticmethod
    def _log_probs(ctx: TextContext, lp: np.ndarray | None, j: int, token: int) -> LogProbabilities | None:
        if lp is None or not ctx.log_probabilities:
            return None
        row = lp[j]
        top = np.argsort(-row, kind="stable")[: ctx.log_probabilities]
        return LogProbabilities(
            token_log_probabilities=[float(row[token])], top_log_probabilities=[{int(t): float(row[t]) for t in top}]
        )

    def build_response(self, context_batch: Sequence[TextContext]) -> dict[RequestID, TextGenerationOutput]:
        """Each context's tokens since the previous call (a variable number), as `TextGenerationOutput`s by request
        id.
        """
        return {c.request_id: c.to_generation_output() for c in context_batch}

    # ── one call ──
    def execute(self, inputs: TextGenerationInputs) -> dict[RequestID, TextGenerationOutput]:
        """One call: a prefill chunk for contexts encoding their prompt, one speculative round for the others.

        ``inputs.num_steps`` is not used: a call runs one round of
        ``num_speculative_tokens`` drafts (MAX's speculative pipeline also drafts its
        configured number). Returns every context's new tokens.
        """
        given = [c for batch in inputs.batches for c in batch.values()]
        live = [c for c in given if not c.is_done]
        if len(live) > self.runner.max_batch_size:
            raise ValueError(f"{_NAME}.execute: {len(live)} contexts; max_batch_size is {self.runner.max_batch_size}")
        flat, _ = self.prepare_batch(self.runner, given, 1)
        self.last_batch_info = BatchInfo([c.start_idx for c in flat], [c.active_length for c in flat], 1)
        encoding = [c for c in live if c.needs_ce]
        decoding = [c for c in live if not c.needs_ce]
        if encoding:
            self._prefill(encoding)
        if decoding:
            self._speculate(decoding)
        return self.build_response(flat)

    def _prefill(self, contexts: list[TextContext]) -> None:
        shadows = [self._shadow(c) for c in contexts]
        behind = [s for s in shadows if s.active_length > 0]
        results = self.runner.execute(contexts)
        if behind:
            self.draft_runner.execute(behind)  # fills the draft's cache; its token is not used
        for c in contexts:
            out = results[c.request_id]
            if out is not None:
                c.update(out.token, out.log_probabilities)

    def _speculate(self, contexts: list[TextContext]) -> None:
        k = self._num_draft_steps
        draft_inputs, steps = self.prepare_batch(self.draft_runner, contexts, k, 1, is_draft=True)
        steps, draft_tokens, draft_logits, draft_inputs, all_q = self.generate_draft_tokens(
            contexts, steps, draft_inputs
        )
        rows = [
            np.concatenate([[c.tokens[c.end_idx - 1]], draft_tokens[r, : draft_inputs.num_draft_tokens[r]]])
            for r, c in enumerate(contexts)
        ]
        offsets = np.concatenate([[0], np.cumsum([len(x) for x in rows])]).astype(np.int64)
        merged = np.concatenate(rows).astype(np.int64)
        first_rejected, recovered, bonus = self.verify_draft_tokens_with_target_model(
            draft_inputs, contexts, steps, draft_tokens, draft_logits, merged, offsets, all_q
        )
        self.update_contexts(
            contexts, first_rejected, recovered, bonus, draft_tokens, steps, draft_inputs.target_logprobs
        )

    def release(self, request_id: RequestID) -> None:
        """Free the request's pages in both pools and its draft shadow (unknown ids are ignored)."""
        self.runner.release(request_id)
        self.draft_runner.release(request_id)
        self._shadows.pop(request_id, None)

    # ── requests in, outputs out ──
    def _run_to_completion(self, contexts: list[TextContext]) -> list[TextGenerationOutput]:
        waiting = list(contexts)
        live: dict[RequestID, TextContext] = {}
        tokens: dict[RequestID, list[int]] = {c.request_id: [] for c in contexts}
        logprobs: dict[RequestID, list[LogProbabilities]] = {c.request_id: [] for c in contexts}
        final: dict[RequestID, Any] = {}
        while waiting or live:
            while waiting and len(live) < self.runner.max_batch_size:
                c = waiting.pop(0)
                live[c.request_id] = c
            try:
                outs = self.execute(TextGenerationInputs(batches=[dict(live)], num_steps=1))
            except Exception:
                for rid in live:
                    self.release(rid)
                raise
            for rid, out in outs.items():
                tokens[rid] += out.tokens
                logprobs[rid] += list(out.log_probabilities or [])
                if out.is_done:
                    final[rid] = out.final_status
                    self.release(rid)
                    del live[rid]
        return [
            TextGenerationOutput(
                request_id=c.request_id,
                tokens=tokens[c.request_id],
                final_status=final[c.request_id],
                log_probabilities=logprobs[c.request_id] or None,
            )
            for c in contexts
        ]

    async def generate_async(
        self, prompts: TextGenerationRequest | str | Sequence[TextGenerationRequest | str]
    ) -> list[TextGenerationOutput]:
        """Run the requests to completion (``max_batch_size`` at a time); one merged `TextGenerationOutput` per request,
        in order.
        """
        requests = self._requests(prompts)
        contexts = [await self.tokenizer.new_context(r) for r in requests]
        return await asyncio.to_thread(self._run_to_completion, contexts)

    def generate(
        self, prompts: TextGenerationRequest | str | Sequence[TextGenerationRequest | str]
    ) -> list[TextGenerationOutput]:
        """`generate_async` from synchronous code."""
        return asyncio.run(self.generate_async(prompts))

    def __repr__(self) -> str:
        return f"{_NAME}(k={self._num_draft_steps}, {self._metrics})"
