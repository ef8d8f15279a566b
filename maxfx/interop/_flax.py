"""Matching a maxfx Module's parameters to a ``flax.nnx`` tree, and copying them both ways."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from flax import nnx

from maxfx._weight_check import check_weight_value
from maxfx.experimental.nn import Embedding, LayerNorm, Linear, ModuleList
from maxfx.experimental.nn.module import Module

__all__ = ["StructureMismatchError", "flax_paths", "from_flax", "to_flax"]


class StructureMismatchError(ValueError):
    """The maxfx Module and the flax tree differ (a missing/extra key, a shape or a dtype)."""


# maxfx parameter name → (flax key, whether the layouts are transposes of each other).
_LAYOUTS: dict[type, dict[str, tuple[str, bool]]] = {
    Linear: {"weight": ("kernel", True), "bias": ("bias", False)},
    Embedding: {"weight": ("embedding", False)},
    LayerNorm: {"weight": ("scale", False), "bias": ("bias", False)},
}


@dataclass(frozen=True)
class _Pair:
    name: str  # qualified maxfx parameter name
    path: tuple  # flax path (keys as the flax tree spells them)
    transpose: bool


def _layout(module: Module) -> dict[str, tuple[str, bool]]:
    for cls in type(module).__mro__:
        if cls in _LAYOUTS:
            return _LAYOUTS[cls]
    return {}


def _fmt(path: tuple) -> str:
    return "/".join(str(k) for k in path) or "<root>"


def _key(tree: Mapping, name: str) -> Any:
    """The key of ``tree`` spelled ``name`` (flax uses ints for list items, maxfx strings)."""
    for k in tree:
        if str(k) == name:
            return k
    return None


# ─── structure matching ─────────────────────────────────────────────────


class _Matcher:
    def __init__(self) -> None:
        self.pairs: list[_Pair] = []
        self.layers: list[tuple[Module, tuple, str]] = []  # (module, flax path, maxfx prefix)

    def node(self, module: Module, tree: Any, path: tuple, prefix: str) -> None:
        where = f"maxfx {type(module).__name__} {prefix[:-1] or '<root>'!r}"
        if not isinstance(tree, Mapping):
            raise StructureMismatchError(
                f"{where}: flax has a leaf at {_fmt(path)!r} where a module (a mapping of parameters) is expected"
            )
        if isinstance(module, ModuleList) and _key(tree, "0") is None and list(map(str, tree)) == ["layers"]:
            tree, path = tree["layers"], (*path, "layers")  # nnx.Sequential keeps its items in `layers`
        self.layers.append((module, path, prefix))
        used: set = set()
        layout = _layout(module)
        for name, _ in module.local_parameters:
            fname, transpose = layout.get(name, (name, False))
            k = _key(tree, fname)
            if k is None:
                raise StructureMismatchError(
                    f"{where}: parameter {prefix + name!r} has no flax counterpart: key {fname!r} missing at "
                    f"{_fmt(path)!r} (flax has {sorted(map(str, tree))})"
                )
            used.add(k)
            self.pairs.append(_Pair(prefix + name, (*path, k), transpose))
        groups: dict[str, list[tuple[str, Module]]] = {}
        for name, child in module.children:
            head, _, rest = name.partition(".")
            groups.setdefault(head, []).append((rest, child))
        for head, items in groups.items():
            k = _key(tree, head)
            if k is None:
                raise StructureMismatchError(
                    f"{where}: child {prefix + head!r} has no flax counterpart: key {head!r} missing at {_fmt(path)!r} "
                    f"(flax has {sorted(map(str, tree))})"
                )
            used.add(k)
            if items[0][0] == "":
                self.node(items[0][1], tree[k], (*path, k), f"{prefix}{head}.")
            else:
                self.sequence(items, tree[k], (*path, k), f"{prefix}{head}.")
        extra = [str(k) for k in tree if k not in used]
        if extra:
            raise StructureMismatchError(
                f"{where}: flax has extra key(s) {extra} at {_fmt(path)!r} with no maxfx parameter or child"
            )

    def sequence(self, items: list[tuple[str, Module]], tree: Any, path: tuple, prefix: str) -> None:
        """A Python list of modules stored on one attribute (children ``attr.0``, ``attr.1``...)."""
        if not isinstance(tree, Mapping):
            raise StructureMismatchError(
                f"maxfx list {prefix[:-1]!r}: flax has a leaf at {_fmt(path)!r} where a list of modules is expected"
            )
        used = set()
        for index, child in items:
            k = _key(tree, index)
            if k is None:
                raise StructureMismatchError(
                    f"maxfx list {prefix[:-1]!r}: item {index} missing at {_fmt(path)!r} (flax has "
                    f"{sorted(map(str, tree))})"
                )
            used.add(k)
            self.node(child, tree[k], (*path, k), f"{prefix}{index}.")
        extra = [str(k) for k in tree if k not in used]
        if extra:
            raise StructureMismatchError(
                f"maxfx list {prefix[:-1]!r} has {len(items)} item(s) but flax has extra key(s) {extra} at "
                f"{_fmt(path)!r}"
            )


def _get(tree: Any, path: tuple) -> Any:
    for k in path:
        tree = tree[k]
    return tree


def _match(module: Module, tree: Mapping, flax_obj: Any) -> list[_Pair]:
    if not isinstance(module, Module):
        raise TypeError(f"maxfx.interop.flax: expected a maxfx experimental.nn Module, got {type(module).__name__}")
    m = _Matcher()
    m.node(module, tree, (), "")
    if isinstance(flax_obj, nnx.Module):
        _check_hyperparameters(m.layers, flax_obj)
    params = dict(module.parameters)
    for p in m.pairs:
        _check_leaf(p, params[p.name], _get(tree, p.path))
    return m.pairs


def _check_leaf(pair: _Pair, tensor: Any, leaf: Any) -> None:
    """The flax leaf, read in maxfx's layout (a Linear kernel transposed), must match the maxfx parameter."""
    shape, dtype = np.shape(leaf), leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
    as_maxfx = jax.ShapeDtypeStruct(shape[::-1] if pair.transpose else shape, dtype)
    layout = ", transposed: flax stores [in, out]" if pair.transpose else ""
    check_weight_value(
        pair.name,
        as_maxfx,
        tensor.shape,
        tensor.dtype,
        where="maxfx.interop.flax",
        error=StructureMismatchError,
        note=f" (flax {_fmt(pair.path)!r} is {np.dtype(dtype).name}{list(shape)}{layout})",
    )


