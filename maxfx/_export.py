"""`export` and `load_exported`: portable StableHLO artifacts that run without the model's code.

``maxfx.export(model, *input_types)`` lowers a model with ``jax.export``:
symbolic dims of the input types (``["batch", 4]``) stay symbolic in the
StableHLO, so the artifact runs at any size for them. ``model`` may be

* the callable `Module.compile` returns, or an ``experimental.nn`` Module
  (compiled first, with ``input_types`` or the module's own ``input_types()``);
* an engine `Model` (from ``InferenceSession.load``) or a `Graph`
  (``weights_registry=`` gives its weights' values);
* a function: of Tensors (traced into a maxfx graph), or of JAX arrays (using
  ``jax.numpy``, or wrapped in ``jax.jit``/``maxfx.jit``: traced by JAX, called
  with JAX arrays); ``input_types`` required. Tensors, Modules and JAX arrays it
  reads from its closure or module globals become weights of the artifact.

Weights are **stored beside** the program, in the same file, not baked in as
constants: the program takes them as arguments (small programs, no constant
folding of large tensors, weights can be read back with `ExportedModel.weights`).
Sharded weights and ``in_shardings=`` make a multi-device program. The
program is stored with its VJP, so a loaded artifact can be differentiated.
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
from jax.sharding import NamedSharding

from lowering.compile import block_program
from lowering.dims import StaticDim
from lowering.targets import export_for, lowering_for, symbolic_input_specs
from lowering.types import BufferType, DeviceRef, TensorType
from lowering.x64 import traced
from maxfx._artifact import (
    ArtifactError,
    ExportedModel,
    is_exported_artifact,
    load_exported,
    mesh_json,
    platform_of,
    program_tree,
)
from maxfx.distributed._gather import gather, is_global
from maxfx.engine import InferenceSession, Model
from maxfx.experimental._tensor import Tensor, _leaf
from maxfx.experimental.nn import Module
from maxfx.experimental.nn._compile import CompiledModel
from maxfx.graph import Graph, Weight

__all__ = ["ArtifactError", "ExportedModel", "export", "is_exported_artifact", "load_exported"]


# ─── what is being exported ─────────────────────────────────────────────────


class _Source:
    """What to export: ``program(inputs, weights)`` of JAX arrays, its weights, device, name, input types.

    ``program`` returns one array or a tuple of arrays (a tuple-returning model, even of one output).
    """

    def __init__(
        self,
        program: Callable[..., Any],
        weights: Mapping[str, Any],
        device: Any,
        name: str,
        input_types: Sequence[Any],
    ):
        self.program = program
        self.weights = dict(weights)
        self.device = device
        self.name = name
        self.input_types = list(input_types)


def _block_source(compiled: Any, name: str, is_tuple: bool) -> _Source:
    """A compiled maxfx block: the program interprets its IR with JAX."""
    block, names = compiled.block, sorted(compiled.weights)
    run = block_program(block)

    def program(args: tuple, weights: tuple) -> Any:  # the artifact's form: (inputs, weights) tuples, no buffers
        outs, _ = run(args, None, dict(zip(names, weights)))
        return tuple(outs) if is_tuple else outs[0]

    weights = {n: compiled.weights[n] for n in names}
    return _Source(program, weights, compiled.device, name, [v.type for v in block.inputs])


def _source(model: Any, input_types: Sequence[Any], weights_registry: Mapping[str, Any] | None) -> tuple[_Source, bool]:
    """The program to export, and whether ``input_types`` were already used to build it."""
    if isinstance(model, ExportedModel):
        raise TypeError("maxfx.export: this model is already exported; call .save(path) or .serialize() on it")
    if isinstance(model, CompiledModel):
        return _block_source(model.model._compiled, model._name, model._is_tuple), False
    if isinstance(model, Model):
        return _block_source(model._compiled, model._name, len(model._compiled.block.outputs) != 1), False
    if isinstance(model, Graph):
        loaded = InferenceSession().load(model, weights_registry=weights_registry)
        return _block_source(loaded._compiled, model.name, len(model._ir.outputs) != 1), False
    if isinstance(model, Module):
        types_ = tuple(input_types) or model.input_types()
        return _block_source(model.compile(*types_).model._compiled, type(model).__name__, False), True
    if callable(model):
        if not input_types:
            raise TypeError(
                f"maxfx.export: exporting the function {_name(model)!r} needs input_types (e.g. "
                "TensorType(DType.float32, ['batch', 4]))"
            )
        _check_types(input_types, "maxfx.export")
        return _function_source(model, input_types), True
    raise TypeError(
        f"maxfx.export: expected a compiled module, Module, engine Model, Graph or function, got {type(model).__name__}"
    )


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


def _is_jitted(fn: Any) -> bool:
    """``jax.jit(f)`` and ``maxfx.jit(f)``: they trace ``f`` with JAX, so their inputs are JAX arrays."""
    return hasattr(fn, "lower") and hasattr(fn, "__wrapped__")


def _function_source(fn: Callable[..., Any], input_types: Sequence[Any]) -> _Source:
    """A function of Tensors is traced into a maxfx graph; a JAX function (or one the graph refuses) by JAX."""
    if _is_jitted(fn):
        return _jax_function(fn, input_types)
    try:
        return _graph_function(fn, input_types)
    except Exception as graph_error:
        # jnp (or any JAX API) given a graph Tensor fails here; JAX tracing with JAX arrays is what it needs.
        try:
            return _jax_function(fn, input_types)
        except Exception as e:
            e.add_note(
                f"maxfx.export: tracing {_name(fn)!r} with JAX arrays failed (above); tracing it as a function of "
                f"Tensors failed too: {type(graph_error).__name__}: {graph_error}"
            )
            raise


def _graph_function(fn: Callable[..., Any], input_types: Sequence[Any]) -> _Source:
    """Trace ``fn`` on graph-valued Tensors into a Graph; captured Tensors/Modules become weights."""
    name = _name(fn)
    graph = Graph(re.sub(r"\W", "_", name) or "fn", input_types=list(input_types))
    registry: dict[str, Any] = {}

    def weight(var: str, t: Tensor) -> Tensor:
        # A graph runs on one device: a weight placed over several processes is read whole first (export runs on every
        # process).
        registry[var] = gather(t._array()) if is_global(t._array()) else t._array()
        w = Weight(var, t.dtype, [int(d) for d in t.shape], DeviceRef.from_device(t.device))
        return Tensor.from_graph_value(graph.add_weight(w))

    with graph:
        traced = _rebind(fn, lambda value, var: _lift(value, var, weight))
        out = traced(*[Tensor.from_graph_value(v) for v in graph.inputs])
        is_tuple = isinstance(out, (tuple, list))
        graph.output(*(out if is_tuple else [out]))
    loaded = InferenceSession().load(graph, weights_registry=registry)
    return _block_source(loaded._compiled, name, is_tuple)


def _jax_function(fn: Callable[..., Any], input_types: Sequence[Any]) -> _Source:
    """Trace ``fn`` with JAX on JAX arrays; captured Tensors, Modules and JAX arrays become weights.

    The captures are found before tracing and rebound inside it to the traced
    weight arguments. A ``jax.jit``/``maxfx.jit`` function is unwrapped for that
    (the export is one jit program anyway); without captures it is called as
    it is, so the shardings it declares stay in the program.
    """
    target = fn.__wrapped__ if _is_jitted(fn) else fn
    weights: dict[str, Any] = {}

    def record(var: str, t: Tensor) -> Tensor:
        weights[var] = t._array() if isinstance(t, Tensor) else t
        return t

    _rebind(target, lambda value, var: _lift(value, var, record))
    call = fn if not weights else None

    def program(args: tuple, ws: tuple) -> Any:
        bound = dict(zip(weights, ws))

        def traced(var: str, t: Any) -> Any:
            return _leaf(bound[var]) if isinstance(t, Tensor) else bound[var]

        out = (call or _rebind(target, lambda value, var: _lift(value, var, traced)))(*args)
        if isinstance(out, (tuple, list)):
            return tuple(o._array() if isinstance(o, Tensor) else o for o in out)
        return out._array() if isinstance(out, Tensor) else out

    device = next((a.devices().pop() for a in weights.values() if isinstance(a, jax.Array)), jax.local_devices()[0])
    return _Source(program, weights, device, _name(fn), input_types)


def _rebind(fn: Callable[..., Any], lift: Callable[[Any, str], Any]) -> Callable[..., Any]:
    """A copy of ``fn`` whose closure cells and globals are ``lift(value, name)`` where that differs.

    Without this, captured eager values are constants of the traced program;
    rebound, they become its weight arguments and are stored beside it.
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
        lifted = lift(value, var)
        changed |= lifted is not value
        closure.append(types.CellType(lifted) if lifted is not value else cell)
    glob = fn.__globals__
    replaced = {}
    for var in code.co_names:
        if var in glob:
            lifted = lift(glob[var], var)
            if lifted is not glob[var]:
                replaced[var] = lifted
    if not changed and not replaced:
        return fn
    new_globals = {**glob, **replaced} if replaced else glob
    return types.FunctionType(code, new_globals, fn.__name__, fn.__defaults__, tuple(closure) or None)


