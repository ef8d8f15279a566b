"""Graph-API transposed 1-D convolutions: `ConvTranspose1d` and `WeightNormConvTranspose1d`.

Both run ``ops.conv2d_transpose`` over a unit height. The weight is stored as
``(kernel_length, out_channels, in_channels)``; with ``permute=True`` it is
PyTorch's ConvTranspose1d weight ``(in_channels, out_channels, kernel_length)``
and inputs/outputs are channels-first ``(N, C, L)``.

Example:
    >>> from maxfx import nn
    >>> from maxfx.dtype import DType
    >>> up = nn.ConvTranspose1d(4, in_channels=8, out_channels=3, dtype=DType.float32, stride=2)
    >>> [int(d) for d in up.weight.shape]
    [4, 3, 8]
"""

from __future__ import annotations

from typing import Any

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx._conv_args import check_conv_input, check_positive, conv_tuple, padding_1d
from maxfx._conv_math import conv_transpose
from maxfx.graph import ops
from maxfx.graph._weight import Weight
from maxfx.nn._conv import _new_weights, _on
from maxfx.nn._graph_util import as_value as _as_value
from maxfx.nn._graph_util import device_ref
from maxfx.nn._layer import Module

__all__ = ["ConvTranspose1d", "WeightNormConvTranspose1d"]


def _pair_1d(layer: str, name: str, value: Any, minimum: int) -> tuple[int, int]:
    """MAX's 2-D form of a 1-D setting: an int ``v`` is ``(neutral, v)`` (the unit height dim first)."""
    neutral = 1 if minimum >= 1 else 0
    return conv_tuple(layer, name, (neutral, value) if isinstance(value, int) else value, 2, minimum)


class ConvTranspose1d(Module):
    """A 1D transposed convolution operator over an input image composed of several input planes.

    Output length ``(L - 1) * stride - left - right + dilation * (length - 1) + 1 + output_padding``.
    ``stride``, ``dilation`` and ``output_padding`` are stored as MAX's 2-D
    pairs ``(1, v)``/``(0, v)``; ``padding`` as ``(0, 0, left, right)``.

    Example:
        >>> up = ConvTranspose1d(3, 4, 2, DType.float32, stride=2, padding=1, output_padding=1)
        >>> up.stride, up.padding, up.output_padding
        ((1, 2), (0, 0, 1, 1), (0, 1))
    """

    weight: Weight  # [in_channels, out_channels, 1, kernel_size] (MAX's transposed-conv layout)
    bias: Weight | None

    def __init__(
        self,
        length: int,
        in_channels: int,
        out_channels: int,
        dtype: DType,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int, int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        output_padding: int | tuple[int, int] = 0,
        device: Any = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__()
        layer = type(self).__name__
        check_positive(layer, length=length, in_channels=in_channels, out_channels=out_channels)
        self.kernel_length, self.in_channels, self.out_channels = length, in_channels, out_channels
        self.device = device_ref(device)
        self.permute = bool(permute)
        self.stride = _pair_1d(layer, "stride", stride, 1)
        self.dilation = _pair_1d(layer, "dilation", dilation, 1)
        self.output_padding = _pair_1d(layer, "output_padding", output_padding, 0)
        self.padding = padding_1d(layer, padding)
        shape = [in_channels, out_channels, length] if permute else [length, out_channels, in_channels]
        self.weight, self.bias = _new_weights(name, dtype, shape, out_channels, has_bias)

    def _apply(self, x: Any, weight: Any, bias: Any) -> Any:
        x = _as_value(x)
        check_conv_input(type(self).__name__, x, 1, self.in_channels, self.permute)
        settings = (self.stride, self.dilation, self.padding, self.output_padding, self.permute)
        return conv_transpose(x, weight, bias, *settings)

    def __call__(self, x: Any) -> Any:
        """``(batch, length, in_channels)`` -> ``(batch, new_length, out_channels)`` (channels-first with
        ``permute``).
        """
        return self._apply(x, _on(self.weight, self.device), _on(self.bias, self.device))


class WeightNormConvTranspose1d(Module):
    """A `ConvTranspose1d` whose weight is ``g * v / ||v||`` (weight normalization, arXiv:1602.07868).

    ``weight_g`` is ``(in_channels, 1, 1)`` (PyTorch's ``weight_norm`` over
    dim 0 of ``(in, out, length)``); ``weight_v`` has the layer's weight shape;
    the norm of ``v`` is taken per input channel.

    Example:
        >>> wn = WeightNormConvTranspose1d(3, 4, 2, DType.float32, has_bias=True)
        >>> sorted(wn.state_dict())
        ['bias', 'weight_g', 'weight_v']
    """

    def __init__(
        self,
        length: int,
        in_channels: int,
        out_channels: int,
        dtype: DType,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int, int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        output_padding: int | tuple[int, int] = 0,
        device: Any = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__()
        conv = ConvTranspose1d(
            length,
            in_channels,
            out_channels,
            dtype,
            stride,
            padding,
            dilation,
            output_padding,
            device,
            has_bias,
            permute,
            name,
        )
        self.device = conv.device
        prefix = f"{name}." if name else ""
        self.weight_g = Weight(prefix + "weight_g", dtype, [in_channels, 1, 1], DeviceRef.CPU())
        self.weight_v = Weight(prefix + "weight_v", dtype, [int(d) for d in conv.weight.shape], DeviceRef.CPU())
        self.bias = conv.bias
        # The conv only supplies geometry; its weight is recomputed from g and v on every call.
        conv.weight = None
        conv.bias = None
        self.conv = conv

    def _weight(self) -> Any:
        v = _on(self.weight_v, self.device)
        g = _on(self.weight_g, self.device)
        if not self.conv.permute:  # v is (length, out, in): the per-input-channel scale goes last
            g = ops.reshape(g, [1, 1, self.conv.in_channels])
        reduce_axes = (1, 2) if self.conv.permute else (0, 1)
        sq = ops.sum(ops.sum(v * v, axis=reduce_axes[1]), axis=reduce_axes[0])
        return v * (g * ops.rsqrt(sq))

    def __call__(self, x: Any) -> Any:
        """The transposed convolution of ``x`` with the normalized weight."""
        return self.conv._apply(x, self._weight(), _on(self.bias, self.device))
