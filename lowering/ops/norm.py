"""RMS and group normalisation: MAX's ``ops.rms_norm`` and ``ops.group_norm``.

Both are composite fronts: they bind the registry's elementwise, reduction,
cast and reshape ops (so they record, run eagerly and differentiate like any
of those) and define no op of their own. ``layer_norm`` is a primitive op in
`lowering.ops.reduction`.

The statistics are computed in float32 and the result is cast back to the
input's dtype, as MAX's kernels and the Hugging Face references do.
"""

from __future__ import annotations

from typing import Any

from lowering.dims import Dim, StaticDim, format_shape
from lowering.dtypes import DType
from lowering.ops._indexing_util import dtype_of
from lowering.ops.core import cast
from lowering.ops.elementwise import add, mul, rsqrt, sub
from lowering.ops.reduction import check_epsilon, mean
from lowering.ops.shape import reshape
from lowering.registry import front

__all__ = ["rms_norm", "group_norm"]


def _float32(x: Any) -> Any:
    return x if dtype_of(x) is DType.float32 else cast(x, DType.float32)


def _require_float(op: str, x: Any, what: str) -> None:
    if not dtype_of(x).is_float():
        raise TypeError(f"{op}: {what} must be a floating-point tensor, got {dtype_of(x)}")


@front()
def rms_norm(input, weight, epsilon, weight_offset=0.0, multiply_before_cast=False):  # noqa: A002 - MAX's names
    """Root-mean-square normalisation over the last dim: ``x / sqrt(mean(x²) + epsilon) * (weight + weight_offset)``.

    Llama's form by default: the normalised value is cast back to ``input``'s
    dtype, then multiplied by the weight. Gemma's form is
    ``weight_offset=1.0, multiply_before_cast=True``: the scale ``1 + weight``
    is applied in float32 before the cast.

    Args:
        input: floating-point tensor ``[..., d]``.
        weight: scale of shape ``[d]``.
        epsilon: positive constant added to the mean square.
        weight_offset: added to ``weight`` (Gemma stores ``weight - 1``).
        multiply_before_cast: apply the scale before casting back to ``input``'s dtype.

    Raises:
        ValueError: ``weight`` is not ``[d]``, or ``epsilon <= 0``.
        TypeError: ``input`` is not floating point.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> ops.rms_norm(Tensor([[3.0, 4.0]]), Tensor([1.0, 2.0]), epsilon=1e-6)
        TensorType(dtype=float32, shape=[Dim(1), Dim(2)], device=cpu:0): [0.8485..., 2.2627...]
    """
    op = "rms_norm"
    eps = check_epsilon(op, epsilon)
    _require_float(op, input, "input")
    if len(input.shape) == 0:
        raise ValueError(f"{op}: input must have at least one dim, got a scalar")
    if len(weight.shape) != 1 or Dim(weight.shape[0]) != Dim(input.shape[-1]):
        raise ValueError(
            f"{op}: weight must have shape [{input.shape[-1]}] (the last dim of input {format_shape(input.shape)}), "
            f"got {format_shape(weight.shape)}"
        )
    x32 = _float32(input)
    normed = mul(x32, rsqrt(add(mean(mul(x32, x32), -1), eps)))
    offset = float(weight_offset)
    if multiply_before_cast:
        scale = _float32(weight)
        return cast(mul(normed, add(scale, offset) if offset else scale), dtype_of(input))
    scale = add(weight, offset) if offset else weight
    return mul(normed if dtype_of(input) is DType.float32 else cast(normed, dtype_of(input)), scale)


@front()
def group_norm(input, gamma, beta, num_groups, epsilon):  # noqa: A002 - MAX's names
    """Group normalisation of ``[batch, channels, ...]``: each of ``num_groups`` channel groups is
    normalised over its channels and trailing dims, then scaled per channel by ``gamma`` and shifted by ``beta``.

    Args:
        input: floating-point tensor ``[N, C, *]`` (rank ≥ 2).
        gamma: per-channel scale ``[C]``.
        beta: per-channel offset ``[C]``.
        num_groups: how many groups split the ``C`` channels (must divide ``C``).
        epsilon: positive constant added to the (population) variance.

    Raises:
        ValueError: rank below 2, ``C`` not divisible by ``num_groups``, ``gamma``/``beta``
            not ``[C]``, or ``epsilon <= 0``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor([[[1.0, 3.0], [2.0, 6.0]]])  # [1, 2 channels, 2]
        >>> ops.group_norm(x, Tensor([1.0, 1.0]), Tensor([0.0, 0.0]), num_groups=2, epsilon=1e-5)
        ... # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(1), Dim(2), Dim(2)], device=cpu:0):
        [-0.9999..., 0.9999..., -0.9999..., 0.9999...]
    """
    op = "group_norm"
    eps = check_epsilon(op, epsilon)
    _require_float(op, input, "input")
    shape = list(input.shape)
    if len(shape) < 2:
        raise ValueError(f"{op}: input must be [batch, channels, ...] (rank >= 2), got shape {format_shape(shape)}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups <= 0:
        raise ValueError(f"{op}: num_groups must be a positive int, got {num_groups!r}")
    channels = Dim(shape[1])
    if not isinstance(channels, StaticDim) or int(channels) % num_groups:
        raise ValueError(
            f"{op}: the {shape[1]} channels of input {format_shape(shape)} must be a static multiple of "
            f"num_groups={num_groups}"
        )
    for name, t in (("gamma", gamma), ("beta", beta)):
        if len(t.shape) != 1 or Dim(t.shape[0]) != channels:
            raise ValueError(
                f"{op}: {name} must have shape [{channels}] (the channels of input {format_shape(shape)}), got "
                f"{format_shape(t.shape)}"
            )
    x32 = _float32(input)
    grouped = reshape(x32, [shape[0], num_groups, -1])
    centered = sub(grouped, mean(grouped, -1))
    normed = reshape(mul(centered, rsqrt(add(mean(mul(centered, centered), -1), eps))), shape)
    per_channel = [int(channels)] + [1] * (len(shape) - 2)
    out = add(mul(normed, reshape(_float32(gamma), per_channel)), reshape(_float32(beta), per_channel))
    return out if dtype_of(input) is DType.float32 else cast(out, dtype_of(input))
