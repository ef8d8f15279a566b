"""``max.pipelines.lib.log_probabilities``: top-k log probabilities over a ragged batch.

`log_probabilities_ragged_graph` builds the graph (MAX's inputs and outputs, from
maxfx graph ops); `compute_log_probabilities_ragged` runs a compiled one and turns
its rows into `~maxfx.interfaces.LogProbabilities`, one per request.

What a row is: the log-softmax of one row of logits, its ``2**levels - 1`` best
tokens, and the log probability of the token that followed. Without echo a request
has one row (its next-token logits, scored against the sampled token). With echo it
has one row per input token: logits row ``j`` is scored against input token
``j + 1``, the last row against the sampled token (the first input token, which no
logits predict, gets no row).

Example:
    >>> import numpy as np
    >>> from maxfx.driver import CPU
    >>> from maxfx.engine import InferenceSession
    >>> from maxfx.graph import DeviceRef
    >>> model = InferenceSession().load(log_probabilities_ragged_graph(DeviceRef.CPU(), levels=3))
    >>> logits = np.log(np.array([[0.5, 0.25, 0.25]], np.float32))
    >>> [lp] = compute_log_probabilities_ragged(CPU(), model, input_row_offsets=np.array([0, 2]), logits=None,
    ...     next_token_logits=logits, tokens=np.array([1,
    ...     2]), sampled_tokens=np.array([0]), batch_top_n=[1], batch_echo=[False])
    >>> [round(v, 4) for v in lp.token_log_probabilities], {k: round(v, 4) for k,
    ...     v in lp.top_log_probabilities[0].items()}
    ([-0.6931], {0: -0.6931})
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.types import DeviceRef, TensorType
from maxfx.driver import Tensor
from maxfx.graph import Graph, TensorValue, ops
from maxfx.interfaces import LogProbabilities

__all__ = ["compute_log_probabilities_ragged", "log_probabilities_ragged_graph", "log_softmax"]

_LOGIT = DType.float32
_TOKEN = DType.uint32
_OFFSET = DType.uint32


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable log-softmax of a numpy array (host code, float32 or wider).

    Example:
        >>> np.round(log_softmax(np.log(np.array([0.5, 0.25, 0.25]))), 4).tolist()
        [-0.6931, -1.3863, -1.3863]
    """
    x = np.asarray(x)
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def log_probabilities_ragged_graph(device: DeviceRef, *, levels: int) -> Graph:
    """The graph `compute_log_probabilities_ragged` runs, as MAX's.

    Inputs: ``logits [rows, vocab]`` float32, ``tokens [total_tokens]``,
    ``sampled_tokens [batch]``, ``logit_row_offsets``, ``token_row_offsets`` and
    ``lp_output_offsets`` (``[batch + 1]`` each, uint32), and ``lp_output_offsets``
    again on the host. Outputs ``lp_logits`` float32 and ``lp_tokens`` uint32, both
    ``[lp_output_offsets[-1], 2**levels]``: per output row the ``2**levels - 1``
    best log probabilities and their tokens (token id ``vocab`` where the
    vocabulary has fewer tokens), then the scored token's. The number of output rows
    is data-dependent, so the compiled graph runs op by op.

    Args:
        device: where the logits live.
        levels: ``log2(max_k + 1)`` for the largest top-k to support; 3 covers
            OpenAI's maximum of 5. ``levels <= 0`` gives only the scored token.

    Raises:
        TypeError: ``device`` is not a `DeviceRef`.
        ValueError: ``levels`` is not an int, or above 16.
    """
    if not isinstance(device, DeviceRef):
        raise TypeError(f"log_probabilities_ragged_graph: device must be a DeviceRef, got {type(device).__name__}")
    if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or levels > 16:
        raise ValueError(
            f"log_probabilities_ragged_graph: levels must be an int <= 16 (log2 of top-k + 1), got {levels!r}"
        )
    per_row = 2 ** int(levels) if levels > 0 else 1
    host = DeviceRef.CPU()
    input_types = [
        TensorType(_LOGIT, ["bseq_or_b", "vocab"], device),
        TensorType(_TOKEN, ["batch_seq"], device),
        TensorType(_TOKEN, ["batch"], device),
        TensorType(_OFFSET, ["batchp1"], device),
        TensorType(_OFFSET, ["batchp1"], device),
        TensorType(_OFFSET, ["batchp1"], device),
        TensorType(_OFFSET, ["batchp1"], host),
    ]
    with Graph("ragged_logprobs", input_types=input_types) as graph:
        logits, tokens, sampled, logit_offsets, token_offsets, output_offsets, _host_offsets = (
            v.tensor for v in graph.inputs
        )
        logit_offsets, token_offsets, output_offsets = (
            ops.cast(v, DType.int64) for v in (logit_offsets, token_offsets, output_offsets)
        )
        counts = output_offsets[1:] - output_offsets[:-1]
        num_seqs = counts.shape[0]
        # The request of each output row, and the row's distance from its request's last row.
        request = ops.repeat_interleave(
            ops.range(0, num_seqs, 1, out_dim=num_seqs, dtype=DType.int64, device=device),
            counts,
            0,
            out_dim="out_batch_seq",
        )
        rows = request.shape[0]
        row = ops.range(0, rows, 1, out_dim=rows, dtype=DType.int64, device=device)
        back = ops.gather(output_offsets[1:], request, 0) - row - 1
        zero = ops.constant(0, DType.int64, device)
        last = back == zero
        token_index = ops.where(last, zero, ops.gather(token_offsets[1:], request, 0) - back)
        scored = ops.where(
            last,
            ops.gather(ops.cast(sampled, DType.int64), request, 0),
            ops.gather(ops.cast(tokens, DType.int64), token_index, 0),
        )
        logits_rows = ops.gather(logits, ops.gather(logit_offsets[1:], request, 0) - back - 1, 0)
        log_probs = ops.logsoftmax(logits_rows)
        scored_lp = ops.unsqueeze(ops.gather_nd(log_probs, ops.stack([row, scored], axis=-1)), 1)
        if per_row > 1:
            top = per_row - 1
            # -inf padding lets a vocabulary smaller than top-k through; padded slots read token id `vocab`.
            pad = ops.broadcast_to(ops.constant(float("-inf"), _LOGIT, device), [rows, top])
            values, ids = ops.top_k(ops.concat([log_probs, pad], axis=1), top, -1)
            vocab = TensorValue(logits.shape[1])
            vocab = vocab if vocab.device == device else ops.transfer_to(vocab, device)
            ids = ops.min(ops.cast(ids, DType.int64), vocab)
            lp_logits = ops.concat([values, scored_lp], axis=1)
            lp_tokens = ops.concat([ids, ops.unsqueeze(scored, 1)], axis=1)
        else:
            lp_logits, lp_tokens = scored_lp, ops.unsqueeze(scored, 1)
        graph.output(lp_logits, ops.cast(lp_tokens, _TOKEN))
    return graph


