"""Binding ops: where an op application goes depends on its inputs.

`bind(op, *inputs, **params)` finds the *context* that owns the inputs and asks
it to apply the op. Every context binds the same way (`Context.bind`): one
memoised `BindPlan` (`lowering.plan`: MAX dtype promotion, Python/numpy data
made constants, the op's rule run once per input kinds, so errors surface at
the call line) and then the context's own `apply`:

- `GraphBuilder` records a `Node` into a `Block` (the Graph API, and
  ``Module.compile`` traces);
- `lowering.eager.EagerContext` records a pending node to realize later;
- `TraceContext` runs the implementation now on JAX arrays or tracers (inside
  ``jax.jit``, ``grad``, ``vmap``).

Data flow: front → `bind` → `find_context` → `Context.bind` → `bind_plan` →
``apply`` → (IR node →) `lowering.interpret.apply_impl` → XLA.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowering.debug import DEBUG, source_location
from lowering.dtypes import DType
from lowering.interpret import apply_impl, resolve_params
from lowering.ir import Block, ConstantValue, Node, Var
from lowering.plan import PYTHON_SCALARS, BindPlan, bind_plan, coercion, infer_types, is_weak, weak_array, weak_kind
from lowering.registry import OpDef, get_op
from lowering.types import DeviceRef, TensorType, Type
from lowering.x64 import run

__all__ = [
    "Captured",
    "Context",
    "GraphBuilder",
    "TraceContext",
    "TRACE",
    "bind",
    "coerce_inputs",
    "current_context",
    "find_context",
    "use_context",
    "infer_types",
    "type_of",
    "is_weak",
]

_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar("maxfx_context", default=None)


def current_context() -> Context | None:
    """The innermost active context (a `Graph` being built, a compile trace...)."""
    return _current.get()


def call_in_context(ctx: Context | None, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with ``ctx`` ambient: `use_context` for one call, without a ``with`` block.

    The eager functional API wraps every op call in this, so it sets the
    context variable directly (a ``with`` statement costs as much again).

    Example:
        >>> call_in_context(None, current_context) is None
        True
    """
    token = _current.set(ctx)
    try:
        return fn(*args, **kwargs)
    finally:
        _current.reset(token)


class use_context:  # noqa: N801 - used like a function
    """Make ``ctx`` the ambient context inside a ``with`` block."""

    def __init__(self, ctx: Context | None):
        self.ctx = ctx
        self._token = None

    def __enter__(self):
        self._token = _current.set(self.ctx)
        return self.ctx

    def __exit__(self, *exc):
        _current.reset(self._token)


# ─── Contexts ──────────────────────────────────────────────────────────────


