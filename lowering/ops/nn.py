"""Convolution, pooling, fold, ROI align and inverse real FFT (resize is in `lowering.ops.resize`).

Layouts (MAX's): activations are channels-last by default (NHWC, NDHWC for
3-D); ``input_layout=ConvInputLayout.NCHW`` makes them channels-first and the
output follows the input's layout. Filters are RSCF ``(H, W, C_in/groups,
C_out)`` (QRSCF for 3-D); ``FCRS`` is PyTorch's ``(C_out, C_in/groups, H, W)``
and ``CFRS`` is ``(C_in/groups, C_out, H, W)``. Paddings list
``(before, after)`` per spatial dim in order (``(top, bottom, left, right)``).

Output sizes follow MAX/PyTorch: ``(in + pad_before + pad_after -
dilation*(k-1) - 1) // stride + 1`` (pooling's ``ceil_mode`` rounds up).
Spatial dims may be symbolic; kernel sizes must be static.

Half-precision inputs accumulate in float32 and are cast back, like matmul.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering.context import bind
from lowering.dims import Dim, StaticDim
from lowering.dtypes import DType
from lowering.ops import _rules as R
from lowering.registry import OpDef, OpError, front, register
from lowering.types import ConvInputLayout, FilterLayout, TensorType

__all__ = [
    "conv2d",
    "conv2d_transpose",
    "conv3d",
    "max_pool2d",
    "avg_pool2d",
    "fold",
    "roi_align",
    "irfft",
    "Normalization",
]


# ─── window geometry ──────────────────────────────────────────────────────


def _window_out(op: str, size: Dim, k: int, s: int, d: int, pad: int, ceil_mode: bool, what: str) -> Dim:
    """Sliding-window output size (MAX's get_sliding_window_out_dim)."""
    span = size + pad - (d * (k - 1) + 1)
    out = (span + s - 1) // s + 1 if ceil_mode else span // s + 1
    if isinstance(out, StaticDim) and out.dim <= 0:
        raise OpError(
            f"{op}: {what} of size {size} with padding {pad} is smaller than the dilated window "
            f"({d}*({k}-1)+1 = {d * (k - 1) + 1}); the output would be empty"
        )
    return out


def _acc_dtype(dtype) -> Any:
    """float32 accumulation for narrow floats, else None (the input dtype)."""
    dt = jnp.dtype(dtype)
    return jnp.float32 if jnp.issubdtype(dt, jnp.floating) and dt.itemsize < 4 else None


def _precision(dtype) -> Any:
    return lax.Precision.HIGHEST if jnp.issubdtype(jnp.dtype(dtype), jnp.floating) else None


# ─── convolution ──────────────────────────────────────────────────────────

# Letter specs (lax.conv_general_dilated) of each layout: I = input channels of
# the filter, O = output channels.
_INPUT_SPECS = {
    (2, ConvInputLayout.NHWC): "NHWC",
    (2, ConvInputLayout.NCHW): "NCHW",
    (3, ConvInputLayout.NHWC): "NDHWC",
    (3, ConvInputLayout.NCHW): "NCDHW",
}
_FILTER_SPECS = {
    ("conv2d", FilterLayout.RSCF): "HWIO",
    ("conv2d", FilterLayout.FCRS): "OIHW",
    ("conv2d", FilterLayout.CFRS): "IOHW",
    ("conv3d", FilterLayout.QRSCF): "DHWIO",
    ("conv3d", FilterLayout.FCQRS): "OIDHW",
    # conv2d_transpose: RSCF is (H, W, C_out, C_in) and CFRS is PyTorch's
    # ConvTranspose2d weight (C_in, C_out, H, W); I is the input's channels.
    ("conv2d_transpose", FilterLayout.RSCF): "HWOI",
    ("conv2d_transpose", FilterLayout.CFRS): "IOHW",
}
_FILTER_DOCS = {
    "conv2d": "RSCF (H, W, C_in/groups, C_out), FCRS (C_out, C_in/groups, H, W) or CFRS (C_in/groups, C_out, H, W)",
    "conv3d": "QRSCF (D, H, W, C_in/groups, C_out) or FCQRS (C_out, C_in/groups, D, H, W)",
    "conv2d_transpose": "RSCF (H, W, C_out, C_in) or CFRS (C_in, C_out, H, W)",
}


def _specs(op: str, nd: int, input_layout: ConvInputLayout, filter_layout: FilterLayout) -> tuple[str, str]:
    try:
        fspec = _FILTER_SPECS[(op, filter_layout)]
    except KeyError:
        raise OpError(f"{op}: unsupported filter_layout {filter_layout}; expected {_FILTER_DOCS[op]}") from None
    return _INPUT_SPECS[(nd, input_layout)], fspec


def _conv_rule(op: str, nd: int, transpose: bool):
    def rule(
        x, filt, *bias, stride, dilation, padding, groups=1, output_paddings=None, input_layout, filter_layout
    ) -> TensorType:
        x = R.require_tensor(op, x, "input")
        f = R.require_tensor(op, filt, "filter")
        xspec, fspec = _specs(op, nd, input_layout, filter_layout)
        if x.rank != nd + 2:
            raise OpError(f"{op}: input must have rank {nd + 2} ({xspec}), got {R.fmt(x)}")
        if f.rank != nd + 2:
            raise OpError(
                f"{op}: filter must have rank {nd + 2} ({filter_layout.value}: {_FILTER_DOCS[op]}), got {R.fmt(f)}"
            )
        if x.dtype is DType.bool:
            raise OpError(f"{op}: expected numeric inputs, got {R.fmt_all([x, f])}")
        device = R.input_device(x, f, *bias)
        fdim = {c: f.shape[i] for i, c in enumerate(fspec)}
        xdim = {c: x.shape[i] for i, c in enumerate(xspec)}
        spatial = xspec.replace("N", "").replace("C", "")
        kernel = []
        for c in spatial:
            if not isinstance(fdim[c], StaticDim):
                raise OpError(f"{op}: the filter's spatial dims must be static, got {R.fmt(f)}")
            kernel.append(fdim[c].dim)
        cin, cout = xdim["C"], fdim["O"]
        # Only a provable mismatch: a symbolic channel count is checked when the graph runs (as MAX).
        if fdim["I"] * groups != cin and isinstance(fdim["I"], StaticDim) and isinstance(cin, StaticDim):
            expect = f"C_in/groups = {cin}/{groups}" if groups > 1 else f"C_in = {cin}"
            raise OpError(
                f"{op}: input channels do not match the filter: input {R.fmt(x)} ({xspec}) has {cin} channels, "
                f"filter {R.fmt(f)} ({filter_layout.value}) expects {expect} (its dim is {fdim['I']})"
            )
        if groups > 1 and isinstance(cout, StaticDim) and cout.dim % groups:
            raise OpError(f"{op}: output channels {cout} of filter {R.fmt(f)} are not divisible by groups={groups}")
        if bias:
            b = R.require_tensor(op, bias[0], "bias")
            if b.rank != 1 or b.shape[0] != cout:
                raise OpError(f"{op}: bias must have shape [{cout}] (out_channels), got {R.fmt(b)}")
        out_spatial = []
        for i, c in enumerate(spatial):
            k, s, d = kernel[i], stride[i], dilation[i]
            lo, hi = padding[2 * i], padding[2 * i + 1]
            if transpose:
                size = (xdim[c] - 1) * s - lo - hi + d * (k - 1) + 1 + output_paddings[i]
                if isinstance(size, StaticDim) and size.dim <= 0:
                    raise OpError(
                        f"{op}: output spatial dim {i} would be {size} for input {R.fmt(x)}; reduce the padding"
                    )
                out_spatial.append(size)
            else:
                out_spatial.append(_window_out(op, xdim[c], k, s, d, lo + hi, False, f"input spatial dim {c}"))
        dims = {"N": xdim["N"], "C": cout, **dict(zip(spatial, out_spatial))}
        return TensorType(x.dtype, [dims[c] for c in xspec], device)

    rule.__name__ = f"_{op}_rule"
    return rule


def _add_bias(out, bias, xspec: str):
    shape = [1] * out.ndim
    shape[xspec.index("C")] = -1
    return out + bias.astype(out.dtype).reshape(shape)


def _conv_impl(op: str, nd: int):
    def impl(x, f, *bias, stride, dilation, padding, groups=1, output_paddings=None, input_layout, filter_layout):
        xspec, fspec = _specs(op, nd, input_layout, filter_layout)
        dn = lax.conv_dimension_numbers(x.shape, f.shape, (xspec, fspec, xspec))
        acc = _acc_dtype(x.dtype)
        pads = [(padding[2 * i], padding[2 * i + 1]) for i in range(nd)]
        out = lax.conv_general_dilated(
            x,
            f,
            window_strides=stride,
            padding=pads,
            rhs_dilation=dilation,
            dimension_numbers=dn,
            feature_group_count=groups,
            precision=_precision(x.dtype),
            preferred_element_type=acc,
        )
        if bias:
            out = _add_bias(out, bias[0], xspec)
        return out.astype(x.dtype)

    return impl


def _conv_transpose_impl(
    x, f, *bias, stride, dilation, padding, output_paddings, input_layout, filter_layout, groups=1
):
    op = "conv2d_transpose"
    xspec, fspec = _specs(op, 2, input_layout, filter_layout)
    spatial = [fspec.index(c) for c in "HW"]
    ks = [f.shape[a] for a in spatial]
    # The gradient of a strided conv w.r.t. its input: dilate the input by the
    # stride and correlate with the spatially flipped kernel.
    f = jnp.flip(f, axis=spatial)
    pads = [
        (
            dilation[i] * (ks[i] - 1) - padding[2 * i],
            dilation[i] * (ks[i] - 1) - padding[2 * i + 1] + output_paddings[i],
        )
        for i in range(2)
    ]
    dn = lax.conv_dimension_numbers(x.shape, f.shape, (xspec, fspec, xspec))
    out = lax.conv_general_dilated(
        x,
        f,
        window_strides=(1, 1),
        padding=pads,
        lhs_dilation=stride,
        rhs_dilation=dilation,
        dimension_numbers=dn,
        precision=_precision(x.dtype),
        preferred_element_type=_acc_dtype(x.dtype),
    )
    if bias:
        out = _add_bias(out, bias[0], xspec)
    return out.astype(x.dtype)


conv2d_p = register(
    OpDef("conv2d", rule=_conv_rule("conv2d", 2, False), impl=_conv_impl("conv2d", 2), promote=(0, 1, 2))
)
conv3d_p = register(
    OpDef("conv3d", rule=_conv_rule("conv3d", 3, False), impl=_conv_impl("conv3d", 3), promote=(0, 1, 2))
)
conv2d_transpose_p = register(
    OpDef(
        "conv2d_transpose", rule=_conv_rule("conv2d_transpose", 2, True), impl=_conv_transpose_impl, promote=(0, 1, 2)
    )
)


def _conv_params(op: str, nd: int, stride, dilation, padding, input_layout, filter_layout) -> dict[str, Any]:
    return {
        "stride": R.int_params(op, stride, nd, "stride", minimum=1),
        "dilation": R.int_params(op, dilation, nd, "dilation", minimum=1),
        "padding": R.int_params(op, padding, 2 * nd, "padding", scalar_ok=False),
        "input_layout": R.enum_param(op, input_layout, ConvInputLayout, "input_layout"),
        "filter_layout": R.enum_param(op, filter_layout, FilterLayout, "filter_layout"),
    }


def _inputs(x, filter, bias) -> tuple:
    return (x, filter) if bias is None else (x, filter, bias)


@front(conv2d_p)
def conv2d(
    x,
    filter,
    stride=(1, 1),
    dilation=(1, 1),
    padding=(0, 0, 0, 0),
    groups=1,
    bias=None,
    input_layout=ConvInputLayout.NHWC,
    filter_layout=FilterLayout.RSCF,
):
    """2-D convolution (cross-correlation) of an NHWC input with an RSCF filter.

    Args:
        x: ``(N, H, W, C_in)`` (``(N, C_in, H, W)`` with ``input_layout=NCHW``).
        filter: ``(kH, kW, C_in/groups, C_out)`` (or per ``filter_layout``).
        stride: ``(h, w)`` step of the window.
        dilation: ``(h, w)`` spacing of the filter taps.
        padding: ``(top, bottom, left, right)`` zeros around the input.
        groups: split channels into this many independent convolutions.
        bias: optional ``(C_out,)`` added to every output position.

    Returns:
        ``(N, H_out, W_out, C_out)`` in the input's layout, with
        ``H_out = (H + top + bottom - dilation*(kH-1) - 1) // stride + 1``.

    Raises:
        ValueError: wrong ranks, channel mismatch, bad layout or an empty output.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> import numpy as np
        >>> x = Tensor(np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1))  # NHWC
        >>> w = Tensor(np.ones((2, 2, 1, 1), np.float32))  # RSCF: a 2x2 box filter
        >>> ops.conv2d(x, w)[0, :, :, 0]  # the sum of each 2x2 window
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [8.0, 12.0, 20.0, 24.0]
        >>> ops.conv2d(x, w, stride=(2, 2), padding=(1, 1, 1, 1))[0, :, :, 0]
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [0.0, 3.0, 9.0, 24.0]
    """
    params = _conv_params("conv2d", 2, stride, dilation, padding, input_layout, filter_layout)
    return bind(conv2d_p, *_inputs(x, filter, bias), groups=R.int_param("conv2d", groups, "groups", 1), **params)


@front(conv3d_p)
def conv3d(
    x,
    filter,
    stride=(1, 1, 1),
    dilation=(1, 1, 1),
    padding=(0, 0, 0, 0, 0, 0),
    groups=1,
    bias=None,
    input_layout=ConvInputLayout.NHWC,
    filter_layout=FilterLayout.QRSCF,
):
    """3-D convolution of an NDHWC input with a QRSCF filter ``(kD, kH, kW, C_in/groups, C_out)``.

    ``padding`` is ``(front, back, top, bottom, left, right)``; ``input_layout=NCHW``
    means NCDHW and ``filter_layout=FCQRS`` is PyTorch's ``(C_out, C_in/groups, kD, kH, kW)``.
    Returns ``(N, D_out, H_out, W_out, C_out)`` in the input's layout.

    Raises:
        ValueError: wrong ranks, channel mismatch, bad layout or an empty output.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> import numpy as np
        >>> x = Tensor(np.ones((1, 2, 2, 2, 1), np.float32))  # NDHWC
        >>> w = Tensor(np.ones((2, 2, 2, 1, 1), np.float32))  # QRSCF
        >>> ops.conv3d(x, w)
        TensorType(dtype=float32, shape=[Dim(1), Dim(1), Dim(1), Dim(1), Dim(1)], device=cpu:0): [8.0]
        >>> ops.conv3d(x, w, padding=(1, 1, 1, 1, 1, 1)).shape
        [Dim(1), Dim(3), Dim(3), Dim(3), Dim(1)]
    """
    params = _conv_params("conv3d", 3, stride, dilation, padding, input_layout, filter_layout)
    return bind(conv3d_p, *_inputs(x, filter, bias), groups=R.int_param("conv3d", groups, "groups", 1), **params)


@front(conv2d_transpose_p)
def conv2d_transpose(
    x,
    filter,
    stride=(1, 1),
    dilation=(1, 1),
    padding=(0, 0, 0, 0),
    output_paddings=(0, 0),
    bias=None,
    input_layout=ConvInputLayout.NHWC,
    filter_layout=FilterLayout.RSCF,
):
    """2-D transposed convolution: the gradient of ``conv2d`` w.r.t. its input.

    Args:
        x: ``(N, H, W, C_in)`` (NCHW with ``input_layout=NCHW``).
        filter: RSCF ``(kH, kW, C_out, C_in)``; ``CFRS`` is PyTorch's
            ConvTranspose2d weight ``(C_in, C_out, kH, kW)``.
        stride: ``(h, w)`` of the convolution this transposes.
        dilation: ``(h, w)`` of the convolution this transposes.
        padding: ``(top, bottom, left, right)`` removed from the output.
        output_paddings: extra rows/columns computed at the bottom/right of the
            output to pick one of the sizes a strided conv maps to the same input
            size (PyTorch's ``output_padding``); each must be smaller than its
            stride or its dilation.
        bias: optional ``(C_out,)``.

    Returns:
        ``(N, H_out, W_out, C_out)`` with ``H_out = (H-1)*stride - top - bottom
        + dilation*(kH-1) + 1 + output_padding``.

    Raises:
        ValueError: wrong ranks, channel mismatch, bad layout or output padding.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> import numpy as np
        >>> x = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32).reshape(1, 2, 2, 1))
        >>> w = Tensor(np.ones((2, 2, 1, 1), np.float32))
        >>> ops.conv2d_transpose(x, w, stride=(2, 2))[0, :, :, 0]  # each pixel becomes a 2x2 block
        ... # doctest: +NORMALIZE_WHITESPACE
        TensorType(dtype=float32, shape=[Dim(4), Dim(4)], device=cpu:0):
        [1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0]
    """
    op = "conv2d_transpose"
    params = _conv_params(op, 2, stride, dilation, padding, input_layout, filter_layout)
    ops_ = R.int_params(op, output_paddings, 2, "output_paddings")
    for i in range(2):
        if ops_[i] >= params["stride"][i] and ops_[i] >= params["dilation"][i]:
            raise OpError(
                f"{op}: output padding must be smaller than either stride or dilation, got "
                f"output_paddings={tuple(output_paddings)} with stride={params['stride']} and "
                f"dilation={params['dilation']}"
            )
    return bind(conv2d_transpose_p, *_inputs(x, filter, bias), output_paddings=ops_, **params)


# ─── pooling ──────────────────────────────────────────────────────────────


def _pool_geometry(op: str, kernel_size, stride, dilation, padding) -> dict[str, Any]:
    if isinstance(kernel_size, (str, bytes)) or not isinstance(kernel_size, Iterable) or len(tuple(kernel_size)) != 2:
        raise TypeError(f"{op}: kernel_size must be a pair (kH, kW), got {kernel_size!r}")
    kernel = tuple(Dim(k) for k in kernel_size)
    if not all(isinstance(k, StaticDim) for k in kernel):
        raise OpError(f"{op}: kernel_size must be static, got {kernel_size!r}")
    pad = R.int_params(op, padding, 2, "padding")
    return {
        "kernel_size": R.int_params(op, kernel, 2, "kernel_size", minimum=1),
        "stride": R.int_params(op, stride, 2, "stride", minimum=1),
        "dilation": R.int_params(op, dilation, 2, "dilation", minimum=1),
        # MAX pads (pad_h, pad_h, pad_w, pad_w).
        "padding": (pad[0], pad[0], pad[1], pad[1]),
    }


def _pool_rule(op: str, float_only: bool):
    def rule(x, *, kernel_size, stride, dilation, padding, ceil_mode, count_boundary=True) -> TensorType:
        x = R.require_tensor(op, x)
        R.require_rank(op, x, lambda r: r == 4, "4 (N, H, W, C)")
        if float_only:
            R.require_dtype(op, x, R.is_float, "a floating-point")
        else:
            R.require_dtype(op, x, R.is_numeric, "a numeric")
        out = [
            _window_out(
                op,
                x.shape[1 + i],
                kernel_size[i],
                stride[i],
                dilation[i],
                padding[2 * i] + padding[2 * i + 1],
                ceil_mode,
                ("height", "width")[i],
            )
            for i in range(2)
        ]
        return TensorType(x.dtype, [x.shape[0], *out, x.shape[3]], x.device)

    rule.__name__ = f"_{op}_rule"
    return rule


def _pool_windows(x_shape, kernel_size, stride, dilation, padding, ceil_mode):
    """Output sizes and the reduce_window padding (ceil mode adds a partial window at the end)."""
    outs, pads = [], [(0, 0)]
    for i in range(2):
        size, k, s, d = x_shape[1 + i], kernel_size[i], stride[i], dilation[i]
        lo, hi = padding[2 * i], padding[2 * i + 1]
        span = size + lo + hi - (d * (k - 1) + 1)
        out = (-(-span // s) if ceil_mode else span // s) + 1
        extra = max(0, (out - 1) * s + d * (k - 1) + 1 - (size + lo + hi))
        outs.append(out)
        pads.append((lo, hi + extra))
    pads.append((0, 0))
    return outs, pads


def _max_pool_impl(x, *, kernel_size, stride, dilation, padding, ceil_mode):
    _, pads = _pool_windows(x.shape, kernel_size, stride, dilation, padding, ceil_mode)
    dt = jnp.dtype(x.dtype)
    init = -jnp.inf if jnp.issubdtype(dt, jnp.floating) else jnp.iinfo(dt).min
    return lax.reduce_window(
        x, np.array(init, dt), lax.max, (1, *kernel_size, 1), (1, *stride, 1), pads, window_dilation=(1, *dilation, 1)
    )


def _valid_counts(size: int, out: int, k: int, s: int, d: int, lo: int) -> np.ndarray:
    pos = np.arange(out)[:, None] * s - lo + np.arange(k)[None, :] * d
    return ((pos >= 0) & (pos < size)).sum(axis=1)


def _avg_pool_impl(x, *, kernel_size, stride, dilation, padding, ceil_mode, count_boundary):
    outs, pads = _pool_windows(x.shape, kernel_size, stride, dilation, padding, ceil_mode)
    acc = _acc_dtype(x.dtype) or x.dtype
    total = lax.reduce_window(
        x.astype(acc),
        np.array(0, acc),
        lax.add,
        (1, *kernel_size, 1),
        (1, *stride, 1),
        pads,
        window_dilation=(1, *dilation, 1),
    )
    if count_boundary:
        # MAX divides by the full window, counting padding and the ceil-mode overhang.
        count = np.full(outs, kernel_size[0] * kernel_size[1])
    else:
        ch = _valid_counts(x.shape[1], outs[0], kernel_size[0], stride[0], dilation[0], padding[0])
        cw = _valid_counts(x.shape[2], outs[1], kernel_size[1], stride[1], dilation[1], padding[2])
        count = np.maximum(ch[:, None] * cw[None, :], 1)  # a window entirely in padding sums to 0
    return (total / jnp.asarray(count[None, :, :, None], acc)).astype(x.dtype)


max_pool2d_p = register(OpDef("max_pool2d", rule=_pool_rule("max_pool2d", False), impl=_max_pool_impl))
avg_pool2d_p = register(OpDef("avg_pool2d", rule=_pool_rule("avg_pool2d", True), impl=_avg_pool_impl))


@front(max_pool2d_p)
def max_pool2d(input, kernel_size, stride=1, dilation=1, padding=0, ceil_mode=False):
    """2-D max pooling over an NHWC tensor.

    Args:
        input: ``(N, H, W, C)``.
        kernel_size: ``(kH, kW)`` (static).
        stride: int or ``(h, w)``.
        dilation: int or ``(h, w)``.
        padding: int or ``(pad_h, pad_w)``, applied on both sides (padding never wins the max).
        ceil_mode: round the output size up (a last partial window) instead of down.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> import numpy as np
        >>> x = Tensor(np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1))
        >>> ops.max_pool2d(x, (2, 2), stride=2)[0, :, :, 0]
        TensorType(dtype=float32, shape=[Dim(2), Dim(2)], device=cpu:0): [5.0, 7.0, 13.0, 15.0]
    """
    return bind(
        max_pool2d_p,
        input,
        ceil_mode=bool(ceil_mode),
        **_pool_geometry("max_pool2d", kernel_size, stride, dilation, padding),
    )


@front(avg_pool2d_p)
def avg_pool2d(input, kernel_size, stride=1, dilation=1, padding=0, ceil_mode=False, count_boundary=True):
    """2-D average pooling over an NHWC float tensor.

    ``count_boundary=True`` divides every window sum by ``kH * kW`` (padding
    counts as zeros, as in MAX); ``False`` divides by the number of window
    elements that lie inside the input.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> import numpy as np
        >>> x = Tensor(np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1))
        >>> ops.avg_pool2d(x, (3, 3), padding=1, count_boundary=False)[0, :, :, 0]
        TensorType(dtype=float32, shape=[Dim(3), Dim(3)], device=cpu:0): [2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0]
        >>> ops.avg_pool2d(x, (3, 3), padding=1)[0, 0, 0, 0]  # padding counted: (0 + 1 + 3 + 4) / 9
        TensorType(dtype=float32, shape=[], device=cpu:0): 0.8888...
    """
    geometry = _pool_geometry("avg_pool2d", kernel_size, stride, dilation, padding)
    return bind(avg_pool2d_p, input, ceil_mode=bool(ceil_mode), count_boundary=bool(count_boundary), **geometry)


# ─── fold (col2im) ────────────────────────────────────────────────────────


def _fold_rule(x, *, output_size, kernel_size, stride, dilation, padding) -> TensorType:
    op = "fold"
    x = R.require_tensor(op, x)
    R.require_rank(op, x, lambda r: r == 3, "3 (N, C * kH * kW, L)")
    kk = kernel_size[0] * kernel_size[1]
    cols = x.shape[1]
    if isinstance(cols, StaticDim) and cols.dim % kk:
        raise OpError(
            f"{op}: dim 1 of {R.fmt(x)} must be a multiple of the product of the total kernel size "
            f"kH * kW = {kernel_size[0]} * {kernel_size[1]}"
        )
    settings = (
        f"output_size={tuple(output_size)}, kernel_size={kernel_size}, stride={stride}, dilation={dilation}, "
        f"padding={padding}"
    )
    # MAX's count first, so a wrong L gets MAX's message even where a window is also too big.
    if all(isinstance(Dim(o), StaticDim) for o in output_size) and isinstance(x.shape[2], StaticDim):
        counts = [
            (int(Dim(output_size[i])) + 2 * padding[i] - dilation[i] * (kernel_size[i] - 1) - 1) // stride[i] + 1
            for i in range(2)
        ]
        if x.shape[2].dim != counts[0] * counts[1]:
            raise OpError(
                f"{op}: last dim of {R.fmt(x)} must match the calculated number of blocks "
                f"{counts[0]} * {counts[1]} = {counts[0] * counts[1]} for {settings}"
            )
    blocks = [
        _window_out(
            op, Dim(output_size[i]), kernel_size[i], stride[i], dilation[i], 2 * padding[i], False, f"output_size[{i}]"
        )
        for i in range(2)
    ]
    expected = blocks[0] * blocks[1]
    if isinstance(expected, StaticDim) and isinstance(x.shape[2], StaticDim) and x.shape[2] != expected:
        raise OpError(
            f"{op}: last dim of {R.fmt(x)} must match the calculated number of blocks {blocks[0]} * {blocks[1]} = "
            f"{expected} for {settings}"
        )
    return TensorType(x.dtype, [x.shape[0], cols // kk, *output_size], x.device)


def _fold_impl(x, *, output_size, kernel_size, stride, dilation, padding):
    n, cols, _ = x.shape
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = kernel_size, stride, dilation, padding
    h, w = output_size
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    c = cols // (kh * kw)
    # bool blocks overlap as a logical or: count the hits, then test for any.
    acc = jnp.int32 if x.dtype == jnp.bool_ else (_acc_dtype(x.dtype) or x.dtype)
    blocks = x.astype(acc).reshape(n, c, kh, kw, oh, ow)
    canvas = jnp.zeros((n, c, h + 2 * ph, w + 2 * pw), acc)
    # Column (c, i, j) of block (y, x) lands at row i*dh + y*sh, column j*dw + x*sw.
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            colsl = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
            canvas = canvas.at[:, :, rows, colsl].add(blocks[:, :, i, j])
    out = canvas[:, :, ph : ph + h, pw : pw + w]
    return out != 0 if x.dtype == jnp.bool_ else out.astype(x.dtype)


fold_p = register(OpDef("fold", rule=_fold_rule, impl=_fold_impl))


@front(fold_p)
def fold(input, output_size, kernel_size, stride=1, dilation=1, padding=0):
    """Sum sliding blocks back into an image (col2im, PyTorch's ``nn.Fold``).

    Args:
        input: ``(N, C * kH * kW, L)``; column ``c*kH*kW + i*kW + j`` of block ``l``
            is kernel offset ``(i, j)`` of channel ``c``.
        output_size: ``(H, W)`` of the result.
        kernel_size: ``(kH, kW)`` (static).
        stride: int or ``(h, w)``.
        dilation: int or ``(h, w)``.
        padding: int or ``(h, w)``.

    Returns:
        ``(N, C, H, W)`` where overlapping block values add up.

    Raises:
        ValueError: dim 1 not a multiple of ``kH*kW``, or ``L`` differing from the
            number of blocks ``prod((size + 2*pad - dil*(k-1) - 1) // stride + 1)``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> import numpy as np
        >>> cols = Tensor(np.ones((1, 4, 4), np.float32))  # C=1, 2x2 kernel, 4 blocks
        >>> ops.fold(cols, (3, 3), (2, 2))[0, 0]  # overlapping blocks add up
        TensorType(dtype=float32, shape=[Dim(3), Dim(3)], device=cpu:0): [1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0]
        >>> ops.fold(cols, (4, 4), (2, 2), stride=2).shape
        [Dim(1), Dim(1), Dim(4), Dim(4)]
    """
    op = "fold"
    if isinstance(output_size, (str, bytes)) or not isinstance(output_size, Iterable) or len(tuple(output_size)) != 2:
        raise TypeError(f"{op}: output_size must be a pair (H, W), got {output_size!r}")
    if isinstance(kernel_size, (str, bytes)) or not isinstance(kernel_size, Iterable) or len(tuple(kernel_size)) != 2:
        raise TypeError(f"{op}: kernel_size must be a pair (kH, kW), got {kernel_size!r}")
    kernel = tuple(Dim(k) for k in kernel_size)
    if not all(isinstance(k, StaticDim) for k in kernel):
        raise OpError(f"{op}: kernel_size must be static, got {kernel_size!r}")
    return bind(
        fold_p,
        input,
        output_size=tuple(Dim(d) for d in output_size),
        kernel_size=R.int_params(op, kernel, 2, "kernel_size", minimum=1),
        stride=R.int_params(op, stride, 2, "stride", minimum=1),
        dilation=R.int_params(op, dilation, 2, "dilation", minimum=1),
        padding=R.int_params(op, padding, 2, "padding"),
    )


# ─── roi_align ────────────────────────────────────────────────────────────

_ROI_MODES = ("AVG", "MAX")


def _roi_align_rule(
    x,
    rois,
    *,
    output_height: int,
    output_width: int,
    spatial_scale: float,
    sampling_ratio: float,
    aligned: bool,
    mode: str,
) -> TensorType:
    op = "roi_align"
    x = R.require_tensor(op, x)
    rois = R.require_tensor(op, rois, "rois")
    if x.rank != 4:
        raise OpError(f"{op}: expects rank-4 NHWC input, got rank {x.rank} ({R.fmt(x)})")
    if rois.rank != 2:
        raise OpError(f"{op}: expects rank-2 rois [M, 5], got rank {rois.rank} ({R.fmt(rois)})")
    if isinstance(rois.shape[1], StaticDim) and rois.shape[1].dim != 5:
        raise OpError(f"{op}: rois must be [M, 5] rows of [batch_index, x1, y1, x2, y2], got {R.fmt(rois)}")
    R.require_dtype(op, x, R.is_float, "a floating-point")
    R.require_dtype(op, rois, R.is_float, "a floating-point", "rois")
    return TensorType(x.dtype, [rois.shape[0], StaticDim(output_height), StaticDim(output_width), x.shape[3]], x.device)


def _roi_align_impl(x, rois, *, output_height, output_width, spatial_scale, sampling_ratio, aligned, mode):
    # MAX's roi_align_nhwc kernel, vectorized over ROIs and output bins: each bin
    # pools a grid of bilinear samples (sampling_ratio per side, or ceil(bin size)
    # when it is 0). "AVG" sums the weighted corner values and divides by the
    # grid size; "MAX" keeps the largest weighted corner value. Samples outside
    # [-1, H] x [-1, W] contribute 0. Coordinates are float32, as in the kernel.
    _, h, w, _ = x.shape
    f32, dt = jnp.float32, x.dtype
    offset = f32(0.5 if aligned else 0.0)
    r = rois.astype(f32)
    scale = f32(spatial_scale)
    start_w, start_h = r[:, 1] * scale - offset, r[:, 2] * scale - offset
    end_w, end_h = r[:, 3] * scale - offset, r[:, 4] * scale - offset
    roi_h, roi_w = end_h - start_h, end_w - start_w
    if not aligned:
        roi_h, roi_w = jnp.maximum(roi_h, f32(1)), jnp.maximum(roi_w, f32(1))
    bin_h, bin_w = roi_h / output_height, roi_w / output_width
    if sampling_ratio > 0:
        grid_h = grid_w = jnp.full(r.shape[:1], int(sampling_ratio), jnp.int32)
    else:
        grid_h, grid_w = jnp.ceil(bin_h).astype(jnp.int32), jnp.ceil(bin_w).astype(jnp.int32)
    count = jnp.maximum(grid_h * grid_w, 1).astype(dt)
    batch = r[:, 0].astype(jnp.int32)
    ph = jnp.arange(output_height, dtype=f32)
    pw = jnp.arange(output_width, dtype=f32)

    def one_roi(b, sh, sw, bh, bw, gh, gw):
        img = x[b]

        def axis(start, size, bins, g, i, limit):
            # Sample coordinates along one axis for every bin: low/high index, weights, validity.
            c = start + bins * size + (i.astype(f32) + f32(0.5)) * size / g.astype(f32)
            ok = (c >= -1) & (c <= limit)
            c = jnp.maximum(c, 0)
            lo = jnp.minimum(c.astype(jnp.int32), limit - 1)
            hi = jnp.minimum(lo + 1, limit - 1)
            frac = c - lo.astype(f32)
            return ok, lo, hi, frac

        def sample(iy, ix, acc):
            oky, yl, yh, ly = axis(sh, bh, ph, gh, iy, h)
            okx, xl, xh, lx = axis(sw, bw, pw, gw, ix, w)
            ok = oky[:, None] & okx[None, :]
            ly, lx = ly[:, None], lx[None, :]
            hy, hx = 1 - ly, 1 - lx
            terms = []
            for yi, xi, wt in ((yl, xl, hy * hx), (yl, xh, hy * lx), (yh, xl, ly * hx), (yh, xh, ly * lx)):
                yy = jnp.where(ok, yi[:, None], 0)
                xx = jnp.where(ok, xi[None, :], 0)
                wt = jnp.where(ok, wt, 0).astype(dt)
                terms.append(wt[..., None] * img[yy, xx])
            if mode == "AVG":
                for t in terms:
                    acc = acc + t
                return acc
            for t in terms:
                acc = jnp.maximum(acc, t)
            return acc

        init = jnp.full((output_height, output_width, x.shape[3]), 0 if mode == "AVG" else -jnp.inf, dt)
        return lax.fori_loop(0, gh, lambda iy, acc: lax.fori_loop(0, gw, lambda ix, a: sample(iy, ix, a), acc), init)

    pooled = jax.vmap(one_roi)(batch, start_h, start_w, bin_h, bin_w, grid_h, grid_w)
    return pooled / count[:, None, None, None] if mode == "AVG" else pooled


roi_align_p = register(OpDef("roi_align", rule=_roi_align_rule, impl=_roi_align_impl, differentiable=False))


@front(roi_align_p)
def roi_align(
    input, rois, output_height, output_width, spatial_scale=1.0, sampling_ratio=0.0, aligned=False, mode="AVG"
):  # noqa: A002 - MAX's name
    """ROI Align pooling (Mask R-CNN) of an NHWC input: one fixed-size map per region.

    Each output bin pools bilinear samples of its part of the region; samples
    farther than one pixel outside the image contribute 0.

    Args:
        input: ``[N, H, W, C]`` floating-point tensor.
        rois: ``[M, 5]`` regions, rows ``[batch_index, x1, y1, x2, y2]``.
        output_height: height of each output map.
        output_width: width of each output map.
        spatial_scale: factor mapping ROI coordinates to input coordinates.
        sampling_ratio: samples per bin along each axis; ``0`` means adaptive
            (``ceil(bin_size)``).
        aligned: shift ROI coordinates by half a pixel (``x * scale - 0.5``);
            unaligned regions are at least 1x1.
        mode: ``"AVG"`` (mean of the samples) or ``"MAX"`` (largest weighted
            corner value of the samples).

    Returns:
        ``[M, output_height, output_width, C]``, the input's dtype.

    Raises:
        ValueError: ``input`` not rank 4, ``rois`` not rank 2 (or a static
            column count other than 5), a non-float dtype, or another ``mode``.

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> x = Tensor(np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1))  # x[0, y, x, 0] = 4y + x
        >>> rois = Tensor(np.array([[0, 0, 0, 2, 2]], np.float32))  # the 2x2 top-left square
        >>> ops.roi_align(x, rois, 1, 1, sampling_ratio=2)  # samples at (0.5, 0.5), (0.5, 1.5), (1.5, 0.5), (1.5, 1.5)
        TensorType(dtype=float32, shape=[Dim(1), Dim(1), Dim(1), Dim(1)], device=cpu:0): [5.0]
    """
    op = "roi_align"
    if mode not in _ROI_MODES:
        raise ValueError(f"{op}: mode must be 'AVG' or 'MAX', got {mode!r}")
    for name, v in (("spatial_scale", spatial_scale), ("sampling_ratio", sampling_ratio)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{op}: {name} must be a number, got {type(v).__name__} {v!r}")
    return bind(
        roi_align_p,
        input,
        rois,
        output_height=R.int_param(op, output_height, "output_height", 1),
        output_width=R.int_param(op, output_width, "output_width", 1),
        spatial_scale=float(spatial_scale),
        sampling_ratio=float(sampling_ratio),
        aligned=bool(aligned),
        mode=mode,
    )


# ─── irfft ────────────────────────────────────────────────────────────────


class Normalization(enum.Enum):
    """Scaling of ``irfft``: ``BACKWARD`` divides by n, ``ORTHO`` by sqrt(n), ``FORWARD`` not at all."""

    BACKWARD = "backward"
    ORTHO = "ortho"
    FORWARD = "forward"


def _irfft_rule(x, *, n, axis, normalization, input_is_complex) -> TensorType:
    op = "irfft"
    x = R.require_tensor(op, x, "input_tensor")
    R.require_dtype(op, x, R.is_float, "a floating-point", "input_tensor")
    shape = list(x.shape)
    if input_is_complex:
        if x.rank < 2 or shape[-1] != 2:
            raise OpError(f"{op}: input_is_complex=True needs a trailing dim of 2 (re, im), got {R.fmt(x)}")
        shape = shape[:-1]
    else:
        R.require_rank(op, x, lambda r: r >= 1, ">= 1", "input_tensor")
    ax = R.normalize_axis(op, axis, len(shape))
    m = shape[ax]
    if not isinstance(m, StaticDim):
        raise OpError(f"{op}: Axis dimension must be static: the transformed axis {axis} of {R.fmt(x)} is {m}")
    size = 2 * (m.dim - 1) if n is None else n
    if size <= 0:
        raise OpError(f"{op}: output length n must be positive, got n={size} for {R.fmt(x)} (axis {axis} has {m} bins)")
    shape[ax] = StaticDim(size)
    return TensorType(x.dtype, shape, x.device)


def _irfft_impl(x, *, n, axis, normalization, input_is_complex):
    real_dt = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    xr = x.astype(real_dt)
    if input_is_complex:
        spec = lax.complex(xr[..., 0], xr[..., 1])
    else:
        spec = xr.astype(jnp.complex128 if real_dt == jnp.float64 else jnp.complex64)
    ax = axis % spec.ndim
    size = 2 * (spec.shape[ax] - 1) if n is None else n
    # jnp.fft.irfft zero-pads or truncates the spectrum to size // 2 + 1 bins, like MAX.
    return jnp.fft.irfft(spec, n=size, axis=ax, norm=normalization).astype(x.dtype)


irfft_p = register(OpDef("irfft", rule=_irfft_rule, impl=_irfft_impl))


@front(irfft_p)
def irfft(
    input_tensor, n=None, axis=-1, normalization=Normalization.BACKWARD, input_is_complex=False, buffer_size_mb=512
):
    """Inverse real FFT along ``axis`` (numpy's ``irfft`` semantics).

    Args:
        input_tensor: float spectrum; its imaginary parts are zero unless
            ``input_is_complex``, where a trailing dim of 2 holds ``(re, im)``
            (that dim is not counted by ``axis``).
        n: output length (static int); the spectrum is zero-padded or truncated
            to ``n // 2 + 1`` bins. Default ``2 * (bins - 1)``.
        axis: transformed axis (static size).
        normalization: ``"backward"`` (divide by n), ``"ortho"`` (by sqrt(n)) or
            ``"forward"`` (no scaling), or a `Normalization`.
        input_is_complex: see ``input_tensor``.
        buffer_size_mb: MAX's scratch-buffer hint; XLA plans its own memory, so
            it is accepted and ignored.

    Returns:
        The real signal: the input's shape (without the complex dim) with
        ``axis`` replaced by ``n``.

    Example:
        >>> from maxfx.graph import ops
        >>> from maxfx.tensor import Tensor
        >>> import numpy as np
        >>> spectrum = np.fft.rfft([1.0, 2.0, 3.0, 4.0])  # [10, -2+2j, -2]
        >>> spec = Tensor(np.stack([spectrum.real, spectrum.imag], -1).astype(np.float32))  # [3, 2]
        >>> ops.irfft(spec, n=4, input_is_complex=True)
        TensorType(dtype=float32, shape=[Dim(4)], device=cpu:0): [1.0, 2.0, 3.0, 4.0]
    """
    op = "irfft"
    if n is not None:
        n = R.int_param(op, n, "n", 1)
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TypeError(f"{op}: axis must be an int, got {type(axis).__name__} {axis!r}")
    norm = normalization.value if isinstance(normalization, enum.Enum) else normalization
    if not isinstance(norm, str) or norm.lower() not in {m.value for m in Normalization}:
        raise OpError(
            f"{op}: Invalid normalization: {norm}; expected 'backward', 'ortho' or 'forward' (or a Normalization)"
        )
    R.int_param(op, buffer_size_mb, "buffer_size_mb", 0)
    return bind(
        irfft_p, input_tensor, n=n, axis=int(axis), normalization=norm.lower(), input_is_complex=bool(input_is_complex)
    )
