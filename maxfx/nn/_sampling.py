"""Sampling modules (``max.nn.sampling``): `MinPSampler`, `RejectionSampler`, `RejectionSamplerWithResiduals`.

They build sampling graphs from registry ops. Randomness comes either from
tensors the caller passes (``uniforms=``, ``rejection_rand=``,
``residual_rand=``: reproducible, as in tests) or from ``ops.random_uniform``
keyed by the module's ``seed`` (static shapes only).

Speculative decoding layout: ``draft_tokens`` is ``[batch, num_steps]``; the
target model scored ``num_steps + 1`` positions per sequence, stacked as
``target_logits: [total_rows, vocab]`` with ``target_logit_offsets: [batch + 1]``
giving each sequence's first row.

Example:
    >>> from maxfx.nn import MinPSampler
    >>> from maxfx.dtype import DType
    >>> sampler = MinPSampler(DType.float32, [4, 1], temperature=0.7, min_p=0.1)
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from lowering.dims import format_shape
from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import Shape, ops
from maxfx.nn._graph_util import as_value
from maxfx.nn._layer import Module

__all__ = ["MinPSampler", "RejectionSampler", "RejectionSamplerWithResiduals"]


def _static_shape(layer: str, value: Any, what: str) -> list[int]:
    try:
        return [int(d) for d in value.shape]
    except TypeError:
        raise ValueError(
            f"{layer}: drawing random numbers needs a static shape, got {what} {format_shape(value.shape)}; pass them "
            "explicitly"
        ) from None


class _Uniforms:
    """Uniform [0, 1) draws keyed ``(seed, counter)``; each draw in a graph gets a new counter."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._counter = itertools.count()

    def draw(self, shape: list[int], device: DeviceRef) -> Any:
        key = ops.constant(
            np.array([self.seed % 2**32, next(self._counter) % 2**32], np.uint32), DType.uint32, DeviceRef.CPU()
        )
        return ops.random_uniform(key, shape, DType.float32, device)


def _first_true(mask: Any, device: DeviceRef) -> Any:
    """Index of the first True along the last axis of ``mask`` ``[b, n]``, or ``n`` if none: ``[b, 1]`` int64."""
    sentinel = ops.broadcast_to(ops.constant(True, DType.bool, device), [mask.shape[0], 1])
    marked = ops.cast(ops.concat([mask, sentinel], axis=1), DType.int64)
    n = int(marked.shape[1])
    # Earlier positions weigh more, so the argmax is the first marked one (argmax ties are not ordered).
    weights = ops.range(n, 0, -1, dtype=DType.int64, device=device)
    return ops.argmax(marked * weights, axis=-1)


def _per_row(value: Any, dtype: DType, rows: Any, device: DeviceRef) -> Any:
    return ops.broadcast_to(ops.constant(value, dtype, device), [rows])


def _check(layer: str, cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"{layer}: {message}")


# ─── min-p ────────────────────────────────────────────────────────────────


class MinPSampler(Module):
    """A min_p sampler: sample from the tokens whose probability is at least ``min_p`` times the largest.

    ``probs = softmax(logits / temperature)``; tokens with
    ``probs < min_p * max(probs)`` are dropped and one token per row is drawn
    from the rest (renormalized) by inverse CDF. Logits must have dtype
    ``dtype``; the int64 token ids are returned with shape ``shape``
    (e.g. ``[batch, 1]``).

    Example:
        >>> sampler = MinPSampler(DType.float32, [2, 1], min_p=0.05)
        >>> with Graph("s", input_types=[TensorType(DType.float32, [2, 100])]) as g:  # doctest: +SKIP
        ...     g.output(sampler(g.inputs[0].tensor))
    """

    dtype: DType
    shape: Shape
    min_p: float
    temperature: float

    def __init__(self, dtype: DType, shape: Any, temperature: float = 1, min_p: float = 0.0, *, seed: int = 0) -> None:
        super().__init__()
        _check("MinPSampler", 0.0 <= min_p <= 1.0, f"min_p must be in [0, 1], got {min_p!r}")
        _check("MinPSampler", temperature > 0, f"temperature must be > 0, got {temperature!r}")
        self.dtype, self.shape = dtype, Shape(shape)
        self.min_p, self.temperature = float(min_p), float(temperature)
        self.seed = int(seed)
        self._rng = _Uniforms(seed)

    def __call__(self, input: Any, uniforms: Any = None) -> Any:  # noqa: A002 - MAX's name
        """Sample token ids from ``input`` logits ``[batch, vocab]``; ``uniforms`` (``[batch]`` in [0, 1)) fixes the
        draws.
        """
        logits = as_value(input)
        _check(
            "MinPSampler", logits.rank == 2, f"expected [batch, vocab] logits, got shape {format_shape(logits.shape)}"
        )
        _check("MinPSampler", logits.dtype == self.dtype, f"expected {self.dtype.name} logits, got {logits.dtype.name}")
        probs = ops.softmax(ops.cast(logits, DType.float32) / self.temperature)
        kept = ops.where(probs >= ops.max(probs, axis=-1) * self.min_p, probs, 0.0)
        cdf = ops.cumsum(kept, axis=-1)
        if uniforms is None:
            u = self._rng.draw(_static_shape("MinPSampler", logits, "logits")[:1], logits.device)
        else:
            u = ops.cast(as_value(uniforms), DType.float32)
            _check(
                "MinPSampler",
                u.rank == 1 and str(u.shape[0]) == str(logits.shape[0]),
                f"uniforms must be [batch], got {format_shape(u.shape)}",
            )
        # Scaling u by the kept mass (the last cdf entry) avoids normalizing and never lands past it.
        target = ops.unsqueeze(u, 1) * cdf[:, -1:]
        tokens = ops.sum(ops.cast(cdf <= target, DType.int64), axis=-1)  # [batch, 1]
        return ops.reshape(tokens, self.shape)


