"""`Module.compile`: trace a module into a Graph, compile it, call it on eager Tensors."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from lowering.compile import InputMismatchError
from lowering.types import DeviceRef, Type
from maxfx.driver._tensor import as_array
from maxfx.experimental._tensor import Tensor, _leaf

__all__ = ["compile_module", "CompiledModule"]


def _check_arity(module: Any, input_types: Sequence[Type]) -> None:
    fn = module.forward if type(module).forward is not _module_cls().forward else module.__call__
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= len(input_types) <= len(positional):
        raise TypeError(
            f"{type(module).__name__}.compile: got {len(input_types)} input type(s) but forward takes "
            f"{len(required)}" + (f" to {len(positional)}" if len(positional) != len(required) else "") + f" positional argument(s) ({', '.join(p.name for p in positional)})"
        )


def _module_cls():
    from maxfx.experimental.nn.module import Module  # noqa: PLC0415

    return Module


def _scannable(module: Any) -> bool:
    """A Sequential of ≥ 2 children with one structure (same class, static attributes, parameter types)."""
    from maxfx.experimental.nn._layers import Sequential  # noqa: PLC0415

    if not isinstance(module, Sequential) or len(module) < 2:
        return False
    first = list(module)[0]
    ref = (jax.tree_util.tree_structure(first), [(n, t.type) for n, t in first.parameters])
    return all(type(m) is type(first) and (jax.tree_util.tree_structure(m), [(n, t.type) for n, t in m.parameters]) == ref for m in module)


def _scan_groups(module: Any) -> dict[str, Any]:
    """Qualified prefix ("blocks.") → Sequential, for the outermost scannable Sequentials."""
    groups: dict[str, Any] = {}
    for prefix, m in module._walk(""):
        if any(prefix.startswith(g) for g in groups):
            continue
        if _scannable(m):
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
        from maxfx.graph import ops  # noqa: PLC0415
        from lowering.dtypes import DType  # noqa: PLC0415

        if not isinstance(x, Tensor) or x._gv is None:
            raise TypeError("a scanned Sequential takes one graph-valued Tensor")
        counter = ops.constant(0, DType.int64, x._gv.device)

        def body(i, h):
            block = self.template.map_parameters(lambda name, t: Tensor.from_graph_value(ops.slice_tensor(self.stacked[name], [i])))
            out = block(Tensor.from_graph_value(h))
            return [i + 1, out._gv]

        _, out = ops.while_loop([counter, x._gv], lambda i, h: self.n > i, body)
        return Tensor.from_graph_value(out)


def _set_path(root: Any, prefix: str, value: Any) -> None:
    *parents, last = prefix[:-1].split(".")
    obj = root
    for p in parents:
        obj = obj[int(p)] if p.isdigit() and not hasattr(obj, p) else getattr(obj, p)
    object.__setattr__(obj, last, value)


def compile_module(module: Any, input_types: Sequence[Type], weights: Mapping[str, Any] | None, *, scan: bool = True) -> CompiledModule:
    from maxfx.engine import InferenceSession  # noqa: PLC0415
    from maxfx.graph import Graph, Weight  # noqa: PLC0415

    for i, t in enumerate(input_types):
        if not isinstance(t, Type):
            raise TypeError(f"{type(module).__name__}.compile: input type {i} must be a TensorType (or other graph Type), got {type(t).__name__}")
    _check_arity(module, input_types)
    params = list(module.parameters)
    overrides = dict(weights or {})
    unknown = sorted(set(overrides) - {n for n, _ in params})
    if unknown:
        raise ValueError(f"{type(module).__name__}.compile: weights has unknown parameter name(s) {unknown}")
    values = {name: overrides[name] if name in overrides else t for name, t in params}
    groups = _scan_groups(module) if scan else {}
    registry: dict[str, Any] = {}
    graph = Graph(type(module).__name__, input_types=list(input_types))
    with graph:

        def add(name: str, t: Any, value: Any) -> Any:
            registry[name] = value
            return graph.add_weight(Weight(name, t.dtype, [int(d) for d in t.shape], DeviceRef.from_device(t.device)))

        in_group = {}
        stacked_values: dict[str, dict[str, Any]] = {}
        for prefix, seq in groups.items():
            n = len(seq)
            stacked_values[prefix] = {}
            for rest, t in list(seq)[0].parameters:
                blocks = [_host_or_array(values[f"{prefix}{i}.{rest}"]) for i in range(n)]
                stacked_values[prefix][rest] = add(f"{prefix}*.{rest}", _StackedType(t, n), _stacked(seq, rest, blocks))
                for i in range(n):
                    in_group[f"{prefix}{i}.{rest}"] = prefix
        graph_values = {name: add(name, t, _host_or_array(values[name])) for name, t in params if name not in in_group}
        traced = module.map_parameters(lambda name, t: Tensor.from_graph_value(graph_values[name]) if name in graph_values else t)
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
            raise RuntimeError(f"{type(module).__name__}.compile: tracing forward failed: {e}") from e
        is_tuple = isinstance(out, (tuple, list))
        outs = list(out) if is_tuple else [out]
        graph.output(*outs)
    model = InferenceSession(devices=[module.device]).load(graph, weights_registry=registry)
    return CompiledModule(model, type(module).__name__, is_tuple)


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
    device = next(iter(blocks[0].devices())) if isinstance(blocks[0], jax.Array) else None
    stacked = jax.device_put(np.stack([np.asarray(b) for b in blocks]), device)
    per_seq[name] = (ids, stacked, blocks)  # blocks kept alive so their ids stay unique
    return stacked


class _StackedType:
    """dtype/shape/device of ``n`` stacked copies of parameter ``t`` (for Weight creation)."""

    def __init__(self, t: Any, n: int):
        self.dtype = t.dtype
        self.shape = [n, *[int(d) for d in t.shape]]
        self.device = t.device


def _host_or_array(value: Any) -> Any:
    return value._array() if isinstance(value, Tensor) else as_array(value)


class CompiledModule:
    """The callable `Module.compile` returns: eager Tensors in, Tensor (or tuple) out."""

    def __init__(self, model: Any, name: str, is_tuple: bool):
        self._model = model
        self._compiled = model._compiled
        self._name = name
        self._is_tuple = is_tuple

    @property
    def model(self) -> Any:
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
