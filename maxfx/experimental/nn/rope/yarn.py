"""YaRN rotary tables (``max.experimental.nn.rope.yarn``): RoPE extended past its training context.

See "YaRN: Efficient Context Window Extension of Large Language Models"
(arxiv.org/abs/2309.00071). `positional_embedding` builds the table a
`RotaryEmbedding` takes, blending RoPE's frequencies (kept for the fast,
high-frequency dims) with frequencies slowed by the scale factor ``s = L' / L``
(for the slow dims) along a linear ramp, and scaling it by YaRN's length
factor ``0.1 ln(s) + 1``. It is computed in float64 and cast to the default
dtype, as `rope.positional_embedding` is.

Example:
    >>> from maxfx.experimental.nn.rope import RotaryEmbedding, yarn
    >>> table = yarn.positional_embedding(dim=8, base=10000.0, max_sequence_length=64,
    ...                                   original_max_sequence_length=16, alpha=1, beta=32)
    >>> RotaryEmbedding(table).max_sequence_length, table.shape
    (64, [Dim(64), Dim(4), Dim(2)])
"""

from __future__ import annotations

import math

from lowering.dtypes import DType
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn.rope import rope
from maxfx.experimental.tensor import default_dtype, defaults

__all__ = ["length_scaling", "linear_interpolation", "linear_ramp_mask", "positional_embedding"]


def positional_embedding(
    dim: int,
    base: float,
    max_sequence_length: int,
    original_max_sequence_length: int,
    alpha: float,
    beta: float,
) -> Tensor:
    """The YaRN rotation table ``[max_sequence_length, dim // 2, 2]`` (cos, sin), in the default dtype.

    Args:
        dim: the head dimension (each real/imaginary component counts as one).
        base: RoPE's frequency base.
        max_sequence_length: ``L'``, the number of positions to embed.
        original_max_sequence_length: ``L``, the context the model was trained
            with; the scale factor is ``L' / L``.
        alpha: YaRN's ``beta_slow`` (e.g. 1): the dims that turn fewer times
            than this over ``L`` use the scaled frequencies.
        beta: YaRN's ``beta_fast`` (e.g. 32): the dims that turn more times
            than this keep the base frequencies; the dims between are blended.
            The two may be given in either order.

    Raises:
        ValueError: the ramp is empty (its start index is not below its end).
    """
    dtype, _ = defaults()
    scale = max_sequence_length / original_max_sequence_length
    with default_dtype(DType.float64):
        base_frequencies = rope.theta(dim, base)
        scaled_frequencies = base_frequencies / scale

        def index_for(rotations: float) -> float:
            # The dim index whose wavelength fits `rotations` times in L: i = d/2 * log_b(L / (2 pi r)).
            return (dim / 2) * math.log(original_max_sequence_length / (2 * math.pi * rotations), base)

        # The ramp runs from the dim of the fast rotations to the dim of the slow ones (HF's
        # low/high). MAX takes start from `alpha` and end from `beta`, which raises for its own
        # documented (alpha=1, beta=32); ordering the two indices gives MAX's table wherever MAX
        # gives one and the paper's for the documented order (docs/pages/max_compatibility.md).
        fast, slow = sorted((index_for(alpha), index_for(beta)))
        start = max(0, math.floor(fast))
        end = min(dim - 1, math.ceil(slow))
        mask = linear_ramp_mask(start, end, dim // 2)
        frequencies = linear_interpolation(base_frequencies, scaled_frequencies, mask)
        table = rope.embed(frequencies, max_sequence_length)
        return (table * length_scaling(scale)).cast(dtype)


def linear_ramp_mask(start_idx: int, end_idx: int, length: int) -> Tensor:
    """``length`` weights rising linearly from 0 (at ``start_idx`` and before) to 1 (at ``end_idx`` and after).

    Raises:
        ValueError: ``start_idx >= end_idx``.

    Example:
        >>> linear_ramp_mask(1, 3, 5).to_numpy().tolist()
        [0.0, 0.0, 0.5, 1.0, 1.0]
    """
    if start_idx >= end_idx:
        raise ValueError(f"linear_ramp_mask: start_idx={start_idx} must be less than end_idx={end_idx}")
    mask = (Tensor.arange(length) - start_idx) / (end_idx - start_idx)
    return mask.clip(min=0, max=1)


def linear_interpolation(low: Tensor, high: Tensor, mask: Tensor) -> Tensor:
    """``(1 - mask) * low + mask * high``: ``low`` where the mask is 0, ``high`` where it is 1."""
    return (1 - mask) * low + mask * high


def length_scaling(scale_factor: float = 1.0) -> float:
    """YaRN's length scaling ``sqrt(1/t) = 0.1 ln(s) + 1`` (paper eq. 22), applied to the whole table.

    Example:
        >>> round(length_scaling(4.0), 6)
        1.138629
    """
    return 0.1 * math.log(scale_factor) + 1.0
