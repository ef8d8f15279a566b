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
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from lowering.compile import CompiledBlock, InputMismatchError
from lowering.devices import jax_device
from lowering.dtypes import DType
from lowering.ir import Block
from lowering.types import BufferType, DeviceRef, TensorType

__all__ = ["InferenceSession", "Model", "TensorSpec", "GPUProfilingMode", "LogLevel", "MojoValue", "CustomExtensionsType"]

CustomExtensionsType: TypeAlias = list[str | Path | Any] | str | Path | Any


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


class MojoValue:
    """An opaque non-tensor model output (maxfx models only return tensors)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"MojoValue({self.value!r})"


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape (None for symbolic dims) and dtype of a model input or output."""

    shape: list[int | None] | None
    dtype: DType
    name: str = ""

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype.name}, name={self.name!r})"


# Arrays this engine wrote into buffer Tensors (id -> array, weakly). Only these, and host
# numpy memory (copied onto the device per call), are donated: a jax.Array the caller
# wrapped (Tensor.from_dlpack shares it) may still be read through the caller's own name.
_engine_buffers: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _donatable(array: Any) -> bool:
    return isinstance(array, np.ndarray) or _engine_buffers.get(id(array)) is array


def _spec(t: Any, name: str) -> TensorSpec:
    dims = [d.dim if d.__class__.__name__ == "StaticDim" else None for d in t.shape]
    return TensorSpec(dims, t.dtype, name)


