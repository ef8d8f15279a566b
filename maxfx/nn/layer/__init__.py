"""``max.nn.layer``: `Module`, `Layer`, `LayerList`, `Shardable`, layer hooks (defined in ``max.nn.layer.layer``)."""

from maxfx.nn._layer import Layer, LayerList, Module, Shardable, add_layer_hook, clear_hooks, recursive_named_layers

__all__ = ["Layer", "LayerList", "Module", "Shardable", "add_layer_hook", "clear_hooks", "recursive_named_layers"]
