"""The convolution layers' math, written once over ``maxfx.graph.ops`` for both module APIs.

The graph layers of `maxfx.nn` and the eager Modules of `maxfx.experimental.nn`
keep their own constructors, weights and argument checks, and call these
functions to convolve: on graph values they record graph ops, on eager Tensors
they run. ``permute=False`` means channels-last inputs and spatial-first filters
(RSCF, QRSCF; ``(*kernel, C_out, C_in/groups)`` for the transposes);
``permute=True`` PyTorch's channels-first inputs and ``(C_out, C_in/groups,
*kernel)`` filters (``(C_in, C_out/groups, *kernel)`` for the transposes). A 1-D
(rank-3) convolution runs as a 2-D one over a unit height, with its settings in
MAX's 2-D forms (``(1, stride)``, ``(0, 0, left, right)``).

Example:
    >>> from maxfx.experimental.tensor import Tensor
    >>> conv(Tensor.ones([1, 2, 5]), Tensor.ones([3, 2, 2]), None, (1, 1), (1, 1), (0, 0, 0, 0), 1, permute=True).shape
    [Dim(1), Dim(3), Dim(4)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lowering.types import ConvInputLayout, FilterLayout
from maxfx.graph import ops

__all__ = ["conv", "conv_transpose"]

Ints = Sequence[int]


def _unit_height(x: Any, filt: Any, permute: bool) -> tuple[Any, Any, int]:
    """A rank-3 input and filter with a unit height added; the axis to squeeze from the output."""
    axis = 2 if permute else 1  # [N, C, L] -> [N, C, 1, L] (NCHW), or [N, L, C] -> [N, 1, L, C] (NHWC)
    return ops.unsqueeze(x, axis), ops.unsqueeze(filt, 2 if permute else 0), axis


def conv(x: Any, filt: Any, bias: Any, stride: Ints, dilation: Ints, padding: Ints, groups: int, permute: bool) -> Any:
    """``ops.conv2d`` of a rank-3 or rank-4 ``x``, ``ops.conv3d`` of a rank-5 one, in the layouts ``permute`` names."""
    if x.rank == 3:
        x, filt, axis = _unit_height(x, filt, permute)
        return ops.squeeze(conv(x, filt, bias, stride, dilation, padding, groups, permute), axis)
    layout = ConvInputLayout.NCHW if permute else ConvInputLayout.NHWC  # NCDHW / NDHWC for rank 5
    if x.rank == 5:
        filter_layout = FilterLayout.FCQRS if permute else FilterLayout.QRSCF
        return ops.conv3d(x, filt, stride, dilation, padding, groups, bias, layout, filter_layout)
    filter_layout = FilterLayout.FCRS if permute else FilterLayout.RSCF
    return ops.conv2d(x, filt, stride, dilation, padding, groups, bias, layout, filter_layout)


def conv_transpose(
    x: Any,
    filt: Any,
    bias: Any,
    stride: Ints,
    dilation: Ints,
    padding: Ints,
    output_padding: Ints,
    permute: bool,
    groups: int = 1,
) -> Any:
    """``ops.conv2d_transpose`` of a rank-3 or rank-4 ``x`` in the layouts ``permute`` names (CFRS or RSCF filters).

    With ``groups > 1`` each group of input channels is transposed-convolved with
    its own slice of the filter and the results are concatenated (PyTorch's
    grouping; ``ops.conv2d_transpose`` has no groups).
    """
    settings = (stride, dilation, padding, output_padding, permute)
    if x.rank == 3:
        x, filt, axis = _unit_height(x, filt, permute)
        return ops.squeeze(conv_transpose(x, filt, bias, *settings, groups), axis)
    if groups > 1:  # filters CFRS [C_in, C_out/G, kH, kW] or RSCF [kH, kW, C_out, C_in/G]
        cin = int(x.shape[1 if permute else 3]) // groups
        cout = int(filt.shape[1]) if permute else int(filt.shape[2]) // groups
        outs = []
        for i in range(groups):
            xs = x[:, i * cin : (i + 1) * cin] if permute else x[:, :, :, i * cin : (i + 1) * cin]
            fs = filt[i * cin : (i + 1) * cin] if permute else filt[:, :, i * cout : (i + 1) * cout]
            bs = bias[i * cout : (i + 1) * cout] if bias is not None else None
            outs.append(conv_transpose(xs, fs, bs, *settings))
        return ops.concat(outs, axis=1 if permute else 3)
    return ops.conv2d_transpose(
        x,
        filt,
        stride=stride,
        dilation=dilation,
        padding=padding,
        output_paddings=output_padding,
        bias=bias,
        input_layout=ConvInputLayout.NCHW if permute else ConvInputLayout.NHWC,
        filter_layout=FilterLayout.CFRS if permute else FilterLayout.RSCF,
    )
