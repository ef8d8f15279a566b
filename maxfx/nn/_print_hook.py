"""`PrintHook` (``max.nn.hooks``): print or export every layer's tensor inputs and outputs.

For graph-API layers the hook rides on the layer-hook machinery
(`add_layer_hook`): while a graph is built, each layer call adds ``ops.print``
nodes (or, with ``export_path``, ``ops.export_tensor`` nodes writing
``{export_path}/{name}.npy``) for its tensor inputs and outputs, so values
appear when the graph runs. Eager modules (``maxfx.experimental.nn``) are
watched per instance once named (`PrintHook.name_layers_v3`): traced into a
graph (``Module.compile``) they add print ops the same way, and called eagerly
their tensors print at once.

Example:
    >>> from maxfx.nn.hooks import PrintHook
    >>> hook = PrintHook()        # create before building the graph
    >>> hook.remove()
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator
from typing import Any

from maxfx.experimental.nn.module import Module, add_call_hook
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
    plus a counter. ``filter`` (a list of names) restricts printing to those
    layers.

    Example:
        >>> hook = PrintHook(export_path="/tmp/ckpt")  # doctest: +SKIP
        >>> hook.name_layers(model)                     # doctest: +SKIP
    """

    def __init__(self, export_path: str | None = None, filter: list[str] | None = None) -> None:
        if filter is not None and (isinstance(filter, str) or not all(isinstance(n, str) for n in filter)):
            raise TypeError(f"PrintHook: filter must be a list of layer names (str), got {filter!r}")
        self._export_path = export_path
        self._filter = None if filter is None else frozenset(filter)
        self._names: dict[int, str] = {}
        self._counts: dict[str, int] = {}
        self._call_hook_removers: list[Any] = []
        add_layer_hook(self)

    @property
    def export_path(self) -> str | None:
        """Directory that receives ``.npy`` files instead of printing (None: print to stdout)."""
        return self._export_path

    def name_layers(self, model: Layer | Module) -> None:
        """Create names for all layers in the model based on nested attributes (the root is ``model``).

        Names are attribute paths, as MAX makes them: a layer held in a list
        attribute is named by its index, so the blocks of a ``LayerList`` stored
        as ``self.layers`` are ``model.layers.layers.0``, ... (the list inside the
        LayerList is its attribute ``layers`` too). A layer reachable by several
        paths keeps the shortest. An eager (``maxfx.experimental.nn``) module is
        named by `name_layers_v3`.

        Raises:
            TypeError: ``model`` is neither a graph-API Layer nor an eager Module.
        """
        if isinstance(model, Module):
            return self.name_layers_v3(model)
        if not isinstance(model, Layer):
            raise TypeError(
                "PrintHook.name_layers expects a max.nn (V2) Layer or a max.experimental.nn (V3) Module, "
                f"got {type(model).__name__}."
            )
        for path, layer in _walk_layers(model):
            self._names.setdefault(id(layer), path)

    def name_layers_v3(self, model: Module) -> None:
        """Name an eager module and every module below it (``model``, ``model.0.fc1``...) and watch their calls.

        Each named module fires the hook after it is called, until `remove`.

        Example:
            >>> from maxfx.experimental.nn import Linear, Sequential
            >>> from maxfx.experimental.tensor import Tensor
            >>> hook = PrintHook(filter=["model.1"])
            >>> hook.name_layers_v3(Sequential(Linear(2, 2), Linear(2, 1)))
            >>> hook.remove()
        """
        if not isinstance(model, Module):
            raise TypeError(
                f"PrintHook.name_layers_v3 expects a max.experimental.nn Module, got {type(model).__name__}"
            )
        for path, module in [("model", model), *((f"model.{p}", m) for p, m in model.descendants)]:
            if id(module) not in self._names:
                self._names[id(module)] = path
                # The name travels with the hook: Module.compile traces copies of the modules.
                self._call_hook_removers.append(add_call_hook(module, functools.partial(self._print_call, path)))

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
        self._print_call(self._name_of(layer), layer, args, kwargs, outputs)

    def _print_call(self, name: str, layer: Any, args: tuple, kwargs: dict, outputs: Any) -> None:
        if self._filter is not None and name not in self._filter:
            return
        for i, t in enumerate(_tensors((args, kwargs))):
            self.print_value(f"{name}-input_{i}", t)
        outs = _tensors(outputs)
        for i, t in enumerate(outs):
            self.print_value(f"{name}-output" if len(outs) == 1 else f"{name}-output_{i}", t)
        return None

    def remove(self) -> None:
        """Stop adding print ops to graphs built from now on, and stop watching eager modules."""
        while self in _HOOKS:
            _HOOKS.remove(self)
        for remove in self._call_hook_removers:
            remove()
        self._call_hook_removers.clear()
