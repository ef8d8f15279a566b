"""Graph-API convolution layers: `Conv1D`, `Conv2d`, `Conv3D` and the deprecated V1 forms.

Layouts follow ``ops.conv2d``/``ops.conv3d``: inputs are channels-last
(``(N, L, C)``, NHWC, NDHWC) and filters are stored spatial-first
(``(k, C_in/groups, C_out)``, RSCF, QRSCF). With ``permute=True`` the layer
takes PyTorch layouts instead: inputs and outputs channels-first and the
filter ``(C_out, C_in/groups, *kernel)``, so PyTorch checkpoints load as they are.
A 1-D convolution is a 2-D one over a unit height.

Example:
    >>> from maxfx import nn
    >>> from maxfx.dtype import DType
    >>> conv = nn.Conv2d(3, in_channels=4, out_channels=8, dtype=DType.float32, padding=1)
    >>> [int(d) for d in conv.filter.shape]
    [3, 3, 4, 8]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lowering.dims import format_shape
from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx._conv_args import check_conv_input, check_groups, conv_padding, conv_tuple
from maxfx._conv_math import conv
from maxfx.graph._weight import Weight
from maxfx.nn._graph_util import as_value as _as_value
from maxfx.nn._graph_util import device_ref
from maxfx.nn._graph_util import on_device as _on
from maxfx.nn._layer import Layer, Module, Shardable

__all__ = ["Conv1D", "Conv2d", "Conv3D", "Conv1DV1", "Conv2dV1", "Conv3DV1", "conv_tuple", "conv_padding"]


# ─── argument normalisation ───────────────────────────────────────────────


def _new_weights(
    name: str | None, dtype: DType, shape: list[int], out_channels: int, has_bias: bool
) -> tuple[Weight, Weight | None]:
    """The layer's ``weight`` of ``shape`` and, with ``has_bias``, its ``(out_channels,)`` ``bias`` (names prefixed by
    ``name.``).
    """
    prefix = f"{name}." if name else ""
    bias = Weight(prefix + "bias", dtype, [out_channels], DeviceRef.CPU()) if has_bias else None
    return Weight(prefix + "weight", dtype, shape, DeviceRef.CPU()), bias


# ─── layers ───────────────────────────────────────────────────────────────


class _ConvND(Module):
    """Shared body of `Conv1D`/`Conv2d`/`Conv3D`: one Weight ``filter`` (+ ``bias``) and an ``ops.conv*`` call."""

    _nd = 2
    _kernel_what = "kernel_size"  # the kernel argument, as errors name it
    filter: Weight  # noqa: A003 - MAX's name; the kernel, laid out RSCF (QRSCF for 3D)
    bias: Weight | None

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        in_channels: int,
        out_channels: int,
        dtype: DType,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | tuple[int, int, int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        num_groups: int = 1,
        device: Any = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
    ) -> None:
        """`Conv2d`'s signature (`Conv3D` passes its kernel as a tuple): the geometry as ``_nd``-tuples, then the
        weights.
        """
        super().__init__()
        layer, nd = type(self).__name__, self._nd
        self.kernel_size = conv_tuple(layer, self._kernel_what, kernel_size, nd)
        self.stride = conv_tuple(layer, "stride", stride, nd)
        self.padding = conv_padding(layer, padding, nd)
        self.dilation = conv_tuple(layer, "dilation", dilation, nd)
        self._setup(self.kernel_size, in_channels, out_channels, dtype, num_groups, device, has_bias, permute, name)

    def _setup(
        self,
        kernel: tuple[int, ...],
        in_channels: int,
        out_channels: int,
        dtype: DType,
        num_groups: int,
        device: Any,
        has_bias: bool,
        permute: bool,
        name: str | None,
    ) -> None:
        layer = type(self).__name__
        check_groups(layer, in_channels, out_channels, num_groups)
        self.in_channels, self.out_channels, self.num_groups = in_channels, out_channels, num_groups
        self.device = device_ref(device)
        self.permute = bool(permute)
        shape = (
            [out_channels, in_channels // num_groups, *kernel]
            if permute
            else [*kernel, in_channels // num_groups, out_channels]
        )
        self.filter, self.bias = _new_weights(name, dtype, shape, out_channels, has_bias)

    def __call__(self, x: Any) -> Any:
        """Convolve ``x`` (channels-last, or channels-first with ``permute``); the output has the input's layout."""
        x = _as_value(x)
        check_conv_input(type(self).__name__, x, self._nd, self.in_channels, self.permute)
        filt, bias = self._weights_on_device()
        return conv(x, filt, bias, self.stride, self.dilation, self.padding, self.num_groups, self.permute)

    def _weights_on_device(self) -> tuple[Any, Any]:
        return _on(self.filter, self.device), _on(self.bias, self.device)


