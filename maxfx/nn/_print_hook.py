"""`PrintHook` (``max.nn.hooks``): print or export every layer's tensor inputs and outputs.

The hook rides on the layer-hook machinery (`add_layer_hook`): while a graph
is built, each layer call adds ``ops.print`` nodes (or, with ``export_path``,
``ops.export_tensor`` nodes writing ``{export_path}/{name}.npy``) for its
tensor inputs and outputs, so values appear when the graph runs.

Example:
    >>> from maxfx.nn.hooks import PrintHook
    >>> hook = PrintHook()        # create before building the graph
    >>> hook.remove()
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from maxfx.graph import ops
from maxfx.nn._layer import _HOOKS, Layer, add_layer_hook

__all__ = ["PrintHook"]


def _tensors(value: Any) -> list[Any]:
    """Flatten tuples/lists/dicts of values into their graph tensor values (other items are skipped)."""
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return [value] if getattr(value, "type", None) is not None else []


def _walk_layers(model: Layer) -> Iterator[tuple[str, Layer]]:
    """``(name, layer)`` breadth first through the attributes of layers and the items of lists and tuples."""
    seen: set[int] = set()
    queue: collections.deque[tuple[str, Any]] = collections.deque([("model", model)])
    while queue:
        name, obj = queue.popleft()
        if isinstance(obj, Layer):
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            yield name, obj
            queue.extend((f"{name}.{k}", v) for k, v in vars(obj).items() if isinstance(v, (Layer, list, tuple)))
        elif isinstance(obj, (list, tuple)):
            queue.extend((f"{name}.{i}", v) for i, v in enumerate(obj))


class PrintHook:
    """Hook that prints/saves layer tensor inputs and outputs.

    Must be created before the graph is built so the print ops become part of
    it. Values are labelled ``{layer}-input_{i}`` and ``{layer}-output`` (or
    ``-output_{i}`` for several outputs); layer names come from `name_layers`
    (attribute paths like ``model.layers.0.mlp``) or default to the class name
    plus a counter.

    Example:
        >>> hook = PrintHook(export_path="/tmp/ckpt")  # doctest: +SKIP
        >>> hook.name_layers(model)                     # doctest: +SKIP
    """

    def __init__(self, export_path: str | None = None) -> None:
        self._export_path = export_path
        self._names: dict[int, str] = {}
        self._counts: dict[str, int] = {}
        add_layer_hook(self)

    @property
    def export_path(self) -> str | None:
        """Directory that receives ``.npy`` files instead of printing (None: print to stdout)."""
        return self._export_path

    def name_layers(self, model: Layer) -> None:
        """Create names for all layers in the model based on nested attributes (the root is ``model``).

        Names are attribute paths, as MAX makes them: a layer held in a list
        attribute is named by its index, so the blocks of a ``LayerList`` stored
        as ``self.layers`` are ``model.layers.layers.0``, ... (the list inside the
        LayerList is its attribute ``layers`` too). A layer reachable by several
        paths keeps the shortest.
        """
        for path, layer in _walk_layers(model):
            self._names.setdefault(id(layer), path)

    def _name_of(self, layer: Any) -> str:
        name = self._names.get(id(layer))
        if name is None:
            base = type(layer).__name__
            n = self._counts[base] = self._counts.get(base, 0) + 1
            name = self._names[id(layer)] = f"{base}{n}"
        return name

    def print_value(self, name: str, value: Any) -> bool:
        """Prints a value, and returns whether the print is successful (False for non-tensors)."""
        if getattr(value, "type", None) is None or not hasattr(value, "shape"):
            return False
        if self._export_path is not None:
            ops.export_tensor(value, self._export_path, name)
        else:
            ops.print(value, label=name)
        return True

    def __call__(self, layer: Any, args: tuple, kwargs: dict, outputs: Any) -> None:
        name = self._name_of(layer)
        for i, t in enumerate(_tensors((args, kwargs))):
            self.print_value(f"{name}-input_{i}", t)
        outs = _tensors(outputs)
        for i, t in enumerate(outs):
            self.print_value(f"{name}-output" if len(outs) == 1 else f"{name}-output_{i}", t)
        return None

    def remove(self) -> None:
        """Stop adding print ops to graphs built from now on."""
        while self in _HOOKS:
            _HOOKS.remove(self)
