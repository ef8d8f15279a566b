"""`Graph`: build a computation explicitly, then compile it with `InferenceSession`.

Example:
    >>> from maxfx.graph import Graph, TensorType, ops
    >>> from maxfx.dtype import DType
    >>> with Graph("relu_graph", input_types=[TensorType(DType.float32, [5])]) as graph:
    ...     graph.output(ops.relu(graph.inputs[0]))
    >>> graph.output_types
    [TensorType(dtype=float32, shape=[Dim(5)], device=cpu:0)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lowering.context import GraphBuilder, use_context
from lowering.custom_ops_path import load_library
from lowering.debug import DEBUG
from lowering.ir import Block, Var
from lowering.ops.core import weight_p
from lowering.ops.custom import lookup_custom_op
from lowering.registry import get_op
from lowering.types import BufferType, DevicePlacementPolicy, DeviceRef, TensorType, Type, _ChainType
from maxfx.graph import ops
from maxfx.graph._current import current_graph, enter_graph, exit_graph
from maxfx.graph._module import Module
from maxfx.graph._value import TensorValue, Value, wrap_var
from maxfx.graph._weight import Weight, weight_params

__all__ = ["Graph", "GraphWeights", "KernelLibrary", "_ChainValue", "_DeviceChainMap"]


class _ChainValue(Value):
    """A device chain (type `_ChainType`): the state of one device's side effects
    at a point of graph construction. A new chain replaces it each time an op
    with a side effect on that device (a print, a buffer load or store, a call
    or control flow that contains one) is recorded."""

    __slots__ = ()


def _device_order(device: DeviceRef) -> tuple:
    return (not device.is_cpu(), str(device.device_type), device.id)


def _orders_on(node: Any, device: DeviceRef) -> bool:
    """``node`` is ordered on ``device``'s chain: an effect or buffer access there, itself or in a block it runs."""
    op = get_op(node.op)
    # as in MAX, buffer reads are ordered on the chain too
    if op.effect or op.written_inputs(node) or any(isinstance(v.type, BufferType) for v in node.inputs):
        devices = {v.type.device for v in (*node.inputs, *node.outputs) if isinstance(v.type, (TensorType, BufferType))}
        if device in (devices or {DeviceRef.CPU()}):
            return True
    for p in node.params.values():
        for block in p if isinstance(p, (tuple, list)) else (p,):
            if isinstance(block, Block) and any(_orders_on(inner, device) for inner in block.nodes):
                return True
    return False


class _DeviceChainMap(Mapping):
    """``Graph.device_chains``: DeviceRef → the device's current `_ChainValue`.

    The host chain (``DeviceRef.CPU()``) exists from the start; reading another
    device adds its chain. Iteration is sorted (CPUs first, then by id).
    maxfx orders effects by node order, so a chain is a marker: the chain read
    after an effect on the device differs from the one read before.
    """

    def __init__(self, graph: Graph):
        self._graph = graph
        self._chains: dict[DeviceRef, tuple[Any, _ChainValue]] = {}
        self[DeviceRef.CPU()]

    def _last_effect(self, device: DeviceRef) -> Any:
        for node in reversed(self._graph._block.nodes):
            if _orders_on(node, device):
                return node
        return None

    def __getitem__(self, device: DeviceRef) -> _ChainValue:
        if not isinstance(device, DeviceRef):
            raise TypeError(f"Graph.device_chains: keys are DeviceRef, got {type(device).__name__} {device!r}")
        node = self._last_effect(device)
        entry = self._chains.get(device)
        if entry is None or entry[0] is not node:
            entry = (node, _ChainValue._make(self._graph._builder, Var(_ChainType())))
            self._chains[device] = entry
        return entry[1]

    def __contains__(self, device: object) -> bool:
        return device in self._chains

    def __iter__(self):
        return iter(sorted(self._chains, key=_device_order))

    def __len__(self) -> int:
        return len(self._chains)

    def copy(self) -> dict[DeviceRef, _ChainValue]:
        """A snapshot: device → current chain (the graph is not changed)."""
        return {d: self[d] for d in self}

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{d}: {self[d]!r}" for d in self) + "}"


