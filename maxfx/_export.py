"""`export` and `load_exported`: portable StableHLO artifacts that run without the model's code.

``maxfx.export(model, *input_types)`` lowers a model with ``jax.export``:
symbolic dims of the input types (``["batch", 4]``) stay symbolic in the
StableHLO, so the artifact runs at any size for them. ``model`` may be

* the callable `Module.compile` returns, or an ``experimental.nn`` Module
  (compiled first, with ``input_types`` or the module's own ``input_types()``);
* an engine `Model` (from ``InferenceSession.load``) or a `Graph`
  (``weights_registry=`` gives its weights' values);
* a plain function of Tensors (``input_types`` required); Tensors and Modules
  it reads from its closure or module globals become weights of the artifact.

Weights are **stored beside** the program, in the same file, not baked in as
constants: the StableHLO takes them as arguments (small programs, no constant
folding of large tensors, weights can be read back with `ExportedModel.weights`).

The artifact is one zip file: ``maxfx_export.json`` (format, input/output
types, weight names, dtypes and shapes, and the ``jax.export.Exported`` fields:
avals with symbolic dims, platforms, calling convention), ``program.mlirbc``
(the StableHLO module as MLIR bytecode, as ``Exported.mlir_module_serialized``)
and ``weights/<i>.bin`` (raw little-endian bytes). `load_exported` rebuilds the
``Exported`` and needs only maxfx (and JAX): no Python code of the model.
(JAX's own ``Exported.serialize`` needs the optional ``flatbuffers`` package;
the fields are stored directly instead, so the artifact works without it.)

Example:
    >>> import numpy as np, maxfx
    >>> from maxfx.experimental.nn import Linear
    >>> from maxfx.graph import TensorType
    >>> from maxfx.dtype import DType
    >>> layer = Linear(4, 2)
    >>> art = maxfx.export(layer.compile(TensorType(DType.float32, ["batch", 4])))
    >>> loaded = maxfx.load_exported(art.serialize())
    >>> loaded(np.ones((3, 4), np.float32)).shape
    [Dim(3), Dim(2)]
"""

from __future__ import annotations

import io
import json
import os
import re
import types
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from lowering.compile import InputMismatchError, check_input_types
from lowering.dims import StaticDim, SymbolicDim
from lowering.dtypes import DType
from lowering.interpret import run_block
from lowering.targets import export_checks, lowering_for
from lowering.types import BufferType, DeviceRef, TensorType
from lowering.x64 import x64

__all__ = ["ExportedModel", "export", "is_exported_artifact", "load_exported"]

_FORMAT = "maxfx.export"
_VERSION = 1
_META = "maxfx_export.json"
_PROGRAM = "program.mlirbc"


# ─── what is being exported ─────────────────────────────────────────────────


class _Source:
    """A compiled block to export: its IR, weight values, device, name and output arity."""

    def __init__(self, compiled: Any, name: str, is_tuple: bool):
        self.block = compiled.block
        self.weights = dict(compiled.weights)
        self.device = compiled.device
        self.name = name
        self.is_tuple = is_tuple


def _source(model: Any, input_types: Sequence[Any], weights_registry: Mapping[str, Any] | None) -> tuple[_Source, bool]:
    """The block to export, and whether ``input_types`` were already used to build it."""
    from maxfx.engine import InferenceSession, Model  # noqa: PLC0415
    from maxfx.experimental.nn._compile import CompiledModule  # noqa: PLC0415
    from maxfx.experimental.nn.module import Module  # noqa: PLC0415
    from maxfx.graph import Graph  # noqa: PLC0415

    if isinstance(model, ExportedModel):
        raise TypeError("maxfx.export: this model is already exported; call .save(path) or .serialize() on it")
    if isinstance(model, CompiledModule):
        return _Source(model.model._compiled, model._name, model._is_tuple), False
    if isinstance(model, Model):
        return _Source(model._compiled, model._name, len(model._compiled.block.outputs) != 1), False
    if isinstance(model, Graph):
        loaded = InferenceSession().load(model, weights_registry=weights_registry)
        return _Source(loaded._compiled, model.name, len(model._ir.outputs) != 1), False
    if isinstance(model, Module):
        types_ = tuple(input_types) or model.input_types()
        return _Source(model.compile(*types_).model._compiled, type(model).__name__, False), True
    if callable(model):
        if not input_types:
            raise TypeError(f"maxfx.export: exporting the function {getattr(model, '__name__', model)!r} needs input_types (e.g. TensorType(DType.float32, ['batch', 4]))")
        return _trace_function(model, input_types), True
    raise TypeError(f"maxfx.export: expected a compiled module, Module, engine Model, Graph or function of Tensors, got {type(model).__name__}")