def _host_array(name: str, value: Any, ndim: int) -> np.ndarray:
    arr = value.to_numpy() if hasattr(value, "to_numpy") else np.asarray(value)
    if arr.ndim != ndim:
        raise ValueError(f"compute_log_probabilities_ragged: {name} must be {ndim}-D, got shape {list(arr.shape)}")
    return arr


def _device_tensor(name: str, value: Any, device: Any) -> Any:
    """``value`` as a float32 driver tensor on ``device`` (numpy arrays are copied there)."""
    if isinstance(value, Tensor):
        if value.dtype is not _LOGIT:
            raise ValueError(f"compute_log_probabilities_ragged: {name} must be float32, got {value.dtype.name}")
        if value.device != device:
            raise ValueError(
                f"compute_log_probabilities_ragged: {name} is on {value.device}, the computation runs on {device}"
            )
        return value
    arr = np.asarray(value)
    if arr.dtype != np.float32:
        raise ValueError(f"compute_log_probabilities_ragged: {name} must be float32, got {arr.dtype}")
    return Tensor.from_numpy(np.ascontiguousarray(arr)).to(device)


def compute_log_probabilities_ragged(
    device: Any,
    model: Any,
    *,
    input_row_offsets: np.ndarray,
    logits: Any,
    next_token_logits: Any,
    tokens: np.ndarray,
    sampled_tokens: np.ndarray,
    batch_top_n: Sequence[int],
    batch_echo: Sequence[bool],
) -> list[LogProbabilities | None]:
    """Log probabilities of a ragged batch's sampled (and, with echo, input) tokens, as MAX's.

    Args:
        device: the device the logits are on (where the graph runs).
        model: a compiled `log_probabilities_ragged_graph`.
        input_row_offsets: ``[batch + 1]``: request b's tokens are
            ``tokens[input_row_offsets[b]:input_row_offsets[b + 1]]``.
        logits: ``[total_tokens, vocab]`` float32 logits of every input token (a
            driver tensor on ``device``, or numpy); None only when no request echoes.
        next_token_logits: ``[batch, vocab]`` float32 logits of each request's next token.
        tokens: ``[total_tokens]`` input tokens.
        sampled_tokens: ``[batch]`` the token sampled for each request.
        batch_top_n: per request, how many top tokens to return (0: no log probabilities, None returned).
        batch_echo: per request, whether to score the input tokens too.

    Returns:
        per request, a `LogProbabilities` (one entry per scored token: its log
        probability, and its ``top_n`` best tokens plus itself), or None where ``top_n == 0``.

    Raises:
        ValueError: inconsistent shapes or lengths, echo without ``logits``, logits
            not float32 or on another device, or a ``top_n`` larger than the graph's levels support.
    """
    offsets = _host_array("input_row_offsets", input_row_offsets, 1).astype(np.int64)
    tokens_np = _host_array("tokens", tokens, 1)
    sampled_np = _host_array("sampled_tokens", sampled_tokens, 1)
    top_n, echo = [int(n) for n in batch_top_n], [bool(e) for e in batch_echo]
    batch = len(top_n)
    next_shape = list(next_token_logits.shape)
    if len(next_shape) != 2:
        raise ValueError(
            f"compute_log_probabilities_ragged: next_token_logits must be [batch, vocab], got shape {next_shape}"
        )
    sizes = {
        "batch_top_n": batch,
        "batch_echo": len(echo),
        "input_row_offsets - 1": len(offsets) - 1,
        "next_token_logits rows": next_shape[0],
        "sampled_tokens": len(sampled_np),
    }
    if len(set(sizes.values())) != 1:
        raise ValueError(f"compute_log_probabilities_ragged: the batch sizes disagree: {sizes}")
    if any(n < 0 for n in top_n):
        raise ValueError(f"compute_log_probabilities_ragged: batch_top_n must be >= 0, got {top_n}")
    if np.any(np.diff(offsets) < 0) or (len(offsets) and (offsets[0] != 0 or offsets[-1] != len(tokens_np))):
        raise ValueError(
            f"compute_log_probabilities_ragged: input_row_offsets must rise from 0 to len(tokens) = {len(tokens_np)}, "
            f"got {offsets.tolist()}"
        )
    vocab = next_shape[1]
    if logits is None:
        if any(echo):
            raise ValueError(
                "compute_log_probabilities_ragged: batch_echo needs the logits of every input token (logits=None)"
            )
        kernel_logits = _device_tensor("next_token_logits", next_token_logits, device)
        logit_offsets = np.arange(batch + 1)
    else:
        shape = list(logits.shape)
        if len(shape) != 2 or shape[0] != len(tokens_np) or shape[1] != vocab:
            raise ValueError(
                f"compute_log_probabilities_ragged: logits must be [len(tokens), vocab] = [{len(tokens_np)}, {vocab}], "
                f"got {shape}"
            )
        kernel_logits = _device_tensor("logits", logits, device)
        logit_offsets = offsets
    counts = np.array([offsets[i + 1] - offsets[i] if e else 1 for i, e in enumerate(echo)], np.int64)
    output_offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(counts)]).astype(np.uint32)

    def u32(a: np.ndarray) -> Any:
        return Tensor.from_numpy(np.ascontiguousarray(np.asarray(a).astype(np.uint32))).to(device)

    lp_logits_t, lp_tokens_t = model.execute(
        kernel_logits,
        u32(tokens_np),
        u32(sampled_np),
        u32(logit_offsets),
        u32(offsets),
        u32(output_offsets),
        Tensor.from_numpy(output_offsets),
    )
    lp_logits, lp_tokens = lp_logits_t.to_numpy(), lp_tokens_t.to_numpy()
    width = lp_logits.shape[1] - 1

    def top(i: int, n: int) -> dict[int, float]:
        if n > width:
            raise ValueError(
                f"compute_log_probabilities_ragged: top_n {n} is more than this graph returns ({width}); rebuild it "
                "with larger levels"
            )
        best = sorted(
            ((int(t), float(v)) for t, v in zip(lp_tokens[i, :-1], lp_logits[i, :-1]) if t < vocab),
            key=lambda item: item[1],
            reverse=True,
        )[:n]
        out = dict(best)
        out[int(lp_tokens[i, -1])] = float(lp_logits[i, -1])  # the scored token is always included
        return out

    results: list[LogProbabilities | None] = []
    for b in range(batch):
        if top_n[b] == 0:
            results.append(None)
            continue
        start, end = int(output_offsets[b]), int(output_offsets[b + 1])
        results.append(
            LogProbabilities(
                token_log_probabilities=[float(v) for v in lp_logits[start:end, -1]],
                top_log_probabilities=[top(i, top_n[b]) for i in range(start, end)],
            )
        )
    return results