def _lift(value: Any, var: str, weight: Callable[[str, Any], Any]) -> Any:
    """``value`` with its eager Tensors (a Tensor, a Module's parameters) or JAX array replaced by ``weight(name,
    value)``.
    """
    if isinstance(value, Tensor) and value._gv is None:
        return weight(var, value)
    if isinstance(value, Module):
        return value.map_parameters(lambda n, t: weight(f"{var}.{n}", t) if t._gv is None else t)
    if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
        return weight(var, value)
    return value


# ─── input types, shardings and symbolic shapes ──────────────────────────────


def _check_types(input_types: Sequence[Any], where: str) -> None:
    for i, t in enumerate(input_types):
        if isinstance(t, BufferType):
            raise TypeError(f"{where}: input {i} is a buffer ({t}); exported programs take tensor inputs only")
        if not isinstance(t, TensorType):
            raise TypeError(f"{where}: input type {i} must be a TensorType, got {type(t).__name__}")


def _input_types(source: _Source, given: Sequence[Any]) -> list[TensorType]:
    """The source's input types, or ``given`` where it refines them (same dtype/rank, equal static dims)."""
    own = source.input_types
    _check_types(own, f"maxfx.export({source.name!r})")
    if not given:
        return own
    _check_types(given, "maxfx.export")
    if len(given) != len(own):
        raise TypeError(
            f"maxfx.export({source.name!r}): got {len(given)} input type(s), the model has {len(own)}: "
            f"{[str(t) for t in own]}"
        )
    for i, (g, b) in enumerate(zip(given, own)):
        same = g.dtype is b.dtype and g.rank == b.rank
        same = same and all(
            not isinstance(bd, StaticDim) or (isinstance(gd, StaticDim) and gd.dim == bd.dim)
            for gd, bd in zip(g.shape, b.shape)
        )
        if not same:
            raise ValueError(
                f"maxfx.export({source.name!r}): input type {i} {g} does not fit the model's input {b} (dtype and rank "
                "must match, static dims must be equal)"
            )
    return list(given)