def _trace_function(fn: Callable[..., Any], input_types: Sequence[Any]) -> _Source:
    """Trace ``fn`` on graph-valued Tensors into a Graph; captured Tensors/Modules become weights."""
    from maxfx.engine import InferenceSession  # noqa: PLC0415
    from maxfx.experimental._tensor import Tensor  # noqa: PLC0415
    from maxfx.graph import Graph  # noqa: PLC0415

    name = getattr(fn, "__name__", type(fn).__name__)
    _check_types(input_types, "maxfx.export")
    graph = Graph(re.sub(r"\W", "_", name) or "fn", input_types=list(input_types))
    registry: dict[str, Any] = {}
    with graph:
        traced = _lift_captures(fn, graph, registry)
        try:
            out = traced(*[Tensor.from_graph_value(v) for v in graph.inputs])
        except Exception as e:
            hint = ""
            if "NoneType" in str(e):
                hint = " (an eager Tensor reached the traced function by a path other than its closure or module globals, e.g. through another function's globals; pass it as an input or export a Module)"
            raise type(e)(f"maxfx.export: tracing {name!r} failed: {e}{hint}") from e
        is_tuple = isinstance(out, (tuple, list))
        graph.output(*(out if is_tuple else [out]))
    loaded = InferenceSession().load(graph, weights_registry=registry)
    return _Source(loaded._compiled, name, is_tuple)


def _lift_captures(fn: Callable[..., Any], graph: Any, registry: dict[str, Any]) -> Callable[..., Any]:
    """A copy of ``fn`` whose captured eager Tensors and Modules read graph weights instead.

    Without this, an eager Tensor meeting a graph value inside the trace has no
    graph value to bind; with it, the captured values are stored in the artifact.
    """
    if not isinstance(fn, types.FunctionType):
        return fn
    code = fn.__code__
    closure = []
    changed = False
    for var, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell (a name assigned later)
            closure.append(cell)
            continue
        lifted = _lift(value, var, graph, registry)
        changed |= lifted is not value
        closure.append(types.CellType(lifted) if lifted is not value else cell)
    glob = fn.__globals__
    replaced = {}
    for var in code.co_names:
        if var in glob:
            lifted = _lift(glob[var], var, graph, registry)
            if lifted is not glob[var]:
                replaced[var] = lifted
    if not changed and not replaced:
        return fn
    new_globals = {**glob, **replaced} if replaced else glob
    return types.FunctionType(code, new_globals, fn.__name__, fn.__defaults__, tuple(closure) or None)


def _lift(value: Any, var: str, graph: Any, registry: dict[str, Any]) -> Any:
    from maxfx.experimental._tensor import Tensor  # noqa: PLC0415
    from maxfx.experimental.nn.module import Module  # noqa: PLC0415
    from maxfx.graph import Weight  # noqa: PLC0415

    def weight(name: str, t: Tensor) -> Tensor:
        registry[name] = t._array()
        w = Weight(name, t.dtype, [int(d) for d in t.shape], DeviceRef.from_device(t.device))
        return Tensor.from_graph_value(graph.add_weight(w))

    if isinstance(value, Tensor) and value._gv is None:
        return weight(var, value)
    if isinstance(value, Module):
        return value.map_parameters(lambda n, t: weight(f"{var}.{n}", t) if t._gv is None else t)
    return value


# ─── input types and symbolic shapes ──────────────────────────────────────────


def _check_types(input_types: Sequence[Any], where: str) -> None:
    for i, t in enumerate(input_types):
        if isinstance(t, BufferType):
            raise TypeError(f"{where}: input {i} is a buffer ({t}); exported programs take tensor inputs only")
        if not isinstance(t, TensorType):
            raise TypeError(f"{where}: input type {i} must be a TensorType, got {type(t).__name__}")


