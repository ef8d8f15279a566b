"""`forward_sequential_layers`: run a stack of layers in order, optionally through shared subgraphs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from maxfx.graph import ops

__all__ = ["forward_sequential_layers"]


def forward_sequential_layers(
    layers: Sequence[Any],
    *,
    inputs_for_layer: Callable[[int, list[Any]], Sequence[Any]],
    weight_prefix_for_layer: Callable[[int], str],
    subgraph_layer_groups: Sequence[Sequence[int]] | None = None,
    initial_hidden_states: Sequence[Any],
    on_layer_output: Callable[[int, list[Any]], None] | None = None,
) -> list[Any]:
    """Thread hidden states through ``layers`` and return the last layer's.

    Layer ``i`` is called as ``layers[i](*inputs_for_layer(i, h))`` where ``h``
    is the previous layer's output (``initial_hidden_states`` for layer 0); an
    argument may be one graph value or a list of them. ``on_layer_output(i, h)``
    sees each layer's output.

    With ``subgraph_layer_groups`` (lists of layer indices whose layers have
    identical structure), each group is staged once: the group's first layer
    is built as subgraph ``transformer_block_<g>`` (its weights named
    relative to ``weight_prefix_for_layer(first)``) and every layer of the
    group becomes an ``ops.call`` of it with ``prefix=weight_prefix_for_layer(i)``,
    so the shared program compiles once. Layers outside every group are
    called directly. ``None`` or ``[]`` calls every layer directly.

    Raises:
        ValueError: if a layer index in ``subgraph_layer_groups`` is out of
            range or appears in two groups.

    Example:
        >>> from maxfx.dtype import DType
        >>> from maxfx.graph import DeviceRef, Graph, TensorType
        >>> from maxfx.nn import Module
        >>> class Double(Module):
        ...     def __call__(self, xs):
        ...         return [x * 2 for x in xs]
        >>> with Graph("g", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())]) as g:
        ...     out = forward_sequential_layers(
        ...         [Double(), Double(), Double()], inputs_for_layer=lambda i, h: [h],
        ...         weight_prefix_for_layer=lambda i: f"layers.{i}.", subgraph_layer_groups=[[0, 1, 2]],
        ...         initial_hidden_states=[g.inputs[0].tensor])
        ...     g.output(*out)
        >>> [str(d) for d in out[0].shape]
        ['2']
    """
    group_of: dict[int, int] = {}
    for gi, group in enumerate(subgraph_layer_groups or ()):
        for i in group:
            if not 0 <= int(i) < len(layers):
                raise ValueError(
                    f"forward_sequential_layers: subgraph_layer_groups[{gi}] names layer {i}, but there are "
                    f"{len(layers)} layers"
                )
            if int(i) in group_of:
                raise ValueError(
                    f"forward_sequential_layers: layer {i} appears in subgraph groups {group_of[int(i)]} and {gi}"
                )
            group_of[int(i)] = gi
    subgraphs: dict[int, Any] = {}
    h = list(initial_hidden_states)
    for i, layer in enumerate(layers):
        args = list(inputs_for_layer(i, h))
        gi = group_of.get(i)
        if gi is None:
            out = layer(*args)
        else:
            if gi not in subgraphs:
                types = [[v.type for v in a] if isinstance(a, (list, tuple)) else a.type for a in args]
                subgraphs[gi] = layer.build_subgraph(f"transformer_block_{gi}", types, weight_prefix_for_layer(i))
            flat = [v for a in args for v in (a if isinstance(a, (list, tuple)) else [a])]
            out = ops.call(subgraphs[gi], *flat, prefix=weight_prefix_for_layer(i))
        h = list(out) if isinstance(out, (list, tuple)) else [out]
        if on_layer_output is not None:
            on_layer_output(i, h)
    return h
