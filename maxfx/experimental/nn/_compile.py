"""`Module.compile`: trace a module into a Graph, compile it, call it on eager Tensors."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

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


def compile_module(module: Any, input_types: Sequence[Type], weights: Mapping[str, Any] | None) -> CompiledModule:
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
    graph = Graph(type(module).__name__, input_types=list(input_types))
    with graph:
        values = {
            name: graph.add_weight(Weight(name, t.dtype, [int(d) for d in t.shape], DeviceRef.from_device(t.device)))
            for name, t in params
        }
        traced = module.map_parameters(lambda name, t: Tensor.from_graph_value(values[name]))
        try:
            out = traced(*[Tensor.from_graph_value(v) for v in graph.inputs])
        except (TypeError, ValueError, IndexError):
            raise
        except Exception as e:
            raise RuntimeError(f"{type(module).__name__}.compile: tracing forward failed: {e}") from e
        is_tuple = isinstance(out, (tuple, list))
        outs = list(out) if is_tuple else [out]
        graph.output(*outs)
    registry = {name: as_array(overrides[name]) if name in overrides else t._array() for name, t in params}
    model = InferenceSession(devices=[module.device]).load(graph, weights_registry=registry)
    return CompiledModule(model, type(module).__name__, is_tuple)


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