def _input_types(source: _Source, given: Sequence[Any]) -> list[TensorType]:
    """The block's input types, or ``given`` where it refines them (same dtype/rank, equal static dims)."""
    block_types = [v.type for v in source.block.inputs]
    _check_types(block_types, f"maxfx.export({source.name!r})")
    if not given:
        return block_types
    _check_types(given, "maxfx.export")
    if len(given) != len(block_types):
        raise TypeError(f"maxfx.export({source.name!r}): got {len(given)} input type(s), the model has {len(block_types)}: {[str(t) for t in block_types]}")
    for i, (g, b) in enumerate(zip(given, block_types)):
        same = g.dtype is b.dtype and g.rank == b.rank
        same = same and all(not isinstance(bd, StaticDim) or (isinstance(gd, StaticDim) and gd.dim == bd.dim) for gd, bd in zip(g.shape, b.shape))
        if not same:
            raise ValueError(f"maxfx.export({source.name!r}): input type {i} {g} does not fit the model's input {b} (dtype and rank must match, static dims must be equal)")
    return list(given)


def _symbolic_specs(input_types: Sequence[TensorType]) -> list[jax.ShapeDtypeStruct]:
    """One ``ShapeDtypeStruct`` per input, symbolic dims shared by name across inputs."""
    scope = jax.export.SymbolicScope()
    symbols: dict[str, Any] = {}
    specs = []
    for i, t in enumerate(input_types):
        dims = []
        for d in t.shape:
            if isinstance(d, StaticDim):
                dims.append(d.dim)
            elif isinstance(d, SymbolicDim):
                if d.name not in symbols:
                    (symbols[d.name],) = jax.export.symbolic_shape(d.name, scope=scope)
                dims.append(symbols[d.name])
            else:
                raise ValueError(f"maxfx.export: input {i} has the algebraic dim {d} ({t}); exported inputs take static sizes or bare symbols ('batch')")
        specs.append(jax.ShapeDtypeStruct(tuple(dims), t.dtype.to_numpy()))
    return specs


def _platform(device: jax.Device) -> str:
    if device.platform != "gpu":
        return device.platform
    version = str(getattr(device.client, "platform_version", "")).lower()
    return "rocm" if "rocm" in version or "hip" in version else "cuda"


# ─── export ────────────────────────────────────────────────────────────────


