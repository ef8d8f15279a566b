"""A Module's fields: which attributes are data and which are static, and how static values compare.

Equinox's rules, adapted to MAX's mutable, optionally-dataclass Modules:

- The *fields* of a Module are its dataclass fields (`module_dataclass`), in
  declaration order, followed by every other attribute set on the instance (for
  plain subclasses: the attributes ``__init__`` sets), in assignment order.
- A field is *static* when declared with `static_field()` (or
  ``dataclasses.field(metadata={"static": True})``) or when its name starts
  with ``_``. Every other field is *data*: its value may be any pytree (a
  Tensor, a Module, lists, tuples and dicts of them); the Tensors in it are
  parameters, the Modules children, and its remaining leaves (``0``, ``None``,
  strings, configs) are static.
- Static values are part of the pytree structure, compared with ``==`` and
  hashed by value: two instances with equal static values share one
  ``jax.jit`` executable. An array or an unhashable value in a static place
  warns once per class and field (`StaticFieldWarning`): it is baked into
  compiled programs and cannot be compared cheaply, which is rarely intended.

Example:
    >>> from maxfx.experimental.nn import Module, module_dataclass, static_field
    >>> from maxfx.experimental.tensor import Tensor
    >>> @module_dataclass
    ... class Scale(Module):
    ...     factor: Tensor
    ...     name: str = static_field(default="scale")
    ...     def forward(self, x):
    ...         return x * self.factor
    >>> [n for n, _ in Scale(Tensor.ones([2])).parameters]
    ['factor']
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from maxfx.experimental._tensor import Tensor

__all__ = ["StaticFieldWarning", "StaticValue", "atom_value", "field_values", "static_field"]

_STATIC = "static"  # the dataclasses.Field metadata key, as in Equinox


def static_field(**kwargs: Any) -> Any:
    """A Module field holding static metadata (part of the pytree structure, never a parameter).

    Takes ``dataclasses.field``'s arguments (``default=``, ``default_factory=``,
    ...). In a `module_dataclass` it declares the field; in a plain subclass,
    ``name: T = static_field()`` at class level marks the attribute that
    ``__init__`` sets as static.

    Example:
        >>> from maxfx.experimental.nn import Module, static_field
        >>> class Scaled(Module):
        ...     factor: float = static_field()
        ...     def __init__(self, factor):
        ...         self.factor = factor
        >>> import jax
        >>> jax.tree_util.tree_structure(Scaled(2.0)) == jax.tree_util.tree_structure(Scaled(2.0))
        True
    """
    metadata = {**(kwargs.pop("metadata", None) or {}), _STATIC: True}
    return dataclasses.field(metadata=metadata, **kwargs)


class StaticFieldWarning(UserWarning):
    """An array or an unhashable value sits in a static place of a Module (see `static_field`)."""


# ─── which attributes are fields, and which are static (decided per class) ───


@dataclasses.dataclass(frozen=True)
class _ClassFields:
    declared: tuple[str, ...]  # dataclass fields, in declaration order
    static: frozenset[str]  # fields marked static_field()

    def items(self, module: Any) -> Iterator[tuple[str, Any, bool]]:
        """``(name, value, static)`` of ``module``'s fields: the declared ones first, in order."""
        values = vars(module)
        static = self.static
        if not self.declared:  # plain subclasses: attributes in the order __init__ set them
            return ((n, v, n in static or n[:1] == "_") for n, v in values.items())
        declared = [(n, values[n], n in static or n[:1] == "_") for n in self.declared if n in values]
        if len(declared) < len(values):
            seen = set(self.declared)
            declared += [(n, v, n in static or n[:1] == "_") for n, v in values.items() if n not in seen]
        return iter(declared)


_FIELDS_ATTR = "__maxfx_fields__"  # the cached _ClassFields, in the class's own __dict__ (gone with the class)


def _is_static_marker(f: Any) -> bool:
    return isinstance(f, dataclasses.Field) and bool(f.metadata.get(_STATIC, False))


def _fields_of(cls: type) -> _ClassFields:
    spec = cls.__dict__.get(_FIELDS_ATTR)
    if spec is None:
        declared = tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else ()
        static = {f.name for f in dataclasses.fields(cls) if _is_static_marker(f)} if declared else set()
        # Plain subclasses mark static attributes with a class-level static_field() (left as a class attribute).
        static |= {name for k in cls.__mro__ for name, value in vars(k).items() if _is_static_marker(value)}
        spec = _ClassFields(declared, frozenset(static))
        type.__setattr__(cls, _FIELDS_ATTR, spec)
    return spec


