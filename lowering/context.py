"""Binding ops: where an op application goes depends on its inputs.

`bind(op, *inputs, **params)` finds the *context* that owns the inputs and asks
it to apply the op:

- `GraphBuilder`: records a `Node` into a `Block` (the Graph API; also used to
  record the eager Tensor's pending work and ``Module.compile`` traces);
- `TraceContext`: inputs are JAX arrays or tracers (inside ``jax.jit``,
  ``grad``, ``vmap``): check the rule, run the impl now.

Before any context sees them, inputs are *coerced*: MAX dtype promotion over
the op's ``promote`` inputs (casting typed operands, turning Python scalars and
numpy arrays into constants of the promoted dtype), and every remaining
non-value input becomes a constant.
"""

from __future__ import annotations

import contextvars
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from lowering.dims import Dim
from lowering.dtypes import DType, promote_strong, promote_weak, result_dtype_for_python_scalar
from lowering.ir import Block, ConstantValue, Node, Var, holds_graph_values, param_key
from lowering.registry import OpDef, OpError, get_op
from lowering.types import DeviceRef, TensorType, Type

__all__ = [
    "Context",
    "GraphBuilder",
    "TraceContext",
    "bind",
    "current_context",
    "use_context",
    "infer_types",
    "type_of",
    "is_weak",
]

_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar("maxfx_context", default=None)


def current_context() -> Context | None:
    """The innermost active context (a `Graph` being built, a compile trace...)."""
    return _current.get()


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


# ─── Inputs ────────────────────────────────────────────────────────────────


def is_weak(x: Any) -> bool:
    """True for Python/numpy data that is not a typed graph/tensor value."""
    return isinstance(x, (numbers.Number, np.ndarray, np.generic, list, tuple, Dim)) and not hasattr(x, "__lowering_context__")


def _weak_array(x: Any) -> np.ndarray:
    if isinstance(x, Dim):
        return np.asarray(int(x), dtype=np.int64)
    return np.asarray(x)