def export(
    model: Any,
    *input_types: TensorType,
    weights_registry: Mapping[str, Any] | None = None,
    platforms: Sequence[str] | None = None,
) -> ExportedModel:
    """Export ``model`` to a portable artifact (StableHLO via ``jax.export``, weights stored beside).

    Args:
        model: a compiled module (``Module.compile(...)``), an ``experimental.nn``
            Module, an engine ``Model``, a ``Graph`` or a function of Tensors.
        input_types: ``TensorType`` per input; symbolic dims (``"batch"``) stay
            symbolic in the artifact. Optional for compiled models, Models and Graphs
            (their own types are used); given ones may fix a symbolic dim to a size.
        weights_registry: weight values of a ``Graph``'s Weights.
        platforms: lower for these JAX platforms (``("cpu", "cuda")``); default: the
            platform of the device the model was compiled for. ``["cuda"]``
            gives an artifact with the Pallas (Triton) attention and
            quantized-matmul kernels, also when exported on a machine without a
            GPU; it needs the jaxlib version that built it (Triton modules have
            no cross-version guarantee). A multi-platform artifact
            (``["cpu", "cuda"]``) runs the portable jnp path on every platform:
            JAX cannot lower a Pallas kernel inside it for the CPU.

    Returns:
        An `ExportedModel`: call it, ``save(path)`` or ``serialize()`` it.

    Raises:
        TypeError: unsupported model or input type, buffer inputs.
        ValueError: input types that do not fit the model, algebraic input dims, or
            a program JAX cannot export with the symbolic dims given (message says why).
    """
    source, used = _source(model, input_types, weights_registry)
    in_types = _input_types(source, () if used else input_types)
    names = sorted(source.weights)
    weights = [source.weights[n] for n in names]
    block = source.block

    def program(args, weight_list):
        outs, _ = run_block(block, list(args), dict(zip(names, weight_list)))
        return tuple(outs)

    specs = _symbolic_specs(in_types)
    weight_specs = [jax.ShapeDtypeStruct(w.shape, w.dtype) for w in weights]
    lowering_platforms = tuple(platforms) if platforms else (_platform(source.device),)
    try:
        # lowering_for: the GPU kernels are emitted for a "cuda" target even where no GPU is attached
        with x64(), lowering_for(lowering_platforms):
            exported = jax.export.export(
                jax.jit(program), platforms=lowering_platforms, disabled_checks=export_checks(lowering_platforms)
            )(specs, weight_specs)
    except jax.errors.ConcretizationTypeError as e:
        raise ValueError(f"maxfx.export({source.name!r}): the graph has data-dependent ops (output shapes depend on values), which cannot be exported: {e}") from e
    except Exception as e:
        # jax.export's InconclusiveDimensionOperation is not public; it and int() of a symbolic size land here.
        if "symbolic" not in str(e).lower() and "inconclusive" not in str(e).lower() and "dimension" not in str(e).lower():
            raise
        raise ValueError(f"maxfx.export({source.name!r}): the program needs a concrete size for a symbolic dim of {[str(t) for t in in_types]}; give a static size in input_types ({type(e).__name__}: {e})") from e
    # The artifact stores avals, not trees: it rebuilds them from the counts, so they must be these.
    assert (exported.in_tree, exported.out_tree) == _trees(len(specs), len(weights), len(exported.out_avals)), exported.in_tree
    out_types = [_output_type(a) for a in exported.out_avals]
    host = {n: np.asarray(w) for n, w in zip(names, weights)}
    return ExportedModel(exported, source.name, in_types, out_types, host, source.is_tuple)


def _output_type(aval: Any) -> TensorType:
    dims = [d if isinstance(d, int) else _dim_name(str(d)) for d in aval.shape]
    return TensorType(DType.from_numpy(aval.dtype), dims, DeviceRef.CPU())


def _dim_name(text: str) -> str:
    # Output dims may be expressions ("2*batch"); Dim names must be identifiers, so spell them out.
    return text if text.isidentifier() else "expr_" + re.sub(r"\W+", "_", text).strip("_")


# ─── the artifact ─────────────────────────────────────────────────────────


def _type_json(t: TensorType) -> dict[str, Any]:
    return {"dtype": t.dtype.name, "shape": [d.dim if isinstance(d, StaticDim) else str(d) for d in t.shape]}


def _type_from_json(d: Mapping[str, Any]) -> TensorType:
    return TensorType(DType[d["dtype"]], d["shape"], DeviceRef.CPU())


def _encode_exported(exp: Any) -> dict[str, Any]:
    """The fields of a ``jax.export.Exported`` as JSON (the module bytes are stored separately)."""
    if any(s is not None for s in (*exp.in_shardings_hlo, *exp.out_shardings_hlo)) or exp.nr_devices != 1:
        raise ValueError(f"maxfx.export: sharded programs ({exp.nr_devices} devices) are not supported; export the single-device model")
    if exp.ordered_effects or exp.unordered_effects:
        raise ValueError(f"maxfx.export: programs with side effects ({exp.ordered_effects + exp.unordered_effects}) cannot be exported")
    aval = lambda a: {"shape": [str(d) for d in a.shape], "dtype": str(a.dtype)}  # noqa: E731
    return {
        "fun_name": exp.fun_name,
        "in_avals": [aval(a) for a in exp.in_avals],
        "out_avals": [aval(a) for a in exp.out_avals],
        "platforms": list(exp.platforms),
        "calling_convention_version": exp.calling_convention_version,
        "module_kept_var_idx": list(exp.module_kept_var_idx),
        "uses_global_constants": bool(exp.uses_global_constants),
        "disabled_safety_checks": [str(c) for c in exp.disabled_safety_checks],
    }


def _trees(n_inputs: int, n_weights: int, n_outputs: int) -> tuple[Any, Any]:
    """The in/out pytree structures of ``program(args, weights)``."""
    return jax.tree.structure((([0] * n_inputs, [0] * n_weights), {})), jax.tree.structure((0,) * n_outputs)