class Context:
    """Where ops applied to this context's values go.

    Every context binds an op the same way (`Context.bind`): it describes each
    input by its kind, gets the memoised `BindPlan` (conversions + the op's
    rule, see `lowering.plan`), converts the inputs and hands them to `apply`.
    Subclasses say what a value's kind is, how to make constants and casts of
    their own values, and what applying means (record a node, record it for
    later realization, or run the implementation now).
    """

    parent: Context | None = None
    closed_graph: str | None = None
    """The name of the Graph whose closed ``with`` block this context records for (`find_context` refuses new ops
    then); None while ops may be added."""
    concrete: bool = False
    """Values of this context hold data (JAX arrays, eager tensors): next to graph
    values they become constants of the graph."""

    def recording_builder(self) -> GraphBuilder | None:
        """The graph builder this context records into (None: it runs or traces ops instead)."""
        return None

    def nested(self, child: GraphBuilder) -> Context:
        """The context the user code of a nested block of ``child`` (a cond branch, a loop body) runs in."""
        return child

    def present(self, value: Any) -> Any:
        """The object user code of this context sees for ``value``, a graph value of its builder."""
        return value

    def kind_of(self, op: OpDef, x: Any) -> Any:
        """The kind of input ``x``: its `Type`, or the kind of untyped data (`weak_kind`)."""
        t = type_of(self, x)
        if t is not None:
            return t
        if is_weak(x):
            return weak_kind(x)
        raise TypeError(
            f"{op.name}: expected a tensor, a graph value, a Python scalar or a numpy array as input; got "
            f"{type(x).__name__}"
        )

    def kinds(self, op: OpDef, inputs: Sequence[Any]) -> list[Any]:
        """The kinds of ``inputs`` (what their `BindPlan` is keyed on)."""
        return [self.kind_of(op, x) for x in inputs]

    def constant(self, array: np.ndarray, dtype: DType, device: DeviceRef | None) -> Any:
        """A value of this context holding ``array`` (already of ``dtype``)."""
        raise NotImplementedError(f"{type(self).__name__} makes no constants")

    def data(self, op: OpDef, x: Any, dtype: DType, device: DeviceRef | None, *, promoted: bool) -> Any:
        """Untyped input ``x`` (Python or numpy data) as a constant of ``dtype``; with ``promoted`` it must fit.

        The one place data becomes a constant (`weak_array` checks the fit);
        contexts override it only to cache the result.
        """
        return self.constant(weak_array(op.name, x, dtype, promoted=promoted), dtype, device)

    def cast(self, x: Any, dtype: DType) -> Any:
        """Value ``x`` of this context converted to ``dtype``."""
        raise NotImplementedError(f"{type(self).__name__} makes no casts")

    def apply(self, op: OpDef, plan: BindPlan, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        """Apply ``op`` to converted ``inputs`` whose types the ``plan`` gives."""
        raise NotImplementedError(f"{type(self).__name__} applies no ops")

    def convert(
        self, op: OpDef, inputs: Sequence[Any], actions: Sequence[Any], types: Sequence[Any], device: DeviceRef | None
    ) -> list[Any]:
        """``inputs`` converted as ``actions`` say (casts, constants of types ``types``): the one interpreter of a
        plan's actions.
        """
        out = list(inputs)
        for i, act in enumerate(actions):
            if act is None:
                continue
            if act[0] == "cast":
                out[i] = self.cast(inputs[i], act[1])
            else:
                out[i] = self.data(op, inputs[i], types[i].dtype, device, promoted=act[0] == "weak")
        return out

    def bind(self, op: OpDef, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        """Apply ``op`` to ``inputs`` in this context: the one bind every context shares.

        The memoised plan of the inputs' kinds converts them and has checked the
        op's rule; the context then applies the op (records or runs it).
        """
        plan = bind_plan(op, self.kinds(op, inputs), params)
        if plan.converts:
            inputs = self.convert(op, inputs, plan.actions, plan.in_types, plan.device)
        return self.apply(op, plan, inputs, params)

    def is_ancestor_of(self, other: Context | None) -> bool:
        while other is not None:
            if other is self:
                return True
            other = other.parent
        return False


def coerce_inputs(ctx: Context, op: OpDef, inputs: Sequence[Any]) -> list[Any]:
    """MAX promotion of ``inputs`` in ``ctx`` without running ``op``'s rule.

    For ops that check their own inputs around nested blocks (``cond``,
    ``while_loop``, ``call``, ``custom``): returns the inputs as ``ctx`` values.
    """
    actions, types, device = coercion(op, [ctx.kind_of(op, x) for x in inputs])
    return ctx.convert(op, inputs, actions, types, device)


_JAX_VALUES = (jax.Array, jax.core.Tracer)


def find_context(op_name: str, inputs: Sequence[Any]) -> Context:
    """The context that must run an op on ``inputs``."""
    ambient = _current.get()
    found: Context | None = None
    for x in inputs:
        if x.__class__ in PYTHON_SCALARS:  # data names no context (the scalar of every `x * 2`)
            continue
        ctx = getattr(x, "__lowering_context__", None)
        if ctx is None:
            if not isinstance(x, _JAX_VALUES):
                continue
            ctx = TRACE
        if ctx is found:
            continue
        if found is None:
            found = ctx
        elif found.is_ancestor_of(ctx):
            found = ctx
        elif not ctx.is_ancestor_of(found):
            if ctx.concrete or found.concrete:
                # Concrete data (JAX arrays, eager tensors) next to graph values become graph constants.
                found = found if ctx.concrete else ctx
                continue
            raise ValueError(
                f"{op_name}: inputs come from different graphs; values of one graph cannot be used in another"
            )
    if found is None:
        if ambient is None:
            raise RuntimeError(
                f"{op_name}: no active Graph. Build graph ops inside `with Graph(...):`, or pass a graph value"
            )
        return ambient
    if (
        ambient is not None
        and found is not TRACE
        and found.is_ancestor_of(ambient)
        and found.recording_builder() is not ambient
    ):
        return ambient  # closure capture inside a nested block (cond / while_loop bodies)
    if found is TRACE and ambient is not None:
        return ambient
    closed = found.closed_graph
    if closed is not None and not found.is_ancestor_of(ambient):
        raise RuntimeError(
            f"{op_name}: an input belongs to Graph {closed!r}, whose `with Graph(...)` block has closed; "
            f"use its values inside that block (or re-enter it: `with graph:`)"
        )
    return found


def bind(op: OpDef, *inputs: Any, **params: Any) -> Any:
    """Apply ``op`` to ``inputs`` in the context that owns them.

    Objects of other libraries that convert themselves (MAX's ``HasTensorValue``
    and ``HasBufferValue``: a ``__tensorvalue__()`` or ``__buffervalue__()``
    method) are converted first.

    Returns one value, a tuple (``multiple_results``) or None (no outputs).
    """
    for x in inputs:
        converts = _CONVERTS_ITSELF.get(x.__class__)  # the memo read inline: every eager op passes here
        if converts or (converts is None and _converts_itself(x.__class__)):
            inputs = tuple([own_value(x) for x in inputs])
            break
    return find_context(op.name, inputs).bind(op, inputs, params)


_CONVERTS_ITSELF: dict[type, bool] = {}


def _converts_itself(cls: type) -> bool:
    """Whether ``cls`` is a foreign type with ``__tensorvalue__``/``__buffervalue__`` (maxfx's own values bind
    directly).
    """
    known = _CONVERTS_ITSELF.get(cls)
    if known is None:
        converts = hasattr(cls, "__tensorvalue__") or hasattr(cls, "__buffervalue__")
        known = _CONVERTS_ITSELF[cls] = converts and not hasattr(cls, "__lowering_context__")
    return known


def _converted(x: Any) -> Any:
    return x.__tensorvalue__() if hasattr(x, "__tensorvalue__") else x.__buffervalue__()


def own_value(x: Any) -> Any:
    """``x``, or the graph value it converts itself to (``__tensorvalue__``/``__buffervalue__``), for fronts that check
    their inputs before `bind`.

    Example:
        >>> own_value(3)
        3
    """
    return _converted(x) if _converts_itself(x.__class__) else x


def type_of(ctx: Context, x: Any) -> Type | None:
    """The graph type of value ``x`` in ``ctx`` (None for untyped Python/numpy data)."""
    t = getattr(x, "type", None)
    if isinstance(t, Type):
        return t
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        return TensorType(DType.from_numpy(x.dtype), x.shape, _JAX_VALUE_DEVICE)
    return None


# Raw JAX values (arrays, tracers) are typed on one placeholder device: placement
# is JAX's business there (tracers carry no device, and constants made while
# tracing land on the default device), so MAX's same-device rule must not fire.
_JAX_VALUE_DEVICE = DeviceRef.CPU()


# ─── Graph building ───────────────────────────────────────────────────────


class GraphBuilder(Context):
    """Records op applications into a `Block`.

    Args:
        block: the block to append to.
        wrap: ``wrap(builder, var) -> value`` makes the user-facing value object
            (``TensorValue``/``BufferValue``) for a new var.
        parent: the enclosing builder for nested blocks (closure capture allowed).
        default_device: device of constants created from Python data.
    """

    def __init__(
        self,
        block: Block,
        wrap: Callable[[GraphBuilder, Var], Any],
        parent: GraphBuilder | None = None,
        default_device: DeviceRef | None = None,
    ):
        self.block = block
        self.wrap = wrap
        self.parent = parent
        self.default_device = default_device or DeviceRef.CPU()
        # Weight name -> graph value, shared by nested blocks: one value per name per graph.
        self.weights: dict[str, Any] = parent.weights if parent is not None else {}

    def var_of(self, x: Any) -> Var:
        """The var behind value ``x`` (which must belong to this builder or an ancestor)."""
        if isinstance(x, Var):
            return x
        if isinstance(x, Captured):
            return self.constant(x.array, x.type.dtype, x.type.device)
        v = getattr(x, "_var", None)
        if v is None and hasattr(type(x), "__tensorvalue__"):  # e.g. a tensor wrapping a value of this graph
            v = getattr(x.__tensorvalue__(), "_var", None)
        if v is None:
            raise TypeError(f"expected a graph value, got {type(x).__name__}")
        return v

    def recording_builder(self) -> GraphBuilder:
        return self

    def kind_of(self, op: OpDef, x: Any) -> Any:
        if isinstance(x, jax.core.Tracer):
            raise TypeError(f"{op.name}: a JAX tracer cannot be used inside a maxfx Graph; pass it as a graph input")
        return super().kind_of(op, x)

    def constant(self, array: np.ndarray, dtype: DType, device: DeviceRef | None) -> Var:
        t = TensorType(dtype, array.shape, device or self.default_device)
        return self._record(
            get_op("constant"),
            [],
            {"value": ConstantValue(np.asarray(array, dtype.to_numpy())), "dtype": dtype, "device": t.device},
            (t,),
        )[0]

    def cast(self, x: Any, dtype: DType) -> Var:
        v = self.var_of(x)
        op = get_op("cast")
        return self._record(op, [v], {"dtype": dtype}, infer_types(op, [v.type], {"dtype": dtype}))[0]

    def capture(self, x: Any, device: DeviceRef | None = None) -> Any:
        """Concrete data (a JAX array, an eager tensor) as a `Captured` value of this graph.

        It is typed by its own dtype, as in every other context, and becomes a
        constant of the graph on ``device`` (default: the graph's) once an op's
        plan has accepted it. Other values are returned unchanged.
        """
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            dtype = DType.from_numpy(x.dtype)
        elif getattr(getattr(x, "__lowering_context__", None), "concrete", False):
            dtype = x.type.dtype
        else:
            return x
        array = np.asarray(x)
        return Captured(array, TensorType(dtype, array.shape, device or self.default_device))

    def _record(
        self, op: OpDef, in_vars: Sequence[Var], params: dict[str, Any], out_types: Sequence[Type]
    ) -> tuple[Var, ...]:
        outs = tuple(Var(t) for t in out_types)
        self.block.nodes.append(
            Node(op.name, tuple(in_vars), params, outs, source_location() if DEBUG.source_tracebacks else None)
        )
        self.block.invalidate()
        return outs

    def bind(self, op: OpDef, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        # Captured data lands on the device of the op's graph values, as Python data does.
        device = next((x.type.device for x in inputs if _is_graph_value(x)), None)
        return super().bind(op, [self.capture(x, device) for x in inputs], params)

    def apply(self, op: OpDef, plan: BindPlan, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        in_vars = [self.var_of(x) for x in inputs]
        values = tuple(self.wrap(self, v) for v in self._record(op, in_vars, params, plan.out_types))
        if op.multiple_results:
            return values
        return values[0] if values else None

    def child(self, name: str) -> GraphBuilder:
        """A builder for a nested block (branch, loop body) that may capture this block's values."""
        return GraphBuilder(Block(name), self.wrap, parent=self, default_device=self.default_device)


# ─── Tracing (inside jax.jit / grad / vmap) ──────────────────────────────


def _is_graph_value(x: Any) -> bool:
    ctx = getattr(x, "__lowering_context__", None)
    return ctx is not None and not ctx.concrete and hasattr(getattr(x, "type", None), "device")


class Captured:
    """Concrete data captured by a graph: typed like a value, recorded as a constant when used.

    Attributes:
        array: the data, on the host.
        type: its `TensorType`.
    """

    __slots__ = ("array", "type")

    def __init__(self, array: np.ndarray, type: TensorType):
        self.array = array
        self.type = type


class TraceContext(Context):
    """Runs ops directly on JAX arrays or tracers after checking their rules."""

    concrete = True

    def constant(self, array: np.ndarray, dtype: DType, device: DeviceRef | None) -> Any:
        return jnp.asarray(array, dtype=dtype.to_numpy())

    def cast(self, x: Any, dtype: DType) -> Any:
        return apply_impl(get_op("cast"), (x,), {"dtype": dtype})

    def bind(self, op: OpDef, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        if op.mutates and not callable(op.mutates):
            raise TypeError(f"{op.name}: mutates a buffer and cannot run on immutable JAX arrays")
        # Concrete arrays: compute with 64-bit types available. Tracers: the enclosing
        # trace decides (switching x64 mid-trace would mix 32- and 64-bit values);
        # maxfx.jit traces with x64 on, plain jax.jit gives JAX's 32-bit defaults.
        if any(isinstance(x, jax.core.Tracer) for x in inputs):
            return super().bind(op, inputs, params)
        return run(super().bind, op, inputs, params)

    def apply(self, op: OpDef, plan: BindPlan, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        out = apply_impl(op, inputs, resolve_params(params, {}))
        if op.multiple_results:
            return tuple(out)
        return out if plan.out_types else None


TRACE = TraceContext()