def _check_hyperparameters(layers: list[tuple[Module, tuple, str]], root: nnx.Module) -> None:
    """Static settings that change the output: the two frameworks must agree or results differ silently."""
    for module, path, prefix in layers:
        if not isinstance(module, LayerNorm):
            continue
        obj = root
        for k in path:
            obj = obj[k] if isinstance(k, int) else getattr(obj, k)
        eps = getattr(obj, "epsilon", None)
        if eps is not None and not np.isclose(eps, module.eps, rtol=1e-6, atol=0):
            raise StructureMismatchError(
                f"maxfx LayerNorm {prefix[:-1] or '<root>'!r} has eps={module.eps} but flax {type(obj).__name__} at "
                f"{_fmt(path)!r} has epsilon={eps}; "
                f"build one with the other's value (e.g. nnx.LayerNorm(..., epsilon={module.eps}))"
            )


# ─── flax trees ────────────────────────────────────────────────────────────


def _param_tree(obj: Any) -> dict:
    """The nested dict of parameter arrays of an nnx Module, nnx State or nested mapping."""
    if isinstance(obj, nnx.Module):
        return nnx.to_pure_dict(nnx.state(obj, nnx.Param))
    if isinstance(obj, nnx.State):
        params = nnx.filter_state(obj, nnx.Param)
        return nnx.to_pure_dict(params if len(params) or not len(obj) else obj)  # a State of plain arrays has no Params
    if isinstance(obj, Mapping):
        return jax.tree.map(
            lambda v: v[...] if isinstance(v, nnx.Variable) else v,
            dict(obj),
            is_leaf=lambda v: isinstance(v, nnx.Variable),
        )
    raise TypeError(
        f"maxfx.interop.flax: expected an nnx.Module, nnx.State or nested dict of arrays, got {type(obj).__name__}"
    )