class _CurrentGraph:
    """Descriptor so that ``Graph.current`` reads the innermost active graph (None outside one)."""

    def __get__(self, obj, owner) -> Graph | None:
        return current_graph()


class KernelLibrary:
    """Paths of custom-kernel libraries attached to a graph.

    MAX loads Mojo kernels from these paths. maxfx runs custom ops from its own
    Python/JAX registry (`maxfx.graph.ops.custom`): a path is checked to exist and
    its Python files are imported, registering their ops (`lowering.custom_ops_path`;
    also what ``CUSTOM_OPS_PATH`` names); a path of Mojo kernels is remembered so
    that using one of its ops fails saying maxfx cannot run Mojo.
    ``verify_custom_op`` checks an op name is registered.
    """

    def __init__(self, context: Any = None, paths: Iterable[str | Path] = ()):
        self.context = context
        self._paths: list[Path] = []
        for p in paths:
            self.add_path(p)

    def add_path(self, path: str | Path) -> None:
        """Add a kernel library path (must exist)."""
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"KernelLibrary.add_path: {p} does not exist")
        if p not in self._paths:
            load_library(
                p
            )  # its Python custom ops register themselves; Mojo kernels are noted (lowering.custom_ops_path)
            self._paths.append(p)

    def library_paths(self) -> list[Path]:
        """The paths added so far."""
        return list(self._paths)

    def load_paths(self, context: Any, custom_extensions: Iterable[str | Path]) -> None:
        """Add every path of ``custom_extensions``."""
        self.context = context
        for p in custom_extensions or ():
            self.add_path(p)

    def verify_custom_op(self, custom_op: Any) -> None:
        """Raise if ``custom_op`` (a name) is not in maxfx's custom-op registry."""
        lookup_custom_op(custom_op if isinstance(custom_op, str) else getattr(custom_op, "name", str(custom_op)))

    def __contains__(self, name: str) -> bool:
        try:
            self.verify_custom_op(name)
        except (KeyError, ValueError):
            return False
        return True


