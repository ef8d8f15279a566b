"""`Module`: a mutable tree of child modules and Tensor parameters, and `module_dataclass`.

A Module is a plain Python object whose Tensor attributes are its *local
parameters* and whose Module attributes (or lists/tuples of Modules) are its
*children*. Every subclass is registered as a JAX pytree when it is defined, so
``jax.tree_util``, ``jax.jit``, ``jax.grad`` and optax see its parameters;
other attributes are static metadata.

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
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import jax
import numpy as np

from lowering.types import Type
from maxfx import driver
from maxfx.driver._device import as_device
from maxfx.experimental._tensor import Tensor

__all__ = ["Module", "module_dataclass"]

_M = TypeVar("_M", bound="Module")


# ─── tree structure ───────────────────────────────────────────────────────


def _is_module_seq(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, Module) for v in value)


def _attributes(module: Module) -> Iterator[tuple[str, Any]]:
    for name, value in vars(module).items():
        if not name.startswith("_"):
            yield name, value


class _Static:
    """Hashable wrapper for static (non-parameter) attributes in pytree metadata."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Static):
            return NotImplemented
        try:
            return bool(self.value == other.value)
        except Exception:  # arrays and other values without a boolean ==
            return self.value is other.value

    def __hash__(self) -> int:
        try:
            return hash(self.value)
        except TypeError:
            return id(self.value)


def _flatten(module: Module):
    names, children, static = [], [], []
    for name, value in vars(module).items():
        if isinstance(value, (Tensor, Module)) or _is_module_seq(value):
            names.append(name)
            children.append(value)
        else:
            static.append((name, _Static(value)))
    return children, (type(module), tuple(names), tuple(static))


def _flatten_with_keys(module: Module):
    children, aux = _flatten(module)
    return [(jax.tree_util.GetAttrKey(n), c) for n, c in zip(aux[1], children)], aux


def _unflatten(aux, children) -> Module:
    cls, names, static = aux
    module = object.__new__(cls)
    for name, value in static:
        object.__setattr__(module, name, value.value)
    for name, value in zip(names, children):
        object.__setattr__(module, name, list(value) if isinstance(value, list) else value)
    return module


# ─── Module ───────────────────────────────────────────────────────────────


