"""Eager Module-API convolution layers (``max.experimental.nn.conv``).

`Conv1d`, `Conv2d` and `Conv3d` convolve; `ConvTranspose1d` and
`ConvTranspose2d` are their transposes (``max.experimental.nn.conv_transpose``
in MAX; `maxfx.experimental.nn.conv_transpose` re-exports the 2-D one).

The weights are eager Tensors drawn from a standard normal (MAX's default
initialisation; load real values with ``load_state_dict``), named ``weight``
and, with ``has_bias=True``, ``bias`` (otherwise ``bias`` is the literal ``0``
and not a parameter). The convolutions are `maxfx._conv_math`'s, the
graph layers' math, so the layers run eagerly, under ``jax.jit`` and inside
`Module.compile` alike.

Layouts are MAX's, chosen by ``permute``:

- ``permute=False``: channels-last inputs and outputs (``(N, L, C)``, NHWC,
  NDHWC) and spatial-first filters (``(K, C_in/groups, C_out)``, RSCF
  ``(kH, kW, C_in/groups, C_out)``, QRSCF ``(kD, kH, kW, C_in/groups, C_out)``;
  ``(*kernel, C_out, C_in/groups)`` for the transposed convs).
- ``permute=True``: PyTorch's layouts, so PyTorch checkpoints load as they
  are: channels-first inputs and outputs (``(N, C, L)``, NCHW, NCDHW) and
  filters ``(C_out, C_in/groups, *kernel)`` (``(C_in, C_out/groups, *kernel)``
  for the transposed convs).

The 1-D layers default to ``permute=True`` and the others to
``permute=False``, as in MAX. A 1-D convolution runs as a 2-D one over a unit
height.

Example:
    >>> from maxfx.experimental.nn.conv import Conv1d
    >>> from maxfx.experimental.tensor import Tensor
    >>> conv = Conv1d(in_channels=4, out_channels=8, kernel_size=3, padding="same", has_bias=True)
    >>> {name: [int(d) for d in t.shape] for name, t in conv.parameters}
    {'weight': [8, 4, 3], 'bias': [8]}
    >>> conv(Tensor.ones([2, 4, 10])).shape
    [Dim(2), Dim(8), Dim(10)]
"""

from __future__ import annotations

from typing import Any, Literal

from lowering.dtypes import DType
from maxfx._conv_args import check_conv_input, check_groups, conv_padding, conv_tuple, padding_1d
from maxfx._conv_math import conv, conv_transpose
from maxfx.experimental import random
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn.module import Module

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d"]


# ─── shared helpers ──────────────────────────────────────────────────────


def _int_1d(layer: str, name: str, value: Any, minimum: int) -> int:
    """A 1-D setting (an int, or one int in a sequence) as an int of at least ``minimum``."""
    if isinstance(value, bool):
        raise ValueError(f"{layer}: {name} must be an int >= {minimum}, got {value!r}")
    return conv_tuple(layer, name, value, 1, minimum)[0]


def _setup_1d(
    module: Module,
    in_channels: int,
    out_channels: int,
    kernel_size: Any,
    dtype: DType | None,
    stride: Any,
    dilation: Any,
    num_groups: int,
    has_bias: bool,
    permute: bool,
    name: str | None,
) -> None:
    """The settings `Conv1d` and `ConvTranspose1d` share, checked and stored (weights and padding are each layer's
    own).
    """
    layer = type(module).__name__
    check_groups(layer, in_channels, out_channels, num_groups)
    module.in_channels, module.out_channels, module.num_groups = in_channels, out_channels, num_groups
    module.kernel_size = _int_1d(layer, "kernel_size", kernel_size, 1)
    module.dtype, module.permute, module.has_bias, module.name = dtype, bool(permute), bool(has_bias), name
    module.stride = _int_1d(layer, "stride", stride, 1)
    module.dilation = _int_1d(layer, "dilation", dilation, 1)


