"""``max.nn.stacked_linear``: `StackedLinear`, projections of one input (Q/K/V, gate/up) as one matmul."""

from maxfx.nn._stacked_linear import StackedLinear

__all__ = ["StackedLinear"]
