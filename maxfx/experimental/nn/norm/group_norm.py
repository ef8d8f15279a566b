"""Group normalisation of the eager Module API (``max.experimental.nn.norm.group_norm``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn.module import Module

__all__ = ["GroupNorm", "group_norm"]

group_norm = F.group_norm
"""``F.group_norm(input, gamma, beta, num_groups, epsilon)``, MAX's name in this module."""


class GroupNorm(Module):
    """Group normalisation over the channel axis (1) of ``[batch, channels, ...]`` input.

    The channels split into ``num_groups`` groups, each normalised over its
    channels and trailing dims; with ``affine`` a per-channel ``weight`` (ones)
    and ``bias`` (zeros) follow, else no parameters are created.

    Args:
        num_groups: groups the channel axis splits into; must divide ``num_channels``.
        num_channels: size of the input's channel axis.
        eps: added to the variance (> 0).
        affine: learn a per-channel scale and bias.

    Raises:
        ValueError: ``num_channels`` is not divisible by ``num_groups``.

    Example:
        >>> norm = GroupNorm(num_groups=2, num_channels=4)
        >>> norm(Tensor.ones([1, 4, 3])).to_numpy().max().item()
        0.0
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        if num_groups <= 0 or num_channels % num_groups != 0:
            raise ValueError(f"num_channels({num_channels}) should be divisible by num_groups({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = (
            int(num_groups),
            int(num_channels),
            float(eps),
            bool(affine),
        )
        self.weight = Tensor.ones([num_channels]) if affine else None
        self.bias = Tensor.zeros([num_channels]) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        if len(x.shape) < 2:
            raise ValueError(f"Expected input tensor with >=2 dimensions, got shape {x.shape}")
        if x.shape[1] != self.num_channels:
            raise ValueError(f"Expected {self.num_channels} channels, got shape {x.shape}")
        if self.affine:
            weight, bias = self.weight, self.bias
        else:
            weight = Tensor.ones([self.num_channels], dtype=x.dtype, device=x.device)
            bias = Tensor.zeros([self.num_channels], dtype=x.dtype, device=x.device)
        return group_norm(x, weight, bias, self.num_groups, self.eps)

    def __rich_repr__(self) -> Iterator[tuple[Any, ...]]:
        """MAX's: the group and channel counts, ``eps`` and ``affine`` when not their defaults."""
        yield "num_groups", self.num_groups
        yield "num_channels", self.num_channels
        yield "eps", self.eps, 1e-5
        yield "affine", self.affine, True
