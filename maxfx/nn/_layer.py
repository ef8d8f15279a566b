"""Graph-API modules (``max.nn.Module``, ``Layer``, ``LayerList``) and layer hooks.

A graph-API `Module` holds `Weight`\\ s and child Modules as attributes and
builds graph ops in ``__call__`` (on `TensorValue`\\ s, inside ``with Graph``).
The Module tree gives every Weight a unique qualified name (``up.weight``,
``layers.3.attention.wq.weight``); `load_state_dict` binds values to them and
`state_dict` returns the mapping ``InferenceSession.load(...,
weights_registry=...)`` needs.

Example:
    >>> from maxfx import nn
    >>> from maxfx.dtype import DType
    >>> from maxfx.graph import DeviceRef, Weight
    >>> class Scale(nn.Module):
    ...     def __init__(self):
    ...         self.weight = Weight("weight", DType.float32, [3], DeviceRef.CPU())
    ...     def __call__(self, x):
    ...         return x * self.weight
    >>> class Net(nn.Module):
    ...     def __init__(self):
    ...         self.a, self.b = Scale(), Scale()
    ...     def __call__(self, x):
    ...         return self.b(self.a(x))
    >>> sorted(Net().state_dict())
    ['a.weight', 'b.weight']
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lowering.dims import format_shape
from lowering.types import Type
from maxfx._weight_check import check_weight_value
from maxfx.driver._tensor import Buffer, as_array
from maxfx.graph import Graph
from maxfx.graph._weight import ShardingStrategy, Weight

__all__ = ["Layer", "Module", "LayerList", "Shardable", "add_layer_hook", "clear_hooks", "recursive_named_layers"]

_HOOKS: list[Callable[..., Any]] = []


def add_layer_hook(fn: Callable[[Any, tuple, dict, Any], Any]) -> None:
    """Call ``fn(layer, args, kwargs, outputs)`` after every layer call; a non-None return replaces the outputs.

    Example:
        >>> seen = []
        >>> add_layer_hook(lambda layer, args, kwargs, out: seen.append(type(layer).__name__))
        >>> clear_hooks()
    """
    _HOOKS.append(fn)


def clear_hooks() -> None:
    """Remove every layer hook."""
    _HOOKS.clear()


def _with_hooks(call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        out = call(self, *args, **kwargs)
        for hook in list(_HOOKS):
            replaced = hook(self, args, kwargs, out)
            if replaced is not None:
                out = replaced
        return out

    wrapper.__maxfx_hooked__ = True
    return wrapper


class Layer:
    """Base of graph-API layers (MAX deprecated it in favour of `Module`; kept for hooks and typing).

    Every subclass's ``__call__`` runs the layer hooks (`add_layer_hook`).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        call = cls.__dict__.get("__call__")
        if call is not None and not getattr(call, "__maxfx_hooked__", False):
            cls.__call__ = _with_hooks(call)


@runtime_checkable
class Shardable(Protocol):
    """Something with a `ShardingStrategy` that can be split over devices."""

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """How the object splits over devices (None: not sharded)."""
        return getattr(self, "_sharding_strategy", None)

    def shard(self, devices: Iterable[Any]) -> Sequence[Any]:
        """Sharded views of this object, one per device."""
        raise TypeError(f"{type(self).__name__} does not support sharding (it defines no shard())")


def _static_dims(shape: Iterable[Any]) -> list[int | None]:
    """Each dimension's size, None for a symbolic or algebraic one."""
    out: list[int | None] = []
    for d in shape:
        try:
            out.append(int(d))
        except TypeError:
            out.append(None)
    return out


def _is_module_seq(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, Module) for v in value)


