"""`Module`: a mutable tree of child modules and Tensor parameters, and `module_dataclass`.

A Module is a plain Python object whose fields (its dataclass fields, or the
attributes ``__init__`` sets) hold its data: the Tensors in them (alone or in
lists, tuples and dicts) are its *local parameters*, the Modules its
*children*. Fields marked `static_field()`, private (``_name``) fields and the
other leaves (``0``, ``None``, strings, configs) are static metadata (see
``_fields``). Every subclass is registered as a JAX pytree when it is defined,
so ``jax.tree_util``, ``jax.jit``, ``jax.grad`` and optax see exactly its
parameters, and instances with equal static values share ``jax.jit``
executables.

Subclasses define ``forward`` (``__call__`` calls it) or override ``__call__``
directly (the ``module_v3`` style); `compile` traces whichever is defined into a
maxfx Graph whose weights are the parameters, compiled once per input shape.

Example:
    >>> from maxfx.experimental.tensor import Tensor
    >>> from maxfx.experimental.nn import Module, module_dataclass
    >>> @module_dataclass
    ... class Affine(Module):
    ...     weight: Tensor
    ...     bias: Tensor | int = 0
    ...     def forward(self, x: Tensor) -> Tensor:
    ...         return x @ self.weight.T + self.bias
    >>> m = Affine(Tensor.ones([2, 3]))
    >>> [name for name, _ in m.parameters]
    ['weight']
    >>> m(Tensor.ones([1, 3])).to_numpy().tolist()
    [[3.0, 3.0]]
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Annotated, Any, TypeVar

import jax
import numpy as np
from rich.pretty import pretty_repr

from lowering.types import Type
from maxfx import driver
from maxfx._weight_check import check_weight_value
from maxfx.driver._device import as_device
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn._compile import CompiledModel, compile_module
from maxfx.experimental.nn._fields import ATOMS, StaticValue, _fields_of, atom_value
from maxfx.experimental.nn._hooks import _CALL_HOOKS, add_call_hook
from maxfx.experimental.nn._subgraph import call_as_subgraph, in_graph_call
from maxfx.experimental.sharding import DeviceMapping, DeviceMesh, distribute

__all__ = [
    "CompiledModel",
    "Module",
    "PinnedDeviceTensor",
    "add_call_hook",
    "module_dataclass",
    "replace_module",
    "subgraphable",
]

_M = TypeVar("_M", bound="Module")


# ─── tree structure: one traversal for the pytree, parameters and children ───
#
# A data field's value is split into its nodes (Tensors and Modules, the pytree
# children) and its other leaves (static, part of the structure). The split is
# `_split_fields`; flatten, unflatten, `parameters`, `children` and the in-place
# updates all go through it, so they always agree.

# Exact node types, checked by identity before the isinstance below (subclasses still reach it).
_NODES: set[type] = {Tensor}


def _is_node(value: Any) -> bool:
    return isinstance(value, (Tensor, Module))


def _is_node_or_none(value: Any) -> bool:
    return value is None or isinstance(value, (Tensor, Module))


def _split_fields(module: Module) -> tuple[list[str], list[Any], tuple]:
    """``(names, children, layout)`` of ``module``'s pytree.

    ``children`` holds, per data field with nodes, the Tensor or Module itself,
    or its container with ``None`` at the static leaves (``names`` their field
    names). ``layout`` is the hashable structure, one entry per field:
    ``(name, None)`` for a node, ``(name, StaticValue)`` for a static value and
    ``(name, (treedef, ((index, StaticValue), ...)))`` for a container.
    """
    owner = type(module)
    names: list[str] = []
    children: list[Any] = []
    layout: list[tuple[str, Any]] = []
    for name, value, static in _fields_of(owner).items(module):
        if type(value) in ATOMS:
            layout.append((name, atom_value(value)))
            continue
        if static:
            layout.append((name, StaticValue(value, owner, name, True)))
            continue
        if type(value) in _NODES or isinstance(value, (Tensor, Module)):  # exact type first: the common case
            names.append(name)
            children.append(value)
            layout.append((name, None))
            continue
        leaves, treedef = jax.tree_util.tree_flatten(value, is_leaf=_is_node_or_none)
        if treedef.num_nodes == 1:  # a single non-node leaf (a config, an enum, an array)
            layout.append((name, StaticValue(value, owner, name, False)))
            continue
        nodes = [leaf if isinstance(leaf, (Tensor, Module)) else None for leaf in leaves]
        statics = tuple(
            (i, StaticValue(leaf, owner, name, False))
            for i, (leaf, node) in enumerate(zip(leaves, nodes))
            if node is None
        )
        names.append(name)
        children.append(treedef.unflatten(nodes))
        layout.append((name, (treedef, statics)))
    return names, children, tuple(layout)


def _rebuild(container: tuple, child: Any) -> Any:
    """A container field's value from its pytree child (nodes) and its static leaves."""
    treedef, statics = container
    leaves = treedef.flatten_up_to(child)
    for i, static in statics:
        leaves[i] = static.value
    return treedef.unflatten(leaves)


