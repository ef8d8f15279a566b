"""Sampling ops: fused top-k / top-p sampling, the penalties, and the masks and draws of MAX's sampling kernels.

These are the registry ops under ``maxfx.nn.kernels``' sampling kernels and
``ops.custom``'s MAX kernel names (`lowering.ops.sampling_kernels`). Kernels that
MAX documents as writing a buffer in place (``apply_penalties_to_logits``,
``update_frequency_data``) are built in ``maxfx.nn.kernels`` as load → op →
``buffer_store``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from lowering.context import bind
from lowering.dims import StaticDim
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.registry import OpDef, OpError, front, register
from lowering.sampling_math import gumbel_argmax, masked_probs, packed_bits
from lowering.types import TensorType

__all__ = [
    "topk_sampling",
    "apply_penalties",
    "update_frequency_data",
]  # and the front-less ops min_p_mask, apply_packed_bitmask, topk_topp_masked_probs, gumbel_argmax

# ─── fused top-k / top-p sampling ─────────────────────────────────────────


def _rows(op: str, logits, named, *, what: str = "logits") -> TensorType:
    """``logits`` (float ``[batch, vocab]``, called ``what`` in errors) and each ``(tensor, name, kind)`` of ``named``
    one entry per batch row.
    """
    lg = R.require_tensor(op, logits, what, rank=2, kind=R.FLOAT)
    for t, name, kind in named:
        t = R.require_tensor(op, t, name, rank=1, kind=kind)
        if t.shape[0] != lg.shape[0]:
            raise OpError(f"{op}: {name} must have one entry per batch row ({lg.shape[0]}), got {R.fmt(t)}")
    return lg


def _sampling_rule(logits, top_k, temperature, top_p, seed, *, max_k: int, use_top_p: bool) -> TensorType:
    op = "topk_fused_sampling"
    lg = _rows(
        op,
        logits,
        (
            (top_k, "top_k", R.INT),
            (temperature, "temperature", R.FLOAT),
            (top_p, "top_p", R.FLOAT),
            (seed, "seed", R.INT),
        ),
    )
    vocab = lg.shape[1]
    if max_k <= 0 or (isinstance(vocab, StaticDim) and max_k > vocab.dim):
        raise OpError(f"{op}: max_k must be in [1, vocab_size={vocab}], got {max_k}")
    return TensorType(DType.int64, [lg.shape[0], 1], lg.device)


def _sample_row(key, vals):
    return jax.random.categorical(key, vals)


def _sampling_impl(logits, top_k, temperature, top_p, seed, *, max_k: int, use_top_p: bool):
    temp = temperature.astype(jnp.float32)
    greedy = temp <= 0  # temperature 0 means greedy decoding
    scaled = logits.astype(jnp.float32) / jnp.where(greedy, 1.0, temp)[:, None]
    vals, idx = lax.top_k(scaled, max_k)
    k = jnp.where(greedy, 1, jnp.clip(top_k.astype(jnp.int64), 1, max_k))
    vals = jnp.where(jnp.arange(max_k)[None, :] < k[:, None], vals, -jnp.inf)
    if use_top_p:
        probs = jax.nn.softmax(vals, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the better-ranked tokens
        vals = jnp.where(before < top_p.astype(jnp.float32)[:, None], vals, -jnp.inf)
    keys = jax.vmap(jax.random.key)(seed.astype(jnp.uint64))
    choice = jax.vmap(_sample_row)(keys, vals)
    return jnp.take_along_axis(idx, choice[:, None], axis=1).astype(jnp.int64)


topk_sampling_p = register(OpDef("topk_sampling", rule=_sampling_rule, impl=_sampling_impl, differentiable=False))


@front(topk_sampling_p)
def topk_sampling(logits, top_k, temperature, top_p, seed, max_k: int, use_top_p: bool = True):
    """Sample one token per row from the top ``top_k`` (and top-``top_p`` mass) of ``logits / temperature``.

    Per-row tensors ``top_k`` (int), ``temperature``, ``top_p`` (float), ``seed``
    (int); ``max_k`` (static) bounds ``top_k``. ``top_k == 1`` or
    ``temperature <= 0`` is greedy. Returns int64 ``[batch, 1]``.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> logits = Tensor([[0.1, 3.0, 0.2], [5.0, 0.0, 1.0]])
        >>> k = Tensor(np.array([1, 1], np.int64))  # top_k == 1: greedy
        >>> t = Tensor([1.0, 1.0])
        >>> p = Tensor([1.0, 1.0])
        >>> seed = Tensor(np.array([0, 1], np.uint64))
        >>> ops.topk_sampling(logits, k, t, p, seed, max_k=2)
        TensorType(dtype=int64, shape=[Dim(2), Dim(1)], device=cpu:0): [1, 0]
        >>> k = Tensor(np.array([2, 2], np.int64))
        >>> tokens = np.asarray(ops.topk_sampling(logits, k, t, p, seed, max_k=2))
        >>> bool(tokens[0, 0] in (1, 2) and tokens[1, 0] in (0, 2))  # each from its row's top 2
        True
    """
    return bind(topk_sampling_p, logits, top_k, temperature, top_p, seed, max_k=int(max_k), use_top_p=bool(use_top_p))


# ─── sampling penalties ───────────────────────────────────────────────────


def _freq_rule_common(op: str, fd: Any, fo: Any) -> tuple[TensorType, TensorType]:
    fd = R.require_tensor(op, fd, "frequency_data", rank=2, kind=R.INT)
    fo = R.require_tensor(op, fo, "frequency_offsets", rank=1, kind=R.INT)
    if fd.shape[1] != 2:
        raise OpError(f"{op}: frequency_data must be [unique_tokens, 2] (token id, count), got {R.fmt(fd)}")
    return fd, fo


def _penalties_rule(logits, fd, fo, fp, pp, rp) -> TensorType:
    op = "apply_penalties_to_logits"
    lg = R.require_tensor(op, logits, "logits", rank=2, kind=R.FLOAT)
    fd, fo = _freq_rule_common(op, fd, fo)
    if fo.shape[0] != lg.shape[0] + 1:
        raise OpError(f"{op}: frequency_offsets must be [batch + 1] = [{lg.shape[0] + 1}], got {R.fmt(fo)}")
    for t, name in ((fp, "frequency_penalty"), (pp, "presence_penalty"), (rp, "repetition_penalty")):
        t = R.require_tensor(op, t, name, kind=R.FLOAT)
        per_row = t.rank == 1 and t.shape[0] == lg.shape[0]
        if not per_row and any(d != 1 for d in t.shape):
            raise OpError(f"{op}: {name} must be a scalar or one value per batch row ([{lg.shape[0]}]), got {R.fmt(t)}")
    return lg


def _segment_of(offsets, n: int):
    """Batch index of each of ``n`` rows under prefix-sum ``offsets`` (== batch for rows past the end)."""
    return jnp.searchsorted(offsets[1:], jnp.arange(n), side="right")


def _penalty_at(v, rows, batch: int):
    """A penalty for each frequency entry: a scalar applies to every row, a ``[batch]`` one is read at the entry's
    row.
    """
    v = v.astype(jnp.float32)
    return v.reshape(-1)[rows] if v.ndim == 1 and v.size == batch and batch != 1 else v.reshape(())


def _penalties_impl(logits, fd, fo, fp, pp, rp):
    batch, vocab = logits.shape
    fo = fo.astype(jnp.int64)
    tok, count = fd[:, 0].astype(jnp.int64), fd[:, 1].astype(jnp.float32)
    row = _segment_of(fo, fd.shape[0])
    valid = (row < batch) & (tok >= 0) & (tok < vocab) & (count > 0)
    r, c = jnp.where(valid, row, batch), jnp.clip(tok, 0, vocab - 1)
    old = logits[jnp.minimum(r, batch - 1), c].astype(jnp.float32)
    rp, fp, pp = (_penalty_at(v, jnp.minimum(r, batch - 1), batch) for v in (rp, fp, pp))
    new = jnp.where(old > 0, old / rp, old * rp) - fp * count - pp
    return logits.at[r, c].set(new.astype(logits.dtype), mode="drop")


apply_penalties_p = register(OpDef("apply_penalties", rule=_penalties_rule, impl=_penalties_impl, differentiable=False))


@front(apply_penalties_p)
def apply_penalties(logits, frequency_data, frequency_offsets, frequency_penalty, presence_penalty, repetition_penalty):
    """Logits with repetition, then frequency and presence, penalties applied to seen tokens.

    For each ``(token, count)`` row of sequence b's slice of ``frequency_data``
    (token < 0 marks an empty slot): ``l = l / rp if l > 0 else l * rp`` then
    ``l -= frequency_penalty * count + presence_penalty``. Each penalty is a
    scalar or one value per batch row.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> logits = Tensor([[1.0, 2.0, -1.0, 0.5]])
        >>> frequency = Tensor(np.array([[1, 2], [2, 1], [-1, 0]], np.int32))  # (token, count); -1: empty
        >>> offsets = Tensor(np.array([0, 3], np.uint32))
        >>> fp, pp, rp = Tensor(0.5), Tensor(0.25), Tensor(2.0)
        >>> ops.apply_penalties(logits, frequency, offsets, fp, pp, rp)  # 2 / 2 - 0.5 * 2 - 0.25; -1 * 2 - 0.5 - 0.25
        TensorType(dtype=float32, shape=[Dim(1), Dim(4)], device=cpu:0): [1.0, -0.25, -2.75, 0.5]
    """
    return bind(
        apply_penalties_p,
        logits,
        frequency_data,
        frequency_offsets,
        frequency_penalty,
        presence_penalty,
        repetition_penalty,
    )


def _update_freq_rule(fd, fo, tokens) -> TensorType:
    op = "update_frequency_data"
    fd, fo = _freq_rule_common(op, fd, fo)
    t = R.require_tensor(op, tokens, "tokens", rank=1, kind=R.INT)
    if fo.shape[0] != t.shape[0] + 1:
        raise OpError(f"{op}: frequency_offsets must have one more entry than tokens, got {R.fmt(fo)} and {R.fmt(t)}")
    return fd


def _update_freq_impl(fd, fo, tokens):
    n, batch = fd.shape[0], tokens.shape[0]
    fo = fo.astype(jnp.int64)
    tok = fd[:, 0].astype(jnp.int64)
    row = _segment_of(fo, n)
    new_tok = tokens.astype(jnp.int64)
    pos = jnp.arange(n)
    seg = jnp.minimum(row, batch)
    match = (row < batch) & (tok == new_tok[jnp.minimum(row, batch - 1)])
    empty = (row < batch) & (tok < 0)
    first_match = jax.ops.segment_min(jnp.where(match, pos, n), seg, num_segments=batch + 1)[:batch]
    first_empty = jax.ops.segment_min(jnp.where(empty, pos, n), seg, num_segments=batch + 1)[:batch]
    found = first_match < n
    target = jnp.where(new_tok < 0, n, jnp.where(found, first_match, first_empty))  # n: no slot, dropped
    counts = jnp.where(found, fd[jnp.minimum(target, n - 1), 1].astype(jnp.int64) + 1, 1)
    fd = fd.at[target, 0].set(new_tok.astype(fd.dtype), mode="drop")
    return fd.at[target, 1].set(counts.astype(fd.dtype), mode="drop")


update_frequency_data_p = register(
    OpDef("update_frequency_data", rule=_update_freq_rule, impl=_update_freq_impl, differentiable=False)
)


@front(update_frequency_data_p)
def update_frequency_data(frequency_data, frequency_offsets, tokens):
    """``frequency_data`` with each sequence's new token counted.

    A token already in the sequence's slice has its count incremented; a new
    one takes the slice's first empty slot (token id < 0) with count 1 (it is
    dropped when the slice is full). Negative ``tokens`` are padding.

    Example:
        >>> import numpy as np
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> frequency = Tensor(np.array([[1, 2], [4, 1], [-1, 0], [0, 3], [-1, 0], [-1, 0]], np.int32))
        >>> offsets = Tensor(np.array([0, 3, 6], np.uint32))  # rows 0-2: sequence 0; rows 3-5: sequence 1
        >>> new_tokens = Tensor(np.array([4, 5], np.int64))
        >>> ops.update_frequency_data(frequency, offsets, new_tokens)  # 4 seen again; 5 takes a free slot
        TensorType(dtype=int32, shape=[Dim(6), Dim(2)], device=cpu:0): [1, 2, 4, 2, -1, 0, 0, 3, 5, 1, -1, 0]
    """
    return bind(update_frequency_data_p, frequency_data, frequency_offsets, tokens)


# ─── min_p_mask: the min-p filter as an op of its own ─────────────────────


def _min_p_rule(logits, min_p, temperature) -> TensorType:
    return _rows("min_p_mask", logits, ((min_p, "min_p", R.FLOAT), (temperature, "temperature", R.FLOAT)))


def _min_p_impl(logits, min_p, temperature):
    # p_i >= min_p * p_max  <=>  l_i / T >= l_max / T + log(min_p); temperature <= 0 (greedy) and min_p <= 0 keep every
    # token.
    x = logits.astype(jnp.float32)
    t = temperature.astype(jnp.float32)[:, None]
    mp = min_p.astype(jnp.float32)[:, None]
    top = jnp.max(x, axis=-1, keepdims=True)
    keep = (x - top) / jnp.where(t > 0, t, 1.0) >= jnp.log(jnp.where(mp > 0, mp, 1.0))
    keep = keep | (t <= 0) | (mp <= 0)
    return jnp.where(keep, logits, jnp.asarray(-jnp.inf, logits.dtype))


min_p_mask_p = register(OpDef("min_p_mask", rule=_min_p_rule, impl=_min_p_impl, differentiable=False))
"""``logits`` with the tokens below ``min_p`` times their row's largest probability (after ``/ temperature``)
set to -inf.
"""


# ─── apply_packed_bitmask: a grammar's packed token mask on the logits ─────


def _bitmask_rule(logits, packed, fill_value) -> TensorType:
    op = "apply_packed_bitmask"
    lg = R.require_tensor(op, logits, "logits", kind=R.NUMERIC)
    pk = R.require_tensor(op, packed, "packed_bitmask", rank=lg.rank)
    if pk.dtype is not DType.int32:
        raise R.OpError(f"{op}: packed_bitmask must be int32 (32 tokens a word), got {R.fmt(pk)}")
    R.require_tensor(op, fill_value, "fill_value", rank=0)
    if lg.rank == 0:
        raise R.OpError(f"{op}: logits must have a vocabulary dim, got {R.fmt(lg)}")
    vocab, words = lg.shape[-1], pk.shape[-1]
    if list(pk.shape[:-1]) != list(lg.shape[:-1]):
        raise R.OpError(
            f"{op}: packed_bitmask's leading dims must equal the logits', got {R.fmt(pk)} for logits {R.fmt(lg)}"
        )
    if isinstance(vocab, StaticDim) and isinstance(words, StaticDim) and words.dim != -(-vocab.dim // 32):
        raise R.OpError(
            f"{op}: packed_bitmask's last dim must be ceil({vocab.dim} / 32) = {-(-vocab.dim // 32)}, got {R.fmt(pk)}"
        )
    return lg


def _bitmask_impl(logits, packed, fill_value):
    keep = packed_bits(packed, logits.shape[-1], jnp)
    if jnp.issubdtype(logits.dtype, jnp.floating):
        keep = keep | (logits == -jnp.inf)  # as MAX's kernel: what the model excluded stays excluded
    return jnp.where(keep, logits, fill_value.astype(logits.dtype))


apply_packed_bitmask_p = register(
    OpDef("apply_packed_bitmask", rule=_bitmask_rule, impl=_bitmask_impl, differentiable=False)
)
"""``logits`` with every token whose bit is clear in ``packed_bitmask`` set to ``fill_value`` (``-inf`` logits kept)."""


# ─── masked_probs and gumbel_argmax: speculative decoding's distributions ──


def _masked_probs_rule(logits, top_k, temperature, top_p) -> TensorType:
    lg = _rows(
        "topk_topp_masked_probs",
        logits,
        ((top_k, "top_k", R.INT), (temperature, "temperature", R.FLOAT), (top_p, "top_p", R.FLOAT)),
    )
    return TensorType(DType.float32, list(lg.shape), lg.device)


def _masked_probs_impl(logits, top_k, temperature, top_p):
    return masked_probs(logits, temperature.astype(jnp.float32), top_k.astype(jnp.int32), top_p.astype(jnp.float32))


masked_probs_p = register(
    OpDef("topk_topp_masked_probs", rule=_masked_probs_rule, impl=_masked_probs_impl, differentiable=False)
)
"""Float32 ``[batch, vocab]``: each row's renormalised softmax over its top-k / top-p set (one-hot argmax
when greedy).
"""


def _gumbel_rule(probs, seed) -> TensorType:
    p = _rows("gumbel_argmax", probs, ((seed, "seed", R.INT),), what="probs")
    return TensorType(DType.int64, [p.shape[0]], p.device)


def _gumbel_impl(probs, seed):
    keys = jax.vmap(jax.random.key)(seed.astype(jnp.uint64))
    return jax.vmap(gumbel_argmax)(keys, jnp.log(probs.astype(jnp.float32))).astype(jnp.int64)


gumbel_argmax_p = register(OpDef("gumbel_argmax", rule=_gumbel_rule, impl=_gumbel_impl, differentiable=False))
"""Int64 ``[batch]``: one token per row drawn in proportion to ``probs`` (Gumbel-max over ``ln p``, keyed by
``seed``).
"""
