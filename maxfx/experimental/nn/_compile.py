"""`Module.compile`: trace a module into a Graph, compile it, call it on eager Tensors.

With ``use_subgraphs=True`` each `Sequential` of identical blocks is traced once,
as a subgraph called once per block with that block's weights
(`_SubgraphSequential`); the compiled graph builds one executable for it, so
compile time does not grow with depth, and no weight is copied.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from lowering.compile import InputMismatchError
from lowering.types import DeviceRef, Type
from maxfx._weight_check import check_weight_value
from maxfx.driver._tensor import Buffer, as_array
from maxfx.engine import InferenceSession, Model
from maxfx.experimental._tensor import Tensor, _leaf
from maxfx.experimental.nn._hooks import copy_call_hooks
from maxfx.experimental.sharding import TensorLayout
from maxfx.graph import Graph, Weight, ops

__all__ = ["CompiledModel", "compile_module"]


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
            f"{len(required)}"
            + (f" to {len(positional)}" if len(positional) != len(required) else "")
            + f" positional argument(s) ({', '.join(p.name for p in positional)})"
        )


# ─── use_subgraphs: which Sequentials become one subgraph ───────────────────


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


def _subgraph_groups(module: Any) -> dict[str, Any]:
    """Qualified prefix (``"blocks."``, ``""`` for the module itself) → Sequential, outermost first."""
    groups: dict[str, Any] = {}
    for prefix, m in module._walk(""):
        if not any(prefix.startswith(g) for g in groups) and _scannable(m):
            groups[prefix] = m
    return groups


class _SubgraphSequential:
    """Stands in for a Sequential of identical blocks while tracing: one subgraph, called once per block.

    The first block is traced once into a subgraph whose weights are named as
    in the block (``attn.weight``); block ``i`` calls it with prefix
    ``"{prefix}{i}."``, so it reads its own weights (``blocks.3.attn.weight``)
    and no weight is copied. The compiled graph builds one executable for the
    subgraph and runs it at every call (`lowering.piecewise`).
    """

    def __init__(self, template: Any, prefix: str, n: int):
        self.template = template
        self.prefix = prefix
        self.n = n

    def __call__(self, x: Any) -> Any:
        if not isinstance(x, Tensor) or x._gv is None:
            raise TypeError(
                "compile(use_subgraphs=True): a Sequential of identical blocks takes one graph-valued Tensor, got "
                f"{type(x).__name__}"
            )
        sub = Graph.current.add_subgraph(f"{self.prefix or 'sequential.'}block", input_types=[x._gv.type])
        with sub:
            weights = {
                n: sub.add_weight(Weight(n, t.dtype, [int(d) for d in t.shape], DeviceRef.from_device(t.device)))
                for n, t in self.template.parameters
            }
            block = self.template.map_parameters(lambda n, t: Tensor.from_graph_value(weights[n]))
            out = block(Tensor.from_graph_value(sub.inputs[0]))
            if not isinstance(out, Tensor) or out._gv is None:
                raise TypeError(
                    "compile(use_subgraphs=True): a block of a Sequential must return one Tensor, got "
                    f"{type(out).__name__}"
                )
            sub.output(out._gv)
        h = x._gv
        for i in range(self.n):
            [h] = ops.call(sub, h, prefix=f"{self.prefix}{i}.")
        return Tensor.from_graph_value(h)


def _set_path(root: Any, prefix: str, value: Any) -> None:
    *parents, last = prefix[:-1].split(".")
    obj = root
    for p in parents:
        obj = obj[int(p)] if p.isdigit() and not hasattr(obj, p) else getattr(obj, p)
    object.__setattr__(obj, last, value)


# ─── compile ────────────────────────────────────────────────────────────────


def _host_or_array(value: Any) -> Any:
    return value._array() if isinstance(value, Tensor) else as_array(value)


def _parameter_values(
    module: Any, params: list[tuple[str, Tensor]], weights: Mapping[str, Any] | None
) -> dict[str, Any]:
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
        check_weight_value(n, arr, t.shape, t.dtype, where=f"{name}.compile(weights=...)")
        values[n] = arr
    return values


def compile_module(
    module: Any,
    input_types: Sequence[Type],
    weights: Mapping[str, Any] | None,
    *,
    entry: Callable[..., Any],
    use_subgraphs: bool = False,
) -> CompiledModel:
    """`Module.compile`: ``entry`` is the method traced (``forward`` or ``__call__``), checked against
    ``input_types``.
    """
    name = type(module).__name__
    input_types = [t.to_type() if isinstance(t, TensorLayout) else t for t in input_types]  # MAX's layout specs
    for i, t in enumerate(input_types):
        if not isinstance(t, Type):
            raise TypeError(
                f"{name}.compile: input type {i} must be a TensorType, TensorLayout (or other graph Type), got "
                f"{type(t).__name__}"
            )
    _check_arity(name, entry, input_types)
    params = list(module.parameters)
    values = _parameter_values(module, params, weights)
    groups = _subgraph_groups(module) if use_subgraphs else {}
    in_group = {n for n, _ in params if any(n.startswith(prefix) for prefix in groups)}
    graph = Graph(name, input_types=list(input_types))
    with graph:
        # A grouped block's weights are declared by its subgraph's calls (under their prefixes), the others here.
        graph_values = {
            n: graph.add_weight(Weight(n, t.dtype, [int(d) for d in t.shape], DeviceRef.from_device(t.device)))
            for n, t in params
            if n not in in_group
        }
        traced = module.map_parameters(
            lambda n, t: Tensor.from_graph_value(graph_values[n]) if n in graph_values else t
        )
        copy_call_hooks(
            zip([m for _, m in module._walk("")], [m for _, m in traced._walk("")])
        )  # e.g. a PrintHook's prints
        for prefix, seq in groups.items():
            grouped = _SubgraphSequential(list(seq)[0], prefix, len(seq))
            if prefix:
                _set_path(traced, prefix, grouped)
            else:
                traced = grouped  # the module itself is the Sequential
        try:
            out = traced(*[Tensor.from_graph_value(v) for v in graph.inputs])
        except (TypeError, ValueError, IndexError):
            raise
        except Exception as e:
            raise RuntimeError(f"{name}.compile: tracing forward failed: {e}") from e
        is_tuple = isinstance(out, (tuple, list))
        graph.output(*(list(out) if is_tuple else [out]))
    model = InferenceSession(devices=[module.device]).load(graph, weights_registry=values)
    return CompiledModel(model, name, is_tuple, graph)


class CompiledModel:
    """What `Module.compile` returns (MAX's ``max.experimental.nn.module.CompiledModel``).

    Two ways to run it, as in MAX:

    * ``compiled(*tensors)``: eager Tensors (or arrays) in, a Tensor (or a tuple,
      when ``forward`` returns one) out;
    * ``compiled.execute_raw(*buffers)``: driver Buffers (or arrays) in, the
      list of output `Buffer`s out, with no Tensor wrapping.

    ``engine_model`` is the underlying `maxfx.engine.Model` (also ``model``),
    ``graph`` the traced `Graph`. ``signal_buffers`` is always empty: maxfx's
    collectives need no signal buffers (MAX allocates them for multi-GPU
    all-reduce).

    Example:
        >>> from maxfx.dtype import DType
        >>> from maxfx.experimental.nn import Linear
        >>> from maxfx.experimental.tensor import Tensor
        >>> from maxfx.graph import TensorType
        >>> layer = Linear(3, 2)
        >>> compiled = layer.compile(TensorType(DType.float32, ["batch", 3], device=layer.device))
        >>> compiled(Tensor.ones([4, 3])).shape
        [Dim(4), Dim(2)]
        >>> [b.shape for b in compiled.execute_raw(Tensor.ones([1, 3]).to_numpy())]
        [(1, 2)]
    """

    def __init__(self, model: Model, name: str, is_tuple: bool, graph: Graph | None = None):
        self._model = model
        self._compiled = model._compiled
        self._name = name
        self._is_tuple = is_tuple
        self._graph = graph

    @property
    def engine_model(self) -> Model:
        """The underlying `maxfx.engine.Model` (MAX: for capture/replay)."""
        return self._model

    @property
    def model(self) -> Model:
        """The underlying `maxfx.engine.Model` (the same as ``engine_model``)."""
        return self._model

    @property
    def graph(self) -> Graph | None:
        """The `Graph` the module was traced into."""
        return self._graph

    @property
    def signal_buffers(self) -> list[Any]:
        """Signal buffers of multi-GPU collectives: always empty in maxfx."""
        return []

    def _run(self, args: Sequence[Any]) -> tuple[Any, ...]:
        arrays = [a._array() if isinstance(a, Tensor) else as_array(a) for a in args]
        try:
            self._compiled.check_inputs(arrays)
        except InputMismatchError as e:
            raise ValueError(f"compiled {self._name}: {e}") from None
        with self._model._printing():  # a run with print ops (e.g. a PrintHook's) returns after printing
            outs, _ = self._compiled(arrays)
        return tuple(outs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise TypeError(f"CompiledModel does not accept keyword arguments; got {sorted(kwargs)}.")
        results = tuple(_leaf(o) for o in self._run(args))
        return results if self._is_tuple else results[0]

    def execute_raw(self, *buffers: Any) -> list[Buffer]:
        """Run on driver Buffers (or arrays, eager Tensors); returns the output `Buffer`s."""
        return self._model.execute(*[b._array() if isinstance(b, Tensor) else b for b in buffers])

    def __repr__(self) -> str:
        return f"CompiledModel({self._name}, inputs={[str(v.type) for v in self._compiled.block.inputs]})"