def _setup_nd(
    module: Module,
    nd: int,
    kernel_size: Any,
    in_channels: int,
    out_channels: int,
    num_groups: int,
    dtype: DType | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    has_bias: bool,
    permute: bool,
    name: str | None,
) -> None:
    """The settings of `Conv2d`, `Conv3d` and `ConvTranspose2d`, checked and stored as MAX stores them.

    ``kernel_size``, ``stride`` and ``dilation`` become ``nd``-tuples and
    ``padding`` the ``2 * nd`` form ``(before_0, after_0, before_1, ...)``; all
    are checked before any weight is drawn. ``num_groups`` is checked here but
    stored by the layers that have it.
    """
    layer = type(module).__name__
    check_groups(layer, in_channels, out_channels, num_groups)
    module.in_channels, module.out_channels = in_channels, out_channels
    module.dtype, module.permute, module.has_bias, module.name = dtype, bool(permute), bool(has_bias), name
    module.kernel_size = conv_tuple(layer, "kernel_size", kernel_size, nd)
    module.stride = conv_tuple(layer, "stride", stride, nd)
    module.padding = conv_padding(layer, padding, nd)
    module.dilation = conv_tuple(layer, "dilation", dilation, nd)


def _init_params(
    module: Module, shape: list[int], out_channels: int, has_bias: bool, dtype: DType | None, device: Any
) -> None:
    """MAX's initialisation: ``weight`` of ``shape`` and (with ``has_bias``) ``bias`` of ``[out_channels]``, both
    standard normal.
    """
    module.weight = random.normal(shape, dtype=dtype, device=device)
    module.bias = random.normal([out_channels], dtype=dtype, device=device) if has_bias else 0
    module.device = module.weight.device


def _on(t: Any, x: Tensor) -> Any:
    """``t`` (a Tensor, or the ``0`` of an absent bias) on ``x``'s device."""
    if not isinstance(t, Tensor) or t.device == x.device:
        return t
    return t.to(x.device)


def _bias(module: Module, x: Tensor) -> Tensor | None:
    return _on(module.bias, x) if isinstance(module.bias, Tensor) else None


class _ConvNd(Module):
    """Conv2d and Conv3d: one construction (MAX's signature, the same for both) and one forward over ``_nd``
    spatial dims.
    """

    _nd: int

    def __init__(
        self,
        kernel_size: int | tuple[int, ...],
        in_channels: int,
        out_channels: int,
        dtype: DType | None = None,
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] = 0,
        dilation: int | tuple[int, ...] = 1,
        num_groups: int = 1,
        device: Any = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
    ) -> None:
        """Kernel size, stride and dilation: an int or ``_nd`` ints; padding: an int, ``_nd`` or ``2 * _nd`` ints."""
        args = (in_channels, out_channels, num_groups, dtype, stride, padding, dilation, has_bias, permute, name)
        _setup_nd(self, self._nd, kernel_size, *args)
        self.num_groups = num_groups
        cin = in_channels // num_groups
        shape = [out_channels, cin, *self.kernel_size] if permute else [*self.kernel_size, cin, out_channels]
        _init_params(self, shape, out_channels, has_bias, dtype, device)

    def forward(self, x: Tensor) -> Tensor:
        """Channels-last ``[N, *spatial, in_channels]`` -> ``[N, *spatial', out_channels]`` (both channels-first with
        ``permute``).

        Raises:
            ValueError: ``x`` has the wrong rank or channel count, or the output would be empty.
        """
        check_conv_input(type(self).__name__, x, self._nd, self.in_channels, self.permute)
        weight, bias = _on(self.weight, x), _bias(self, x)
        return conv(x, weight, bias, self.stride, self.dilation, self.padding, self.num_groups, self.permute)


# ─── Conv2d ──────────────────────────────────────────────────────────────