def _set(tree: dict, path: tuple, value: Any) -> None:
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def _maxfx_value(tensor: Any, pair: _Pair) -> Any:
    array = tensor._array()
    return array.T if pair.transpose else array


# ─── public API ───────────────────────────────────────────────────────────


def flax_paths(module: Module, flax_obj: Any) -> dict[str, str]:
    """Qualified maxfx parameter name → flax path (``"layers/0/kernel"``).

    Raises:
        StructureMismatchError: the structures differ (the message names the path).

    Example:
        >>> from flax import nnx
        >>> from maxfx.experimental.nn import LayerNorm
        >>> flax_paths(LayerNorm(4), nnx.LayerNorm(4, epsilon=1e-5, rngs=nnx.Rngs(0)))
        {'weight': 'scale', 'bias': 'bias'}
    """
    return {p.name: _fmt(p.path) for p in _match(module, _param_tree(flax_obj), flax_obj)}


def to_flax(module: Module, target: Any) -> Any:
    """Copy ``module``'s parameters into ``target``.

    Args:
        module: a maxfx ``experimental.nn`` Module.
        target: an ``nnx.Module`` (updated in place and returned), an ``nnx.State``
            or a nested dict of arrays (a new one with the values replaced is returned).

    Raises:
        StructureMismatchError: a key is missing or extra, or a shape/dtype differs
            (nothing is written then); also when a LayerNorm's eps differs.

    Example:
        >>> from flax import nnx
        >>> from maxfx.experimental.nn import Embedding
        >>> emb = Embedding(5, dim=3)
        >>> state = to_flax(emb, nnx.state(nnx.Embed(5, 3, rngs=nnx.Rngs(0))))
        >>> bool((state["embedding"][...] == emb.weight.to_numpy()).all())
        True
    """
    tree = _param_tree(target)
    pairs = _match(module, tree, target)
    params = dict(module.parameters)
    new: dict = {}
    for p in pairs:
        _set(new, p.path, _maxfx_value(params[p.name], p))
    if isinstance(target, nnx.Module):
        state = nnx.state(target, nnx.Param)
        nnx.replace_by_pure_dict(state, new)
        nnx.update(target, state)
        return target
    if isinstance(target, nnx.State):
        out = jax.tree.map(
            copy.copy, target, is_leaf=lambda v: isinstance(v, nnx.Variable)
        )  # leave the caller's state as it was
        nnx.replace_by_pure_dict(out, new)
        return out
    out = copy.deepcopy(tree)
    for p in pairs:
        _set(out, p.path, _get(new, p.path))
    return out


def from_flax(source: Any, module: Module) -> Module:
    """Load ``source``'s parameters (an ``nnx.Module``, ``nnx.State`` or nested dict) into ``module``.

    ``module`` is updated in place (and returned); it is unchanged when anything
    is raised.

    Raises:
        StructureMismatchError: a key is missing or extra, or a shape/dtype differs.

    Example:
        >>> from flax import nnx
        >>> from maxfx.experimental.nn import Linear
        >>> flax_layer = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
        >>> layer = from_flax(flax_layer, Linear(3, 2))
        >>> bool((layer.weight.to_numpy() == flax_layer.kernel[...].T).all())
        True
    """
    tree = _param_tree(source)
    pairs = _match(module, tree, source)
    state = {}
    for p in pairs:
        leaf = jax.numpy.asarray(_get(tree, p.path))
        state[p.name] = leaf.T if p.transpose else leaf
    module.load_state_dict(state)
    return module