class Module(Layer):
    """Graph-API module: tracks `Weight` attributes and child modules.

    Works without ``super().__init__()`` (seed 004's example omits it).
    """

    def __init__(self) -> None:
        self._ensure_init()

    def _ensure_init(self) -> None:
        d = self.__dict__
        if "_layer_weights" not in d:
            d["_layer_weights"] = {}  # attribute name -> Weight
            d["_weight_keys"] = {}  # attribute name -> its state-dict key (the Weight's name when assigned)
            d["_sublayers"] = {}
            d["_shared"] = set()

    def __setattr__(self, name: str, value: Any) -> None:
        self._ensure_init()
        d = self.__dict__
        d["_layer_weights"].pop(name, None)
        d["_weight_keys"].pop(name, None)
        d["_sublayers"].pop(name, None)
        if not name.startswith("_"):
            if isinstance(value, Weight):
                d["_layer_weights"][name] = value
                # As in MAX, a weight's key is its own name (``self.fc1_weight = Weight("fc1.weight", ...)``
                # is ``fc1.weight``); the usual ``self.weight = Weight("weight", ...)`` is the attribute name.
                d["_weight_keys"][name] = value.name or name
            elif isinstance(value, Module):
                d["_sublayers"][name] = value
            elif _is_module_seq(value):
                d["_sublayers"][name] = LayerList(list(value))
        object.__setattr__(self, name, value)

    # -- tree ------------------------------------------------------------------
    @property
    def layer_weights(self) -> dict[str, Weight]:
        """Local weight name (the Weight's name when it was assigned) → Weight (shared weights excluded)."""
        self._ensure_init()
        keys = self._weight_keys
        return {keys.get(k, k): w for k, w in self._layer_weights.items() if k not in self._shared}

    @property
    def sublayers(self) -> dict[str, Module]:
        """Attribute name → direct child module."""
        self._ensure_init()
        return dict(self._sublayers)

    def set_shared_weight(self, name: str, weight: Weight) -> None:
        """Store ``weight`` as attribute ``name`` without owning it (state dicts skip it)."""
        setattr(self, name, weight)
        self._shared.add(name)

    # A module whose own attribute name is left out of its descendants' weight names
    # (``parent.child.w`` is named ``parent.w``): MAX's unfused StackedLinear sets it
    # so ``qkv_proj = StackedLinear(names=["q_proj", ...])`` keeps checkpoint names.
    _omit_module_attr_name: bool = False

    def raw_state_dict(self) -> dict[str, Weight]:
        """Qualified name → Weight for every owned weight; also gives each Weight that name.

        Raises:
            ValueError: two different weights get the same qualified name (MAX's
                ``Duplicate weight FQN``), e.g. through ``_omit_module_attr_name``.
        """
        out: dict[str, Weight] = {}
        owners: dict[str, str] = {}
        for path, prefix, layer in _weight_owners(self):
            for name, w in layer.layer_weights.items():
                qualified = prefix + name
                if qualified in out and out[qualified] is not w:
                    raise ValueError(
                        f"{type(self).__name__}: Duplicate weight FQN {qualified!r} produced by two distinct attribute "
                        "paths: "
                        f"{owners[qualified] or '<root>'!r} and {path or '<root>'!r}. A module that sets "
                        "_omit_module_attr_name "
                        "(notably StackedLinear with stacked=False) leaves its own attribute name out of its weights' "
                        "names, "
                        "so one of its children can collide with a sibling; rename one of them"
                    )
                w.name = qualified
                out[qualified] = w
                owners[qualified] = path
        return out

    def state_dict(self, auto_initialize: bool = True) -> dict[str, Any]:
        """Qualified name → value for every weight: what `load_state_dict` bound, or a zero-filled driver `Buffer`.

        Weights never loaded are zero Buffers (as in MAX) when ``auto_initialize``, else a ValueError.

        Raises:
            ValueError: a weight has no value and ``auto_initialize`` is False,
                or its shape has symbolic dimensions (no size to zero-fill).
        """
        out: dict[str, Any] = {}
        for name, w in self.raw_state_dict().items():
            value = getattr(w, "_loaded_value", None)
            if value is None:
                if not auto_initialize:
                    raise ValueError(
                        f"{type(self).__name__}.state_dict: weight {name!r} has no value; call load_state_dict first"
                    )
                dims = _static_dims(w.shape)
                if any(d is None for d in dims):
                    raise ValueError(
                        f"{type(self).__name__}.state_dict: weight {name!r} has symbolic shape "
                        f"{format_shape(w.shape)}; load a value with load_state_dict first"
                    )
                value = Buffer.zeros(dims, w.dtype)
            out[name] = value
        return out

    def load_state_dict(
        self,
        state_dict: Mapping[str, Any],
        *,
        override_quantization_encoding: bool = False,
        weight_alignment: int | None = None,
        strict: bool = True,
    ) -> None:
        """Bind values (numpy/DLPack arrays, driver Tensors, `WeightData`) to the weights by name.

        Raises:
            ValueError: ``strict`` and a weight is missing or a key is unused; a value's
                dtype or shape differs from its Weight; a value is not aligned. Nothing
                is bound when anything is raised.
        """
        weights = self.raw_state_dict()
        if strict:
            missing = sorted(set(weights) - set(state_dict))
            unused = sorted(set(state_dict) - set(weights))
            if missing or unused:
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: "
                    + (f"Missing required weights: missing weight(s) {missing}" if missing else "")
                    + ("; " if missing and unused else "")
                    + (f"Unexpected keys in state_dict: unused key(s) {unused}" if unused else "")
                )
        staged: list[tuple[Weight, Any, Any]] = []
        for name, w in weights.items():
            if name not in state_dict:
                continue
            raw = state_dict[name]
            encoding = getattr(raw, "quantization_encoding", None)
            value = getattr(raw, "data", raw) if hasattr(raw, "quantization_encoding") else raw
            arr = as_array(value)
            check_weight_value(name, arr, w.shape, w.dtype, where=f"{type(self).__name__}.load_state_dict")
            align = weight_alignment or w.align or np.dtype(arr.dtype).alignment
            if isinstance(arr, np.ndarray) and arr.size and arr.ctypes.data % align:
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: Found unaligned weight {name!r}: its data is not aligned "
                    f"to {align} bytes; copy it or pass weight_alignment="
                )
            staged.append((w, value, encoding))
        for w, value, encoding in staged:
            w._loaded_value = value
            if override_quantization_encoding and encoding is not None:
                w.quantization_encoding = encoding

    def build_subgraph(self, name: str, input_types: Sequence[Type | list[Type]], weight_prefix: str = "") -> Any:
        """A subgraph of the current Graph computing this layer, for ``ops.call(sub, *args, prefix=...)``.

        Weights whose qualified names start with ``weight_prefix`` become
        placeholders named without it; each ``ops.call`` supplies the prefix that
        selects one layer's weights.
        """
        parent = Graph.current
        if parent is None:
            raise RuntimeError(f"{type(self).__name__}.build_subgraph: call it while building a Graph")
        groups = [list(t) if isinstance(t, (list, tuple)) else [t] for t in input_types]
        flat = [t for g in groups for t in g]
        sub = parent.add_subgraph(name, input_types=flat)
        weights = self.raw_state_dict()
        renamed = {}
        for qualified, w in weights.items():
            full = weight_prefix + qualified if not qualified.startswith(weight_prefix) else qualified
            if weight_prefix and full.startswith(weight_prefix):
                renamed[w] = (w.name, w._placeholder)
                w.name, w._placeholder = full[len(weight_prefix) :], True
        try:
            with sub:
                values = list(sub.inputs)
                args, i = [], 0
                for g, spec in zip(groups, input_types):
                    chunk = values[i : i + len(g)]
                    i += len(g)
                    args.append(chunk if isinstance(spec, (list, tuple)) else chunk[0])
                out = self(*args)
                outs = list(out) if isinstance(out, (list, tuple)) else [out]
                sub.output(*outs)
        finally:
            for w, (old, placeholder) in renamed.items():
                w.name, w._placeholder = old, placeholder
        return sub

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self.sublayers) or ''})"