def _flatten(module: Module) -> tuple[list[Any], tuple]:
    _, children, layout = _split_fields(module)
    return children, layout


def _flatten_with_keys(module: Module) -> tuple[list[tuple[Any, Any]], tuple]:
    names, children, layout = _split_fields(module)
    return [(jax.tree_util.GetAttrKey(n), c) for n, c in zip(names, children)], layout


def _unflatten(cls: type, layout: tuple, children: Iterable[Any]) -> Module:
    module = object.__new__(cls)
    values = vars(module)
    it = iter(children)
    for name, entry in layout:
        if entry is None:
            values[name] = next(it)
        elif isinstance(entry, StaticValue):
            values[name] = entry.value
        else:
            values[name] = _rebuild(entry, next(it))
    return module


def _qualified(field: str, path: tuple) -> str:
    """``field.0.key`` for the node at pytree ``path`` inside a field's value."""
    parts = [field]
    for key in path:  # GetAttrKey, DictKey / FlattenedIndexKey, SequenceKey
        parts.append(str(next((getattr(key, a) for a in ("name", "key", "idx") if hasattr(key, a)), key)))
    return ".".join(parts)


def _nodes(module: Module) -> Iterator[tuple[str, Tensor | Module]]:
    """``(name, node)`` for every Tensor and Module in ``module``'s data fields, in field order.

    Items of a list field are named ``field.0``, ``field.1``, ...; entries of a
    dict field ``field.key``.
    """
    names, children, _ = _split_fields(module)
    for name, child in zip(names, children):
        if isinstance(child, (Tensor, Module)):
            yield name, child
        else:
            for path, node in jax.tree_util.tree_flatten_with_path(child, is_leaf=_is_node)[0]:
                yield _qualified(name, path), node


# ─── device pinning ──────────────────────────────────────────────────────


class _DevicePinned:
    """Annotation marker of `PinnedDeviceTensor` (annotate fields with that alias, not this)."""


PinnedDeviceTensor = Annotated[Tensor, _DevicePinned]
"""A `Tensor` field that `Module.to` leaves on its current device (MAX's alias).

For parameters that must stay put wherever the module goes, e.g. scalar scale
factors a kernel reads on the host::

    @module_dataclass
    class Scaled(Module):
        weight: Tensor
        scale: PinnedDeviceTensor  # stays on the CPU after .to(Accelerator())
"""


def _pinned_device_fields(cls: type) -> frozenset[str]:
    """Names of the fields ``cls`` (or a base) annotates as `PinnedDeviceTensor` (also as a string annotation)."""
    pinned = set()
    for base in cls.__mro__:
        for name, ann in vars(base).get("__annotations__", {}).items():
            if ann is PinnedDeviceTensor or (isinstance(ann, str) and ann.split(".")[-1] == "PinnedDeviceTensor"):
                pinned.add(name)
    return frozenset(pinned)


# ─── Module ───────────────────────────────────────────────────────────────