class Graph:
    """A computation graph under construction.

    Use it as a context manager: inside ``with Graph(name, input_types=[...]) as g``,
    ``g.inputs`` are symbolic values, ops record nodes, and ``g.output(...)`` sets
    the results. Or pass ``forward``: ``Graph(name, forward=fn, input_types=...)``
    builds immediately by calling ``fn(*inputs)``.

    Args:
        name: graph name (MAX requires it; some of its examples omit it, so it defaults to "graph").
        forward: optional function of the inputs returning the outputs.
        input_types: `TensorType`/`BufferType` of each input (str dims are symbolic).
        path: loading a serialized MAX graph is not supported (raises).
        custom_extensions: kernel library paths (recorded, see `KernelLibrary`).
        module: the `Module` this graph joins as a top-level graph, compiled
            together with the module's other graphs (default: a Module of its own).
        strict_device_placement: what ``ops.constant`` does with data that lives
            on an accelerator (`DevicePlacementPolicy`: warn by default).
    """

    current = _CurrentGraph()
    debug = DEBUG
    """Process-wide debugging options (MAX's ``Graph.debug``): ``source_tracebacks`` is read while graphs are built."""

    def __init__(
        self,
        name: str = "graph",
        forward: Callable[..., Any] | None = None,
        input_types: Iterable[Type] = (),
        path: Path | None = None,
        *args: Any,
        custom_extensions: Iterable[str | Path] = (),
        context: Any = None,
        kernel_library: KernelLibrary | None = None,
        module: Any = None,
        strict_device_placement: DevicePlacementPolicy = DevicePlacementPolicy.Warn,
        **kwargs: Any,
    ):
        if path is not None:
            raise ValueError(
                f"Graph(path={path!r}): loading serialized MAX (MLIR) graphs is not supported by maxfx; "
                "build the graph in Python or use maxfx.export artifacts"
            )
        if module is None:
            module = Module()
        elif not isinstance(module, Module):
            raise TypeError(f"Graph {name!r}: module must be a maxfx.graph.Module, got {type(module).__name__}")
        self.name = name
        self._module = module
        self._block = Block(name)
        input_types = list(input_types)
        for i, t in enumerate(input_types):
            if not isinstance(t, Type):
                raise TypeError(
                    f"Graph {name!r}: input_types[{i}] must be a TensorType or BufferType, got {type(t).__name__}"
                )
        device = next((t.device for t in input_types if hasattr(t, "device")), DeviceRef.CPU())
        self._builder = GraphBuilder(self._block, wrap_var, default_device=device)
        self._builder.strict_device_placement = DevicePlacementPolicy(strict_device_placement)
        self._block.inputs = [Var(t) for t in input_types]
        self._inputs = tuple(wrap_var(self._builder, v) for v in self._block.inputs)
        self._weights: dict[str, Any] = {}  # name -> Weight
        self._weight_values: dict[str, TensorValue] = {}
        self._subgraphs: dict[str, Graph] = {}
        self._has_output = False
        self._ctx_stack: list[tuple[Any, Any]] = []
        self.kernel_library = kernel_library or KernelLibrary(context, custom_extensions)
        self.device_chains = _DeviceChainMap(self)
        self._always_ready_chain = _ChainValue._make(self._builder, Var(_ChainType()))
        self._parent: Graph | None = None
        module._add(self)  # before forward, as MAX adds the graph op first; a duplicate name fails fast
        if forward is not None:
            with self:
                outputs = forward(*self._inputs, *args, **kwargs)
                if outputs is None:
                    self.output()
                elif isinstance(outputs, (tuple, list)):
                    self.output(*outputs)
                else:
                    self.output(outputs)

    # -- context management ------------------------------------------------
    def __enter__(self) -> Graph:
        token_ctx = use_context(self._builder)
        token_ctx.__enter__()
        token_stack = enter_graph(self)
        self._ctx_stack.append((token_ctx, token_stack))
        self._builder.closed_graph = None
        return self

    def __exit__(self, *exc: Any) -> None:
        token_ctx, token_stack = self._ctx_stack.pop()
        exit_graph(token_stack)
        token_ctx.__exit__(*exc)
        if not self._ctx_stack:
            # Ops on this graph's values outside its block raise (naming the graph) instead of joining it silently.
            self._builder.closed_graph = self.name

    # -- inputs / outputs ----------------------------------------------------
    @property
    def inputs(self) -> Sequence[Value]:
        """Symbolic values of the inputs, in ``input_types`` order."""
        return self._inputs

    def output(self, *outputs: Any) -> None:
        """Set the graph's results (values or constants). Call exactly once."""
        if self._has_output:
            raise ValueError(f"Graph {self.name!r}: output() was already called")
        vars_: list[Var] = []
        with use_context(self._builder):
            for i, o in enumerate(outputs):
                gv = getattr(o, "_gv", None)  # an eager-API Tensor wrapping a value of this graph
                if gv is not None:
                    o = gv
                if not isinstance(o, Value):
                    bad = (
                        f"Graph {self.name!r}: output {i} must be a graph value (TensorValue, BufferValue) "
                        f"or numeric constant data, got {type(o).__name__} {o!r:.80}"
                    )
                    if isinstance(o, (str, bytes)):  # numpy would make a text array of it
                        raise TypeError(bad)
                    try:
                        o = ops.constant(o, device=self._builder.default_device)
                    except TypeError as e:  # a ValueError (ragged lists, out-of-range ints) stays one
                        raise TypeError(f"{bad} ({e})") from None
                if o._builder is not self._builder:
                    raise ValueError(f"Graph {self.name!r}: output {i} belongs to a different graph")
                vars_.append(o._var)
        self._block.outputs = vars_
        self._block.invalidate()
        self._has_output = True

    @property
    def output_types(self) -> list[Type]:
        """Types of the outputs (empty until `output` is called)."""
        return [v.type for v in self._block.outputs]

    @property
    def input_types(self) -> list[Type]:
        """Types of the inputs."""
        return [v.type for v in self._block.inputs]

    # -- weights ---------------------------------------------------------------
    def add_weight(self, weight: Any, force_initial_weight_on_host: bool = True) -> TensorValue:
        """Add a `Weight` as a graph input bound at load time; returns its value.

        The same Weight object again returns the existing value; a different
        Weight with the same name is a ValueError (as in MAX), even when its type is equal.
        """
        params = weight_params(weight)
        name = weight.name if weight.shard_idx is None else f"{weight.name}[shard {weight.shard_idx}]"
        existing = self._weights.get(name)
        if existing is not None:
            if existing is weight:
                return self._weight_values[name]
            raise ValueError(
                f"Graph {self.name!r}: weight {name!r} already exists (a different Weight object of type "
                f"{existing.type}); "
                f"add that Weight again, or give the new one ({weight.type}) another name"
            )
        if name in self._builder.weights:
            raise ValueError(f"Graph {self.name!r}: weight name {name!r} is already used by ops.constant_external")
        value = self._builder.bind(weight_p, [], params)
        self._builder.weights[name] = value
        self._weights[name] = weight
        self._weight_values[name] = value
        return value

    def weights(self) -> GraphWeights:
        """The graph's weights: a mapping name → `Weight` that also allocates new
        weights by hierarchical name (``weights.layers[0].attn.weight.allocate(dtype=..., shape=...)``)."""
        return GraphWeights(self)

    # -- subgraphs ---------------------------------------------------------
    def add_subgraph(
        self,
        name: str,
        forward: Callable[..., Any] | None = None,
        input_types: Iterable[Type] = (),
        path: Path | None = None,
        custom_extensions: Iterable[str | Path] = (),
        devices: Iterable[DeviceRef] = (),
    ) -> Graph:
        """A named subgraph, invoked with ``ops.call(subgraph, *args)``."""
        if name in self._subgraphs:
            raise ValueError(f"Graph {self.name!r}: subgraph {name!r} already exists")
        sub = Graph(
            name,
            forward=forward,
            input_types=input_types,
            path=path,
            custom_extensions=custom_extensions,
            kernel_library=self.kernel_library,
            strict_device_placement=self._builder.strict_device_placement,
        )
        sub._parent = self
        sub._module = self._module  # a subgraph lives in its parent's module, called from there, not a top-level graph
        for device in devices:
            sub.device_chains[device]  # MAX pre-allocates these chains
        self._subgraphs[name] = sub
        return sub

    # -- copying -------------------------------------------------------------
    def copy(self, name: str | None = None) -> Graph:
        """An independent copy of this graph: the same inputs, ops, weights, subgraphs and outputs.

        Ops recorded on the copy (inside ``with copy:``) do not change this
        graph, and the reverse; both can be compiled. The copy is named ``name``
        (default: this graph's name) and belongs to a new `Module` of its own,
        so it never clashes with this graph's name. Values of this graph are not
        values of the copy: use ``copy.inputs`` and ops on them. Subgraphs are
        shared (both graphs call the same subgraph).

        Raises:
            RuntimeError: the graph is being built (inside its ``with`` block).

        Example:
            >>> from maxfx.dtype import DType
            >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
            >>> with Graph("double", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())]) as g:
            ...     g.output(g.inputs[0] * 2)
            >>> twin = g.copy("double_copy")
            >>> twin.name, len(twin._ir.nodes) == len(g._ir.nodes), twin.output_types == g.output_types
            ('double_copy', True, True)
        """
        if self._ctx_stack:
            raise RuntimeError(
                f"Graph {self.name!r}.copy(): finish building the graph (leave its `with` block) before copying it"
            )
        new = Graph(
            self.name if name is None else name,
            input_types=self.input_types,
            kernel_library=self.kernel_library,
            strict_device_placement=self._builder.strict_device_placement,
        )
        # The IR's nodes and vars are immutable records: the copy shares them in its own lists,
        # so what either graph records later goes to that graph only.
        new._block.inputs = list(self._block.inputs)
        new._block.nodes = list(self._block.nodes)
        new._block.outputs = list(self._block.outputs)
        new._block.invalidate()
        new._inputs = tuple(wrap_var(new._builder, v) for v in new._block.inputs)
        new._builder.weights = {n: wrap_var(new._builder, v._var) for n, v in self._builder.weights.items()}
        new._weights = dict(self._weights)
        new._weight_values = {n: new._builder.weights[n] for n in self._weight_values}
        new._subgraphs = dict(self._subgraphs)
        new._has_output = self._has_output
        return new

    # -- misc --------------------------------------------------------------
    @property
    def module(self) -> Module:
        """The `Module` this graph belongs to (compiled as one unit with its other graphs)."""
        return self._module

    @property
    def always_ready_chain(self) -> _ChainValue:
        """A chain that depends on no effect (maxfx orders effects by node order)."""
        return self._always_ready_chain

    @property
    def kernel_libraries_paths(self) -> list[Path]:
        """Kernel library paths attached to this graph."""
        return self.kernel_library.library_paths()

    @property
    def _ir(self) -> Block:
        return self._block

    def __str__(self) -> str:
        return self._block.format()

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, inputs={self.input_types}, outputs={self.output_types})"