class Conv2d(_ConvNd):
    """A 2D convolution layer over NHWC inputs (NCHW with ``permute=True``).

    ``weight`` is RSCF ``[kernel_height, kernel_width, in_channels // num_groups,
    out_channels]``, or PyTorch's ``[out_channels, in_channels // num_groups,
    kernel_height, kernel_width]`` with ``permute=True``. ``padding`` is an int,
    ``(pad_h, pad_w)`` or ``(top, bottom, left, right)`` and is stored as the
    four-int form; ``stride``/``dilation`` are stored as ``(h, w)`` pairs.

    Example:
        >>> from maxfx.experimental.nn.conv import Conv2d
        >>> from maxfx.experimental.tensor import Tensor
        >>> conv = Conv2d(kernel_size=3, in_channels=3, out_channels=16, padding=1, has_bias=True, permute=True)
        >>> [int(d) for d in conv.weight.shape], conv.padding
        ([16, 3, 3, 3], (1, 1, 1, 1))
        >>> conv(Tensor.ones([1, 3, 8, 8])).shape
        [Dim(1), Dim(16), Dim(8), Dim(8)]
    """

    weight: Tensor
    bias: Tensor | Literal[0]
    _nd = 2


# ─── Conv3d ──────────────────────────────────────────────────────────────


class Conv3d(_ConvNd):
    """A 3D convolution layer over NDHWC inputs (NCDHW with ``permute=True``).

    ``weight`` is QRSCF ``[kernel_depth, kernel_height, kernel_width,
    in_channels // num_groups, out_channels]``, or PyTorch's ``[out_channels,
    in_channels // num_groups, kernel_depth, kernel_height, kernel_width]`` with
    ``permute=True``. ``padding`` is an int, ``(pad_d, pad_h, pad_w)`` or
    ``(d_before, d_after, h_before, h_after, w_before, w_after)`` and is stored
    as the six-int form; ``kernel_size``/``stride``/``dilation`` are stored as
    ``(d, h, w)`` triples.

    Example:
        >>> from maxfx.experimental.nn.conv import Conv3d
        >>> from maxfx.experimental.tensor import Tensor
        >>> conv = Conv3d(kernel_size=3, in_channels=4, out_channels=8, padding=(0, 1, 1), has_bias=True, permute=True)
        >>> [int(d) for d in conv.weight.shape], conv.padding
        ([8, 4, 3, 3, 3], (0, 0, 1, 1, 1, 1))
        >>> conv(Tensor.ones([1, 4, 5, 6, 6])).shape
        [Dim(1), Dim(8), Dim(3), Dim(6), Dim(6)]
    """

    weight: Tensor
    bias: Tensor | Literal[0]
    _nd = 3


# ─── Conv1d ──────────────────────────────────────────────────────────────