class Conv1D(_ConvND):
    """A 1D convolution over an input signal composed of several input planes.

    Input ``(batch, length, in_channels)`` (``(batch, in_channels, length)``
    with ``permute=True``); ``filter`` is ``(kernel_size, in_channels/num_groups,
    out_channels)`` (PyTorch's ``(out, in/groups, kernel_size)`` with ``permute``).
    Like `Conv1DV1`, existing values can be passed as ``filter=``/``bias=``
    keywords instead of the sizes (the form seed 002's conv example uses).

    Example:
        >>> conv = Conv1D(3, 16, 32, DType.float32, padding=1, has_bias=True)
        >>> sorted(conv.state_dict())  # checkpoint names: the filter is stored as 'weight'
        ['bias', 'weight']
    """

    _nd = 1

    def __init__(
        self,
        kernel_size: int | None = None,
        in_channels: int | None = None,
        out_channels: int | None = None,
        dtype: DType | None = None,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        num_groups: int = 1,
        device: Any = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
        *,
        filter: Any = None,  # noqa: A002 - MAX's name
        bias: Any = None,
    ) -> None:
        Module.__init__(self)  # not _ConvND's: a 1-D kernel and the filter=/bias= form
        self.stride = conv_tuple("Conv1D", "stride", stride, 1)[0]
        self.dilation = conv_tuple("Conv1D", "dilation", dilation, 1)[0]
        pad = conv_padding("Conv1D", padding, 1)
        self.padding = pad[0] if pad[0] == pad[1] else pad
        if filter is not None:
            self._adopt(filter, bias, num_groups, device, permute)
            return
        if None in (kernel_size, in_channels, out_channels, dtype):
            raise TypeError(
                "Conv1D: pass kernel_size, in_channels, out_channels and dtype (or existing values as filter=/bias=)"
            )
        kernel = conv_tuple("Conv1D", "kernel_size", kernel_size, 1)
        self._setup(kernel, in_channels, out_channels, dtype, num_groups, device, has_bias, permute, name)

    def _adopt(self, filt: Any, bias: Any, num_groups: int, device: Any, permute: bool) -> None:
        shape = [int(d) for d in filt.shape]
        if len(shape) != 3:
            raise ValueError(f"Conv1D: filter must have rank 3, got shape {shape}")
        out_c, in_per_group = (shape[0], shape[1]) if permute else (shape[2], shape[1])
        self.in_channels, self.out_channels, self.num_groups = in_per_group * num_groups, out_c, num_groups
        self.device, self.permute = (
            device_ref(device if device is not None else getattr(filt, "device", None)),
            bool(permute),
        )
        self.filter, self.bias = filt, bias

    def __call__(self, x: Any) -> Any:
        """Convolve ``x``; returns ``(batch, new_length, out_channels)`` (channels-first with ``permute``)."""
        x = _as_value(x)
        check_conv_input("Conv1D", x, 1, self.in_channels, self.permute)
        filt, bias = self._weights_on_device()
        filt, bias = _as_value(filt), (_as_value(bias) if bias is not None else None)
        stride, dilation, pad = (1, self.stride), (1, self.dilation), (0, 0, *conv_padding("Conv1D", self.padding, 1))
        return conv(x, filt, bias, stride, dilation, pad, self.num_groups, self.permute)


class Conv2d(_ConvND, Shardable):
    """A 2D convolution over an input signal composed of several input planes.

    Input NHWC, ``filter`` RSCF ``(kH, kW, in/groups, out)``; with
    ``permute=True`` NCHW and PyTorch's ``(out, in/groups, kH, kW)``.
    ``padding`` is an int, ``(pad_h, pad_w)`` or ``(top, bottom, left, right)``.

    Example:
        >>> conv = Conv2d((3, 5), 4, 8, DType.float32, stride=2, padding=(1, 2))
        >>> conv.padding
        (1, 1, 2, 2)
    """

    _nd = 2

    @property
    def sharding_strategy(self) -> Any:
        """Get the Conv2d sharding strategy (only replication is supported)."""
        return self.__dict__.get("_sharding_strategy")

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: Any) -> None:
        if strategy is not None and not strategy.is_replicate:
            raise ValueError(f"Conv2d: only replicate is supported as a sharding strategy, got {strategy}")
        self.__dict__["_sharding_strategy"] = strategy
        for w in (self.filter, self.bias):
            if w is not None:
                w.sharding_strategy = strategy

    def shard(self, devices: Iterable[Any]) -> list[Conv2d]:
        """Creates sharded views of this Conv2d layer across multiple devices (each holds the full filter)."""
        devices = list(devices)
        if self.sharding_strategy is None:
            raise ValueError(
                "Conv2d.shard: the layer has no sharding strategy; set sharding_strategy first "
                "(ShardingStrategy.replicate(n))"
            )
        filters = self.filter.shard(devices)
        biases = self.bias.shard(devices) if self.bias is not None else [None] * len(devices)
        out = []
        for dev, f, b in zip(devices, filters, biases):
            layer = Conv2d.__new__(Conv2d)
            Module.__init__(layer)
            for attr in (
                "kernel_size",
                "stride",
                "padding",
                "dilation",
                "in_channels",
                "out_channels",
                "num_groups",
                "permute",
            ):
                setattr(layer, attr, getattr(self, attr))
            layer.device, layer.filter, layer.bias = device_ref(dev), f, b
            out.append(layer)
        return out