def _decode_check(text: str, where: str) -> Any:
    """A stored disabled safety check: only the custom-call targets `lowering.targets.export_checks` writes."""
    allowed = {str(c): c for c in export_checks(("cuda",))}
    if text not in allowed:
        raise ValueError(f"{where}: unsupported disabled safety check {text!r} (maxfx artifacts only disable {sorted(allowed)})")
    return allowed[text]


def _decode_exported(fields: Mapping[str, Any], module: bytes, n_inputs: int, where: str) -> Any:
    import jax.numpy as jnp  # noqa: PLC0415

    checks = tuple(_decode_check(c, where) for c in fields.get("disabled_safety_checks", ()))
    scope = jax.export.SymbolicScope()

    def aval(d: Mapping[str, Any]) -> Any:
        shape = jax.export.symbolic_shape(",".join(d["shape"]), scope=scope) if d["shape"] else ()
        return jax.core.ShapedArray(shape, jnp.dtype(d["dtype"]))

    in_avals = tuple(aval(a) for a in fields["in_avals"])
    out_avals = tuple(aval(a) for a in fields["out_avals"])
    in_tree, out_tree = _trees(n_inputs, len(in_avals) - n_inputs, len(out_avals))
    try:
        return jax.export.Exported(
            fun_name=fields["fun_name"],
            in_tree=in_tree,
            in_avals=in_avals,
            out_tree=out_tree,
            out_avals=out_avals,
            nr_devices=1,
            in_shardings_hlo=(None,) * len(in_avals),
            out_shardings_hlo=(None,) * len(out_avals),
            _in_named_shardings=(None,) * len(in_avals),
            _out_named_shardings=(None,) * len(out_avals),
            platforms=tuple(fields["platforms"]),
            ordered_effects=(),
            unordered_effects=(),
            disabled_safety_checks=checks,
            mlir_module_serialized=module,
            calling_convention_version=int(fields["calling_convention_version"]),
            module_kept_var_idx=tuple(fields["module_kept_var_idx"]),
            uses_global_constants=bool(fields["uses_global_constants"]),
            _get_vjp=None,
        )
    except TypeError as e:  # the Exported dataclass changed between JAX versions
        raise ValueError(f"{where}: this JAX ({jax.__version__}) cannot rebuild the exported program: {e}") from e