class Model:
    """A loaded graph, ready to execute. Made by `InferenceSession.load`."""

    def __init__(self, compiled: CompiledBlock, name: str, input_names: Sequence[str]):
        self._compiled = compiled
        self._name = name
        self._input_names = list(input_names)

    @property
    def input_metadata(self) -> list[TensorSpec]:
        """One `TensorSpec` per input."""
        return [_spec(v.type, n) for v, n in zip(self._compiled.block.inputs, self._input_names)]

    @property
    def output_metadata(self) -> list[TensorSpec]:
        """One `TensorSpec` per output."""
        return [_spec(v.type, f"output{i}") for i, v in enumerate(self._compiled.block.outputs)]

    def execute(self, *args: Any) -> list[Any]:
        """Run the model on one argument per graph input; returns a list of driver Tensors.

        Arguments may be driver Tensors, numpy/JAX/DLPack arrays or Python scalars
        (for rank-0 inputs). Buffer inputs must be driver Tensors; they are updated
        in place: the executable reuses (donates) their memory when the engine owns it
        (a previous execution's value, or host memory it copies anyway), so a
        step does not copy e.g. a whole KV-cache pool.

        Raises:
            ValueError: an input's dtype or shape does not match the graph (the
                message names the input and the expected type).
        """
        from maxfx.driver import Tensor  # noqa: PLC0415
        from maxfx.driver._tensor import as_array  # noqa: PLC0415

        inputs = self._compiled.block.inputs
        if len(args) != len(inputs):
            raise ValueError(f"Model {self._name!r}: expected {len(inputs)} inputs ({', '.join(self._input_names)}), got {len(args)}")
        arrays = []
        for i, (v, a) in enumerate(zip(inputs, args)):
            if isinstance(v.type, BufferType) and not isinstance(a, Tensor):
                raise TypeError(f"Model {self._name!r}: input {i} is a buffer ({v.type}); pass a maxfx.driver.Tensor so it can be updated in place")
            if isinstance(a, (int, float, bool, np.generic)) and not isinstance(a, np.ndarray):
                a = np.asarray(a, dtype=v.type.dtype.to_numpy())
            arrays.append(as_array(a))
        try:
            self._compiled.check_inputs(arrays, self._input_names)
        except InputMismatchError as e:
            raise ValueError(f"Model {self._name!r}: {e}") from None
        # Donated: the executable writes the buffers' new values over their old memory (no copy of
        # e.g. a KV-cache pool per step); the Tensors are rebound to those values right below.
        buffers = self._compiled._buffer_inputs
        donate = all(_donatable(arrays[i]) for i in buffers)
        outs, buffer_finals = self._compiled(arrays, donate_buffers=donate)
        for i, final in zip(buffers, buffer_finals):
            args[i]._assign(final)
            _engine_buffers[id(final)] = final
        return [Tensor._from_array(o) for o in outs]

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Same as `execute`; keyword arguments bind inputs by name."""
        if kwargs:
            args = list(args) + [None] * (len(self._input_names) - len(args))
            for k, v in kwargs.items():
                if k not in self._input_names:
                    raise TypeError(f"Model {self._name!r}: unknown input name {k!r}; inputs are {self._input_names}")
                args[self._input_names.index(k)] = v
            missing = [n for n, a in zip(self._input_names, args) if a is None]
            if missing:
                raise TypeError(f"Model {self._name!r}: missing inputs {missing}")
        return self.execute(*args)

    def _stablehlo(self, *args: Any, platform: str | None = None) -> str:
        """StableHLO of the program for ``args``; ``platform="cuda"`` lowers for a GPU (also from a CPU-only machine)."""
        from maxfx.driver._tensor import as_array  # noqa: PLC0415

        return self._compiled.lower_text([as_array(a) for a in args], donate_buffers=True, platform=platform)

    def __repr__(self) -> str:
        return f"Model({self._name!r}, inputs={self.input_metadata}, outputs={self.output_metadata})"


class InferenceSession:
    """Compiles graphs for a set of devices.

    Args:
        devices: driver devices to run on (default: the host CPU only).
        num_threads: accepted for compatibility (XLA picks its own thread pool).
        custom_extensions: kernel library paths (maxfx custom ops are Python/JAX;
            see ``maxfx.graph.ops.custom``).
    """

    def __init__(self, devices: Sequence[Any] | None = None, num_threads: int | None = None, *, custom_extensions: CustomExtensionsType | None = None):
        from maxfx.driver import CPU  # noqa: PLC0415

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
        from maxfx.driver._tensor import as_array  # noqa: PLC0415
        from maxfx.graph import Graph  # noqa: PLC0415

        if isinstance(model, (str, Path)):
            from maxfx._export import is_exported_artifact, load_exported  # noqa: PLC0415

            if is_exported_artifact(model):  # written by maxfx.export(...).save(path)
                return load_exported(model, device=self._devices[0]).model
            raise RuntimeError(f"InferenceSession.load({model!r}): loading serialized MAX graphs from a path is not supported; pass a maxfx Graph")
        if not isinstance(model, Graph):
            raise TypeError(f"InferenceSession.load: expected a Graph, got {type(model).__name__}")
        if not model._has_output:
            raise ValueError(f"InferenceSession.load: graph {model.name!r} has no outputs; call graph.output(...)")
        registry = dict(weights_registry or {})
        weights = {}
        for name, (t, full_shape) in _weight_inputs(model._ir).items():
            if name not in registry:
                raise ValueError(f"InferenceSession.load: weight {name!r} ({t}) is missing from weights_registry")
            arr = as_array(registry[name])
            _check_weight(name, t, full_shape, arr)
            weights[name] = arr
        device = self._device_for(model._ir)
        compiled = CompiledBlock(model._ir, weights, device)
        names = [f"input{i}" for i in range(len(model.inputs))]
        return Model(compiled, model.name, names)

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


def _weight_inputs(block: Block, found: dict | None = None, prefix: str = "") -> dict[str, tuple[TensorType, tuple[int, ...]]]:
    """Every ``weight`` node of ``block`` and its nested blocks: name → (type, full shape before sharding).

    Subgraphs invoked by ``ops.call`` see their weights under the call's prefix.
    """
    found = {} if found is None else found
    for node in block.nodes:
        if node.op == "weight":
            t = node.params["type"]
            shape = [int(d) for d in t.shape]
            shard = node.params.get("shard")
            if shard is not None:
                axis, _, n = shard
                shape[axis] *= n
            found.setdefault(prefix + node.params["name"], (t, tuple(shape)))
        inner = prefix + node.params.get("prefix", "") if node.op == "call" else prefix
        for p in node.params.values():
            for b in p if isinstance(p, (tuple, list)) else (p,):
                if isinstance(b, Block):
                    _weight_inputs(b, found, inner)
    return found


def _check_weight(name: str, t: TensorType, full_shape: tuple[int, ...], arr: Any) -> None:
    got = DType.from_numpy(arr.dtype)
    if got is not t.dtype:
        raise ValueError(f"InferenceSession.load: weight {name!r} expects dtype {t.dtype.name}, got {got.name}")
    if tuple(arr.shape) != full_shape:
        raise ValueError(f"InferenceSession.load: weight {name!r} expects shape {list(full_shape)}, got {list(arr.shape)}")
