"""Graph-API norms that are not V1 layers: ``ConstantLayerNorm`` (gamma 1, beta 0, no weights) and ``GroupNorm``."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowering.dtypes import DType
from lowering.types import DeviceRef
from maxfx.graph import ops
from maxfx.graph._weight import Weight
from maxfx.nn._graph_util import on_device as _on
from maxfx.nn._layer import Module

__all__ = ["ConstantLayerNorm", "GroupNorm"]


class ConstantLayerNorm(Module):
    """Layer norm with constant ``gamma = 1`` and ``beta = 0`` (numpy arrays, no weights).

    Example:
        >>> norm = ConstantLayerNorm(8, DeviceRef.CPU(), DType.float32)
        >>> norm.state_dict()
        {}
    """

    def __init__(self, dims: int | tuple[int, ...], device: Any, dtype: DType, eps: float = 1e-5):
        super().__init__()
        shape = (dims,) if isinstance(dims, int) else tuple(dims)
        self.device = DeviceRef.from_device(device)
        self.dtype = dtype
        self.eps = eps
        self.gamma = np.ones(shape, dtype.to_numpy())
        self.beta = np.zeros(shape, dtype.to_numpy())

    def __call__(self, x: Any) -> Any:
        gamma = ops.constant(self.gamma, self.dtype, x.device)
        beta = ops.constant(self.beta, self.dtype, x.device)
        return ops.layer_norm(x.cast(self.dtype), gamma, beta, self.eps).cast(x.dtype)


class GroupNorm(Module):
    """PyTorch ``group_norm``: normalise each of ``num_groups`` channel groups of ``[N, C, *]`` input.

    ``device`` defaults to ``gpu:0`` as documented; it only says where the
    weights live — the computation follows the input's device.

    Example:
        >>> gn = GroupNorm(2, 4, device=DeviceRef.CPU())
        >>> sorted(gn.state_dict())
        ['bias', 'weight']
    """

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: Any = DeviceRef.GPU(),  # noqa: B008 - MAX's documented default
    ):
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")

        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.device = DeviceRef.from_device(device)
        if affine:
            self.weight = Weight("weight", DType.float32, [num_channels], DeviceRef.CPU())
            self.bias = Weight("bias", DType.float32, [num_channels], DeviceRef.CPU())

    def __call__(self, x: Any) -> Any:
        if x.rank < 2 or int(x.shape[1]) != self.num_channels:
            raise ValueError(f"GroupNorm: expected input [N, {self.num_channels}, ...], got {list(x.shape)}")
        if self.affine:
            gamma, beta = _on(self.weight, x.device), _on(self.bias, x.device)
        else:
            gamma, beta = (
                ops.constant(np.full(self.num_channels, v, np.float32), DType.float32, x.device) for v in (1.0, 0.0)
            )
        return ops.group_norm(x, gamma, beta, self.num_groups, self.eps)
