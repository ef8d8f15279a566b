"""Tensor dimensions (``max.graph.dim``)."""

from lowering.dims import AlgebraicDim, Dim, DimLike, StaticDim, SymbolicDim

__all__ = ["AlgebraicDim", "Dim", "DimLike", "StaticDim", "SymbolicDim"]