class Conv3D(_ConvND):
    """A 3D convolution over an input signal composed of several input planes.

    Input NDHWC, ``filter`` ``(depth, height, width, in/groups, out)``; with
    ``permute=True`` NCDHW and PyTorch's ``(out, in/groups, D, H, W)``.
    ``padding`` is an int, 3 ints or ``(front, back, top, bottom, left, right)``.

    Example:
        >>> conv = Conv3D(2, 3, 3, in_channels=4, out_channels=8, dtype=DType.float32, padding=1)
        >>> [int(d) for d in conv.filter.shape]
        [2, 3, 3, 4, 8]
    """

    _nd = 3
    _kernel_what = "kernel size (depth, height, width)"

    def __init__(
        self,
        depth: int,
        height: int,
        width: int,
        in_channels: int,
        out_channels: int,
        dtype: DType,
        stride: int | tuple[int, int, int] = 1,
        padding: int | tuple[int, int, int, int, int, int] = 0,
        dilation: int | tuple[int, int, int] = 1,
        num_groups: int = 1,
        device: Any = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
    ) -> None:
        kernel = (depth, height, width)
        args = (
            in_channels,
            out_channels,
            dtype,
            stride,
            padding,
            dilation,
            num_groups,
            device,
            has_bias,
            permute,
            name,
        )
        super().__init__(kernel, *args)


# ─── deprecated value-holding forms ───────────────────────────────────────


def _v1_call(layer: Any, nd: int, x: Any) -> Any:
    """`Conv2dV1`/`Conv3DV1`: ``layer``'s settings checked and normalised, then the channels-last convolution."""
    name = type(layer).__name__
    stride = conv_tuple(name, "stride", layer.stride, nd)
    dilation = conv_tuple(name, "dilation", layer.dilation, nd)
    padding = conv_padding(name, layer.padding, nd)
    x, filt = _as_value(x), _as_value(layer.filter)
    bias = _as_value(layer.bias) if layer.bias is not None else None
    check_conv_input(name, x, nd, None, False)
    if filt.rank != nd + 2:
        raise ValueError(f"{name}: filter must have rank {nd + 2}, got shape {format_shape(filt.shape)}")
    return conv(x, filt, bias, stride, dilation, padding, layer.groups, permute=False)


@dataclass
class Conv1DV1(Layer):
    """DEPRECATED (use `Conv1D`): 1-D convolution of a ``(N, L, C)`` input with a ``(k, C/groups, out)`` filter
    value.
    """

    filter: Any  # noqa: A003 - MAX's name
    bias: Any = None
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    groups: int = 1

    def __call__(self, x: Any) -> Any:
        filt = _as_value(self.filter)
        if filt.rank != 3:
            raise ValueError(
                "Conv1DV1: filter must be (kernel_size, in_channels/groups, out_channels), got shape "
                f"{format_shape(filt.shape)}"
            )
        x = _as_value(x)
        check_conv_input("Conv1DV1", x, 1, None, False)
        bias = _as_value(self.bias) if self.bias is not None else None
        pad = (0, 0, *conv_padding("Conv1DV1", self.padding, 1))
        return conv(x, filt, bias, (1, self.stride), (1, self.dilation), pad, self.groups, permute=False)


@dataclass
class Conv2dV1(Layer):
    """DEPRECATED (use `Conv2d`): NHWC input, RSCF filter value; ``padding`` an int or ``(top, bottom, left,
    right)``.
    """

    filter: Any  # noqa: A003 - MAX's name
    bias: Any = None
    stride: int | tuple[int, int] = (1, 1)
    padding: int | tuple[int, int, int, int] = (0, 0, 0, 0)
    dilation: int | tuple[int, int] = (1, 1)
    groups: int = 1

    def __call__(self, x: Any) -> Any:
        return _v1_call(self, 2, x)


@dataclass
class Conv3DV1(Layer):
    """DEPRECATED (use `Conv3D`): NDHWC input, QRSCF filter value; ``padding`` an int or 6 ints."""

    filter: Any  # noqa: A003 - MAX's name
    bias: Any = None
    stride: int | tuple[int, int, int] = (1, 1, 1)
    padding: int | tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0)
    dilation: int | tuple[int, int, int] = (1, 1, 1)
    groups: int = 1

    def __call__(self, x: Any) -> Any:
        return _v1_call(self, 3, x)
