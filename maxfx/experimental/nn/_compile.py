"""`Module.compile`: trace a module into a Graph, compile it, call it on eager Tensors.

With ``scan_layers=True`` each `Sequential` of identical blocks is traced once,
as a loop over its blocks' weights stacked into ``[n, ...]`` arrays
(`_ScannedSequential`), so compile time does not grow with depth.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.compile import InputMismatchError
from lowering.dtypes import DType
from lowering.types import DeviceRef, Type
from lowering.x64 import x64
from maxfx.driver._tensor import as_array
from maxfx.engine import InferenceSession, Model
from maxfx.experimental._tensor import Tensor, _leaf
from maxfx.graph import Graph, Weight, ops

__all__ = ["CompiledModule", "compile_module"]


def _check_arity(name: str, entry: Callable[..., Any], input_types: Sequence[Type]) -> None:
    try:
        params = list(inspect.signature(entry).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= len(input_types) <= len(positional):
        raise TypeError(
            f"{name}.compile: got {len(input_types)} input type(s) but forward takes "
            f"{len(required)}" + (f" to {len(positional)}" if len(positional) != len(required) else "") + f" positional argument(s) ({', '.join(p.name for p in positional)})"
        )


# ─── scan_layers: which Sequentials become loops ────────────────────────────


def _applies_children_in_order(module: Any) -> bool:
    """Whether ``module``'s forward is `Sequential`'s (the class defining it sets ``_children_in_order``).

    A subclass that overrides ``forward`` is traced as written.
    """
    owner = next(k for k in type(module).__mro__ if "forward" in vars(k))
    return bool(vars(owner).get("_children_in_order", False))


def _signature(block: Any) -> tuple:
    return jax.tree_util.tree_structure(block), [(n, t.type) for n, t in block.parameters]


def _scannable(module: Any) -> bool:
    """A Sequential of ≥ 2 blocks with one structure: class, static fields and parameter types."""
    if not _applies_children_in_order(module) or len(module) < 2:
        return False
    blocks = list(module)
    first = _signature(blocks[0])
    return all(type(b) is type(blocks[0]) and _signature(b) == first for b in blocks[1:])


def _scan_groups(module: Any) -> dict[str, Any]:
    """Qualified prefix (``"blocks."``, ``""`` for the module itself) → Sequential, outermost first."""
    groups: dict[str, Any] = {}
    for prefix, m in module._walk(""):
        if not any(prefix.startswith(g) for g in groups) and _scannable(m):
            groups[prefix] = m
    return groups


class _ScannedSequential:
    """Stands in for a Sequential of identical blocks while tracing: one loop over stacked weights.

    The block is traced once, inside a ``while_loop`` whose counter selects each
    block's weights from ``[n, ...]`` stacked graph weights, so the compiled
    program (and its compile time) does not grow with the number of blocks.
    """

    def __init__(self, template: Any, stacked: dict[str, Any], n: int):
        self.template = template
        self.stacked = stacked
        self.n = n

    def __call__(self, x: Any) -> Any:
        if not isinstance(x, Tensor) or x._gv is None:
            raise TypeError(f"compile(scan_layers=True): a scanned Sequential takes one graph-valued Tensor, got {type(x).__name__}")
        counter = ops.constant(0, DType.int64, x._gv.device)

        def body(i: Any, h: Any) -> list[Any]:
            block = self.template.map_parameters(lambda name, t: Tensor.from_graph_value(ops.slice_tensor(self.stacked[name], [i])))
            return [i + 1, block(Tensor.from_graph_value(h))._gv]

        _, out = ops.while_loop([counter, x._gv], lambda i, h: self.n > i, body)
        return Tensor.from_graph_value(out)


def _set_path(root: Any, prefix: str, value: Any) -> None:
    *parents, last = prefix[:-1].split(".")
    obj = root
    for p in parents:
        obj = obj[int(p)] if p.isdigit() and not hasattr(obj, p) else getattr(obj, p)
    object.__setattr__(obj, last, value)


# ─── stacked weights ────────────────────────────────────────────────────────

_stack_cache: weakref.WeakKeyDictionary[Any, dict[str, tuple]] = weakref.WeakKeyDictionary()


def _stacked(seq: Any, name: str, blocks: list[Any]) -> Any:
    """``[n, ...]`` stack of the blocks' values of parameter ``name``, made once per set of arrays.

    Stacking copies every block's weights (hundreds of MB for a real model), so
    it is cached on the Sequential until one of its parameters changes.
    """
    ids = tuple(id(b) for b in blocks)
    per_seq = _stack_cache.setdefault(seq, {})
    hit = per_seq.get(name)
    if hit is not None and hit[0] == ids:
        return hit[1]
    stacked = _stack(blocks)
    per_seq[name] = (ids, stacked, blocks)  # blocks kept alive so their ids stay unique
    return stacked


def _stack(arrays: list[Any]) -> Any:
    """``jnp.stack(arrays)`` with a single copy of the data.

    On the host the blocks are copied straight into a 64-byte-aligned numpy
    buffer, which JAX's CPU client then adopts without copying (XLA's alignment);
    ``np.stack`` followed by ``device_put`` would copy everything twice. Arrays on
    an accelerator are stacked there.
    """
    devices = {d for a in arrays if isinstance(a, jax.Array) for d in a.devices()}
    with x64():  # int64/float64 weights stay 64-bit
        if any(d.platform != "cpu" for d in devices) or len(devices) > 1:
            return jnp.stack(arrays)
        first = np.asarray(arrays[0])
        out = _aligned_empty((len(arrays), *first.shape), first.dtype)
        for i, a in enumerate(arrays):
            out[i] = np.asarray(a)
        return jax.device_put(out, next(iter(devices), None), may_alias=True)


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype, alignment: int = 64) -> np.ndarray:
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start : start + nbytes].view(dtype).reshape(shape)


class _StackedType:
    """dtype/shape/device of ``n`` stacked copies of parameter ``t`` (for Weight creation)."""

    def __init__(self, t: Any, n: int):
        self.dtype = t.dtype
        self.shape = [n, *[int(d) for d in t.shape]]
        self.device = t.device


# ─── compile ────────────────────────────────────────────────────────────────


def _host_or_array(value: Any) -> Any:
    return value._array() if isinstance(value, Tensor) else as_array(value)


def _parameter_values(module: Any, params: list[tuple[str, Tensor]], weights: Mapping[str, Any] | None) -> dict[str, Any]:
    """Parameter name → array to compile with: the parameter's own, or its override from ``weights``."""
    name = type(module).__name__
    overrides = dict(weights or {})
    unknown = sorted(set(overrides) - {n for n, _ in params})
    if unknown:
        raise ValueError(f"{name}.compile: weights has unknown parameter name(s) {unknown}")
    values = {}
    for n, t in params:
        if n not in overrides:
            values[n] = t._array()
            continue
        arr = _host_or_array(overrides[n])
        given, shape = DType.from_numpy(arr.dtype), [int(d) for d in t.shape]
        if given is not t.dtype or list(arr.shape) != shape:
            raise ValueError(f"{name}.compile: weights[{n!r}] is {given.name}{list(arr.shape)}, but the parameter is {t.dtype.name}{shape}")
        values[n] = arr
    return values


