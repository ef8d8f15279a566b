"""``max.pipelines.lib.sampling.sampling``: the sampling graphs of MAX's pipelines.

- `token_sampler`: one decode step's sampler, built from a `SamplingConfig`
  (penalties, ``min_tokens`` masks, structured-output bitmasks, ragged logits are
  graph inputs only when the config switches them on), then fused top-k / top-p /
  temperature sampling (`maxfx.nn.kernels.topk_fused_sampling`).
- `rejection_sampler`: speculative decoding's greedy verification of draft tokens.
- `rejection_sampler_with_residuals`: speculative sampling (accept with
  probability ``min(1, p / q)``, resample from the residual ``max(p - q, 0)``,
  plus a bonus token).

The graphs take MAX's inputs in MAX's order, with symbolic batch, step and
vocabulary dims; compile them with ``InferenceSession().load(graph)``. They are
built from maxfx graph ops and the sampling kernels of `maxfx.nn.kernels`; the
two rejection samplers compute what `maxfx.nn.RejectionSampler` and
`maxfx.nn.RejectionSamplerWithResiduals` compute, with every shape symbolic.

Example:
    >>> import numpy as np
    >>> from maxfx.driver import Tensor
    >>> from maxfx.engine import InferenceSession
    >>> from maxfx.graph import DeviceRef
    >>> from maxfx.pipelines import SamplingConfig
    >>> model = InferenceSession().load(token_sampler(SamplingConfig(), DeviceRef.CPU()))
    >>> logits = Tensor.from_numpy(np.array([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]], np.float32))  # a buffer input
    >>> tokens, all_tokens, seed = model.execute(
    ...     logits, np.zeros((2, 0), np.int64), np.array([1, 1]), np.array(1), np.ones(2, np.float32),
    ...     np.ones(2, np.float32), np.array(1.0, np.float32), np.zeros(2, np.uint64))
    >>> tokens.to_numpy().tolist(), seed.to_numpy().tolist()
    ([1, 0], [1, 1])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.types import BufferType, DeviceRef, TensorType
from maxfx.graph import Graph, TensorValue, ops
from maxfx.nn.kernels import topk_fused_sampling, update_frequency_data

__all__ = ["DEFAULT_MAX_K", "rejection_sampler", "rejection_sampler_with_residuals", "token_sampler"]

DEFAULT_MAX_K = 256
"""Static bound of `token_sampler`'s top-k when ``max_k`` is not given: rows asking for more
tokens (or for the whole vocabulary, ``top_k <= 0``) sample from the best ``DEFAULT_MAX_K``."""

# The fill MAX writes into masked logits (min_tokens masks, structured-output bitmasks).
_MASKED_LOGIT = -10000.0
_BIG_INDEX = 2**62


def _sampling_input_types(
    sampling_config: Any, return_logits: bool, device: DeviceRef
) -> dict[str, TensorType | BufferType]:
    """The sampler's inputs, by name, in MAX's order (the config decides which optional ones exist)."""
    inputs: dict[str, TensorType | BufferType] = {}
    rows = "total_output_len" if sampling_config.enable_variable_logits else "batch"
    inputs["logits"] = BufferType(sampling_config.in_dtype, [rows, "vocab_size"], device)
    inputs["prev_tokens"] = TensorType(DType.int64, ["batch", "num_prev_steps"], device)
    inputs["top_k"] = TensorType(DType.int64, ["batch"], device)
    inputs["max_k"] = TensorType(DType.int64, [], DeviceRef.CPU())
    inputs["temperature"] = TensorType(DType.float32, ["batch"], device)
    inputs["top_p"] = TensorType(DType.float32, ["batch"], device)
    inputs["min_top_p"] = TensorType(DType.float32, [], DeviceRef.CPU())
    inputs["seed"] = TensorType(DType.uint64, ["batch"], device)
    if return_logits:
        inputs["existing_logits"] = TensorType(DType.float32, ["batch", "num_prev_steps"], device)
    if sampling_config.enable_variable_logits:
        inputs["logit_offsets"] = TensorType(DType.uint32, ["logit_offsets_len"], device)
    if sampling_config.enable_structured_output:
        # Its own vocabulary dim: llguidance pads bitmasks to a multiple of 32 tokens.
        inputs["bitmask"] = TensorType(DType.bool, ["batch", "vocab_size_structured"], device)
    if sampling_config.enable_penalties:
        inputs["penalty_freq_data"] = BufferType(DType.int32, ["unique_tokens", 2], device)
        inputs["penalty_freq_offsets"] = TensorType(DType.uint32, ["batch_add_1"], device)
        inputs["repetition_freq_data"] = BufferType(DType.int32, ["unique_tokens_2", 2], device)
        inputs["repetition_freq_offsets"] = TensorType(DType.uint32, ["batch_add_1"], device)
        for name in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
            inputs[name] = TensorType(DType.float32, ["batch"], device)
    if sampling_config.enable_min_tokens:
        inputs["min_tokens_mask"] = TensorType(DType.int32, ["num_token_masks", 2], device)
    return inputs


def _check_device(fn: str, device: Any) -> DeviceRef:
    if not isinstance(device, DeviceRef):
        raise TypeError(
            f"{fn}: device must be a DeviceRef (e.g. DeviceRef.CPU() or DeviceRef.from_device(dev)), got "
            f"{type(device).__name__}"
        )
    return device


def token_sampler(
    sampling_config: Any, device: DeviceRef, return_logits: bool = False, *, max_k: int | None = None
) -> Graph:
    """The graph of one sampling step, as MAX's ``token_sampler``.

    Inputs, in order (the optional ones only when ``sampling_config`` enables them):
    ``logits`` (a buffer ``[batch, vocab]``, or ``[total_output_len, vocab]`` with
    ``enable_variable_logits``), ``prev_tokens [batch, n]`` int64, ``top_k [batch]``
    int64 (``<= 0``: the whole vocabulary), ``max_k`` (host int64 scalar, the batch's
    largest ``top_k``; accepted, the static ``max_k`` below bounds k), ``temperature
    [batch]`` (0: greedy), ``top_p [batch]``, ``min_top_p`` (host float32 scalar, the
    batch's smallest ``top_p``), ``seed [batch]`` uint64; then ``existing_logits
    [batch, n]`` (``return_logits``), ``logit_offsets [batch + 1]`` uint32
    (``enable_variable_logits``: each sequence samples from its last row),
    ``bitmask [batch, vocab']`` bool (``enable_structured_output``: False masks a
    token), the penalty frequency buffers, offsets and per-row
    frequency/presence/repetition penalties (``enable_penalties``; the repetition
    penalty is applied first, and both frequency buffers count the sampled token),
    and ``min_tokens_mask [n, 2]`` (row, token) pairs to mask (``enable_min_tokens``).

    Outputs: ``tokens [batch]`` int64, ``all_tokens = prev_tokens + [tokens]``, with
    ``return_logits`` the logits of the sampled tokens appended to
    ``existing_logits``, and ``seed + 1``.

    Args:
        sampling_config: the `SamplingConfig` whose switches shape the graph.
        device: where the logits live.
        return_logits: also output the sampled tokens' logits.
        max_k: static bound on top-k (maxfx: the fused sampler needs k at build time);
            default `DEFAULT_MAX_K`. Pass the vocabulary size to sample rows asking for
            every token exactly. It may exceed the vocabulary.

    Raises:
        TypeError: ``device`` is not a `DeviceRef`.
        ValueError: ``max_k`` is not a positive int.
    """
    device = _check_device("token_sampler", device)
    bound = DEFAULT_MAX_K if max_k is None else max_k
    if isinstance(bound, bool) or not isinstance(bound, (int, np.integer)) or bound < 1:
        raise ValueError(f"token_sampler: max_k must be a positive int (a static bound on top_k), got {max_k!r}")
    bound = int(bound)
    types = _sampling_input_types(sampling_config, return_logits, device)
    names = list(types)
    with Graph("top_k_sampler", input_types=list(types.values())) as graph:
        inputs = dict(zip(names, graph.inputs))
        if sampling_config.enable_penalties:
            # MAX names the offsets' dim batch_add_1; maxfx's penalty ops check that it is batch + 1.
            batch_plus_1 = inputs["prev_tokens"].tensor.shape[0] + 1
            for name in ("penalty_freq_offsets", "repetition_freq_offsets"):
                inputs[name] = ops.rebind(inputs[name].tensor, [batch_plus_1])
        logits_buffer = inputs["logits"].buffer
        logits = ops.buffer_load(logits_buffer)
        if sampling_config.enable_variable_logits:
            # Ragged logits: each sequence samples from its last row.
            offsets = ops.cast(inputs["logit_offsets"].tensor, DType.int64)
            logits = ops.rebind(ops.gather(logits, offsets[1:] - 1, 0), ["batch", "vocab_size"])
        logits = _penalize_rows(sampling_config, inputs, logits, device)
        if not sampling_config.enable_variable_logits and (
            sampling_config.enable_penalties or sampling_config.enable_min_tokens
        ):
            ops.buffer_store(logits_buffer, logits)  # as MAX, which penalizes the logits buffer in place
        logits = ops.cast(logits, sampling_config.out_dtype)
        if sampling_config.enable_structured_output:
            bitmask = inputs["bitmask"].tensor
            bitmask = ops.rebind(bitmask[:, : logits.shape[1]], list(logits.shape))
            logits = ops.where(bitmask, logits, ops.constant(_MASKED_LOGIT, logits.dtype, device))
        top_k = inputs["top_k"].tensor
        # top_k <= 0 asks for the whole vocabulary: the most the graph was built to consider.
        top_k = ops.where(
            top_k <= ops.constant(0, DType.int64, device),
            ops.broadcast_to(ops.constant(bound, DType.int64, device), list(top_k.shape)),
            top_k,
        )
        # Padding with -inf columns lets the static bound exceed the vocabulary.
        pad = ops.broadcast_to(ops.constant(float("-inf"), logits.dtype, device), [logits.shape[0], bound])
        padded = ops.concat([logits, pad], axis=1)
        seed = inputs["seed"].tensor
        tokens = topk_fused_sampling(
            padded,
            top_k,
            max_k=bound,
            temperature=inputs["temperature"].tensor,
            top_p=inputs["top_p"].tensor,
            min_top_p=ops.cast(inputs["min_top_p"].tensor, DType.float32),
            seed=seed,
        )
        if sampling_config.enable_penalties:
            sampled = ops.squeeze(tokens, 1)
            update_frequency_data(inputs["penalty_freq_data"].buffer, inputs["penalty_freq_offsets"], sampled)
            update_frequency_data(inputs["repetition_freq_data"].buffer, inputs["repetition_freq_offsets"], sampled)
        all_tokens = ops.concat([inputs["prev_tokens"].tensor, tokens], -1)
        next_seed = seed + ops.constant(1, DType.uint64, device)
        if return_logits:
            batch = tokens.shape[0]
            rows = ops.unsqueeze(ops.range(0, batch, 1, out_dim=batch, dtype=DType.int64, device=device), 1)
            new_logits = ops.reshape(ops.gather_nd(logits, ops.concat([rows, tokens], axis=1)), list(tokens.shape))
            all_logits = ops.concat([inputs["existing_logits"].tensor, ops.cast(new_logits, DType.float32)], -1)
            graph.output(ops.squeeze(tokens, -1), all_tokens, all_logits, next_seed)
        else:
            graph.output(ops.squeeze(tokens, -1), all_tokens, next_seed)
    return graph


def _dim_scalar(dim: Any, device: DeviceRef) -> Any:
    """A (static or symbolic) dim as an int64 scalar on ``device``."""
    value = TensorValue(dim)
    return value if value.device == device else ops.transfer_to(value, device)


def _apply_row_penalties(
    logits: Any,
    frequency_data: Any,
    frequency_offsets: Any,
    frequency: Any,
    presence: Any,
    repetition: Any,
    device: DeviceRef,
) -> Any:
    """MAX's penalty kernel with per-row penalties ``[batch]``: for each ``(token, count)`` of sequence b's slice.

    ``l = l / repetition[b] if l > 0 else l * repetition[b]``, then
    ``l -= frequency[b] * count + presence[b]``; token ids < 0 are empty slots.
    """
    batch, vocab = logits.shape[0], logits.shape[1]
    entries = frequency_data.shape[0]
    offsets = ops.cast(frequency_offsets, DType.int64)
    tokens = ops.cast(frequency_data[:, 0], DType.int64)
    counts = ops.cast(frequency_data[:, 1], DType.float32)
    position = _arange(entries, device)
    # Sequence of each entry: how many sequences end at or before it.
    row = ops.squeeze(
        ops.sum(ops.cast(ops.unsqueeze(offsets[1:], 0) <= ops.unsqueeze(position, 1), DType.int64), axis=-1), -1
    )
    zero_i = ops.constant(0, DType.int64, device)
    valid = (
        (position < offsets[-1])
        & (tokens >= zero_i)
        & (tokens < _dim_scalar(vocab, device))
        & (counts > ops.constant(0.0, DType.float32, device))
    )
    r, c = ops.where(valid, row, zero_i), ops.where(valid, tokens, zero_i)
    index = ops.stack([r, c], axis=-1)
    old = ops.cast(ops.gather_nd(logits, index), DType.float32)
    rep, freq, pres = (ops.gather(ops.cast(v, DType.float32), r, 0) for v in (repetition, frequency, presence))
    new = ops.where(old > ops.constant(0.0, DType.float32, device), old / rep, old * rep) - freq * counts - pres
    delta = ops.where(valid, new - old, ops.constant(0.0, DType.float32, device))
    zeros = ops.broadcast_to(ops.constant(0.0, DType.float32, device), [batch, vocab])
    return logits + ops.cast(ops.scatter_nd_add(zeros, delta, index), logits.dtype)


def _penalize_rows(sampling_config: Any, inputs: dict[str, Any], logits: Any, device: DeviceRef) -> Any:
    """The repetition penalty, then frequency/presence penalties, then the min_tokens mask, on ``logits [batch,
    vocab]``.
    """
    if sampling_config.enable_penalties:
        rows = logits.shape[0]
        zero = ops.broadcast_to(ops.constant(0.0, DType.float32, device), [rows])
        one = ops.broadcast_to(ops.constant(1.0, DType.float32, device), [rows])
        repetition_data = ops.buffer_load(inputs["repetition_freq_data"].buffer)
        logits = _apply_row_penalties(
            logits,
            repetition_data,
            inputs["repetition_freq_offsets"],
            zero,
            zero,
            inputs["repetition_penalty"].tensor,
            device,
        )
        penalty_data = ops.buffer_load(inputs["penalty_freq_data"].buffer)
        logits = _apply_row_penalties(
            logits,
            penalty_data,
            inputs["penalty_freq_offsets"],
            inputs["frequency_penalty"].tensor,
            inputs["presence_penalty"].tensor,
            one,
            device,
        )
    if sampling_config.enable_min_tokens:
        mask = ops.cast(inputs["min_tokens_mask"].tensor, DType.int64)
        fill = ops.broadcast_to(ops.constant(_MASKED_LOGIT, logits.dtype, device), [mask.shape[0]])
        logits = ops.scatter_nd(logits, fill, mask)
    return logits


# ─── speculative decoding ─────────────────────────────────────────────────────


def _spec_input_types(device: DeviceRef) -> list[TensorType]:
    return [
        TensorType(DType.int64, ["batch_size", "num_steps"], device),  # draft tokens
        TensorType(DType.float32, ["batch_size", "num_steps"], device),  # draft logits of the drafted tokens
        TensorType(
            DType.float32, ["total_output_len", "vocab_size"], device
        ),  # target logits, num_steps + 1 rows per sequence
        TensorType(DType.int64, ["logit_offsets_len"], device),  # first target row of each sequence (+ the end)
    ]


def _arange(n: Any, device: DeviceRef) -> Any:
    return ops.range(0, n, 1, out_dim=n, dtype=DType.int64, device=device)


def _step_rows(offsets: Any, steps: Any, device: DeviceRef) -> Any:
    """``[batch, steps]`` target rows: ``offsets[b] + s``."""
    return ops.unsqueeze(ops.cast(offsets[:-1], DType.int64), 1) + ops.unsqueeze(_arange(steps, device), 0)


def _first_true(mask: Any, device: DeviceRef) -> Any:
    """Per row of ``mask [batch, n]``: the first True position, or ``n`` when none (int64 ``[batch]``)."""
    batch = mask.shape[0]
    sentinel = ops.broadcast_to(ops.constant(True, DType.bool, device), [batch, 1])
    marked = ops.concat([mask, sentinel], axis=1)  # [batch, n + 1]: position n is always True
    width = marked.shape[1]
    positions = ops.broadcast_to(ops.unsqueeze(_arange(width, device), 0), [batch, width])
    return ops.squeeze(
        ops.min(ops.where(marked, positions, ops.constant(_BIG_INDEX, DType.int64, device)), axis=-1), -1
    )


def _greedy_rows(rows: Any, device: DeviceRef, seed: int) -> Any:
    """``topk_fused_sampling`` with top_k 1 (greedy), as MAX's samplers draw replacement and bonus tokens: ``[batch,
    1]``.
    """
    return topk_fused_sampling(rows, 1, temperature=1.0, top_p=1.0, seed=seed)


def rejection_sampler(device: DeviceRef, *, seed: int = 0) -> Graph:
    """The graph of speculative decoding's greedy verification, as MAX's ``rejection_sampler``.

    Inputs: ``draft_tokens [batch, num_steps]`` int64, ``draft_logits [batch,
    num_steps]`` (the draft model's logit of each drafted token), ``target_logits
    [total_output_len, vocab]`` (``num_steps + 1`` rows per sequence) and
    ``target_logit_offsets [batch + 1]`` int64 (each sequence's first row).

    Draft step ``s`` of sequence ``b`` is rejected when its draft logit exceeds the
    target logit of the same token (row ``offsets[b] + s``) by more than 1e-5.
    Outputs ``first_rejected [batch, 1]`` (``num_steps`` when every draft is
    accepted) and ``sampled [batch, 1]``: the target's best token at that step (the
    correction, or the bonus token after the last draft).

    Args:
        device: where the inputs live.
        seed: seed of the replacement draw (greedy, so it does not change the result).

    Raises:
        TypeError: ``device`` is not a `DeviceRef`.
    """
    device = _check_device("rejection_sampler", device)
    with Graph("rejection_sampler", input_types=_spec_input_types(device)) as graph:
        draft_tokens, draft_logits, target_logits, offsets = (v.tensor for v in graph.inputs)
        offsets = ops.rebind(offsets, [draft_tokens.shape[0] + 1])
        steps = draft_tokens.shape[1]
        rows = _step_rows(offsets, steps, device)
        target_for_draft = ops.gather_nd(target_logits, ops.stack([rows, draft_tokens], axis=-1))
        rejected = draft_logits > target_for_draft + ops.constant(1e-05, DType.float32, device)
        first = _first_true(rejected, device)
        chosen_rows = ops.gather(target_logits, ops.cast(offsets[:-1], DType.int64) + first, 0)
        graph.output(ops.unsqueeze(first, 1), _greedy_rows(chosen_rows, device, seed))
    return graph


def rejection_sampler_with_residuals(device: DeviceRef, *, seed: int = 0, debug: bool = False) -> Graph:
    """The graph of speculative sampling with residual resampling, as MAX's ``rejection_sampler_with_residuals``.

    Inputs: as `rejection_sampler`, then ``all_draft_logits [num_steps, batch,
    vocab]``; with ``debug`` also the random numbers ``rejection_rand [batch,
    num_steps]`` and ``residual_rand [batch, num_steps, vocab]`` (uniform in [0, 1)),
    which otherwise come from ``ops.random`` seeded with ``seed``.

    With ``p`` the target's and ``q`` the draft's softmax, draft token ``x`` at step
    ``s`` is accepted when ``u < min(1, p(x) / (q(x) + 1e-10))``. Outputs
    ``first_rejected [batch]`` (``num_steps`` when all are accepted), ``recovered
    [batch, num_steps]`` (per step, a draw from ``max(p - q, tiny)`` renormalized,
    by the exponential race ``argmax(residual / -log(r))``) and ``bonus [batch, 1]``
    (the target's best token after the last draft).

    Args:
        device: where the inputs live.
        seed: seed of the graph's random draws.
        debug: take the random numbers as inputs instead of drawing them (reproducible tests).

    Raises:
        TypeError: ``device`` is not a `DeviceRef`.
    """
    device = _check_device("rejection_sampler_with_residuals", device)
    input_types = [
        *_spec_input_types(device),
        TensorType(DType.float32, ["num_steps", "batch_size", "vocab_size"], device),
    ]
    if debug:
        input_types += [
            TensorType(DType.float32, ["batch_size", "num_steps"], device),
            TensorType(DType.float32, ["batch_size", "num_steps", "vocab_size"], device),
        ]
    with Graph("rejection_sampler_with_residuals", input_types=input_types) as graph:
        values = [v.tensor for v in graph.inputs]
        draft_tokens, _draft_logits, target_logits, offsets, all_draft_logits = values[:5]
        batch, steps = draft_tokens.shape[0], draft_tokens.shape[1]
        offsets = ops.rebind(offsets, [batch + 1])
        target = ops.softmax(ops.gather(target_logits, _step_rows(offsets, steps, device), 0))  # [batch, steps, vocab]
        draft = ops.softmax(ops.permute(all_draft_logits, [1, 0, 2]))
        b_idx = ops.broadcast_to(ops.unsqueeze(_arange(batch, device), 1), [batch, steps])
        s_idx = ops.broadcast_to(ops.unsqueeze(_arange(steps, device), 0), [batch, steps])
        index = ops.stack([b_idx, s_idx, draft_tokens], axis=-1)
        ratio = ops.gather_nd(target, index) / (
            ops.gather_nd(draft, index) + ops.constant(1e-10, DType.float32, device)
        )
        residual = ops.max(target - draft, ops.constant(float(np.finfo(np.float32).tiny), DType.float32, device))
        residual = residual / ops.sum(residual, axis=-1)
        if debug:
            rejection_rand, residual_rand = values[5], values[6]
            ops.print(ratio, label="rejection_sampler.ratio")
        else:
            ops.random.set_seed(int(seed) % 2**64)
            rejection_rand = ops.random.uniform(TensorType(DType.float32, list(ratio.shape), device))
            residual_rand = ops.random.uniform(TensorType(DType.float32, list(residual.shape), device))
        rejected = rejection_rand >= ops.min(ratio, ops.constant(1.0, DType.float32, device))
        if debug:
            ops.print(ops.cast(rejected, DType.int32), label="rejection_sampler.rejected")
        first = _first_true(rejected, device)
        race = -ops.log(ops.max(residual_rand, ops.constant(float(np.finfo(np.float32).eps), DType.float32, device)))
        recovered = ops.squeeze(ops.argmax(residual / race, axis=-1), -1)
        bonus_rows = ops.gather(target_logits, ops.cast(offsets[1:], DType.int64) - 1, 0)
        graph.output(first, recovered, _greedy_rows(bonus_rows, device, seed))
    return graph
