"""Sampling kernels of ``max.nn.kernels``: fused top-k/top-p sampling and repetition penalties.

``frequency_data [unique_tokens, 2]`` holds ``(token id, count)`` rows, sequence
b owning rows ``[frequency_offsets[b], frequency_offsets[b+1])``; a token id < 0
marks a free slot. MAX's penalty kernels write buffers in place; here they load
the buffer, apply a registry op and store the result back.

Example:
    >>> from maxfx.nn import kernels
    >>> callable(kernels.topk_fused_sampling)
    True
"""

from __future__ import annotations

import numbers
from typing import Any

from lowering.dtypes import DType
from lowering.ops.sampling_kernels import per_row
from maxfx.graph import ops

__all__ = ["topk_fused_sampling", "apply_penalties_to_logits", "update_frequency_data"]


def _is_value(x: Any) -> bool:
    return getattr(x, "type", None) is not None


def _per_row(x: Any, dtype: DType, logits: Any) -> Any:
    """A ``[batch]`` tensor of ``dtype`` from a Python scalar or a scalar/``[batch]`` tensor."""
    if not _is_value(x):
        x = ops.constant(x, dtype, logits.device)
    return per_row(x, dtype, logits.shape[0])


def _check_scalar(name: str, value: Any, ok: bool, expected: str) -> None:
    if not ok:
        raise ValueError(f"topk_fused_sampling: expected {name} {expected}, got {value!r}")


def topk_fused_sampling(
    logits: Any,
    top_k: Any,
    *,
    temperature: Any = 1.0,
    max_k: Any = None,
    min_top_p: Any = None,
    top_p: Any = 1.0,
    seed: Any = 0,
) -> Any:
    """Sample a token per row of ``logits [batch, vocab]`` from its top ``top_k`` after ``/ temperature``.

    ``top_k``, ``temperature``, ``top_p`` and ``seed`` are scalars or ``[batch]``
    tensors; ``max_k`` (required for a tensor ``top_k``) bounds k statically;
    ``top_p < 1`` keeps the smallest prefix of the sorted candidates holding
    that probability mass. ``top_k == 1`` (or temperature 0) is greedy.
    ``min_top_p``, the batch's smallest ``top_p`` when known, lets the kernel
    skip the nucleus step when it is 1. Returns int64 ``[batch, 1]``.

    Raises:
        ValueError: non-positive ``top_k``/``max_k``, negative temperature,
            ``top_p`` outside (0, 1], or a tensor ``top_k`` without ``max_k``.

    Example:
        >>> tokens = topk_fused_sampling(logits, 50, temperature=0.7, top_p=0.9, seed=1)  # doctest: +SKIP
    """
    if _is_value(top_k):
        if max_k is None:
            raise ValueError("topk_fused_sampling: max_k is required when top_k is a tensor")
    else:
        _check_scalar("top_k", top_k, isinstance(top_k, numbers.Integral) and top_k > 0, "to be a positive int")
        max_k = top_k if max_k is None else max_k
    _check_scalar("max_k", max_k, isinstance(max_k, numbers.Integral) and max_k > 0, "to be a positive int")
    if not _is_value(temperature):
        _check_scalar("temperature", temperature, temperature >= 0, "to be >= 0 (0 = greedy)")
    if not _is_value(top_p):
        _check_scalar("top_p", top_p, 0 < top_p <= 1, "to be in (0, 1]")
    if min_top_p is not None and not _is_value(min_top_p):
        _check_scalar("min_top_p", min_top_p, 0 < min_top_p <= 1, "to be in (0, 1]")
    known_p = min_top_p if min_top_p is not None else top_p
    use_top_p = _is_value(known_p) or known_p < 1
    args = [
        _per_row(v, dt, logits)
        for v, dt in ((top_k, DType.int64), (temperature, DType.float32), (top_p, DType.float32), (seed, DType.uint64))
    ]
    return ops.topk_sampling(logits, *args, max_k=int(max_k), use_top_p=use_top_p)


def _scalar_f32(x: Any, device: Any) -> Any:
    if _is_value(x):
        return x.cast(DType.float32) if x.dtype is not DType.float32 else x
    return ops.constant(float(x), DType.float32, device)


def _require_buffer(kernel: str, buf: Any, name: str) -> None:
    if not hasattr(buf, "type") or type(buf.type).__name__ != "BufferType":
        raise TypeError(f"{kernel}: {name} must be a BufferValue, got {type(buf).__name__}")
    if buf.rank != 2:
        raise ValueError(f"{kernel}: {name} must be a 2d buffer, got {buf.type}")


def apply_penalties_to_logits(
    logits_buffer: Any,
    frequency_data: Any,
    frequency_offsets: Any,
    *,
    frequency_penalty: Any = 0.0,
    presence_penalty: Any = 0.0,
    repetition_penalty: Any = 1.0,
) -> None:
    """Penalize, in ``logits_buffer [batch, vocab]``, the tokens each sequence has produced.

    For each ``(token, count)`` of sequence b: ``l = l / repetition_penalty`` if
    ``l > 0`` else ``l * repetition_penalty``, then ``l -= frequency_penalty *
    count + presence_penalty``.

    Example:
        >>> apply_penalties_to_logits(buf, fd, fo, frequency_penalty=0.5)  # doctest: +SKIP
    """
    kernel = "apply_penalties_to_logits"
    _require_buffer(kernel, logits_buffer, "logits_buffer")
    dev = logits_buffer.device
    pens = [_scalar_f32(p, dev) for p in (frequency_penalty, presence_penalty, repetition_penalty)]
    ops.buffer_store(
        logits_buffer, ops.apply_penalties(ops.buffer_load(logits_buffer), frequency_data, frequency_offsets, *pens)
    )


def update_frequency_data(frequency_data: Any, frequency_offsets: Any, tokens: Any) -> None:
    """Count each sequence's newly sampled token in the ``frequency_data`` buffer.

    A token already present gets ``count + 1``; a new one takes the sequence's
    first free slot with count 1 (dropped when none is free).

    Example:
        >>> update_frequency_data(fd_buf, fo, new_tokens)  # doctest: +SKIP
    """
    _require_buffer("update_frequency_data", frequency_data, "frequency_data")
    ops.buffer_store(
        frequency_data, ops.update_frequency_data(ops.buffer_load(frequency_data), frequency_offsets, tokens)
    )
