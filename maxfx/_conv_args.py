"""Argument checks shared by the conv layers of both module APIs (``maxfx.nn`` and ``maxfx.experimental.nn``).

Sizes, strides, paddings and input layouts are normalised and checked here,
with errors that name the layer, so the graph-API and eager-Module conv
layers accept and refuse the same arguments.

Example:
    >>> conv_padding("Conv2d", 1, 2)
    (1, 1, 1, 1)
    >>> padding_1d("Conv1d", (2, 3))
    (0, 0, 2, 3)
"""

from __future__ import annotations

from typing import Any

from lowering.dims import format_shape

__all__ = ["check_conv_input", "check_groups", "check_positive", "conv_padding", "conv_tuple", "padding_1d"]


def _ints(value: Any, n: int) -> tuple[Any, ...]:
    """``value`` repeated ``n`` times if an int, its items if a tuple or list, else ``()`` (which every check
    refuses).
    """
    if isinstance(value, int):
        return (value,) * n
    return tuple(value) if isinstance(value, (tuple, list)) else ()


def conv_tuple(layer: str, name: str, value: Any, n: int, minimum: int = 1) -> tuple[int, ...]:
    """``value`` (an int or ``n`` ints) as ``n`` ints, each at least ``minimum``."""
    vals = _ints(value, n)
    if len(vals) != n or not all(isinstance(v, int) and v >= minimum for v in vals):
        raise ValueError(f"{layer}: {name} must be an int or {n} ints >= {minimum}, got {value!r}")
    return vals


def conv_padding(layer: str, value: Any, nd: int) -> tuple[int, ...]:
    """Padding as ``2 * nd`` ints ``(before_0, after_0, before_1, ...)``; an int or ``nd`` ints pad both sides."""
    vals = _ints(value, nd)
    if len(vals) == nd:
        vals = tuple(v for p in vals for v in (p, p))
    if len(vals) != 2 * nd or not all(isinstance(v, int) and v >= 0 for v in vals):
        raise ValueError(f"{layer}: padding must be an int, {nd} ints or {2 * nd} ints >= 0, got {value!r}")
    return vals


def check_positive(layer: str, **sizes: Any) -> None:
    """Raise a ValueError naming ``layer`` and the first of ``sizes`` that is not a positive int."""
    for what, v in sizes.items():
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{layer}: {what} must be a positive int, got {v!r}")


def check_groups(layer: str, in_channels: int, out_channels: int, num_groups: int) -> None:
    """Raise a ValueError naming ``layer`` unless the channel counts and ``num_groups`` are positive and divisible."""
    check_positive(layer, in_channels=in_channels, out_channels=out_channels, num_groups=num_groups)
    if in_channels % num_groups or out_channels % num_groups:
        raise ValueError(
            f"{layer}: in_channels={in_channels} and out_channels={out_channels} must both be divisible by "
            f"num_groups={num_groups}"
        )


_INPUT_DOC = {1: ("(N, L, C)", "(N, C, L)"), 2: ("NHWC", "NCHW"), 3: ("NDHWC", "NCDHW")}


def check_conv_input(layer: str, x: Any, nd: int, in_channels: int | None, channels_first: bool) -> None:
    """Raise a ValueError naming ``layer`` unless ``x`` is a rank ``nd + 2`` float value with ``in_channels``
    channels.
    """
    layout = _INPUT_DOC[nd][1 if channels_first else 0]
    if x.rank != nd + 2:
        raise ValueError(f"{layer}: expected a rank-{nd + 2} {layout} input, got shape {format_shape(x.shape)}")
    c = x.shape[1 if channels_first else -1]
    if in_channels is not None and str(c) != str(in_channels):
        raise ValueError(
            f"{layer}: the input {format_shape(x.shape)} ({layout}) has {c} channels, expected "
            f"in_channels={in_channels}"
        )


def padding_1d(layer: str, value: Any) -> tuple[int, int, int, int]:
    vals = (0, 0, value, value) if isinstance(value, int) else _ints(value, 0)
    if len(vals) == 2:  # (left, right) along the length
        vals = (0, 0, *vals)
    if len(vals) != 4 or not all(isinstance(v, int) and v >= 0 for v in vals) or vals[0] or vals[1]:
        raise ValueError(
            f"{layer}: padding must be an int, (left, right) or (0, 0, left, right) of ints >= 0, got {value!r}"
        )
    return vals