# ─── rejection sampling for speculative decoding ──────────────────────────


def _check_spec_inputs(layer: str, draft_tokens: Any, target_logits: Any, offsets: Any) -> None:
    _check(
        layer,
        draft_tokens.rank == 2 and draft_tokens.dtype.is_integral(),
        "draft_tokens must be integer [batch, num_steps], got "
        f"{draft_tokens.dtype.name}{format_shape(draft_tokens.shape)}",
    )
    _check(
        layer,
        target_logits.rank == 2,
        f"target_logits must be [total_rows, vocab], got {format_shape(target_logits.shape)}",
    )
    _check(layer, offsets.rank == 1, f"target_logit_offsets must be [batch + 1], got {format_shape(offsets.shape)}")


class RejectionSampler(Module):
    """A simple rejection sampler (greedy-draft verification for speculative decoding).

    Draft token ``s`` of sequence ``b`` is rejected when its draft logit exceeds
    the target logit for the same token (row ``offsets[b] + s``) by more than
    ``eps``. Returns ``(first_rejected [batch, 1], sampled [batch, 1])``: the
    first rejected step (``num_steps`` when all are accepted) and a token
    sampled (top-k/top-p/temperature, ``ops.topk_sampling``) from the target
    logits at that step.

    Example:
        >>> sampler = RejectionSampler(DeviceRef.CPU(), top_k=1)
    """

    def __init__(
        self,
        device: DeviceRef,
        top_k: int = 1,
        top_p: float = 1,
        temperature: float = 1.0,
        seed: int = 0,
        eps: float = 1e-05,
    ) -> None:
        super().__init__()
        _check("RejectionSampler", isinstance(top_k, int) and top_k >= 1, f"top_k must be an int >= 1, got {top_k!r}")
        _check("RejectionSampler", 0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p!r}")
        self.device = device
        self.top_k, self.top_p, self.temperature, self.seed, self.eps = (
            top_k,
            float(top_p),
            float(temperature),
            int(seed),
            float(eps),
        )

    def __call__(
        self, draft_tokens: Any, draft_logits_for_sampled_tokens: Any, target_logits: Any, target_logit_offsets: Any
    ) -> tuple[Any, Any]:
        """Verify ``draft_tokens`` against the target logits; see the class docstring for shapes."""
        layer = "RejectionSampler"
        tokens, draft_logits = as_value(draft_tokens), as_value(draft_logits_for_sampled_tokens)
        logits, offsets = as_value(target_logits), as_value(target_logit_offsets)
        _check_spec_inputs(layer, tokens, logits, offsets)
        _check(
            layer,
            str(draft_logits.shape) == str(tokens.shape),
            f"draft_logits_for_sampled_tokens {format_shape(draft_logits.shape)} must match draft_tokens "
            f"{format_shape(tokens.shape)}",
        )
        steps = int(tokens.shape[1])
        starts = ops.cast(offsets[:-1], DType.int64)  # first target row of each sequence
        rows = ops.unsqueeze(starts, 1) + ops.unsqueeze(ops.range(0, steps, dtype=DType.int64, device=logits.device), 0)
        index = ops.stack([rows, ops.cast(tokens, DType.int64)], axis=-1)  # [batch, steps, 2]
        target_for_draft = ops.gather_nd(logits, index)  # [batch, steps]
        rejected = ops.cast(draft_logits, DType.float32) > ops.cast(target_for_draft, DType.float32) + self.eps
        first = _first_true(rejected, logits.device)  # [batch, 1]
        rejected_rows = ops.gather(logits, starts + ops.squeeze(first, 1), axis=0)
        batch = tokens.shape[0]
        sampled = ops.topk_sampling(
            rejected_rows,
            _per_row(self.top_k, DType.int64, batch, logits.device),
            _per_row(self.temperature, DType.float32, batch, logits.device),
            _per_row(self.top_p, DType.float32, batch, logits.device),
            _per_row(self.seed, DType.int64, batch, logits.device),
            max_k=self.top_k,
        )
        return first, sampled