class Module:
    """Base class of eager-API neural-network modules.

    Subclass it (optionally with `module_dataclass`), store Tensors and child
    Modules as attributes, and define ``forward`` (or ``__call__``).
    ``Module[[Tensor], Tensor]`` is accepted for type checkers.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_with_keys(cls, _flatten_with_keys, functools.partial(_unflatten, cls), _flatten)
        _NODES.add(cls)

    def __class_getitem__(cls, params: Any) -> type:
        return cls

    def __setattr__(self, name: str, value: Any) -> None:
        # A float weight replaced by an integer Tensor (or the reverse) would fail only
        # when forward runs, far from the assignment: refuse it here. Same-kind changes
        # (float32 -> bfloat16, int8 -> uint8) and first assignments are plain Python.
        if isinstance(value, Tensor):
            old = self.__dict__.get(name)
            if isinstance(old, Tensor):
                _check_dtype_kind(self, name, old, value)
        object.__setattr__(self, name, value)

    # -- computation --------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's computation; subclasses override it (or ``__call__``)."""
        raise NotImplementedError(f"{type(self).__name__} must define forward() (or override __call__)")

    #: Set by `subgraphable`: calls inside a graph lower to one shared subgraph.
    _is_subgraphable: bool = False
    #: `subgraphable`'s ``name``: modules marked with one name share one subgraph.
    _subgraph_name: str | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._is_subgraphable and in_graph_call(args, kwargs):
            out = call_as_subgraph(self, self._subgraph_name, args, kwargs)
        else:
            out = self.forward(*args, **kwargs)
        if _CALL_HOOKS:  # debugging hooks (PrintHook.name_layers_v3) watch some instances
            for hook in _CALL_HOOKS.get(self, ()):
                hook(self, args, kwargs, out)
        return out

    # -- device ------------------------------------------------------------
    @property
    def device(self) -> driver.Device:
        """The device of the module's weights and computation (CPU unless set by `to`)."""
        return self.__dict__.get("_device") or driver.CPU()

    @device.setter
    def device(self, value: Any) -> None:
        self.__dict__["_device"] = as_device(value, f"{type(self).__name__}.device")

    def to(self: _M, target: Any) -> _M:
        """Move the parameters to ``target`` (in place) and record its device as ``self.device``; returns self.

        ``target`` is a `Device` (or DeviceRef), a `DeviceMesh` (parameters
        replicated over it) or a `DeviceMapping` (laid out as it says); with a
        mesh or mapping, ``device`` becomes the mesh's first device. Fields
        annotated `PinnedDeviceTensor` stay where they are (in this module and
        its descendants).

        Raises:
            TypeError: ``target`` is none of these.
        """
        where = f"{type(self).__name__}.to"
        if isinstance(target, DeviceMapping):
            primary, move = target.mesh.devices[0], (lambda t: distribute(t, target))
        elif isinstance(target, DeviceMesh):
            primary, move = target.devices[0], (lambda t: distribute(t, target))
        else:
            try:
                dev = as_device(target, where)
            except TypeError:
                raise TypeError(
                    f"{where}() expects a Device, DeviceMesh, or DeviceMapping, got {type(target).__name__}"
                ) from None
            primary, move = dev, (lambda t: t.to(dev))
        for _, m in self._walk(""):
            pinned = _pinned_device_fields(type(m))
            m.apply_to_local_parameters(lambda name, t, pinned=pinned: t if name.split(".")[0] in pinned else move(t))
            m.device = primary
        return self

    # -- traversal ---------------------------------------------------------
    @property
    def local_parameters(self) -> Iterator[tuple[str, Tensor]]:
        """``(field name, Tensor)`` for the Tensors in this module's data fields (list items as ``name.i``)."""
        for name, node in _nodes(self):
            if isinstance(node, Tensor):
                yield name, node

    @property
    def children(self) -> Iterator[tuple[str, Module]]:
        """``(field name, module)`` for direct child modules (list items as ``name.i``)."""
        for name, node in _nodes(self):
            if isinstance(node, Module):
                yield name, node

    def _walk(self, prefix: str) -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, child in self.children:
            yield from child._walk(f"{prefix}{name}.")

    @property
    def descendants(self) -> Iterator[tuple[str, Module]]:
        """``(qualified path, module)`` for every module below this one."""
        for path, m in self._walk(""):
            if m is not self:
                yield path[:-1], m

    descendents = descendants  # seed 003's spelling

    @property
    def parameters(self) -> Iterator[tuple[str, Tensor]]:
        """``(qualified name, Tensor)`` depth first: own parameters, then each child's."""
        for prefix, m in self._walk(""):
            for name, t in m.local_parameters:
                yield prefix + name, t

    def state_dict(self) -> dict[str, np.ndarray]:
        """Qualified parameter name → the parameter's values as a host numpy array.

        Host arrays (copied off accelerators) so that weight writers that take
        numpy arrays accept the dict as is, e.g.
        ``safetensors.numpy.save_file(model.state_dict(), "model.safetensors")``;
        `load_state_dict` takes it back. ``dict(model.parameters)`` gives the Tensors.

        Example:
            >>> from maxfx.experimental.nn import Linear
            >>> {k: v.shape for k, v in Linear(3, 2).state_dict().items()}
            {'weight': (2, 3), 'bias': (2,)}
        """
        return {name: t.to_numpy() for name, t in self.parameters}

    # -- updates -------------------------------------------------------------
    def apply_to_local_parameters(self, f: Callable[[str, Tensor], Tensor]) -> None:
        """Replace each local parameter ``name`` by ``f(name, tensor)`` (in place)."""
        names, children, layout = _split_fields(self)
        entries = dict(layout)
        for name, child in zip(names, children):
            if isinstance(child, Tensor):
                object.__setattr__(self, name, _as_tensor(f(name, child), name))
            elif not isinstance(child, Module):

                def replace(path: Any, node: Any, name: str = name) -> Any:
                    if not isinstance(node, Tensor):
                        return node
                    qualified = _qualified(name, path)
                    return _as_tensor(f(qualified, node), qualified)

                updated = jax.tree_util.tree_map_with_path(replace, child, is_leaf=_is_node)
                object.__setattr__(self, name, _rebuild(entries[name], updated))

    def apply_to_parameters(self, f: Callable[[str, Tensor], Tensor]) -> None:
        """Replace every parameter by ``f(qualified name, tensor)`` (in place, whole tree)."""
        for prefix, m in list(self._walk("")):
            m.apply_to_local_parameters(lambda name, t, prefix=prefix: f(prefix + name, t))

    def map_parameters(self: _M, f: Callable[[str, Tensor], Tensor]) -> _M:
        """A deep copy of the module tree with every parameter replaced by ``f(name, tensor)``."""
        # Tensors are immutable values here: the copy shares them until f replaces them.
        clone = copy.deepcopy(self, {id(t): t for _, t in self.parameters})
        clone.apply_to_parameters(f)
        return clone

    def load_state(self, lookup: Callable[..., Any] | Mapping[str, Any]) -> None:
        """Replace each parameter by ``lookup(name)`` or ``lookup(name, tensor)`` (by the lookup's arity).

        A mapping is accepted too (``model.load_state(weights)``).

        All values are fetched and checked before any is assigned: on error the
        module is unchanged.
        """
        if isinstance(lookup, Mapping):  # seed 003 also passes the dict itself
            lookup = lookup.__getitem__
        two_args = _arity(lookup) >= 2
        new = {name: (lookup(name, t) if two_args else lookup(name)) for name, t in self.parameters}
        self._assign_checked(new, "load_state")

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Load ``state`` (qualified name → DLPack array or Tensor) into the parameters.

        Raises:
            KeyError: a parameter has no entry in ``state``.
            ValueError: ``strict`` and ``state`` has keys that are not parameters; or a
                value's dtype or shape differs from its parameter.
        The module is unchanged when anything is raised.
        """
        names = [name for name, _ in self.parameters]
        missing = [n for n in names if n not in state]
        if missing:
            raise KeyError(
                f"{type(self).__name__}.load_state_dict: missing parameter(s) {missing}; state has {sorted(state)[:10]}"
            )
        if strict:
            extra = sorted(set(state) - set(names))
            if extra:
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: unexpected key(s) {extra} (strict=True); parameters are "
                    f"{names}"
                )
        self._assign_checked({n: state[n] for n in names}, "load_state_dict")

    def _assign_checked(self, new: Mapping[str, Any], where: str) -> None:
        current = dict(self.parameters)
        converted: dict[str, Tensor] = {}
        for name, value in new.items():
            old = current[name]
            t = _as_tensor(value, name, device=old.device)
            check_weight_value(name, t, old.shape, old.dtype, where=f"{type(self).__name__}.{where}")
            converted[name] = t if t.device == old.device else t.to(old.device)
        self.apply_to_parameters(lambda name, t: converted.get(name, t))

    # -- compile -------------------------------------------------------------
    def input_types(self) -> tuple[Type, ...]:
        """Input types for `compile` (layers that know their input shape define this)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not define input_types(); pass TensorTypes to compile() explicitly"
        )

    def compile(
        self, *input_types: Type, weights: Mapping[str, Any] | None = None, use_subgraphs: bool = False
    ) -> CompiledModel:
        """Trace the module into a Graph and compile it; returns a `CompiledModel` (callable on eager Tensors).

        Parameters become graph weights (arguments of the executable, never
        constants); ``weights`` (qualified name → array) overrides their values.
        Symbolic dims (``"batch"``) accept any size: one XLA compile per new shape.
        An input type may also be a one-device ``sharding.TensorLayout`` (MAX's
        input spec: dtype, shape and mapping).

        ``use_subgraphs=True`` (MAX's subgraphs, applied for you) traces each
        `Sequential` of two or more blocks with one structure (same class,
        static fields and parameter types) once, as a subgraph that every block
        calls with its own weights; the subgraph compiles to one executable run
        once per block, so compile time no longer grows with depth. Nothing is
        copied and parameter names are unchanged. The cost is one dispatch per
        block and no XLA fusion across blocks. Other Sequentials are traced as
        written.

        Raises:
            TypeError: the number of input types does not match ``forward``.
            ValueError: ``weights`` names an unknown parameter or has a wrong dtype/shape.
            RuntimeError: tracing failed (the message names the op).
        """
        entry = self.forward if type(self).forward is not Module.forward else self.__call__
        return compile_module(self, input_types, weights, entry=entry, use_subgraphs=use_subgraphs)

    # -- printing ------------------------------------------------------------
    def __rich_repr__(self) -> Iterator[tuple[str, Any]]:
        """MAX's: the child modules, ``name=child`` (``rich``'s repr protocol; layers yield their constructor's
        arguments).

        A field holding several modules (a list, a dict) is shown once, by its
        field name, with its Tensors as their types.
        """
        shown: set[str] = set()
        for name, _ in self.children:
            field = name.split(".", 1)[0]
            if field not in shown:
                shown.add(field)
                yield field, _for_repr(getattr(self, field))

    def __repr__(self) -> str:
        """``rich.pretty.pretty_repr(self)``, as MAX: one line up to 80 columns, else one child per line.

        What is printed is what `__rich_repr__` yields; a Tensor prints as its
        type, so a repr never realizes a lazy Tensor.

        Example:
            >>> from maxfx.experimental.nn import Linear, RMSNorm, Sequential
            >>> Sequential(Linear(4, 8), RMSNorm(8))
            Sequential(Linear(in_dim=Dim(4), out_dim=Dim(8)), RMSNorm(dim=Dim(8)))
            >>> Sequential(Linear(4, 8), RMSNorm(8), Linear(8, 2))
            Sequential(
                Linear(in_dim=Dim(4), out_dim=Dim(8)),
                RMSNorm(dim=Dim(8)),
                Linear(in_dim=Dim(8), out_dim=Dim(2))
            )
        """
        return pretty_repr(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__


def _dtype_kind(t: Tensor) -> str | None:
    """``"floating-point"`` or ``"integer"``; None for other dtypes (bool), which are not checked."""
    dtype = t.dtype
    return "floating-point" if dtype.is_float() else "integer" if dtype.is_integral() else None


def _check_dtype_kind(module: Module, name: str, old: Tensor, new: Tensor) -> None:
    """TypeError when ``new`` would replace ``module.name`` (a Tensor ``old``) with the other dtype kind.

    Example:
        >>> import numpy as np
        >>> from maxfx.experimental.nn import Linear
        >>> layer = Linear(2, 2)
        >>> layer.weight = Tensor(np.zeros((2, 2), np.int32))  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        TypeError: Linear.weight is a Tensor of dtype float32; the assigned Tensor has dtype int32
        (integer where floating-point is expected), which would fail only when the module runs;
        cast it first: value.cast(DType.float32)
    """
    before, after = _dtype_kind(old), _dtype_kind(new)
    if before is None or after is None or before == after:
        return
    raise TypeError(
        f"{type(module).__name__}.{name} is a Tensor of dtype {old.dtype.name}; the assigned Tensor has dtype "
        f"{new.dtype.name} "
        f"({after} where {before} is expected), which would fail only when the module runs; cast it first: "
        f"value.cast(DType.{old.dtype.name})"
    )


class _Verbatim:
    """An object whose repr is the given text: printed in a Tensor's place (its type, never its values)."""

    __slots__ = ("_text",)

    def __init__(self, text: str) -> None:
        self._text = text

    def __repr__(self) -> str:
        return self._text


def _dim_text(d: Any) -> Any:
    try:
        return int(d)
    except (TypeError, ValueError):
        return str(d)


def _tensor_text(t: Tensor) -> str:
    ty = t.type
    return f"Tensor(dtype={ty.dtype.name}, shape={[_dim_text(d) for d in ty.shape]}, device={ty.device})"


def _for_repr(value: Any) -> Any:
    """``value`` with each Tensor (also inside plain lists, tuples and dicts) replaced by a `_Verbatim` of its type."""
    if isinstance(value, Tensor):
        return _Verbatim(_tensor_text(value))
    if type(value) in (list, tuple):
        return type(value)(_for_repr(v) for v in value)
    if type(value) is dict:
        return {k: _for_repr(v) for k, v in value.items()}
    return value


def _module_dataclass_rich_repr(self: Any) -> Iterator[tuple[Any, ...]]:
    """MAX's repr of a `module_dataclass`: ``(name, value, default)`` per field; rich omits a value equal to its
    default.
    """
    for field in dataclasses.fields(self):
        value = getattr(self, field.name)
        if isinstance(value, Tensor) or field.default is dataclasses.MISSING:
            # MAX never gives a Tensor a default (rich would == compare it); nothing equals MISSING either.
            yield field.name, _for_repr(value)
        else:
            yield field.name, _for_repr(value), field.default


def _arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 2
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _as_tensor(value: Any, name: str, device: Any = None) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, driver.Tensor) or hasattr(value, "__dlpack__") or isinstance(value, np.ndarray):
        t = Tensor.from_dlpack(value)
        return t if device is None else t.to(device)
    raise TypeError(f"parameter {name!r}: expected a Tensor or DLPack array, got {type(value).__name__}")