class ExportedModel:
    """An exported model: callable on Tensors/arrays; `save`/`serialize` write the artifact.

    Made by `export` and `load_exported`. Calls check inputs against
    `input_types` (symbolic dims accept any size) and compile once per new
    input shape.

    Attributes:
        name: the model's name.
        input_types: one ``TensorType`` per input (symbolic dims as exported).
        output_types: one ``TensorType`` per output.
        platforms: the JAX platforms the StableHLO was lowered for.
    """

    def __init__(self, exported: Any, name: str, input_types: Sequence[TensorType], output_types: Sequence[TensorType], weights: Mapping[str, np.ndarray], is_tuple: bool, device: Any = None):
        self._exported = exported
        self.name = name
        self.input_types = list(input_types)
        self.output_types = list(output_types)
        self._host_weights = dict(weights)
        self._is_tuple = is_tuple
        self._device = device
        self._placed: list[Any] | None = None
        self._call = jax.jit(lambda args, ws: exported.call(args, ws))

    # -- properties -----------------------------------------------------------
    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(self._exported.platforms)

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """Weight name → value (host numpy arrays), as stored in the artifact."""
        return dict(self._host_weights)

    @property
    def device(self) -> Any:
        """The driver device calls run on (the exported platform's first device unless given)."""
        if self._device is None:
            from maxfx.driver import CPU, Accelerator, accelerator_count  # noqa: PLC0415

            gpu = any(p in ("cuda", "rocm") for p in self.platforms) and accelerator_count() > 0
            self._device = Accelerator() if gpu and "cpu" not in self.platforms[:1] else CPU()
        return self._device

    def stablehlo(self) -> str:
        """The exported StableHLO module as text (symbolic dims appear as dynamic sizes)."""
        return str(self._exported.mlir_module())

    # -- running ----------------------------------------------------------------
    def _check(self, arrays: Sequence[Any], names: Sequence[str] | None = None) -> None:
        check_input_types(self.input_types, arrays, names)

    def _run(self, arrays: Sequence[Any]) -> list[Any]:
        platform = _platform(self.device.jax_device)
        if platform not in self.platforms:
            raise RuntimeError(f"exported model {self.name!r} was lowered for {list(self.platforms)}, not for {platform} ({self.device}); export with platforms=[..., {platform!r}]")
        target = self.device.jax_device
        with x64():
            if self._placed is None:
                self._placed = [jax.device_put(self._host_weights[n], target) for n in sorted(self._host_weights)]
            args = [jax.device_put(a, target) for a in arrays]
            return list(self._call(args, self._placed))

    def _arrays(self, args: Sequence[Any]) -> list[Any]:
        from maxfx.driver._tensor import as_array  # noqa: PLC0415
        from maxfx.experimental._tensor import Tensor  # noqa: PLC0415

        out = []
        for a, t in zip(args, self.input_types):
            if isinstance(a, Tensor):
                out.append(a._array())
            elif isinstance(a, (int, float, bool, np.generic)):
                out.append(np.asarray(a, dtype=t.dtype.to_numpy()))
            else:
                out.append(as_array(a))
        return out + [as_array(a) for a in args[len(self.input_types):]]

    def __call__(self, *args: Any) -> Any:
        """Run on Tensors or arrays; returns a Tensor (or a tuple for multi-output models).

        Raises:
            ValueError: an input's dtype or shape does not match `input_types`.
        """
        from maxfx.experimental._tensor import _leaf  # noqa: PLC0415

        arrays = self._arrays(args)
        try:
            self._check(arrays)
        except InputMismatchError as e:
            raise ValueError(f"exported model {self.name!r}: {e}") from None
        outs = tuple(_leaf(o) for o in self._run(arrays))
        return outs if self._is_tuple else outs[0]

    @property
    def model(self) -> Any:
        """This artifact as an engine ``Model`` (``execute`` returns driver Tensors)."""
        from maxfx.engine import Model  # noqa: PLC0415

        return Model(_EngineAdapter(self), self.name, [f"input{i}" for i in range(len(self.input_types))])

    # -- serialization --------------------------------------------------------
    def serialize(self) -> bytes:
        """The artifact as bytes (a zip: metadata JSON, serialized jax.export program, raw weights)."""
        names = sorted(self._host_weights)
        meta = {
            "format": _FORMAT,
            "version": _VERSION,
            "name": self.name,
            "inputs": [_type_json(t) for t in self.input_types],
            "outputs": [_type_json(t) for t in self.output_types],
            "is_tuple": self._is_tuple,
            "jax_version": jax.__version__,
            "exported": _encode_exported(self._exported),
            "weights": [
                {"name": n, "dtype": DType.from_numpy(self._host_weights[n].dtype).name, "shape": list(self._host_weights[n].shape), "file": f"weights/{i}.bin"}
                for i, n in enumerate(names)
            ],
        }
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            z.writestr(_META, json.dumps(meta, indent=1))
            z.writestr(_PROGRAM, bytes(self._exported.mlir_module_serialized))
            for w in meta["weights"]:
                z.writestr(w["file"], np.ascontiguousarray(self._host_weights[w["name"]]).tobytes())  # native (little-endian) order
        return buf.getvalue()

    def save(self, path: str | os.PathLike) -> Path:
        """Write the artifact to ``path``; returns the path."""
        path = Path(path)
        path.write_bytes(self.serialize())
        return path

    def __repr__(self) -> str:
        return f"ExportedModel({self.name!r}, inputs={[str(t) for t in self.input_types]}, platforms={list(self.platforms)})"