class Module:
    """Base class of eager-API neural-network modules.

    Subclass it (optionally with `module_dataclass`), store Tensors and child
    Modules as attributes, and define ``forward`` (or ``__call__``).
    ``Module[[Tensor], Tensor]`` is accepted for type checkers.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_with_keys(cls, _flatten_with_keys, _unflatten, _flatten)

    def __class_getitem__(cls, params: Any) -> type:
        return cls

    # -- computation --------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's computation; subclasses override it (or ``__call__``)."""
        raise NotImplementedError(f"{type(self).__name__} must define forward() (or override __call__)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    # -- device ------------------------------------------------------------
    @property
    def device(self) -> driver.Device:
        """The device of the module's weights and computation (CPU unless set by `to`)."""
        return self.__dict__.get("_device") or driver.CPU()

    @device.setter
    def device(self, value: Any) -> None:
        self.__dict__["_device"] = as_device(value, f"{type(self).__name__}.device")

    def to(self: _M, device: Any) -> _M:
        """Move every parameter to ``device`` (in place), record it as ``self.device``; returns self."""
        dev = as_device(device, f"{type(self).__name__}.to")
        self.apply_to_parameters(lambda _, t: t.to(dev))
        for _, m in self._walk(""):
            m.device = dev
        return self

    # -- traversal ---------------------------------------------------------
    @property
    def local_parameters(self) -> Iterator[tuple[str, Tensor]]:
        """``(attribute name, Tensor)`` for the Tensors stored directly on this module."""
        for name, value in _attributes(self):
            if isinstance(value, Tensor):
                yield name, value

    @property
    def children(self) -> Iterator[tuple[str, Module]]:
        """``(attribute name, module)`` for direct child modules (list items as ``name.i``)."""
        for name, value in _attributes(self):
            if isinstance(value, Module):
                yield name, value
            elif _is_module_seq(value):
                for i, m in enumerate(value):
                    yield f"{name}.{i}", m

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

    def state_dict(self) -> dict[str, Tensor]:
        """Qualified parameter name → Tensor."""
        return dict(self.parameters)

    # -- updates -------------------------------------------------------------
    def apply_to_local_parameters(self, f: Callable[[str, Tensor], Tensor]) -> None:
        """Replace each local parameter ``name`` by ``f(name, tensor)`` (in place)."""
        for name, t in list(self.local_parameters):
            object.__setattr__(self, name, _as_tensor(f(name, t), name))

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
        self._assign_checked(new)

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
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing parameter(s) {missing}; state has {sorted(state)[:10]}")
        if strict:
            extra = sorted(set(state) - set(names))
            if extra:
                raise ValueError(f"{type(self).__name__}.load_state_dict: unexpected key(s) {extra} (strict=True); parameters are {names}")
        self._assign_checked({n: state[n] for n in names})

    def _assign_checked(self, new: Mapping[str, Any]) -> None:
        current = dict(self.parameters)
        converted: dict[str, Tensor] = {}
        for name, value in new.items():
            old = current[name]
            t = _as_tensor(value, name, device=old.device)
            if t.dtype is not old.dtype or list(t.shape) != list(old.shape):
                raise ValueError(
                    f"{type(self).__name__}: parameter {name!r} expects {old.dtype.name}{[int(d) for d in old.shape]}, "
                    f"got {t.dtype.name}{[int(d) for d in t.shape]}"
                )
            converted[name] = t if t.device == old.device else t.to(old.device)
        self.apply_to_parameters(lambda name, t: converted.get(name, t))

    # -- compile -------------------------------------------------------------
    def input_types(self) -> tuple[Type, ...]:
        """Input types for `compile` (layers that know their input shape define this)."""
        raise NotImplementedError(f"{type(self).__name__} does not define input_types(); pass TensorTypes to compile() explicitly")

    def compile(self, *input_types: Type, weights: Mapping[str, Any] | None = None) -> Callable[..., Any]:
        """Trace the module into a Graph and compile it; returns a callable on eager Tensors.

        Parameters become graph weights (arguments of the executable, never
        constants); ``weights`` (qualified name → array) overrides their values.
        Symbolic dims (``"batch"``) accept any size: one XLA compile per new shape.

        Raises:
            TypeError: the number of input types does not match ``forward``.
            RuntimeError: tracing failed (the message names the op).
        """
        from maxfx.experimental.nn._compile import compile_module  # noqa: PLC0415

        return compile_module(self, input_types, weights)

    # -- printing ------------------------------------------------------------
    def __repr__(self) -> str:
        fields = [(n, v) for n, v in _attributes(self)]
        if not fields:
            return f"{type(self).__name__}()"
        inner = ",\n".join(f"{n}={_short_repr(v)}" for n, v in fields)
        return f"{type(self).__name__}(\n" + _indent(inner) + "\n)"

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def _short_repr(value: Any) -> str:
    if isinstance(value, Tensor):
        t = value.type
        return f"Tensor(dtype={t.dtype.name}, shape={[int(d) for d in t.shape]}, device={t.device})"
    if _is_module_seq(value):
        return "[\n" + _indent(",\n".join(repr(m) for m in value)) + "\n]"
    return repr(value)


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


# ─── module_dataclass ────────────────────────────────────────────────────


def module_dataclass(cls: type | None = None, /, *, repr: bool = False, **kwargs: Any):  # noqa: A002 - MAX's name
    """``dataclasses.dataclass`` for Modules: fields become attributes, ``Module.__repr__`` is kept.

    Usable bare (``@module_dataclass``) or with arguments
    (``@module_dataclass(repr=True, frozen=False)``). Equality stays identity
    (modules are mutable and hashable).
    """

    def wrap(c: type) -> type:
        kwargs.setdefault("eq", False)
        return dataclasses.dataclass(c, repr=repr, **kwargs)

    return wrap if cls is None else wrap(cls)