def field_values(module: Any) -> Iterator[tuple[str, Any, bool]]:
    """``(name, value, static)`` for each field of ``module``, in field order.

    Example:
        >>> from maxfx.experimental.nn import LayerNorm
        >>> [(n, s) for n, _, s in field_values(LayerNorm(2))]
        [('weight', False), ('bias', False), ('eps', False)]
    """
    return _fields_of(type(module)).items(module)


# ─── static values: compared and hashed by value ─────────────────────────────


def _frozen(value: Any) -> Any:
    """A hashable stand-in for lists, dicts and sets of hashable values (``TypeError`` otherwise)."""
    if isinstance(value, (list, tuple)):
        return (type(value), tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return (type(value), frozenset(_frozen(v) for v in value))
    hash(value)
    return value


_warned: weakref.WeakKeyDictionary[type, set[str]] = weakref.WeakKeyDictionary()
# Warnings point at the user's line: frames in maxfx and JAX are skipped.
_LIBRARY_DIRS = (
    os.path.dirname(os.path.abspath(jax.__file__)) + os.sep,
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,  # maxfx/
)


def _warn_once(owner: type, field: str, problem: str) -> None:
    seen = _warned.setdefault(owner, set())
    if field in seen:
        return
    seen.add(field)
    warnings.warn(f"{owner.__name__}.{field} {problem}", StaticFieldWarning, skip_file_prefixes=_LIBRARY_DIRS)


# Values that can hold no Tensor and hash by value: static without a pytree walk.
ATOMS = frozenset({int, float, complex, bool, str, bytes, type(None)})
_ATOM_CACHE_SIZE = 4096
_ATOM_VALUES: dict[tuple, StaticValue] = {}


def atom_value(value: Any) -> StaticValue:
    """The `StaticValue` of an `ATOMS` value, shared by every flatten that meets it (a flatten makes
    one per static field of every module, so a model's ~100 eps, sizes and names cost a dict lookup).

    Example:
        >>> atom_value(1e-5) is atom_value(1e-5), atom_value(0.0) is atom_value(-0.0)
        (True, False)
    """
    key = (type(value), value, math.copysign(1.0, value)) if type(value) is float else (type(value), value)
    static = _ATOM_VALUES.get(key)
    if static is None:
        if len(_ATOM_VALUES) >= _ATOM_CACHE_SIZE:  # values that keep changing (a step counter) must not pile up
            _ATOM_VALUES.clear()
        static = _ATOM_VALUES[key] = StaticValue(value, type(None), "", True)
    return static


class StaticValue:
    """A static value in a Module's pytree structure: equal when the values are equal (``==``).

    numpy arrays compare by content; JAX arrays and Tensors by identity (comparing
    them would read device memory); values with no hash are hashed by their type.
    Arrays and unhashable values warn once per class and field, naming the fix.
    """

    __slots__ = ("value", "_hash", "_identity")

    def __init__(self, value: Any, owner: type, field: str, declared_static: bool):
        self.value = value
        self._identity = False
        if type(value) in ATOMS:  # most static values (eps, sizes, names): every flatten makes these
            self._hash = hash(value)
            return
        if isinstance(value, np.ndarray):
            self._hash = hash((np.ndarray, value.shape, value.dtype.str))
            problem = "a numpy array"
        elif isinstance(value, (jax.Array, Tensor)):
            self._hash = id(value)
            self._identity = True
            problem = "a Tensor" if isinstance(value, Tensor) else "a JAX array"
        else:
            try:
                self._hash = hash(_frozen(value))
                return
            except TypeError:
                self._hash = hash(type(value))
                _warn_once(
                    owner,
                    field,
                    f"holds an unhashable {type(value).__name__} in a static place: it is compared with == on every "
                    "jax.jit call. Make it hashable (a tuple, a frozen dataclass).",
                )
                return
        where = (
            "in a static field" if declared_static else "in a data field; only Tensors are parameters, so it is static"
        )
        _warn_once(
            owner,
            field,
            f"holds {problem} {where}: it is compared on every jax.jit call and baked into compiled programs as a "
            f"constant. Store a Tensor (Tensor(...)) to make it a parameter, or a tuple if it is configuration.",
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StaticValue):
            return NotImplemented
        a, b = self.value, other.value
        if a is b:
            return True
        if self._identity or self._hash != other._hash or type(a) is not type(b):
            return False
        if isinstance(a, np.ndarray):
            return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))
        try:
            return bool(a == b)
        except Exception:  # noqa: BLE001 - == without a truth value (e.g. arrays inside a list): unequal
            return False

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"StaticValue({self.value!r})"
