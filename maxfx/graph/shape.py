"""Tensor shapes (``max.graph.shape``)."""

from lowering.dims import Shape, ShapeLike

__all__ = ["Shape", "ShapeLike"]
