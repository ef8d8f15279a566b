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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lowering.compile import CompiledBlock
from lowering.devices import jax_device
from lowering.dtypes import DType
from lowering.ir import Block, weight_reads
from lowering.types import BufferType, DeviceRef, TensorType
from maxfx._artifact import ArtifactProgram, is_exported_artifact, load_exported
from maxfx.driver import CPU
from maxfx.driver._tensor import as_array
from maxfx.engine._compilation_stats import timed_phase
from maxfx.engine._model import Model, require_contiguous
from maxfx.graph import Graph

__all__ = ["CompiledModel", "InferenceSession", "GPUProfilingMode", "LogLevel", "CustomExtensionsType"]

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


class CompiledModel:
    """A checked graph, ready for `InferenceSession.init` to bind weights (MAX's ``CompiledModel``).

    Attributes:
        graph: the `Graph` it was made from.
        expected_weights: weight name → (its type, its full unsharded shape): what ``init`` needs.
        device: the JAX device it runs on.
    """

    def __init__(self, graph: Graph, expected_weights: Mapping[str, Any], device: Any):
        self.graph = graph
        self.expected_weights = dict(expected_weights)
        self.device = device

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

    def __init__(self, devices: Sequence[Any] | None = None, num_threads: int | None = None, *, custom_extensions: CustomExtensionsType | None = None):
        self._devices = list(devices) if devices else [CPU()]
        self.num_threads = num_threads
        self.custom_extensions = custom_extensions
        self._settings: dict[str, Any] = {}

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
                return Model(ArtifactProgram(exported), exported.name, [f"input{i}" for i in range(len(exported.input_types))])
            raise RuntimeError(f"InferenceSession.load({model!r}): loading serialized MAX graphs from a path is not supported; pass a maxfx Graph")
        return self.init(self.compile(model), weights_registry=weights_registry)

    def compile(self, model: Graph, *, custom_extensions: CustomExtensionsType | None = None, custom_ops_path: str | None = None) -> CompiledModel:
        """Check ``model`` (a `Graph`) and prepare it to run, before any weight has a value.

        MAX's two-step form of `load`: ``session.init(compiled, weights_registry=...)``
        then binds the weights and returns a `Model`; one `CompiledModel` can be
        initialized more than once (with different weights). XLA compiles when
        the model first runs on concrete input shapes, as with `load`.

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
            TypeError: ``model`` is not a Graph.
            ValueError: the graph has no outputs, or uses a device the session does not have.
        """
        if not isinstance(model, Graph):
            raise TypeError(f"InferenceSession.compile: expected a Graph, got {type(model).__name__}")
        if not model._has_output:
            raise ValueError(f"InferenceSession.compile: graph {model.name!r} has no outputs; call graph.output(...)")
        with timed_phase("compile"):
            return CompiledModel(model, _weight_inputs(model._ir), self._device_for(model._ir))

    def init(self, compiled: CompiledModel, *, weights_registry: Mapping[str, Any] | None = None) -> Model:
        """A runnable `Model` of ``compiled`` (from `compile`) with the weights' values from ``weights_registry``.

        Raises:
            TypeError: ``compiled`` is not a `CompiledModel`.
            ValueError: a weight has no value, or its value's dtype/shape differs from the Weight.
        """
        if not isinstance(compiled, CompiledModel):
            raise TypeError(f"InferenceSession.init: expected the CompiledModel that InferenceSession.compile returns, got {type(compiled).__name__}")
        with timed_phase("init"):
            return self._init(compiled, weights_registry)

    def init_all(self, compiled: CompiledModel, *, weights_registry: Mapping[str, Any] | None = None) -> dict[str, Model]:
        """`init` for every graph of ``compiled``, as ``{graph name: Model}`` (MAX's multi-graph form)."""
        model = self.init(compiled, weights_registry=weights_registry)
        return {compiled.graph.name: model}

    def load_all(self, model: Graph, *, weights_registry: Mapping[str, Any] | None = None) -> dict[str, Model]:
        """`load` returning ``{graph name: Model}``, like `init_all`."""
        return self.init_all(self.compile(model), weights_registry=weights_registry)

    def _init(self, compiled: CompiledModel, weights_registry: Mapping[str, Any] | None) -> Model:
        registry = dict(weights_registry or {})
        for name, value in registry.items():
            require_contiguous("InferenceSession.load", f"weight {name!r}", value)
        weights = {}
        for name, (t, full_shape) in compiled.expected_weights.items():
            if name not in registry:
                raise ValueError(f"InferenceSession.load: weight {name!r} ({t}) is missing from weights_registry")
            arr = as_array(registry[name])
            _check_weight(name, t, full_shape, arr)
            weights[name] = arr
        graph = compiled.graph
        block = CompiledBlock(graph._ir, weights, compiled.device)
        return Model(block, graph.name, [f"input{i}" for i in range(len(graph.inputs))])

    def _device_for(self, block: Block):
        refs = {v.type.device for v in block.inputs if isinstance(v.type, (TensorType, BufferType))}
        refs |= {v.type.device for v in block.outputs if isinstance(v.type, (TensorType, BufferType))}
        session_refs = [DeviceRef.from_device(d) for d in self._devices]
        gpu = [r for r in refs if r.is_gpu()]
        target = gpu[0] if gpu else (session_refs[0] if session_refs else DeviceRef.CPU())
        if gpu and gpu[0] not in session_refs:
            raise ValueError(f"InferenceSession.load: graph uses {gpu[0]} but the session's devices are {[str(r) for r in session_refs]}")
        return jax_device(target)

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


def _weight_inputs(block: Block) -> dict[str, tuple[TensorType, tuple[int, ...]]]:
    """Every weight ``block`` reads (nested blocks and subgraph calls included): name → (type, full shape before sharding)."""
    found: dict[str, tuple[TensorType, tuple[int, ...]]] = {}
    for name, node in weight_reads(block.nodes):
        t = node.params["type"]
        shape = [int(d) for d in t.shape]
        shard = node.params.get("shard")
        if shard is not None:
            axis, _, n = shard
            shape[axis] *= n
        found.setdefault(name, (t, tuple(shape)))
    return found


def _check_weight(name: str, t: TensorType, full_shape: tuple[int, ...], arr: Any) -> None:
    got = DType.from_numpy(arr.dtype)
    if got is not t.dtype:
        raise ValueError(f"InferenceSession.load: weight {name!r} expects dtype {t.dtype.name}, got {got.name}")
    if tuple(arr.shape) != full_shape:
        raise ValueError(f"InferenceSession.load: weight {name!r} expects shape {list(full_shape)}, got {list(arr.shape)}")