class LayerList(Module):
    """A list of layers registered as children ``0``, ``1``, ...

    As in MAX, an item may also be a plain callable (``ops.relu``, a lambda):
    it is applied in its place but holds no weights, so it is no child; the
    modules keep their positions as names (``Sequential([Linear, ops.relu,
    Linear])`` names its weights ``0.weight`` and ``2.weight``).

    Example:
        >>> layers = LayerList([Module(), Module()])
        >>> list(layers.sublayers)
        ['0', '1']
    """

    def __init__(self, layers: Iterable[Module]):
        super().__init__()
        self.layers = []
        for layer in layers:
            self.append(layer)

    def _sync(self) -> None:
        self._sublayers.clear()
        for i, layer in enumerate(self.__dict__["layers"]):
            if isinstance(layer, Layer):  # a plain callable holds no weights: no child
                self._sublayers[str(i)] = layer

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "layers":
            self._ensure_init()
            object.__setattr__(self, name, list(value))
            self._sync()
        else:
            super().__setattr__(name, value)

    def append(self, layer: Module) -> None:
        """Add ``layer`` at the end."""
        self.insert(len(self.layers), layer)

    def extend(self, layer: Iterable[Module]) -> None:
        """Add every layer of ``layer`` at the end."""
        for item in layer:
            self.append(item)

    def insert(self, i: int, layer: Module | Callable[..., Any]) -> None:
        """Insert ``layer`` (a Module, or a plain callable such as ``ops.relu``) before position ``i``."""
        if not isinstance(layer, Layer) and not callable(layer):
            raise TypeError(
                f"LayerList: expected a Module or a callable (e.g. ops.relu), got {type(layer).__name__} {layer!r:.60}"
            )
        self.__dict__["layers"].insert(i, layer)
        self._sync()

    def __getitem__(self, i: int) -> Module:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[Module]:
        return iter(self.layers)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Apply the layers in order (each takes the previous one's output)."""
        x = args[0] if len(args) == 1 else args
        for layer in self.layers:
            x = layer(x, **kwargs)
        return x


def _weight_owners(parent: Module, path: str = "", prefix: str = "") -> Iterator[tuple[str, str, Module]]:
    """``(attribute path, weight-name prefix, layer)`` for ``parent`` and every layer below it;
    the prefix skips the names of modules with ``_omit_module_attr_name``."""
    yield path, prefix, parent
    for name, child in parent.sublayers.items():
        child_prefix = prefix if child._omit_module_attr_name else f"{prefix}{name}."
        yield from _weight_owners(child, f"{path}.{name}" if path else name, child_prefix)


def recursive_named_layers(parent: Module, prefix: str = "") -> Iterator[tuple[str, Module]]:
    """``(qualified name, layer)`` for ``parent`` (named ``prefix``) and every layer below it."""
    for path, _, layer in _weight_owners(parent, prefix):
        yield path, layer