def compile_module(module: Any, input_types: Sequence[Type], weights: Mapping[str, Any] | None, *, entry: Callable[..., Any], scan_layers: bool = False) -> CompiledModule:
    """`Module.compile`: ``entry`` is the method traced (``forward`` or ``__call__``), checked against ``input_types``."""
    name = type(module).__name__
    for i, t in enumerate(input_types):
        if not isinstance(t, Type):
            raise TypeError(f"{name}.compile: input type {i} must be a TensorType (or other graph Type), got {type(t).__name__}")
    _check_arity(name, entry, input_types)
    params = list(module.parameters)
    values = _parameter_values(module, params, weights)
    groups = _scan_groups(module) if scan_layers else {}
    registry: dict[str, Any] = {}
    graph = Graph(name, input_types=list(input_types))
    with graph:

        def add(weight_name: str, t: Any, value: Any) -> Any:
            registry[weight_name] = value
            return graph.add_weight(Weight(weight_name, t.dtype, [int(d) for d in t.shape], DeviceRef.from_device(t.device)))

        in_group: set[str] = set()
        stacked_values: dict[str, dict[str, Any]] = {}
        for prefix, seq in groups.items():
            n = len(seq)
            stacked_values[prefix] = {}
            for rest, t in list(seq)[0].parameters:
                blocks = [values[f"{prefix}{i}.{rest}"] for i in range(n)]
                stacked_values[prefix][rest] = add(f"{prefix}*.{rest}", _StackedType(t, n), _stacked(seq, rest, blocks))
                in_group.update(f"{prefix}{i}.{rest}" for i in range(n))
        graph_values = {n: add(n, t, values[n]) for n, t in params if n not in in_group}
        traced = module.map_parameters(lambda n, t: Tensor.from_graph_value(graph_values[n]) if n in graph_values else t)
        for prefix, seq in groups.items():
            scanned = _ScannedSequential(list(seq)[0], stacked_values[prefix], len(seq))
            if prefix:
                _set_path(traced, prefix, scanned)
            else:
                traced = scanned  # the module itself is the Sequential
        try:
            out = traced(*[Tensor.from_graph_value(v) for v in graph.inputs])
        except (TypeError, ValueError, IndexError):
            raise
        except Exception as e:
            raise RuntimeError(f"{name}.compile: tracing forward failed: {e}") from e
        is_tuple = isinstance(out, (tuple, list))
        graph.output(*(list(out) if is_tuple else [out]))
    model = InferenceSession(devices=[module.device]).load(graph, weights_registry=registry)
    return CompiledModule(model, name, is_tuple)


class CompiledModule:
    """The callable `Module.compile` returns: eager Tensors in, Tensor (or tuple) out."""

    def __init__(self, model: Model, name: str, is_tuple: bool):
        self._model = model
        self._compiled = model._compiled
        self._name = name
        self._is_tuple = is_tuple

    @property
    def model(self) -> Model:
        """The underlying `maxfx.engine.Model`."""
        return self._model

    def __call__(self, *args: Any) -> Any:
        arrays = [a._array() if isinstance(a, Tensor) else as_array(a) for a in args]
        try:
            self._compiled.check_inputs(arrays)
        except InputMismatchError as e:
            raise ValueError(f"compiled {self._name}: {e}") from None
        outs, _ = self._compiled(arrays)
        results = tuple(_leaf(o) for o in outs)
        return results if self._is_tuple else results[0]

    def __repr__(self) -> str:
        return f"CompiledModule({self._name}, inputs={[str(v.type) for v in self._compiled.block.inputs]})"