# ─── subgraphs and surgery ───────────────────────────────────────────────


def subgraphable(module: Any = None, *, name: str | None = None) -> Any:
    """Mark a `Module` subclass or instance so its calls inside a graph lower to one shared subgraph.

    Speeds up graph building and compilation of repeated blocks: the first call
    (inside `Module.compile`, or any graph being built) traces the block into a
    subgraph; later calls of blocks with the same structure (class, static
    fields, parameter and input types) reuse it with their own weights, which
    are passed as subgraph arguments. With ``name``, all modules marked with
    that name share one subgraph. Eager calls run ``forward`` as usual.
    Kernel fusion does not cross a subgraph boundary, so mark large blocks.

    Usable as a class decorator (``@subgraphable``, ``@subgraphable(name="block")``)
    or on an instance (``subgraphable(layer, name="block")``).

    Raises:
        TypeError: ``module`` is not a Module subclass or instance.

    Example:
        >>> from maxfx.dtype import DType
        >>> from maxfx.experimental.nn import Linear, Sequential
        >>> from maxfx.experimental.tensor import Tensor
        >>> from maxfx.graph import TensorType
        >>> net = Sequential(*[subgraphable(Linear(4, 4)) for _ in range(3)])
        >>> compiled = net.compile(TensorType(DType.float32, ["batch", 4], device=net.device))
        >>> len(compiled.graph._subgraphs)  # three blocks, one subgraph
        1
        >>> compiled(Tensor.ones([2, 4])).shape
        [Dim(2), Dim(4)]
    """
    if module is None:
        return lambda m: subgraphable(m, name=name)
    if (isinstance(module, type) and issubclass(module, Module)) or isinstance(module, Module):
        if isinstance(module, Module):
            object.__setattr__(module, "_is_subgraphable", True)
            object.__setattr__(module, "_subgraph_name", name)
        else:
            module._is_subgraphable = True
            module._subgraph_name = name
        return module
    raise TypeError(f"subgraphable expects a Module subclass or instance, got {type(module).__name__}")