class Conv1d(Module):
    """A 1D convolution layer over ``[N, C, L]`` inputs (``[N, L, C]`` with ``permute=False``).

    ``weight`` is ``[out_channels, in_channels // num_groups, kernel_size]``
    (``[kernel_size, in_channels // num_groups, out_channels]`` with
    ``permute=False``). ``padding`` is an int, ``(left, right)`` or ``"same"``
    (``dilation * (kernel_size - 1)`` zeros split as evenly as possible, the odd
    one on the right; the output keeps the input length when ``stride=1``). It
    is stored, as in MAX, as the 2-D form ``(0, 0, left, right)``.

    Example:
        >>> from maxfx.experimental.nn.conv import Conv1d
        >>> from maxfx.experimental.tensor import Tensor
        >>> conv = Conv1d(in_channels=16, out_channels=32, kernel_size=3, stride=2, padding=1)
        >>> conv.padding
        (0, 0, 1, 1)
        >>> conv(Tensor.ones([1, 16, 64])).shape
        [Dim(1), Dim(32), Dim(32)]
    """

    weight: Tensor
    bias: Tensor | Literal[0]

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        dtype: DType | None = None,
        stride: int = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int = 1,
        num_groups: int = 1,
        device: Any = None,
        has_bias: bool = False,
        permute: bool = True,
        name: str | None = None,
    ) -> None:
        layer = "Conv1d"
        _setup_1d(
            self, in_channels, out_channels, kernel_size, dtype, stride, dilation, num_groups, has_bias, permute, name
        )
        if isinstance(padding, str):
            if padding != "same":
                raise ValueError(f"Conv1d only supports padding='same' or an integer/tuple, got {padding!r}")
            total = self.dilation * (self.kernel_size - 1)
            self.padding = (0, 0, total // 2, total - total // 2)
        else:
            self.padding = padding_1d(layer, padding)
        k = self.kernel_size
        shape = (
            [out_channels, in_channels // num_groups, k] if permute else [k, in_channels // num_groups, out_channels]
        )
        _init_params(self, shape, out_channels, has_bias, dtype, device)

    def forward(self, x: Tensor) -> Tensor:
        """``[N, in_channels, L]`` -> ``[N, out_channels, L']`` (channels-last with ``permute=False``).

        The weight is cast to ``x``'s dtype, as in MAX.

        Raises:
            ValueError: ``x`` is not rank 3 or has the wrong channel count, or the output would be empty.
        """
        check_conv_input("Conv1d", x, 1, self.in_channels, self.permute)
        weight = _on(self.weight, x).cast(x.dtype)
        stride, dilation = (1, self.stride), (1, self.dilation)
        return conv(x, weight, _bias(self, x), stride, dilation, self.padding, self.num_groups, self.permute)


# ─── ConvTranspose1d ─────────────────────────────────────────────────────


class ConvTranspose1d(Module):
    """A 1D transposed convolution layer over ``[N, C_in, L]`` inputs (``[N, L, C_in]`` with ``permute=False``).

    ``weight`` is PyTorch's ``[in_channels, out_channels // num_groups,
    kernel_size]``, or ``[kernel_size, out_channels, in_channels // num_groups]``
    with ``permute=False``. The output length is ``(L - 1) * stride - left -
    right + dilation * (kernel_size - 1) + 1 + output_padding``: ``padding``
    (an int or ``(left, right)``) is cropped from the output, ``output_padding``
    (smaller than ``stride`` or ``dilation``) added at its end. As in MAX,
    ``padding`` is stored as ``(0, 0, left, right)`` and ``output_padding`` as
    ``(0, output_padding)``.

    Example:
        >>> from maxfx.experimental.nn.conv import ConvTranspose1d
        >>> from maxfx.experimental.tensor import Tensor
        >>> up = ConvTranspose1d(in_channels=16, out_channels=8, kernel_size=4, stride=2, padding=1)
        >>> [int(d) for d in up.weight.shape]
        [16, 8, 4]
        >>> up(Tensor.ones([1, 16, 32])).shape
        [Dim(1), Dim(8), Dim(64)]
    """

    weight: Tensor
    bias: Tensor | Literal[0]

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        dtype: DType | None = None,
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
        output_padding: int = 0,
        dilation: int = 1,
        num_groups: int = 1,
        device: Any = None,
        has_bias: bool = False,
        permute: bool = True,
        name: str | None = None,
    ) -> None:
        layer = "ConvTranspose1d"
        _setup_1d(
            self, in_channels, out_channels, kernel_size, dtype, stride, dilation, num_groups, has_bias, permute, name
        )
        self.padding = padding_1d(layer, padding)
        op = _int_1d(layer, "output_padding", output_padding, 0)
        if op >= self.stride and op >= self.dilation:
            raise ValueError(
                f"{layer}: output_padding must be smaller than stride or dilation, got output_padding={op} with "
                f"stride={self.stride}, dilation={self.dilation}"
            )
        self.output_padding = (0, op)
        k = self.kernel_size
        shape = (
            [in_channels, out_channels // num_groups, k] if permute else [k, out_channels, in_channels // num_groups]
        )
        _init_params(self, shape, out_channels, has_bias, dtype, device)

    def forward(self, x: Tensor) -> Tensor:
        """``[N, in_channels, L]`` -> ``[N, out_channels, L']`` (channels-last with ``permute=False``).

        The weight is cast to ``x``'s dtype, as in MAX. With ``num_groups > 1``
        each group of input channels is transposed-convolved with its own slice
        of the weight and the results are concatenated (PyTorch's grouping).

        Raises:
            ValueError: ``x`` is not rank 3 or has the wrong channel count, or the output would be empty.
        """
        check_conv_input("ConvTranspose1d", x, 1, self.in_channels, self.permute)
        weight = _on(self.weight, x).cast(x.dtype)
        stride, dilation = (1, self.stride), (1, self.dilation)
        settings = (stride, dilation, self.padding, self.output_padding, self.permute, self.num_groups)
        return conv_transpose(x, weight, _bias(self, x), *settings)


# ─── ConvTranspose2d ─────────────────────────────────────────────────────


class ConvTranspose2d(Module):
    """A 2D transposed convolution layer over NHWC inputs (NCHW with ``permute=True``).

    ``weight`` is RSCF ``[kernel_height, kernel_width, out_channels,
    in_channels]``, or PyTorch's ``[in_channels, out_channels, kernel_height,
    kernel_width]`` with ``permute=True``; as in MAX there are no groups. Each
    output size is ``(H - 1) * stride - before - after + dilation * (k - 1) + 1
    + output_padding``: ``padding`` (an int, ``(pad_h, pad_w)`` or ``(top,
    bottom, left, right)``, stored as the four-int form) is cropped from the
    output and ``output_padding`` (an int or ``(h, w)``, each smaller than its
    stride or its dilation) added at the bottom/right. Positionally
    ``dilation`` comes before ``output_padding``, as in MAX (`ConvTranspose1d`
    has them the other way round).

    Example:
        >>> from maxfx.experimental.nn.conv import ConvTranspose2d
        >>> from maxfx.experimental.tensor import Tensor
        >>> up = ConvTranspose2d(kernel_size=4, in_channels=8, out_channels=4, stride=2, padding=1, permute=True)
        >>> [int(d) for d in up.weight.shape], up.padding, up.output_padding
        ([8, 4, 4, 4], (1, 1, 1, 1), (0, 0))
        >>> up(Tensor.ones([1, 8, 5, 6])).shape
        [Dim(1), Dim(4), Dim(10), Dim(12)]
    """

    weight: Tensor
    bias: Tensor | Literal[0]

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        in_channels: int,
        out_channels: int,
        dtype: DType | None = None,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | tuple[int, int, int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        output_padding: int | tuple[int, int] = 0,
        device: Any = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
    ) -> None:
        layer = "ConvTranspose2d"
        args = (in_channels, out_channels, 1, dtype, stride, padding, dilation, has_bias, permute, name)
        _setup_nd(self, 2, kernel_size, *args)
        op = conv_tuple(layer, "output_padding", output_padding, 2, 0)
        for o, s, d in zip(op, self.stride, self.dilation):
            if o >= s and o >= d:
                raise ValueError(
                    f"{layer}: each output_padding must be smaller than its stride or its dilation, got "
                    f"output_padding={op} with stride={self.stride}, dilation={self.dilation}"
                )
        self.output_padding = op
        shape = (
            [in_channels, out_channels, *self.kernel_size]
            if permute
            else [*self.kernel_size, out_channels, in_channels]
        )
        _init_params(self, shape, out_channels, has_bias, dtype, device)

    def forward(self, x: Tensor) -> Tensor:
        """``[N, H, W, in_channels]`` -> ``[N, H', W', out_channels]`` (both channels-first with ``permute``).

        Raises:
            ValueError: ``x`` is not rank 4 or has the wrong channel count, or the padding crops the output to nothing.
        """
        check_conv_input("ConvTranspose2d", x, 2, self.in_channels, self.permute)
        settings = (self.stride, self.dilation, self.padding, self.output_padding, self.permute)
        return conv_transpose(x, _on(self.weight, x), _bias(self, x), *settings)