class GraphWeights(Mapping):
    """Weights of a graph by name, with hierarchical allocation.

    As a mapping it lists the weights added so far. Attribute and index access
    build dotted names (``w.layers[0].mlp`` → ``"layers.0.mlp"``); `allocate`
    creates a `Weight` of that name in the graph and `exists` says whether one
    is already there.

    Example:
        >>> graph = Graph("my_model")  # doctest: +SKIP
        >>> w = graph.weights().transformer.layers[0].attention.weight.allocate(dtype=DType.float32, shape=(768, 768))
    """

    def __init__(self, graph: Graph, prefix: str = ""):
        self._graph = graph
        self._prefix = prefix

    @property
    def name(self) -> str:
        """The dotted name built so far."""
        return self._prefix.rstrip(".")

    def _child(self, key: Any) -> GraphWeights:
        return GraphWeights(self._graph, f"{self._prefix}{key}.")

    def __getattr__(self, attr: str) -> GraphWeights:
        if attr.startswith("_"):
            raise AttributeError(attr)
        return self._child(attr)

    def __getitem__(self, key: Any) -> Any:
        full = f"{self._prefix}{key}"
        if full in self._graph._weights:
            return self._graph._weights[full]
        return self._child(key)

    def __iter__(self):
        return (n[len(self._prefix) :] for n in self._graph._weights if n.startswith(self._prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return f"{self._prefix}{key}" in self._graph._weights

    def exists(self) -> bool:
        """True if a weight with exactly this name is in the graph."""
        return self.name in self._graph._weights

    def allocate(
        self, dtype: Any = None, shape: Any = None, quantization_encoding: Any = None, device: Any = None
    ) -> Any:
        """Create the weight called `name` in the graph and return it."""
        if not self.name:
            raise ValueError("GraphWeights.allocate: name a weight first, e.g. weights.layer.weight.allocate(...)")
        if dtype is None or shape is None:
            raise ValueError(
                f"GraphWeights.allocate({self.name!r}): dtype and shape are required (the graph has no weight file)"
            )
        weight = Weight(self.name, dtype, shape, device, quantization_encoding)
        self._graph.add_weight(weight)
        return weight


def _is_tensor_type(t: Type) -> bool:
    return isinstance(t, (TensorType, BufferType))