def replace_module(root: Module, name: str, new: Module) -> Module:
    """Put ``new`` at the qualified path ``name`` of ``root``'s tree (in place); returns the module it replaces.

    ``name`` is a path as `Module.descendants` names it (``"layers.0.mlp"``;
    list items by index, dict entries by key). Use it to swap a layer for
    another (a quantized or LoRA-wrapped one) without rebuilding the tree.

    Raises:
        TypeError: ``new`` is not a Module.
        KeyError: no descendant of ``root`` has that path.

    Example:
        >>> from maxfx.experimental.nn import Linear, Sequential
        >>> net = Sequential(Linear(4, 4), Linear(4, 2))
        >>> old = replace_module(net, "1", Linear(4, 3))
        >>> old.weight.shape, net[1].weight.shape
        ([Dim(2), Dim(4)], [Dim(3), Dim(4)])
    """
    if not isinstance(new, Module):
        raise TypeError(f"replace_module: new must be a Module, got {type(new).__name__}")
    paths = dict(root.descendants)
    if name not in paths:
        raise KeyError(
            f"replace_module: {type(root).__name__} has no descendant {name!r} (descendants: {sorted(paths)})"
        )
    old = paths[name]
    parent_path, _, leaf = name.rpartition(".")
    parent = paths[parent_path] if parent_path else root
    for field, node in list(_nodes(parent)):
        if node is old and field.split(".")[-1] == leaf:
            head, _, rest = field.partition(".")
            if not rest:
                object.__setattr__(parent, head, new)
            else:
                container = getattr(parent, head)
                key: Any = int(rest) if isinstance(container, (list, tuple)) else rest
                if isinstance(container, tuple):
                    object.__setattr__(
                        parent, head, type(container)(new if i == key else v for i, v in enumerate(container))
                    )
                else:
                    container[key] = new
            return old
    raise KeyError(f"replace_module: {name!r} is not directly settable on {type(parent).__name__}")


