"""``max.experimental.nn.common_layers.mlp``: the gated MLP of transformer blocks and MoE experts.

``down_proj(act(gate_proj(x)) * up_proj(x))`` with three `Linear` layers.

Example:
    >>> from maxfx.experimental.tensor import Tensor
    >>> mlp = MLP(hidden_dim=4, feed_forward_length=8, bias=False)
    >>> mlp(Tensor.ones([2, 4])).shape
    [Dim(2), Dim(4)]
"""

from __future__ import annotations

from typing import Any

from maxfx.experimental.nn._layers import Linear
from maxfx.experimental.nn.common_layers.activation import activation_function_from_name
from maxfx.experimental.nn.module import Module
from maxfx.experimental.tensor import Tensor

__all__ = ["MLP"]


class MLP(Module):
    """Gated MLP: ``down_proj(act(gate_proj(x)) * up_proj(x))``.

    Args:
        hidden_dim: input and output width.
        feed_forward_length: the inner width.
        bias: whether the three projections have biases.
        activation_function: an activation name (`activation_function_from_name`), ``"silu"`` by default.
    """

    def __init__(
        self, hidden_dim: int, feed_forward_length: int, bias: bool = False, activation_function: str = "silu"
    ):
        self.hidden_dim, self.feed_forward_length = int(hidden_dim), int(feed_forward_length)
        self.gate_proj = Linear(hidden_dim, feed_forward_length, bias=bias)
        self.up_proj = Linear(hidden_dim, feed_forward_length, bias=bias)
        self.down_proj = Linear(feed_forward_length, hidden_dim, bias=bias)
        self.activation_function = activation_function_from_name(activation_function)

    def forward(self, x: Tensor) -> Any:
        return self.down_proj(self.activation_function(self.gate_proj(x)) * self.up_proj(x))
