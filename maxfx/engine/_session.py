"""`InferenceSession` and `Model`: compile graphs with XLA and run them.

``session.load(graph, weights_registry=...)`` checks the graph and its weights
and returns a `Model`; ``model.execute(*inputs)`` compiles once per concrete
input signature (symbolic dims stay free until then; executables are cached)
and returns driver tensors.

Example:
    >>> import numpy as np
    >>> from maxfx.engine import InferenceSession
    >>> from maxfx.graph import Graph, TensorType, ops
    >>> from maxfx.dtype import DType
    >>> with Graph("relu", input_types=[TensorType(DType.float32, ["n"])]) as g:
    ...     g.output(ops.relu(g.inputs[0]))
    >>> model = InferenceSession().load(g)
    >>> model.execute(np.array([-1.0, 2.0], np.float32))[0].to_numpy()
    array([0., 2.], dtype=float32)
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lowering.compile import CompiledBlock
from lowering.debug import DEBUG
from lowering.debug_print import PrintOptions, PrintStyle
from lowering.devices import jax_device
from lowering.ir import Block, weight_reads
from lowering.types import BufferType, DeviceRef, TensorType
from lowering.virtual_devices import is_virtual_device_mode, jax_platform_of_api
from maxfx._artifact import ArtifactProgram, is_exported_artifact, load_exported
from maxfx._weight_check import check_weight_value
from maxfx.driver import CPU
from maxfx.driver._tensor import as_array
from maxfx.engine._compilation_stats import timed_phase
from maxfx.engine._cross_compile import lower_for_platform
from maxfx.engine._model import Model, require_contiguous
from maxfx.graph import Graph, Module

__all__ = ["CompiledModel", "InferenceSession", "GPUProfilingMode", "LogLevel", "PrintStyle", "CustomExtensionsType"]

type CustomExtensionsType = list[str | Path | Any] | str | Path | Any


class GPUProfilingMode(enum.Enum):
    """GPU profiling detail (accepted for compatibility; use ``jax.profiler`` for traces)."""

    OFF = "off"
    ON = "on"
    DETAILED = "detailed"


class LogLevel(enum.Enum):
    """Log level of kernels (accepted for compatibility)."""

    NOTSET = "notset"
    TRACE = "trace"
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


class _CompiledGraph:
    """One graph of a `CompiledModel`: the graph, the weights it reads, and where it runs.

    ``device`` is the JAX device it runs on, or None for a virtual device; then
    ``exported`` is the program lowered for that device's platform and ``virtual``
    the `VirtualAccelerator`.
    """

    def __init__(
        self, graph: Graph, expected_weights: Mapping[str, Any], device: Any, exported: Any = None, virtual: Any = None
    ):
        self.graph = graph
        self.expected_weights = dict(expected_weights)
        self.device = device
        self.exported = exported
        self.virtual = virtual


class CompiledModel:
    """Checked graphs, ready for `InferenceSession.init` / `init_all` to bind weights (MAX's ``CompiledModel``).

    Made by `InferenceSession.compile` from a `Graph` (one graph) or a `Module`
    (each of its top-level graphs). Not executable; one CompiledModel can be
    initialized more than once.

    Attributes:
        expected_weights: weight name → (its type, its full unsharded shape), over
            every graph: what ``init`` needs.
    """

    def __init__(self, graphs: Sequence[_CompiledGraph]):
        self._graphs = list(graphs)
        self.expected_weights: dict[str, Any] = {}
        for entry in self._graphs:
            self.expected_weights.update(entry.expected_weights)

    @property
    def graph_names(self) -> list[str]:
        """The names of the compiled graphs (the keys of ``init_all``'s result)."""
        return [entry.graph.name for entry in self._graphs]

    @property
    def graph(self) -> Graph:
        """The compiled graph, when there is one (see `graph_names` for a Module's)."""
        return self._single("CompiledModel.graph").graph

    @property
    def device(self) -> Any:
        """The JAX device the single compiled graph runs on (None for a virtual device)."""
        return self._single("CompiledModel.device").device

    def _single(self, where: str) -> _CompiledGraph:
        if len(self._graphs) != 1:
            raise ValueError(
                f"{where}: this CompiledModel holds {len(self._graphs)} graphs {self.graph_names}; use "
                "InferenceSession.init_all to get a Model per graph"
            )
        return self._graphs[0]

    def __repr__(self) -> str:
        return "CompiledModel()"  # MAX's repr: the artifact is opaque


class InferenceSession:
    """Compiles graphs for a set of devices.

    Args:
        devices: driver devices to run on (default: the host CPU only).
        num_threads: accepted for compatibility (XLA picks its own thread pool).
        custom_extensions: kernel library paths (maxfx custom ops are Python/JAX;
            see ``maxfx.graph.ops.custom``).
    """

    debug = DEBUG
    """Process-wide debugging options (MAX's ``InferenceSession.debug``, a `DebugConfig`): ``nan_check`` and
    ``op_log_level`` are read by ``compile``/``load``, ``device_sync_mode`` by each execution."""

    def __init__(
        self,
        devices: Sequence[Any] | None = None,
        num_threads: int | None = None,
        *,
        custom_extensions: CustomExtensionsType | None = None,
    ):
        self._devices = list(devices) if devices else [CPU()]
        self.num_threads = num_threads
        self.custom_extensions = custom_extensions
        self._settings: dict[str, Any] = {}
        self._print_options = PrintOptions()

    @property
    def devices(self) -> list[Any]:
        """The session's driver devices."""
        return list(self._devices)

    def load(
        self,
        model: Any,
        *,
        custom_extensions: CustomExtensionsType | None = None,
        custom_ops_path: str | None = None,
        weights_registry: Mapping[str, Any] | None = None,
    ) -> Model:
        """Prepare ``model`` (a `Graph`) to run; values of its Weights come from ``weights_registry``.

        ``model`` may also be the path of an artifact written by ``maxfx.export(...).save(path)``.

        Raises:
            ValueError: a weight has no value, or its value's dtype/shape differs from the Weight.
            RuntimeError: ``model`` is a path to anything but a ``maxfx.export`` artifact
                (serialized MAX graphs are not supported).
        """
        if isinstance(model, (str, Path)):
            if is_exported_artifact(model):  # written by maxfx.export(...).save(path)
                exported = load_exported(model, device=self._devices[0])
                return Model(
                    ArtifactProgram(exported), exported.name, [f"input{i}" for i in range(len(exported.input_types))]
                )
            raise RuntimeError(
                f"InferenceSession.load({model!r}): loading serialized MAX graphs from a path is not supported; pass a "
                "maxfx Graph"
            )
        return self.init(self.compile(model), weights_registry=weights_registry)

    def compile(
        self,
        model: Graph | Module,
        *,
        custom_extensions: CustomExtensionsType | None = None,
        custom_ops_path: str | None = None,
    ) -> CompiledModel:
        """Check ``model`` (a `Graph`, or a `Module` of graphs) and prepare it to run, before any weight has a value.

        MAX's two-step form of `load`: ``session.init(compiled, weights_registry=...)``
        then binds the weights and returns a `Model` (``init_all``: one per graph of
        a Module); one `CompiledModel` can be initialized more than once (with
        different weights). XLA compiles when the model first runs on concrete
        input shapes, as with `load`.

        In virtual-device mode (``maxfx.driver.set_virtual_device_count``), a graph on
        a virtual GPU is compiled for real: lowered with ``jax.export`` for the
        virtual device's platform. Such a CompiledModel cannot be initialized (no
        hardware to bind weights on).

        Example:
            >>> import numpy as np
            >>> from maxfx.engine import InferenceSession
            >>> from maxfx.graph import DeviceRef, Graph, TensorType, Weight
            >>> from maxfx.dtype import DType
            >>> with Graph("scale", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())]) as g:
            ...     g.output(g.inputs[0] * g.add_weight(Weight("w", DType.float32, [2], DeviceRef.CPU())))
            >>> session = InferenceSession()
            >>> compiled = session.compile(g)
            >>> list(compiled.expected_weights)
            ['w']
            >>> model = session.init(compiled, weights_registry={"w": np.array([2.0, 3.0], np.float32)})
            >>> model.execute(np.ones(2, np.float32))[0].to_numpy().tolist()
            [2.0, 3.0]

        Raises:
            TypeError: ``model`` is not a Graph or Module.
            ValueError: a graph has no outputs or uses a device the session does not
                have, a Module has no graphs, or two graphs read one weight name with different types.
            RuntimeError: lowering a graph for a virtual device failed (the message says why).
        """
        if isinstance(model, Graph):
            graphs = [model]
        elif isinstance(model, Module):
            graphs = model.graphs
            if not graphs:
                raise ValueError(
                    "InferenceSession.compile: the Module has no graphs; build each Graph with module=this_module"
                )
        else:
            raise TypeError(f"InferenceSession.compile: expected a Graph or a Module, got {type(model).__name__}")
        for graph in graphs:
            if not graph._has_output:
                raise ValueError(
                    f"InferenceSession.compile: graph {graph.name!r} has no outputs; call graph.output(...)"
                )
        with timed_phase("compile"):
            compiled = CompiledModel([self._compile_graph(graph) for graph in graphs])
        _check_shared_weights(compiled._graphs)
        return compiled

    def _compile_graph(self, graph: Graph) -> _CompiledGraph:
        weights = _weight_inputs(graph._ir)
        target = self._target_for(graph._ir)
        if target.is_gpu() and is_virtual_device_mode():
            virtual = target.to_device()
            platform = jax_platform_of_api(virtual.api)
            try:
                exported = lower_for_platform(graph._ir, weights, platform)
            except Exception as e:  # noqa: BLE001 - any lowering failure is reported with the graph and the target
                raise RuntimeError(
                    f"InferenceSession.compile: lowering graph {graph.name!r} for the virtual {virtual.api} "
                    f"{virtual.architecture_name} device {target} failed: {e}"
                ) from e
            return _CompiledGraph(graph, weights, None, exported, virtual)
        return _CompiledGraph(graph, weights, jax_device(target))

    def init(self, compiled: CompiledModel, *, weights_registry: Mapping[str, Any] | None = None) -> Model:
        """A runnable `Model` of ``compiled`` (from `compile`) with the weights' values from ``weights_registry``.

        Raises:
            TypeError: ``compiled`` is not a `CompiledModel`.
            ValueError: a weight has no value, or its value's dtype/shape differs from the
                Weight; ``compiled`` holds several graphs (use `init_all`).
            RuntimeError: ``compiled`` was compiled for a virtual device.
        """
        if not isinstance(compiled, CompiledModel):
            raise TypeError(
                "InferenceSession.init: expected the CompiledModel that InferenceSession.compile returns, got "
                f"{type(compiled).__name__}"
            )
        entry = compiled._single("InferenceSession.init")
        with timed_phase("init"):
            return self._init(entry, _contiguous_registry(weights_registry))

    def init_all(
        self, compiled: CompiledModel, *, weights_registry: Mapping[str, Any] | None = None
    ) -> dict[str, Model]:
        """`init` for every graph of ``compiled``, as ``{graph name: Model}`` (MAX's multi-graph form).

        Each graph takes the weights it reads from ``weights_registry``.
        """
        if not isinstance(compiled, CompiledModel):
            raise TypeError(
                "InferenceSession.init_all: expected the CompiledModel that InferenceSession.compile returns, got "
                f"{type(compiled).__name__}"
            )
        with timed_phase("init"):
            registry = _contiguous_registry(weights_registry)
            return {entry.graph.name: self._init(entry, registry) for entry in compiled._graphs}

    def load_all(self, model: Graph | Module, *, weights_registry: Mapping[str, Any] | None = None) -> dict[str, Model]:
        """`load` returning ``{graph name: Model}``, like `init_all`; ``model`` may be a `Module` of graphs."""
        return self.init_all(self.compile(model), weights_registry=weights_registry)

    def _init(self, compiled: _CompiledGraph, registry: dict[str, Any]) -> Model:
        if compiled.device is None:
            raise compiled.virtual._no_hardware(
                f"initializing graph {compiled.graph.name!r} (binding its weights and making it runnable)"
            )
        weights = {}
        for name, (t, full_shape) in compiled.expected_weights.items():
            if name not in registry:
                raise ValueError(f"InferenceSession.load: weight {name!r} ({t}) is missing from weights_registry")
            arr = _weight_array(name, t, full_shape, registry[name])
            check_weight_value(name, arr, full_shape, t.dtype, where="InferenceSession.load")
            weights[name] = arr
        graph = compiled.graph
        block = CompiledBlock(graph._ir, weights, compiled.device)
        return Model(block, graph.name, [f"input{i}" for i in range(len(graph.inputs))], self._print_options)

    def _target_for(self, block: Block) -> DeviceRef:
        """The device ``block`` runs on: its GPU if it uses one (which the session must have), else the session's first
        device.
        """
        refs = {v.type.device for v in block.inputs if isinstance(v.type, (TensorType, BufferType))}
        refs |= {v.type.device for v in block.outputs if isinstance(v.type, (TensorType, BufferType))}
        session_refs = [DeviceRef.from_device(d) for d in self._devices]
        gpu = [r for r in refs if r.is_gpu()]
        target = gpu[0] if gpu else (session_refs[0] if session_refs else DeviceRef.CPU())
        if gpu and gpu[0] not in session_refs:
            raise ValueError(
                f"InferenceSession.load: graph uses {gpu[0]} but the session's devices are "
                f"{[str(r) for r in session_refs]}"
            )
        return target

    def set_debug_print_options(
        self,
        style: str | PrintStyle = PrintStyle.COMPACT,
        precision: int = 6,
        output_directory: str | os.PathLike | None = None,
    ) -> None:
        """How the print ops (``ops.print``, ``TensorValue.print``, ``PrintHook``) of this session's models show
        tensors.

        Takes effect at each execution, also for models loaded before. ``BINARY``
        writes each printed tensor's raw bytes to ``{output_directory}/{label}``
        (read with ``Buffer.mmap``, giving dtype and shape); ``BINARY_MAX_CHECKPOINT``
        writes ``{output_directory}/{label}.max``, read with ``maxfx.driver.load_max_buffer``.

        Args:
            style: ``COMPACT`` (default), ``FULL``, ``BINARY``, ``BINARY_MAX_CHECKPOINT``
                or ``NONE``, as a `PrintStyle` or its name.
            precision: digits of ``FULL``'s elements.
            output_directory: where the binary styles write (created if missing).

        Raises:
            TypeError: an unknown style, a non-int ``FULL`` precision, a directory that is not a str or Path.
            ValueError: a binary style without an output directory.

        Example:
            >>> import numpy as np
            >>> from maxfx.graph import Graph, TensorType, ops
            >>> from maxfx.dtype import DType
            >>> with Graph("p", input_types=[TensorType(DType.float32, [3])]) as g:
            ...     g.inputs[0].print("x")
            ...     g.output(g.inputs[0])
            >>> session = InferenceSession()
            >>> model = session.load(g)
            >>> session.set_debug_print_options("FULL", precision=2)
            >>> _ = model.execute(np.array([1.0, 2.5, -3.0], np.float32))
            x = tensor<3xf32> [1.00e+00, 2.50e+00, -3.00e+00]
        """
        self._print_options.set(style, precision, output_directory)

    # Settings MAX exposes for its Mojo kernels; XLA has no equivalent, they are recorded only.
    def gpu_profiling(self, mode: GPUProfilingMode) -> None:
        """Record the GPU profiling mode (use ``jax.profiler`` for actual traces)."""
        self._settings["gpu_profiling"] = GPUProfilingMode(mode)

    def set_mojo_assert_level(self, level: Any) -> None:
        """Record the kernel assert level (no Mojo kernels run in maxfx)."""
        self._settings["assert_level"] = level

    def set_mojo_log_level(self, level: Any) -> None:
        """Record the kernel log level."""
        self._settings["log_level"] = LogLevel(level) if isinstance(level, str) else level

    def set_split_k_reduction_precision(self, precision: Any) -> None:
        """Record the split-K reduction precision preference."""
        self._settings["split_k_reduction_precision"] = precision

    def use_old_top_k_kernel(self, mode: Any) -> None:
        """Record the top-k kernel preference (maxfx uses ``jax.lax.top_k``)."""
        self._settings["old_top_k_kernel"] = mode

    def __repr__(self) -> str:
        return f"InferenceSession(devices={self._devices})"


def _contiguous_registry(weights_registry: Mapping[str, Any] | None) -> dict[str, Any]:
    """``weights_registry`` as a dict, after refusing strided values as MAX does."""
    registry = dict(weights_registry or {})
    for name, value in registry.items():
        require_contiguous("InferenceSession.load", f"weight {name!r}", value)
    return registry


def _check_shared_weights(graphs: Sequence[_CompiledGraph]) -> None:
    """Graphs compiled together bind one registry, so a weight name they share must mean one type."""
    seen: dict[str, tuple[str, Any]] = {}
    for entry in graphs:
        for name, (t, full_shape) in entry.expected_weights.items():
            first = seen.setdefault(name, (entry.graph.name, (t, full_shape)))
            if first[1][0].dtype is not t.dtype or first[1][1] != full_shape:
                raise ValueError(
                    f"InferenceSession.compile: graphs {first[0]!r} and {entry.graph.name!r} both read weight "
                    f"{name!r}, "
                    f"as {first[1][0].dtype.name}{list(first[1][1])} and {t.dtype.name}{list(full_shape)}; one "
                    "weights_registry binds both, so rename one"
                )


def _weight_inputs(block: Block) -> dict[str, tuple[TensorType, tuple[int, ...]]]:
    """Every weight ``block`` reads (nested blocks and subgraph calls included): name → (type, full shape before
    sharding).
    """
    found: dict[str, tuple[TensorType, tuple[int, ...]]] = {}
    for name, node in weight_reads(block.nodes):
        t = node.params["type"]
        shape = [int(d) for d in t.shape]
        shard = node.params.get("shard")
        if shard is not None:  # (axis, slices, full size of axis): the registry holds the whole weight
            axis, _, full = shard
            shape[axis] = full
        found.setdefault(name, (t, tuple(shape)))
    return found


def _weight_array(name: str, t: TensorType, full_shape: tuple[int, ...], value: Any) -> Any:
    """The array of registry entry ``name``; any other value is a TypeError naming the weight.

    A path (a common slip: the registry holds the file, not its tensors) gets its own hint.
    """
    if isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(
            f"InferenceSession.load: weights_registry[{name!r}] is a {type(value).__name__} ({value!r:.80}), not the "
            "weight's values; "
            f"expected an array of {t.dtype.name}{list(full_shape)} (numpy/JAX array, Tensor or DLPack object); "
            "load files first, e.g. with maxfx.graph.weights.load_weights"
        )
    try:
        return as_array(value)
    except TypeError as e:
        raise TypeError(f"InferenceSession.load: weights_registry[{name!r}]: {e}") from None
