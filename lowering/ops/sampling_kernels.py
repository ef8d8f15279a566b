"""MAX's sampling kernels by their kernel-library names, for ``ops.custom`` / ``ops.inplace_custom``.

MAX's pipelines and tests call these Mojo kernels by name; maxfx provides each
over the registry ops of `lowering.ops.sampling` (``topk_sampling``,
``apply_penalties``, ``update_frequency_data``, ``min_p_mask``,
``apply_packed_bitmask``, ``topk_topp_masked_probs``, ``gumbel_argmax``):

- ``sampler.fused_token_sampling``: ``values`` (``K``, [``max_k``], ``temperature``,
  ``top_p``, [``min_top_p``, [``min_p``]], ``seed``, ``logits``), every per-row input
  ``[batch]`` or a scalar; out int64 ``[batch, 1]``. ``max_k`` may be a runtime
  value, so the candidates are bounded by the vocabulary.
- ``min_p_sampling``: ``(min_ps [batch], logits, temperature)``: a token of
  ``softmax(logits / temperature)`` among those with at least ``min_p`` times the
  row's largest probability (seed 0, as the kernel takes none).
- ``sampler.apply_penalties`` (in place): ``(logits buffer, frequency_data,
  frequency_offsets, frequency_penalty, presence_penalty, repetition_penalty)``,
  the penalties scalars or ``[batch]``.
- ``sampler.update_frequency_data`` (in place): ``(frequency_data buffer,
  frequency_offsets, new_tokens)``.
- ``mo.apply_packed_bitmask``: ``(logits, packed int32 [..., ceil(vocab / 32)],
  fill_value)`` (``fill_value`` a scalar value, or ``parameters={"fill_value": x}``):
  the logits with every token whose bit is clear set to ``fill_value``; a logit
  already ``-inf`` stays ``-inf``. The engine's structured-output mask unpacks
  llguidance's bitmask with the same `packed_bits`.
- ``sampler.topk_topp_masked_probs``: ``(K, temperature, top_p, logits)``: float32
  ``[batch, vocab]``, each row's softmax of ``logits / temperature`` over its top-k /
  top-p set (one-hot argmax for ``temperature <= 0``), the engine's `masked_probs`.
- ``sampler.gumbel_argmax_from_probs``: ``(seed, probs)``: int64 ``[batch]``, one token
  per row drawn proportionally to the row's (unnormalised) probabilities, Gumbel-max
  over ``ln p`` keyed by the row's seed (equal seeds, equal noise).
- ``sampler.fused_token_sampling_with_dist``: ``(K, max_k, temperature, top_p, seed,
  logits)``: the token (int64 ``[batch]``) drawn from the masked distribution, and that
  distribution (``[batch, vocab]``, the dtype of ``out_types[1]``, float32 by default).
  MAX runs these three on GPUs only; maxfx runs them on every device.

The random stream is JAX's (``jax.random`` keyed by each row's seed), not Mojo's:
a seed reproduces maxfx's samples, not MAX's.

Example:
    >>> from lowering.ops.custom import custom_op_names
    >>> "sampler.fused_token_sampling" in custom_op_names()
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lowering.context import bind
from lowering.dims import StaticDim
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.ops.buffer import buffer_load, buffer_store
from lowering.ops.core import cast_p, constant
from lowering.ops.custom import custom_kernel
from lowering.ops.sampling import (
    apply_packed_bitmask_p,
    apply_penalties_p,
    gumbel_argmax_p,
    masked_probs_p,
    min_p_mask_p,
    topk_sampling_p,
    update_frequency_data_p,
)
from lowering.ops.shape import broadcast_to, reshape

__all__ = ["per_row"]


def per_row(x: Any, dtype: DType, batch: Any) -> Any:
    """``x`` (a scalar or ``[batch]`` value) as a ``[batch]`` tensor of ``dtype``."""
    if x.type.dtype is not dtype:
        x = bind(cast_p, x, dtype=dtype)
    one = x.type.rank == 1 and isinstance(x.type.shape[0], StaticDim) and x.type.shape[0].dim == 1
    if x.type.rank == 0 or (one and not (isinstance(batch, StaticDim) and batch.dim == 1)):
        x = broadcast_to(reshape(x, [1]), [batch])
    return x


def _vocab(op: str, logits: Any) -> int:
    vocab = logits.type.shape[-1]
    if not isinstance(vocab, StaticDim):
        raise R.OpError(f"{op}: the vocabulary (logits' last dim) must be static, got {R.fmt(logits.type)}")
    return int(vocab.dim)


# ─── the kernels ──────────────────────────────────────────────────────────

_FUSED = "sampler.fused_token_sampling"
# MAX's operand lists across its versions, by length (newest last).
_FUSED_LAYOUTS = {
    5: ("K", "temperature", "top_p", "seed", "logits"),
    6: ("K", "max_k", "temperature", "top_p", "seed", "logits"),
    7: ("K", "max_k", "temperature", "top_p", "min_top_p", "seed", "logits"),
    8: ("K", "max_k", "temperature", "top_p", "min_top_p", "min_p", "seed", "logits"),
}


@custom_kernel(_FUSED)
def _fused_token_sampling(
    values: Sequence[Any], out_types: Sequence[Any] | None, parameters: Mapping[str, Any]
) -> list[Any]:
    layout = _FUSED_LAYOUTS.get(len(values))
    if layout is None:
        raise R.OpError(
            f"custom: kernel {_FUSED!r} takes {' or '.join(map(str, _FUSED_LAYOUTS))} values "
            f"({', '.join(_FUSED_LAYOUTS[8])}), got {len(values)}"
        )
    v = dict(zip(layout, values))
    logits = v["logits"]
    R.require_tensor(_FUSED, logits.type, "logits", rank=2, kind=R.FLOAT)
    batch = logits.type.shape[0]
    if "min_p" in v:
        logits = bind(
            min_p_mask_p,
            logits,
            per_row(v["min_p"], DType.float32, batch),
            per_row(v["temperature"], DType.float32, batch),
        )
    args = [
        per_row(v[n], dt, batch)
        for n, dt in (
            ("K", DType.int64),
            ("temperature", DType.float32),
            ("top_p", DType.float32),
            ("seed", DType.uint64),
        )
    ]
    return [bind(topk_sampling_p, logits, *args, max_k=_vocab(_FUSED, logits), use_top_p=True)]


@custom_kernel("min_p_sampling")
def _min_p_sampling(values: Sequence[Any], out_types: Sequence[Any] | None, parameters: Mapping[str, Any]) -> list[Any]:
    if len(values) != 3:
        raise R.OpError(
            f"custom: kernel 'min_p_sampling' takes 3 values (min_ps, logits, temperature), got {len(values)}"
        )
    min_ps, logits, temperature = values
    R.require_tensor("min_p_sampling", logits.type, "logits", rank=2, kind=R.FLOAT)
    batch, vocab = logits.type.shape[0], _vocab("min_p_sampling", logits)
    device = logits.type.device
    temp = per_row(temperature, DType.float32, batch)
    masked = bind(min_p_mask_p, logits, per_row(min_ps, DType.float32, batch), temp)
    every, whole, seed = (
        per_row(constant(x, dt, device), dt, batch)
        for x, dt in ((vocab, DType.int64), (1.0, DType.float32), (0, DType.uint64))
    )
    return [bind(topk_sampling_p, masked, every, temp, whole, seed, max_k=vocab, use_top_p=False)]


@custom_kernel("sampler.apply_penalties", inplace=True)
def _apply_penalties(
    values: Sequence[Any], out_types: Sequence[Any] | None, parameters: Mapping[str, Any]
) -> list[Any]:
    if len(values) != 6:
        raise R.OpError(
            "inplace_custom: kernel 'sampler.apply_penalties' takes 6 values (logits, frequency_data, "
            f"frequency_offsets, frequency_penalty, presence_penalty, repetition_penalty), got {len(values)}"
        )
    buf, fd, fo, *pens = values
    pens = [p if p.type.dtype is DType.float32 else bind(cast_p, p, dtype=DType.float32) for p in pens]
    buffer_store(buf, bind(apply_penalties_p, buffer_load(buf), fd, fo, *pens))
    return []


@custom_kernel("sampler.update_frequency_data", inplace=True)
def _update_frequency_data(
    values: Sequence[Any], out_types: Sequence[Any] | None, parameters: Mapping[str, Any]
) -> list[Any]:
    if len(values) != 3:
        raise R.OpError(
            "inplace_custom: kernel 'sampler.update_frequency_data' takes 3 values (frequency_data, "
            f"frequency_offsets, new_tokens), got {len(values)}"
        )
    buf, fo, tokens = values
    buffer_store(buf, bind(update_frequency_data_p, buffer_load(buf), fo, tokens))
    return []


@custom_kernel("mo.apply_packed_bitmask")
def _apply_packed_bitmask(
    values: Sequence[Any], out_types: Sequence[Any] | None, parameters: Mapping[str, Any]
) -> list[Any]:
    name = "mo.apply_packed_bitmask"
    if len(values) == 2 and "fill_value" in parameters:
        logits, packed = values
        fill = constant(float(parameters["fill_value"]), logits.type.dtype, logits.type.device)
    elif len(values) == 3:
        logits, packed, fill = values
    else:
        raise R.OpError(
            f"custom: kernel {name!r} takes 3 values (logits, packed_bitmask, fill_value), or 2 and "
            f"parameters={{'fill_value': x}}; got {len(values)} values"
        )
    if fill.type.rank == 1:
        fill = reshape(fill, [])
    if fill.type.dtype is not logits.type.dtype:
        fill = bind(cast_p, fill, dtype=logits.type.dtype)
    return [bind(apply_packed_bitmask_p, logits, packed, fill)]


def _arity(name: str, values: Sequence[Any], names: tuple[str, ...]) -> None:
    if len(values) != len(names):
        raise R.OpError(f"custom: kernel {name!r} takes {len(names)} values ({', '.join(names)}), got {len(values)}")


@custom_kernel("sampler.topk_topp_masked_probs")
def _topk_topp_masked_probs(
    values: Sequence[Any], out_types: Sequence[Any] | None, parameters: Mapping[str, Any]
) -> list[Any]:
    _arity("sampler.topk_topp_masked_probs", values, ("K", "temperature", "top_p", "input"))
    k, temperature, top_p, logits = values
    return [bind(masked_probs_p, logits, k, temperature, top_p)]


@custom_kernel("sampler.gumbel_argmax_from_probs")
def _gumbel_argmax_from_probs(
    values: Sequence[Any], out_types: Sequence[Any] | None, parameters: Mapping[str, Any]
) -> list[Any]:
    _arity("sampler.gumbel_argmax_from_probs", values, ("seed", "probs"))
    seed, probs = values
    return [bind(gumbel_argmax_p, probs, seed)]


@custom_kernel("sampler.fused_token_sampling_with_dist")
def _fused_token_sampling_with_dist(
    values: Sequence[Any], out_types: Sequence[Any] | None, parameters: Mapping[str, Any]
) -> list[Any]:
    # max_k only bounds K in MAX's kernel (it sizes the candidate buffer); the filter reads K itself.
    _arity("sampler.fused_token_sampling_with_dist", values, ("K", "max_k", "temperature", "top_p", "seed", "input"))
    k, _max_k, temperature, top_p, seed, logits = values
    dist = bind(masked_probs_p, logits, k, temperature, top_p)
    tokens = bind(gumbel_argmax_p, dist, seed)
    want = out_types[1].dtype if out_types is not None and len(out_types) > 1 else DType.float32
    return [tokens, dist if want is DType.float32 else bind(cast_p, dist, dtype=want)]