class RejectionSamplerWithResiduals(Module):
    """A simple rejection sampler: speculative sampling with residual resampling (Leviathan et al.).

    Step ``s`` is accepted with probability ``min(1, p(x) / (q(x) + eps))``
    (``p`` target, ``q`` draft softmax probabilities of the drafted token
    ``x``); on rejection a token is drawn from ``max(p - q, tiny)``
    (renormalized) by the exponential-race trick. Returns
    ``(first_rejected [batch], recovered [batch, num_steps], bonus [batch, 1])``
    where ``bonus`` is sampled (``ops.topk_sampling``) from each sequence's
    last target row. ``debug=True`` prints the acceptance ratios and decisions
    when the graph runs.

    Example:
        >>> sampler = RejectionSamplerWithResiduals(DeviceRef.CPU(), top_k=1)
    """

    def __init__(
        self,
        device: DeviceRef,
        top_k: int = 1,
        temperature: float = 1.0,
        eps: float = 1e-10,
        seed: int = 0,
        debug: bool = False,
    ) -> None:
        super().__init__()
        _check(
            "RejectionSamplerWithResiduals",
            isinstance(top_k, int) and top_k >= 1,
            f"top_k must be an int >= 1, got {top_k!r}",
        )
        self.device = device
        self.top_k, self.temperature, self.eps, self.seed, self.debug = (
            top_k,
            float(temperature),
            float(eps),
            int(seed),
            bool(debug),
        )
        self._rng = _Uniforms(seed)

    def _probs(self, layer: str, logits: Any, all_draft_logits: Any, batch: Any, steps: int) -> tuple[Any, Any]:
        vocab = logits.shape[1]
        _check(
            layer,
            all_draft_logits.rank == 3,
            f"all_draft_logits must be [num_steps, batch, vocab], got {format_shape(all_draft_logits.shape)}",
        )
        per_seq = ops.reshape(ops.cast(logits, DType.float32), [batch, steps + 1, vocab])
        target = ops.softmax(per_seq[:, :steps, :])
        draft = ops.softmax(ops.permute(ops.cast(all_draft_logits, DType.float32), [1, 0, 2]))
        return target, draft

    def _rand(self, layer: str, given: Any, like: Any, what: str) -> Any:
        if given is None:
            return self._rng.draw(_static_shape(layer, like, what), like.device)
        r = ops.cast(as_value(given), DType.float32)
        _check(
            layer,
            str(r.shape) == str(like.shape),
            f"{what} must have shape {format_shape(like.shape)}, got {format_shape(r.shape)}",
        )
        return r

    def __call__(
        self,
        draft_tokens: Any,
        draft_logits_for_sampled_tokens: Any,
        target_logits: Any,
        target_logit_offsets: Any,
        all_draft_logits: Any,
        rejection_rand: Any = None,
        residual_rand: Any = None,
    ) -> tuple[Any, Any, Any]:
        """Accept/reject the drafts; ``target_logits`` holds ``num_steps + 1`` rows per sequence."""
        layer = "RejectionSamplerWithResiduals"
        tokens, logits, offsets = as_value(draft_tokens), as_value(target_logits), as_value(target_logit_offsets)
        _check_spec_inputs(layer, tokens, logits, offsets)
        batch, steps, dev = tokens.shape[0], int(tokens.shape[1]), logits.device
        target, draft = self._probs(layer, logits, as_value(all_draft_logits), batch, steps)
        b_idx = ops.broadcast_to(ops.unsqueeze(ops.range(0, batch, dtype=DType.int64, device=dev), 1), [batch, steps])
        s_idx = ops.broadcast_to(ops.unsqueeze(ops.range(0, steps, dtype=DType.int64, device=dev), 0), [batch, steps])
        index = ops.stack([b_idx, s_idx, ops.cast(tokens, DType.int64)], axis=-1)
        ratio = ops.gather_nd(target, index) / (ops.gather_nd(draft, index) + self.eps)
        u = self._rand(layer, rejection_rand, ratio, "rejection_rand")
        rejected = u >= ops.min(ratio, 1.0)
        if self.debug:
            ops.print(ratio, label="rejection_sampler.ratio")
            ops.print(ops.cast(rejected, DType.int32), label="rejection_sampler.rejected")
        first = ops.squeeze(_first_true(rejected, dev), 1)
        residual = ops.max(target - draft, float(np.finfo(np.float32).tiny))
        residual = residual / ops.sum(residual, axis=-1)
        # Exponential race: argmax(p / E) with E ~ Exp(1) is a draw from p.
        r = self._rand(layer, residual_rand, residual, "residual_rand")
        exp_noise = -ops.log(ops.max(r, float(np.finfo(np.float32).eps)))
        recovered = ops.squeeze(ops.argmax(residual / exp_noise, axis=-1), -1)
        bonus_rows = ops.gather(logits, ops.cast(offsets[1:], DType.int64) - 1, axis=0)
        bonus = ops.topk_sampling(
            bonus_rows,
            _per_row(self.top_k, DType.int64, batch, dev),
            _per_row(self.temperature, DType.float32, batch, dev),
            _per_row(1.0, DType.float32, batch, dev),
            _per_row(self.seed, DType.int64, batch, dev),
            max_k=self.top_k,
        )
        return first, recovered, bonus