def _placed_sharding(array: Any) -> Any:
    """A weight's sharding when it spans several devices (kept in the program), else None (portable)."""
    sharding = getattr(array, "sharding", None)
    if sharding is None or len(sharding.device_set) == 1:
        return None
    if not isinstance(sharding, NamedSharding):
        raise ValueError(
            f"maxfx.export: a weight is placed with {type(sharding).__name__}; sharded exports take NamedSharding "
            "(maxfx.shard gives one)"
        )
    return sharding


def _with_shardings(specs: Sequence[Any], shardings: Sequence[Any], where: str) -> tuple[list[Any], Any]:
    """``specs`` with their shardings, and the one mesh the NamedShardings share (None: one device)."""
    meshes = {s.mesh for s in shardings if isinstance(s, NamedSharding)}
    if len(meshes) > 1:
        raise ValueError(
            f"{where}: the inputs and weights are sharded over {len(meshes)} different meshes; use one mesh"
        )
    out = [
        jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh) if sh is not None else s for s, sh in zip(specs, shardings)
    ]
    return out, next(iter(meshes), None)


def _input_shardings(in_shardings: Sequence[Any] | None, n: int, where: str) -> list[Any]:
    if in_shardings is None:
        return [None] * n
    in_shardings = list(in_shardings)
    if len(in_shardings) != n:
        raise ValueError(f"{where}: in_shardings has {len(in_shardings)} entries, the model has {n} inputs")
    for i, s in enumerate(in_shardings):
        if s is not None and not isinstance(s, NamedSharding):
            raise TypeError(
                f"{where}: in_shardings[{i}] must be a jax.sharding.NamedSharding or None, got {type(s).__name__}"
            )
    return in_shardings


# ─── export ────────────────────────────────────────────────────────────────


