"""Ragged and scatter kernels of ``max.nn.kernels``: ``rope_ragged``, ``merge_ragged_tensors``,
``scatter_nd_skip_oob_indices``, ``scatter_set_constant`` and ``apply_packed_bitmask``.

Each is built from registry ops (`maxfx.graph.ops`), so it runs in graphs,
eagerly and under ``jax.jit`` alike.

Example:
    >>> import numpy as np
    >>> from maxfx.nn import kernels
    >>> from maxfx.experimental.tensor import Tensor
    >>> from maxfx.dtype import DType
    >>> x = Tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    >>> idx = Tensor(np.array([[1], [-999], [-2]], np.int64))  # -999 is out of range: skipped
    >>> kernels.scatter_nd_skip_oob_indices(x, Tensor([10.0, 15.0, 20.0]), idx).to_numpy().tolist()
    [1.0, 10.0, 3.0, 20.0, 5.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowering.context import bind
from lowering.dtypes import DType
from lowering.ops.sampling import apply_packed_bitmask_p
from maxfx.graph import ops

__all__ = [
    "apply_packed_bitmask",
    "merge_ragged_tensors",
    "rope_ragged",
    "scatter_nd_skip_oob_indices",
    "scatter_set_constant",
]


def _check(name: str, value: Any, *, dtype: DType | None = None, rank: int | None = None) -> None:
    if dtype is not None and value.dtype != dtype:
        raise ValueError(f"expected {name} to have dtype {dtype.name}, was {value.dtype.name}")
    if rank is not None and value.rank != rank:
        raise ValueError(f"expected {name} to have rank {rank}, was {value.rank}")


def rope_ragged(
    input: Any,  # noqa: A002 - MAX's name
    input_row_offsets: Any,
    start_pos: Any,
    freqs_cis: Any,
    *,
    interleaved: bool = True,
    rope_first: bool = False,
    output_dtype: DType | None = None,
) -> Any:
    """Rotary embedding of ragged rows ``input [total_tokens, heads, head_dim]`` (MAX's argument order).

    Row ``i`` of sequence ``b`` (rows ``input_row_offsets[b]:input_row_offsets[b+1]``)
    sits at position ``start_pos[b] + i``; ``freqs_cis [max_seq_len, rope_dim]``
    holds the (cos, sin) pairs. When ``rope_dim < head_dim`` only ``rope_dim``
    columns of each head rotate, the trailing ones (the leading ones with
    ``rope_first``), and the rest pass through. ``interleaved`` rotates pairs
    ``(2i, 2i+1)``, otherwise ``(i, i + rope_dim/2)``. The math is
    `ops.rope_ragged`'s; the result is cast to ``output_dtype`` if given.

    Raises:
        ValueError: ``input_row_offsets``/``start_pos`` not uint32 rank 1,
            ``input`` not rank 3, ``freqs_cis`` not rank 2 or wider than a head.

    Example:
        >>> import numpy as np
        >>> from maxfx.experimental.tensor import Tensor
        >>> freqs = Tensor([[1.0, 0.0], [0.0, 1.0]])  # position 1 turns by 90 degrees
        >>> x = Tensor(np.array([[[1.0, 0.0]], [[1.0, 0.0]]], np.float32))
        >>> offsets, start = Tensor(np.array([0, 2], np.uint32)), Tensor(np.array([0], np.uint32))
        >>> rope_ragged(x, offsets, start, freqs)[:, 0].to_numpy().tolist()
        [[1.0, 0.0], [0.0, 1.0]]
    """
    _check("input_row_offsets", input_row_offsets, dtype=DType.uint32, rank=1)
    _check("start_pos", start_pos, dtype=DType.uint32, rank=1)
    _check("input", input, rank=3)
    _check("freqs_cis", freqs_cis, rank=2)
    head_dim, rope_dim = input.shape[2], freqs_cis.shape[1]
    if rope_dim == head_dim:
        out = ops.rope_ragged(input, freqs_cis, input_row_offsets, start_pos, interleaved=interleaved)
    else:
        try:
            h, r = int(head_dim), int(rope_dim)
        except TypeError:
            raise ValueError(
                f"rope_ragged: freqs_cis width {rope_dim} differs from the head dim {head_dim} and one is symbolic"
            ) from None
        if r > h:
            raise ValueError(f"rope_ragged: freqs_cis rotates {r} columns but a head has only {h}")
        rot, keep = (input[:, :, :r], input[:, :, r:]) if rope_first else (input[:, :, h - r :], input[:, :, : h - r])
        rotated = ops.rope_ragged(rot, freqs_cis, input_row_offsets, start_pos, interleaved=interleaved)
        out = ops.concat([rotated, keep] if rope_first else [keep, rotated], axis=-1)
    return out if output_dtype is None or output_dtype == out.dtype else ops.cast(out, output_dtype)


def scatter_nd_skip_oob_indices(input: Any, updates: Any, indices: Any) -> Any:  # noqa: A002 - MAX's name
    """`ops.scatter_nd` that skips the updates whose index is out of range (instead of failing).

    ``indices [*Q, k]`` picks slices of ``input`` as in `ops.scatter_nd`; an index
    vector with a component outside ``[-dim, dim)`` is skipped (MAX uses e.g.
    ``int32`` min as "no slot"); negative components in range count from the end.

    Raises:
        ValueError: as `ops.scatter_nd` (dtypes, shapes, devices).
    """
    k = int(indices.shape[-1])
    d0 = input.shape[0]
    dims = _as_operand(list(input.shape[:k]), indices.dtype, indices.device)  # [k]
    in_range = ops.cast((indices >= -dims) & (indices < dims), DType.int32)
    valid = ops.min(in_range, axis=-1) == 1  # [*Q, 1]: every component in range
    normalized = ops.where(indices < 0, indices + dims, indices)
    if isinstance(dims, np.ndarray):
        trash: Any = np.concatenate([dims[:1], np.zeros(k - 1, dims.dtype)])
    else:
        trash = ops.concat([dims[:1], ops.broadcast_to(dims[:1] * 0, [k - 1])], axis=0) if k > 1 else dims
    safe = ops.where(valid, normalized, trash)  # skipped updates go to one extra row past the end
    spare = ops.broadcast_to(input[:1] * 0, [1, *input.shape[1:]])
    padded = ops.concat([input, spare], axis=0)
    out = ops.scatter_nd(padded, updates, safe)
    return ops.rebind(
        out[:d0] if isinstance(d0, int) else ops.slice_tensor(out, [(slice(0, d0), d0)]), list(input.shape)
    )


def _is_static(dim: Any) -> bool:
    try:
        int(dim)
    except TypeError:
        return False
    return True


def _as_operand(dims: list[Any], dtype: DType, device: Any) -> Any:
    """``dims`` as a rank-1 operand: a numpy array when static (ops take arrays), else `ops.shape_to_tensor`."""
    if all(_is_static(d) for d in dims):
        return np.array([int(d) for d in dims], dtype.to_numpy())
    out = ops.cast(ops.shape_to_tensor(dims), dtype)
    return out if out.device == device else ops.transfer_to(out, device)


def apply_packed_bitmask(logits: Any, packed_bitmask: Any, fill_val: float = -10000.0) -> Any:
    """``logits`` with every token whose bit is clear in ``packed_bitmask`` set to ``fill_val``.

    ``packed_bitmask [..., ceil(vocab / 32)]`` (int32, the layout llguidance
    and xgrammar fill) holds token ``v``'s bit at bit ``v % 32`` of word
    ``v // 32``; set means allowed. Any rank (``[batch, vocab]``,
    ``[batch, steps, vocab]``); padding bits past ``vocab`` are never read.
    As MAX's kernel (``mo.apply_packed_bitmask``), a logit the model already set
    to ``-inf`` stays ``-inf``; the default ``fill_val`` is MAX's sampler's
    (-10000), finite so that a row the grammar masks entirely samples uniformly
    instead of giving NaN. One op (`lowering.ops.sampling_kernels`), also what the
    engine's structured output unpacks llguidance's masks with.

    Raises:
        ValueError: the bitmask is not int32, its rank or leading dims differ
            from the logits', or its last dim is not ``ceil(vocab / 32)`` (when
            both are static).

    Example:
        >>> import numpy as np
        >>> from maxfx.experimental.tensor import Tensor
        >>> logits = Tensor(np.zeros((1, 40), np.float32))
        >>> mask = Tensor(np.array([[0b101, 1 << 7]], np.int32))  # tokens 0, 2 and 32 + 7
        >>> out = apply_packed_bitmask(logits, mask, fill_val=-1.0).to_numpy()
        >>> np.flatnonzero(out[0] == 0).tolist()
        [0, 2, 39]
    """
    fill = np.asarray(fill_val, logits.dtype.to_numpy())  # a scalar operand, placed beside the logits by bind
    return bind(apply_packed_bitmask_p, logits, packed_bitmask, fill)


def scatter_set_constant(data: Any, indices: Any, fill_val: float) -> None:
    """Set ``data[i, j] = fill_val`` for every row ``(i, j)`` of ``indices [K, 2]`` in the 2d buffer ``data``.

    Example:
        >>> scatter_set_constant(mask_buf, positions, float("-inf"))  # doctest: +SKIP
    """
    if getattr(data, "rank", None) != 2 or type(getattr(data, "type", None)).__name__ != "BufferType":
        raise ValueError(f"scatter_set_constant: data must be a 2d BufferValue, got {getattr(data, 'type', data)!r}")
    if indices.rank != 2 or indices.shape[1] != 2:
        raise ValueError(
            "scatter_set_constant: indices must be [K, 2] (row, column) pairs, got "
            f"{indices.dtype.name}{list(indices.shape)}"
        )
    if indices.dtype not in (DType.int32, DType.int64):
        indices = indices.cast(DType.int64)
    fill = ops.broadcast_to(ops.constant(fill_val, data.dtype, data.device).reshape([1]), [indices.shape[0]])
    ops.buffer_store(data, ops.scatter_nd(ops.buffer_load(data), fill, indices))


def merge_ragged_tensors(a: Any, a_row_offsets: Any, b: Any, b_row_offsets: Any) -> tuple[Any, Any]:
    """Interleave two ragged batches sequence by sequence; returns ``(merged, merged_row_offsets)``.

    Example (seed 002): ``a = [1..6]``, offsets ``[0, 2, 6]``; ``b = [7..10]``,
    offsets ``[0, 3, 4]`` → ``[1, 2, 7, 8, 9, 3, 4, 5, 6, 10]``, ``[0, 5, 10]``.

        >>> merged, offsets = merge_ragged_tensors(a, ao, b, bo)  # doctest: +SKIP
    """
    merged, offsets = ops.merge_ragged_tensors(a, a_row_offsets, b, b_row_offsets)
    return merged, offsets
