"""``max.nn.layer.layer``: the module MAX defines `Module`, `Layer` and `LayerList` in (the same classes as
`maxfx.nn.layer`).

Example:
    >>> from maxfx.nn.layer.layer import Module
    >>> from maxfx import nn
    >>> Module is nn.Module
    True
"""

from maxfx.nn._layer import Layer, LayerList, Module, Shardable, add_layer_hook, clear_hooks, recursive_named_layers

__all__ = ["Layer", "LayerList", "Module", "Shardable", "add_layer_hook", "clear_hooks", "recursive_named_layers"]
