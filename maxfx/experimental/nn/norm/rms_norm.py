"""RMS normalisation layers of the eager Module API (``max.experimental.nn.norm.rms_norm``).

``rms_norm`` is ``F.rms_norm`` (``ops.rms_norm``, usable on eager Tensors
too); the layers hold a ``[dim]`` scale
and call it, so they run eagerly, under ``jax.jit`` and inside ``Module.compile``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lowering.dims import Dim, StaticDim
from lowering.dtypes import DType
from maxfx.experimental import functional as F
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn.module import Module

__all__ = ["GemmaRMSNorm", "RMSNorm", "rms_norm"]

rms_norm = F.rms_norm
"""``F.rms_norm(input, weight, epsilon, weight_offset=0.0, multiply_before_cast=False)``, MAX's name in this module."""


class RMSNorm(Module):
    """Root-mean-square normalisation over the last dim: ``x / sqrt(mean(x²) + eps) * weight``.

    The statistics are computed in float32 and the result is cast back to the
    input dtype before the scale is applied (as Llama's reference does).

    Args:
        dim: size of the normalised (last) dim.
        eps: added to the mean square (> 0).
        dtype: dtype of ``weight`` (default: the default dtype; maxfx extension).
        weight: an existing ``[dim]`` scale to use instead of ones (maxfx extension).

    Example:
        >>> norm = RMSNorm(2)
        >>> norm(Tensor([[3.0, 4.0]])).to_numpy().astype(float).round(4).tolist()
        [[0.8485, 1.1314]]
    """

    def __init__(self, dim: int, eps: float = 1e-6, *, dtype: DType | None = None, weight: Tensor | None = None):
        if isinstance(dim, bool) or int(dim) <= 0:
            raise ValueError(f"{type(self).__name__}: dim must be a positive int, got {dim!r}")
        if not eps > 0:
            raise ValueError(f"{type(self).__name__}: eps must be > 0, got {eps}")
        if weight is not None and [int(d) for d in weight.shape] != [int(dim)]:
            raise ValueError(
                f"{type(self).__name__}: weight must have shape [{int(dim)}], got {[int(d) for d in weight.shape]}"
            )
        self.weight = Tensor.ones([int(dim)], dtype=dtype) if weight is None else weight
        self.eps = float(eps)

    @property
    def dim(self) -> Dim:
        """The size of the normalised (last) dim."""
        return StaticDim(int(self.weight.shape[0]))

    # Llama's form; GemmaRMSNorm scales by ``1 + weight`` before the cast.
    _weight_offset = 0.0
    _multiply_before_cast = False

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.weight.shape[0]:
            raise ValueError(f"{type(self).__name__}: input {x.type} must end in dim {self.weight.shape[0]}")
        return rms_norm(
            x, self.weight, self.eps, weight_offset=self._weight_offset, multiply_before_cast=self._multiply_before_cast
        )

    def __rich_repr__(self) -> Iterator[tuple[Any, ...]]:
        """MAX's: ``dim`` (a Dim) and ``eps`` when it is not 1e-6."""
        yield "dim", self.dim
        yield "eps", self.eps, 1e-6


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMS normalisation: scales by ``1 + weight`` and applies it in float32 before casting back.

    Same constructor as `RMSNorm` (the scale starts at ones, as in MAX, so a
    fresh layer multiplies by 2); Gemma checkpoints store ``weight`` centred at 0.

    Example:
        >>> norm = GemmaRMSNorm(2)
        >>> norm(Tensor([[3.0, 4.0]])).to_numpy().astype(float).round(4).tolist()
        [[1.6971, 2.2627]]
    """

    _weight_offset = 1.0
    _multiply_before_cast = True