# ─── module_dataclass ────────────────────────────────────────────────────


def module_dataclass(cls: type | None = None, /, *, repr: bool = False, **kwargs: Any):  # noqa: A002 - MAX's name
    """``dataclasses.dataclass`` for Modules: fields become attributes, ``Module.__repr__`` is kept.

    Usable bare (``@module_dataclass``) or with arguments
    (``@module_dataclass(repr=True, frozen=False)``). Equality stays identity
    (modules are mutable and hashable). The fields, in declaration order, are
    the Module's pytree fields; declare static ones with `static_field()`.
    As in MAX, a class without its own ``__rich_repr__`` prints every field
    (``name=value``, omitted when equal to its default; Tensors as their type).

    Example:
        >>> from maxfx.experimental.tensor import Tensor
        >>> @module_dataclass
        ... class Scale(Module):
        ...     weight: Tensor
        ...     offset: float = 0.0
        >>> Scale(Tensor.ones([2]))
        Scale(weight=Tensor(dtype=float32, shape=[2], device=cpu:0))
        >>> Scale(Tensor.ones([2]), offset=1.0)
        Scale(weight=Tensor(dtype=float32, shape=[2], device=cpu:0), offset=1.0)
    """

    def wrap(c: type) -> type:
        kwargs.setdefault("eq", False)
        decorated = dataclasses.dataclass(c, repr=repr, **kwargs)
        if getattr(decorated, "__rich_repr__", None) is Module.__rich_repr__:
            decorated.__rich_repr__ = _module_dataclass_rich_repr
        return decorated

    return wrap if cls is None else wrap(cls)
