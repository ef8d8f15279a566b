"""`Module`: graphs compiled together, as one unit (``max.graph.Module``).

Each `Graph` built with ``module=m`` joins ``m`` as a top-level graph;
``InferenceSession.compile(m)`` / ``load_all(m)`` compile all of them, and
``init_all`` / ``load_all`` return one Model per graph, keyed by graph name
(e.g. a vision encoder and a language model handed over together). A Graph
built without ``module=`` gets a Module of its own (``graph.module``).

Example:
    >>> from maxfx.graph import Graph, Module, TensorType
    >>> from maxfx.dtype import DType
    >>> module = Module()
    >>> with Graph("encoder", input_types=[TensorType(DType.float32, [2])], module=module) as enc:
    ...     enc.output(enc.inputs[0] * 2)
    >>> with Graph("decoder", input_types=[TensorType(DType.float32, [2])], module=module) as dec:
    ...     dec.output(dec.inputs[0] + 1)
    >>> module.top_level_graph_names()
    ['encoder', 'decoder']
"""

from __future__ import annotations

from typing import Any

__all__ = ["Module"]


class Module:
    """A container for one or more Graphs compiled together.

    Args:
        mlir_module: MAX wraps an existing MLIR ``builtin.ModuleOp`` here; maxfx
            graphs are not MLIR, so only None (a new, empty module) is accepted.

    Raises:
        TypeError: ``mlir_module`` is given.
    """

    def __init__(self, mlir_module: Any = None):
        if mlir_module is not None:
            raise TypeError(
                f"Module(mlir_module=...): maxfx graphs are not MLIR modules, so a {type(mlir_module).__name__} cannot "
                "be wrapped; create Module() and build each Graph with module=that_module"
            )
        self._graphs: dict[str, Any] = {}

    def _add(self, graph: Any) -> None:
        """Add ``graph`` as a top-level graph (Graph's constructor calls this).

        Raises:
            ValueError: the module already has a graph of that name (names key
                the Models that ``init_all`` returns).
        """
        if graph.name in self._graphs:
            raise ValueError(
                f"Module: a graph named {graph.name!r} is already in this module; graphs of one module need distinct "
                "names (InferenceSession.init_all returns their Models by name)"
            )
        self._graphs[graph.name] = graph

    def top_level_graph_names(self) -> list[str]:
        """The name of every top-level graph, in the order they were built."""
        return list(self._graphs)

    @property
    def graphs(self) -> list[Any]:
        """The top-level graphs, in the order they were built."""
        return list(self._graphs.values())

    def __str__(self) -> str:
        return "\n\n".join(str(g) for g in self._graphs.values())

    def __repr__(self) -> str:
        return f"Module(graphs={self.top_level_graph_names()})"