class Context:
    """Where ops applied to this context's values go."""

    parent: Context | None = None
    concrete: bool = False
    """Values of this context hold data (JAX arrays, eager tensors): next to graph
    values they become constants of the graph."""

    def bind(self, op: OpDef, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        raise NotImplementedError  # abstract: GraphBuilder and TraceContext implement it

    def is_ancestor_of(self, other: Context | None) -> bool:
        while other is not None:
            if other is self:
                return True
            other = other.parent
        return False


def _context_of(x: Any) -> Context | None:
    ctx = getattr(x, "__lowering_context__", None)
    if ctx is not None:
        return ctx
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        return TRACE
    return None


def find_context(op_name: str, inputs: Sequence[Any]) -> Context:
    """The context that must run an op on ``inputs``."""
    ambient = _current.get()
    found: Context | None = None
    for x in inputs:
        ctx = _context_of(x)
        if ctx is None or ctx is found:
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
            raise ValueError(f"{op_name}: inputs come from different graphs; values of one graph cannot be used in another")
    if found is None:
        if ambient is None:
            raise RuntimeError(
                f"{op_name}: no active Graph. Build graph ops inside `with Graph(...):`, or pass a graph value"
            )
        return ambient
    if ambient is not None and found is not TRACE and found.is_ancestor_of(ambient):
        return ambient  # closure capture inside a nested block (cond / while_loop bodies)
    if found is TRACE and ambient is not None:
        return ambient
    return found


def bind(op: OpDef, *inputs: Any, **params: Any) -> Any:
    """Apply ``op`` to ``inputs`` in the context that owns them.

    Returns one value, a tuple (``multiple_results``) or None (no outputs).
    """
    return find_context(op.name, inputs).bind(op, inputs, params)


# ─── Type inference ───────────────────────────────────────────────────────


_RULE_CACHE: dict[tuple, tuple[Type, ...]] = {}


def _run_rule(op: OpDef, types: Sequence[Type], params: dict[str, Any]) -> tuple[Type, ...]:
    out = op.rule(*types, **params)
    if out is None:
        return ()
    if isinstance(out, Type):
        if op.multiple_results:
            raise TypeError(f"rule of {op.name} must return a tuple of types")
        return (out,)
    return tuple(out)


def infer_types(op: OpDef, types: Sequence[Type], params: dict[str, Any]) -> tuple[Type, ...]:
    """Output types of ``op`` (memoised on op, input types and params).

    Params that can only be keyed by identity (callables, blocks holding
    closures) bypass the memo.
    """
    if holds_graph_values(params):
        return _run_rule(op, types, params)
    try:
        key = (op.name, tuple(t.key() for t in types), param_key(params))
        cached = _RULE_CACHE.get(key)
    except (TypeError, AttributeError):
        return _run_rule(op, types, params)
    if cached is None:
        cached = _run_rule(op, types, params)
        if len(_RULE_CACHE) > 65536:
            _RULE_CACHE.clear()
        _RULE_CACHE[key] = cached
    return cached


# ─── Coercion (MAX promotion) ─────────────────────────────────────────────


def type_of(ctx: Context, x: Any) -> Type | None:
    """The graph type of value ``x`` in ``ctx`` (None for weak Python/numpy data)."""
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


def coercion_plan(op: OpDef, types: Sequence[Type | None]) -> tuple[Any, ...]:
    """How each input of ``op`` must be converted, from the input types alone.

    ``types[i]`` is None for weak Python/numpy data. Returns one action per
    input: None (use as is), ``("cast", dtype)`` (a typed input promoted to
    ``dtype``), ``("weak", dtype)`` (weak data that must fit ``dtype`` exactly)
    or ``("default",)`` (weak data outside the promoted inputs: a constant of its
    natural dtype).

    Raises:
        TypeError: no typed operand among the promoted inputs.
        OpError: typed operands whose dtypes MAX does not promote (int32 + float32).
    """
    actions: list[Any] = [None] * len(types)
    promote = [i for i in op.promote if i < len(types)]
    if promote:
        strong = [i for i in promote if types[i] is not None]
        if not strong:
            raise TypeError(f"{op.name}: Binary ops require at least one max object (a tensor or graph value)")
        target = types[strong[0]].dtype
        for i in strong[1:]:
            try:
                target = promote_strong(target, types[i].dtype)
            except ValueError as e:
                shapes = ", ".join(f"{types[j].dtype.name}[{', '.join(str(d) for d in types[j].shape)}]" for j in strong)
                raise OpError(f"{op.name}: incompatible input dtypes ({shapes}): {e}") from None
        for i in promote:
            if types[i] is None:
                actions[i] = ("weak", target)
            elif types[i].dtype is not target:
                actions[i] = ("cast", target)
    for i, t in enumerate(types):
        if t is None and actions[i] is None:
            actions[i] = ("default",)
    return tuple(actions)


def coerce_inputs(ctx: Context, op: OpDef, inputs: Sequence[Any]) -> list[Any]:
    """Apply MAX promotion and turn weak data into typed constants in ``ctx``.

    Returns the inputs as ``ctx``-native values (whatever ``ctx.constant`` and
    ``ctx.cast`` produce, and typed values unchanged).
    """
    inputs = list(inputs)
    types = [type_of(ctx, x) for x in inputs]
    for i, x in enumerate(inputs):
        if types[i] is None and not is_weak(x) and i in op.promote:
            raise TypeError(f"{op.name}: Binary ops require at least one max object (a tensor or graph value); got {type(x).__name__}")
    try:
        actions = coercion_plan(op, types)
    except TypeError:
        kinds = ", ".join(type(inputs[i]).__name__ for i in op.promote if i < len(inputs))
        raise TypeError(f"{op.name}: Binary ops require at least one max object (a tensor or graph value); got {kinds}") from None
    device = next((t.device for t in types if t is not None and hasattr(t, "device")), None)
    for i, act in enumerate(actions):
        if act is None:
            continue
        x = inputs[i]
        if act[0] == "cast":
            inputs[i] = ctx.cast(x, act[1])
        elif act[0] == "weak":
            inputs[i] = ctx.constant(_weak_to_numpy(op.name, x, act[1]), act[1], device)
        elif is_weak(x):
            arr = _weak_array(x)
            dtype = _default_dtype(arr, x)
            inputs[i] = ctx.constant(arr.astype(dtype.to_numpy()), dtype, device)
    return inputs


def _default_dtype(arr: np.ndarray, x: Any) -> DType:
    if isinstance(x, (np.ndarray, np.generic)):
        return DType.from_numpy(arr.dtype)
    if arr.dtype == np.bool_:
        return DType.bool
    if np.issubdtype(arr.dtype, np.integer):
        return DType.int64
    return DType.float32 if np.issubdtype(arr.dtype, np.floating) else DType.from_numpy(arr.dtype)


def _weak_to_numpy(op_name: str, x: Any, target: DType) -> np.ndarray:
    try:
        if isinstance(x, (numbers.Number, np.generic, Dim)):
            promote_weak(target, int(x) if isinstance(x, Dim) else x)
            return np.asarray(int(x) if isinstance(x, Dim) else x).astype(target.to_numpy())
        arr = np.asarray(x)
        if arr.dtype.kind == "f" and not target.is_float():
            raise ValueError(f"Unsafe cast: can't promote a float array to dtype({target})")
        return arr.astype(target.to_numpy())
    except ValueError as e:
        raise OpError(f"{op_name}: {e}") from None


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
        v = getattr(x, "_var", None)
        if v is None:
            raise TypeError(f"expected a graph value, got {type(x).__name__}")
        return v

    def constant(self, array: np.ndarray, dtype: DType, device: DeviceRef | None) -> Var:
        t = TensorType(dtype, array.shape, device or self.default_device)
        return self._record(get_op("constant"), [], {"value": ConstantValue(np.asarray(array, dtype.to_numpy())), "dtype": dtype, "device": t.device}, (t,))[0]

    def cast(self, x: Any, dtype: DType) -> Var:
        v = x if isinstance(x, Var) else self.var_of(x)
        op = get_op("cast")
        return self._record(op, [v], {"dtype": dtype}, infer_types(op, [v.type], {"dtype": dtype}))[0]

    def _lift(self, x: Any) -> Any:
        if isinstance(x, (jax.Array,)) and not isinstance(x, jax.core.Tracer):
            return np.asarray(x)
        ctx = getattr(x, "__lowering_context__", None)
        if ctx is not None and ctx.concrete:
            return np.asarray(x)  # an eager tensor: its (realized) values become a constant
        return x

    def _record(self, op: OpDef, in_vars: Sequence[Var], params: dict[str, Any], out_types: Sequence[Type]) -> tuple[Var, ...]:
        outs = tuple(Var(t) for t in out_types)
        self.block.nodes.append(Node(op.name, tuple(in_vars), params, outs))
        self.block.invalidate()
        return outs

    def bind(self, op: OpDef, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        inputs = [self._lift(x) for x in inputs]
        if any(isinstance(x, jax.core.Tracer) for x in inputs):
            raise TypeError(f"{op.name}: a JAX tracer cannot be used inside a maxfx Graph; pass it as a graph input")
        coerced = coerce_inputs(self, op, inputs)
        in_vars = [x if isinstance(x, Var) else self.var_of(x) for x in coerced]
        out_types = infer_types(op, [v.type for v in in_vars], params)
        outs = self._record(op, in_vars, params, out_types)
        values = tuple(self.wrap(self, v) for v in outs)
        if op.multiple_results:
            return values
        if not values:
            return None
        return values[0]

    def child(self, name: str) -> GraphBuilder:
        """A builder for a nested block (branch, loop body) that may capture this block's values."""
        return GraphBuilder(Block(name), self.wrap, parent=self, default_device=self.default_device)


# ─── Tracing (inside jax.jit / grad / vmap) ──────────────────────────────


class TraceContext(Context):
    """Runs ops directly on JAX arrays or tracers after checking their rules."""

    concrete = True

    def constant(self, array: np.ndarray, dtype: DType, device: DeviceRef | None) -> Any:
        import jax.numpy as jnp  # noqa: PLC0415

        return jnp.asarray(array, dtype=dtype.to_numpy())

    def cast(self, x: Any, dtype: DType) -> Any:
        return get_op("cast").impl(x, dtype=dtype)

    def bind(self, op: OpDef, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        import contextlib  # noqa: PLC0415

        from lowering.x64 import x64  # noqa: PLC0415

        # Concrete arrays: compute with 64-bit types available. Tracers: the enclosing
        # trace decides (switching x64 mid-trace would mix 32- and 64-bit values);
        # maxfx.jit traces with x64 on, plain jax.jit gives JAX's 32-bit defaults.
        tracing = any(isinstance(x, jax.core.Tracer) for x in inputs)
        with contextlib.nullcontext() if tracing else x64():
            coerced = coerce_inputs(self, op, inputs)
            types = [type_of(self, x) for x in coerced]
            out_types = infer_types(op, types, params)
            if op.impl is None:
                raise TypeError(f"{op.name}: has no direct implementation and cannot run on JAX arrays")
            from lowering.interpret import resolve_params  # noqa: PLC0415

            out = op.impl(*coerced, **resolve_params(params, {}))
        if op.mutates and not callable(op.mutates):
            raise TypeError(f"{op.name}: mutates a buffer and cannot run on immutable JAX arrays")
        if op.multiple_results:
            return tuple(out)
        return out if out_types else None


TRACE = TraceContext()