def export(
    model: Any,
    *input_types: TensorType,
    weights_registry: Mapping[str, Any] | None = None,
    platforms: Sequence[str] | None = None,
    in_shardings: Sequence[Any] | None = None,
    vjp_order: int | None = None,
) -> ExportedModel:
    """Export ``model`` to a portable artifact (``jax.export`` program, weights stored beside).

    Args:
        model: a compiled module (``Module.compile(...)``), an ``experimental.nn``
            Module, an engine ``Model``, a ``Graph``, a function of Tensors, or a
            JAX function (using ``jax.numpy``, or wrapped in ``jax.jit``/``maxfx.jit``),
            which is called with JAX arrays.
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
        in_shardings: a ``NamedSharding`` (or None) per input: the program is
            sharded over that mesh. Weights placed on several devices
            (``maxfx.shard``) keep their sharding. The loaded artifact runs on the
            first devices of its platform, arranged as that mesh.
        vjp_order: how many orders of VJP to store (``jax.export``'s ``vjp_order``).
            Default: 1 where the program can be differentiated, else 0 (then
            `ExportedModel.differentiable` is False).

    Returns:
        An `ExportedModel`: call it, ``save(path)`` or ``serialize()`` it.

    Raises:
        TypeError: unsupported model, input type or sharding, buffer inputs.
        ValueError: input types that do not fit the model, algebraic input dims, a
            program JAX cannot export with the symbolic dims given, or a
            ``vjp_order`` the program cannot be differentiated to (message says why).

    Example:
        >>> import jax.numpy as jnp, numpy as np, maxfx
        >>> from maxfx.graph import TensorType
        >>> from maxfx.dtype import DType
        >>> art = maxfx.export(lambda x: jnp.tanh(x) * 2, TensorType(DType.float32, ["n"]))
        >>> art.differentiable, art(np.zeros(3, np.float32)).to_numpy().tolist()
        (True, [0.0, 0.0, 0.0])
    """
    source, used = _source(model, input_types, weights_registry)
    in_types = _input_types(source, () if used else input_types)
    where = f"maxfx.export({source.name!r})"
    weights = list(source.weights.values())
    specs, mesh = _with_shardings(
        [
            *symbolic_input_specs(in_types, "maxfx.export", "exported inputs"),
            *(jax.ShapeDtypeStruct(w.shape, w.dtype) for w in weights),
        ],
        [*_input_shardings(in_shardings, len(in_types), where), *(_placed_sharding(w) for w in weights)],
        where,
    )
    device = source.device if mesh is None else mesh.devices.flat[0]
    lowering_platforms = tuple(platforms) if platforms else (platform_of(device),)
    exported = _export_program(
        source, specs[: len(in_types)], specs[len(in_types) :], lowering_platforms, where, in_types
    )
    # The VJP is traced too: with 64-bit types, for the same targets (the GPU kernels are emitted for "cuda" even where
    # no GPU is attached).
    with lowering_for(lowering_platforms):
        program = traced(_serialize, exported, vjp_order, where)
    # The artifact checks these trees on load; the program must have them.
    assert exported.in_tree == program_tree(len(in_types), len(weights)), exported.in_tree
    if exported.out_tree not in (jax.tree.structure(0), jax.tree.structure((0,) * len(exported.out_avals))):
        raise TypeError(
            f"{where}: the model returns {exported.out_tree}; exported models return an array or a tuple/list of arrays"
        )
    # gather: a weight split over several processes' devices is read whole (every process runs export, so the all-gather
    # is matched).
    host = dict(zip(source.weights, gather(list(source.weights.values()))))
    return ExportedModel(
        jax.export.deserialize(program), program, source.name, host, mesh_json(mesh) if mesh is not None else None
    )


def _export_program(
    source: _Source,
    specs: list[Any],
    weight_specs: list[Any],
    platforms: tuple[str, ...],
    where: str,
    in_types: Sequence[Any],
) -> Any:
    try:
        return export_for(
            source.program, platforms, tuple(specs), tuple(weight_specs)
        )  # traced with 64-bit types, inside lowering_for
    except jax.errors.ConcretizationTypeError as e:
        raise ValueError(
            f"{where}: the graph has data-dependent ops (output shapes depend on values), which cannot be exported: {e}"
        ) from e
    except Exception as e:
        # jax.export's InconclusiveDimensionOperation is not public; it and int() of a symbolic size land here.
        if (
            "symbolic" not in str(e).lower()
            and "inconclusive" not in str(e).lower()
            and "dimension" not in str(e).lower()
        ):
            raise
        raise ValueError(
            f"{where}: the program needs a concrete size for a symbolic dim of {[str(t) for t in in_types]}; give a "
            f"static size in input_types ({type(e).__name__}: {e})"
        ) from e


def _serialize(exported: Any, vjp_order: int | None, where: str) -> bytes:
    """``exported.serialize`` with the VJP: ``vjp_order`` orders, or 1 if the program allows it (else 0)."""
    if vjp_order is not None:
        if type(vjp_order) is not int or vjp_order < 0:
            raise ValueError(f"{where}: vjp_order must be an int >= 0, got {vjp_order!r}")
        try:
            return bytes(exported.serialize(vjp_order=vjp_order))
        except Exception as e:
            raise ValueError(
                f"{where}: the program cannot be differentiated to order {vjp_order} ({type(e).__name__}: {e}); export "
                "with vjp_order=0"
            ) from e
    try:
        return bytes(exported.serialize(vjp_order=1))
    except Exception:  # e.g. a Pallas kernel without a VJP rule: the artifact runs, without gradients
        return bytes(exported.serialize(vjp_order=0))