class _EngineAdapter:
    """Presents an `ExportedModel` as the compiled block an engine `Model` runs."""

    _buffer_inputs: list[int] = []

    class _Var:
        def __init__(self, t: TensorType):
            self.type = t

    class _Block:
        def __init__(self, inputs: list, outputs: list):
            self.inputs = inputs
            self.outputs = outputs

    def __init__(self, exported: ExportedModel):
        self._exported = exported
        self.block = self._Block([self._Var(t) for t in exported.input_types], [self._Var(t) for t in exported.output_types])

    def check_inputs(self, args: Sequence[Any], names: Sequence[str] | None = None) -> None:
        self._exported._check(args, names)

    def __call__(self, args: Sequence[Any], donate_buffers: bool = False) -> tuple[list[Any], list[Any]]:
        # An exported program has no buffer inputs, so there is nothing to donate.
        return self._exported._run(args), []

    def lower_text(self, args: Sequence[Any], donate_buffers: bool = False) -> str:
        return self._exported.stablehlo()


# ─── loading ───────────────────────────────────────────────────────────────


def _read_bytes(path_or_bytes: Any) -> bytes:
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return bytes(path_or_bytes)
    if isinstance(path_or_bytes, (str, os.PathLike)):
        return Path(path_or_bytes).read_bytes()
    raise TypeError(f"load_exported: expected a path or bytes, got {type(path_or_bytes).__name__}")


def is_exported_artifact(path_or_bytes: Any) -> bool:
    """Whether ``path_or_bytes`` is an artifact written by `ExportedModel.save`/`serialize`."""
    try:
        source = io.BytesIO(_read_bytes(path_or_bytes)) if isinstance(path_or_bytes, (bytes, bytearray, memoryview)) else os.fspath(path_or_bytes)
        if not zipfile.is_zipfile(source):
            return False
        with zipfile.ZipFile(source) as z:
            return _META in z.namelist()
    except (OSError, TypeError):
        return False


def load_exported(path_or_bytes: str | os.PathLike | bytes, *, device: Any = None) -> ExportedModel:
    """Load an artifact written by `export` (a path or bytes); returns a callable `ExportedModel`.

    Args:
        path_or_bytes: the file (``model.save(path)``) or ``model.serialize()`` bytes.
        device: the driver device to run on (default: the first device of the
            platform the artifact was exported for).

    Raises:
        ValueError: the data is not a maxfx export artifact, or it is corrupt or of
            an unknown format version.

    Example:
        >>> import numpy as np, maxfx
        >>> from maxfx.graph import TensorType
        >>> from maxfx.dtype import DType
        >>> from maxfx.experimental import functional as F
        >>> art = maxfx.export(lambda x: F.relu(x) * 2, TensorType(DType.float32, ["n"]))
        >>> maxfx.load_exported(art.serialize())(np.array([-1.0, 3.0], np.float32)).to_numpy()
        array([0., 6.], dtype=float32)
    """
    from maxfx.driver._device import as_device  # noqa: PLC0415

    data = _read_bytes(path_or_bytes)
    where = f"load_exported({path_or_bytes!r})" if not isinstance(path_or_bytes, (bytes, bytearray, memoryview)) else "load_exported(<bytes>)"
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            if _META not in z.namelist():
                raise ValueError(f"{where}: not a maxfx export artifact (no {_META}); write one with maxfx.export(...).save(path)")
            meta = json.loads(z.read(_META))
            if meta.get("format") != _FORMAT or meta.get("version") != _VERSION:
                raise ValueError(f"{where}: unsupported artifact format {meta.get('format')!r} version {meta.get('version')!r} (this maxfx reads {_FORMAT!r} version {_VERSION})")
            exported = _decode_exported(meta["exported"], z.read(_PROGRAM), len(meta["inputs"]), where)
            weights = {}
            for w in meta["weights"]:
                raw = z.read(w["file"])
                weights[w["name"]] = np.frombuffer(raw, dtype=DType[w["dtype"]].to_numpy()).reshape(w["shape"])
    except zipfile.BadZipFile as e:
        raise ValueError(f"{where}: not a maxfx export artifact ({e})") from None
    except (KeyError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: corrupt maxfx export artifact ({type(e).__name__}: {e})") from None
    dev = as_device(device, "load_exported") if device is not None else None
    return ExportedModel(
        exported,
        meta["name"],
        [_type_from_json(t) for t in meta["inputs"]],
        [_type_from_json(t) for t in meta["outputs"]],
        weights,
        bool(meta["is_tuple"]),
        dev,
    )
