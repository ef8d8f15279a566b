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
The artifact's format, `ExportedModel` and `load_exported` are in `maxfx._artifact`.

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

import re
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from lowering.dims import StaticDim
from lowering.dtypes import DType
from lowering.interpret import run_block
from lowering.targets import export_checks, lowering_for, symbolic_input_specs
from lowering.types import BufferType, DeviceRef, TensorType
from lowering.x64 import x64
from maxfx._artifact import ExportedModel, is_exported_artifact, load_exported, platform_of, program_trees
from maxfx.engine import InferenceSession, Model
from maxfx.experimental._tensor import Tensor
from maxfx.experimental.nn import Module
from maxfx.experimental.nn._compile import CompiledModule
from maxfx.graph import Graph, Weight

__all__ = ["ExportedModel", "export", "is_exported_artifact", "load_exported"]


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

    specs = symbolic_input_specs(in_types, "maxfx.export", "exported inputs")
    weight_specs = [jax.ShapeDtypeStruct(w.shape, w.dtype) for w in weights]
    lowering_platforms = tuple(platforms) if platforms else (platform_of(source.device),)
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
    assert (exported.in_tree, exported.out_tree) == program_trees(len(specs), len(weights), len(exported.out_avals)), exported.in_tree
    out_types = [_output_type(a) for a in exported.out_avals]
    host = {n: np.asarray(w) for n, w in zip(names, weights)}
    return ExportedModel(exported, source.name, in_types, out_types, host, source.is_tuple)


def _output_type(aval: Any) -> TensorType:
    dims = [d if isinstance(d, int) else _dim_name(str(d)) for d in aval.shape]
    return TensorType(DType.from_numpy(aval.dtype), dims, DeviceRef.CPU())


def _dim_name(text: str) -> str:
    # Output dims may be expressions ("2*batch"); Dim names must be identifiers, so spell them out.
    return text if text.isidentifier() else "expr_" + re.sub(r"\W+", "_", text).strip("_")
