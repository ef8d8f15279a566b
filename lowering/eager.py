"""Eager execution with lazy, fused realization.

Ops applied to eager tensors are *recorded*, not run: `EagerContext.bind` checks
the op's rule at once (so shape and dtype errors surface at the call line) and
returns a `LazyVar` whose producing `Node` points at its inputs. A tensor is
*realized* when someone needs its values; `realize` then gathers every pending
node it depends on and runs them as one program:

- the program's inputs (*leaves*) are the already-realized arrays and the
  constants the ops captured; its key is the graph's structure plus the leaves'
  shapes and dtypes, never their values, so a loop body maps to one key;
- the first time a key is seen the nodes run op by op on JAX arrays (no XLA
  compile of a graph that may never recur); from the second time on, the whole
  graph is one ``jax.jit`` executable, cached by key;
- the requested tensors and every other still-referenced tensor of that graph
  come back from the same run, so nothing alive is computed twice.

Inside ``jax.jit``/``grad``/``vmap`` eager tensors hold tracers and ops apply
their implementation directly (`TraceContext`). Ops with side effects,
buffer writes or data-dependent output shapes run immediately.

Memory stays bounded: realized vars drop their producer (so the graph behind
them can be freed), tensors are referenced weakly by the graph, and a var with
more than ``MAX_PENDING`` pending ancestors is realized when it is created.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from lowering.context import TRACE, Context, coerce_inputs, coercion_plan, infer_types
from lowering.devices import jax_device
from lowering.dtypes import DType, promote_weak, result_dtype_for_python_scalar
from lowering.interpret import Interpreter
from lowering.ir import Node, Var, _var_ids, param_key
from lowering.registry import OpDef, OpError, get_op
from lowering.types import DeviceRef, TensorType
from lowering.x64 import x64

__all__ = ["LazyVar", "EagerContext", "EAGER", "realize", "eager_stats", "MAX_PENDING"]

MAX_PENDING = 512
"""A var whose pending graph grows past this many nodes is realized on creation."""

# Ops that never run lazily: their results depend on device state or values, or they act.
_IMMEDIATE = frozenset({"transfer_to", "print", "custom", "inplace_custom"})


class LazyVar(Var):
    """A var of the eager graph: either realized (``array``) or pending (``node``).

    Attributes:
        node: the node that computes it while pending; None once realized.
        array: its value once realized (a JAX array or tracer, or a numpy constant).
        owner: weak reference to the user-facing tensor holding it (if any).
        pending: estimate of the number of pending nodes behind it.
    """

    __slots__ = ("node", "array", "owner", "pending")

    def __init__(self, type: Any, array: Any = None, node: Node | None = None, pending: int = 0):
        self.id = next(_var_ids)
        self.type = type
        self.array = array
        self.node = node
        self.owner = None
        self.pending = pending

    @property
    def realized(self) -> bool:
        return self.node is None


class _Stats:
    def __init__(self) -> None:
        self.compiles = 0
        self.fused_runs = 0
        self.op_by_op_runs = 0

    def as_dict(self) -> dict[str, int]:
        return {"compiles": self.compiles, "fused_runs": self.fused_runs, "op_by_op_runs": self.op_by_op_runs}


_stats = _Stats()


def eager_stats() -> dict[str, int]:
    """Counts of fused-program compiles and runs, and op-by-op runs (for tests/benchmarks)."""
    return _stats.as_dict()


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


# ─── Constants ────────────────────────────────────────────────────────────

_SMALL = 16
_const_cache: collections.OrderedDict[tuple, jax.Array] = collections.OrderedDict()


def _device_constant(array: np.ndarray, device: jax.Device) -> jax.Array:
    """``array`` on ``device``; small constants are cached (they recur in loops: ``x * 2``)."""
    if array.size > _SMALL:
        return jax.device_put(array, device)
    key = (array.dtype.str, array.shape, array.tobytes(), device)
    hit = _const_cache.get(key)
    if hit is None:
        with x64():
            hit = jax.device_put(array, device)
        _const_cache[key] = hit
        if len(_const_cache) > 4096:
            _const_cache.popitem(last=False)
    return hit


# ─── Recording ────────────────────────────────────────────────────────────


_SCALARS = (int, float, bool)


class _BindPlan:
    """What binding an op to inputs of given types does: conversions, output types, node signature.

    Computed once per (op, input types, params); building it runs the op's rule,
    so shape and dtype errors are raised here, at the call.
    """

    __slots__ = ("actions", "out_types", "signature", "device", "immediate", "single")

    def __init__(self, op: OpDef, kinds: list[Any], params: dict[str, Any]):
        # kinds[i]: the input's graph type, or the Python type of a scalar input.
        types = [None if isinstance(k, type) else k for k in kinds]
        self.actions = coercion_plan(op, types)
        typed = [t for t in types if t is not None]
        self.device = next((t.device for t in typed if hasattr(t, "device")), None)
        device = self.device or DeviceRef.CPU()
        in_types = []
        for k, t, act in zip(kinds, types, self.actions):
            if act is None:
                in_types.append(t)
            elif act[0] == "cast":
                in_types.append(TensorType(act[1], t.shape, t.device))
            elif act[0] == "weak":
                in_types.append(TensorType(act[1], [], device))
            else:
                in_types.append(TensorType(result_dtype_for_python_scalar(k()), [], device))
        _check_device_types(op, typed)
        self.out_types = infer_types(op, in_types, params)
        self.signature = _intern_signature((op.name, param_key(params), tuple(t.key() for t in self.out_types)))
        self.immediate = bool(op.mutates or op.effect or op.data_dependent or op.name in _IMMEDIATE)
        self.single = len(self.out_types) == 1 and not op.multiple_results


_bind_plans: dict[tuple, _BindPlan] = {}
_signatures: dict[tuple, int] = {}


def _intern_signature(sig: tuple) -> int:
    """A small int standing for a node signature: program keys hash ints, not nested tuples."""
    n = _signatures.get(sig)
    if n is None:
        n = _signatures[sig] = len(_signatures)
    return n
_scalar_leaves: collections.OrderedDict[tuple, LazyVar] = collections.OrderedDict()


def _scalar_leaf(op_name: str, x: Any, dtype: DType | None, device: DeviceRef | None) -> LazyVar:
    """A realized rank-0 constant for the Python scalar ``x`` (cached: loops reuse ``x * 2``'s 2)."""
    key = (type(x), x, dtype, device)
    leaf = _scalar_leaves.get(key)
    if leaf is None:
        if dtype is None:
            dtype = result_dtype_for_python_scalar(x)
        else:
            try:
                promote_weak(dtype, x)
            except ValueError as e:
                raise OpError(f"{op_name}: {e}") from None
        device = device or DeviceRef.CPU()
        arr = np.asarray(x, dtype.to_numpy())
        with x64():
            leaf = LazyVar(TensorType(dtype, [], device), array=jax.device_put(arr, jax_device(device)))
        _scalar_leaves[key] = leaf
        if len(_scalar_leaves) > 4096:
            _scalar_leaves.popitem(last=False)
    return leaf


class EagerContext(Context):
    """Records ops on eager tensors into a pending graph.

    Args:
        wrap: ``wrap(var) -> tensor`` makes the user-facing object for a new var.
    """

    concrete = True

    def __init__(self, wrap: Callable[[LazyVar], Any] | None = None):
        self.wrap = wrap or (lambda v: v)
        self.default_device = DeviceRef.CPU()

    # Used by coerce_inputs for Python scalars / numpy data and promotions.
    def constant(self, array: np.ndarray, dtype: DType, device: DeviceRef | None) -> LazyVar:
        device = device or self.default_device
        arr = np.asarray(array, dtype.to_numpy())
        return LazyVar(TensorType(dtype, arr.shape, device), array=_device_constant(arr, jax_device(device)))

    def cast(self, x: Any, dtype: DType) -> LazyVar:
        v = x if isinstance(x, LazyVar) else x._var
        op = get_op("cast")
        return self._record(op, [v], {"dtype": dtype}, infer_types(op, [v.type], {"dtype": dtype}))[0]

    def var_of(self, x: Any) -> LazyVar:
        if isinstance(x, LazyVar):
            return x
        v = getattr(x, "_var", None)
        if not isinstance(v, LazyVar):
            raise TypeError(f"expected an eager tensor, got {type(x).__name__}")
        return v

    def leaf(self, array: Any, type: TensorType | None = None) -> LazyVar:
        """A realized var holding ``array`` (a JAX array or tracer)."""
        if type is None:
            type = TensorType(DType.from_numpy(array.dtype), array.shape, _device_ref(array))
        return LazyVar(type, array=array)

    def bind(self, op: OpDef, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        key: list[Any] = [op]
        for x in inputs:
            v = getattr(x, "_var", None)
            if v is not None:
                if isinstance(v.array, jax.core.Tracer):
                    return self._bind_traced(op, inputs, params)
                key.append(v.type)
            elif type(x) in _SCALARS:
                key.append(type(x))
            elif isinstance(x, LazyVar):
                key.append(x.type)
            else:
                return self._bind_general(op, inputs, params)
        try:
            key.append(param_key(params) if params else ())
            key_t = tuple(key)
            plan = _bind_plans.get(key_t)
        except TypeError:  # unhashable params
            return self._bind_general(op, inputs, params)
        if plan is None:
            plan = _BindPlan(op, key[1:-1], params)
            if len(_bind_plans) > 8192:
                _bind_plans.clear()
            _bind_plans[key_t] = plan
        in_vars = []
        for x, act in zip(inputs, plan.actions):
            if act is None:
                in_vars.append(x if x.__class__ is LazyVar else x._var)
            elif act[0] == "cast":
                in_vars.append(self.cast(x, act[1]))
            else:
                in_vars.append(_scalar_leaf(op.name, x, act[1] if act[0] == "weak" else None, plan.device))
        if plan.immediate:
            return self._finish(op, in_vars, params, plan.out_types, plan.signature)
        # The common case, kept tight: record one node with one output.
        pending = 1
        for v in in_vars:
            pending += v.pending
        node = Node(op.name, tuple(in_vars), params, ())
        node._sig = plan.signature
        if plan.single:
            out = LazyVar(plan.out_types[0], None, node, pending)
            node.outputs = (out,)
            if pending > MAX_PENDING:
                realize(node.outputs)
            return self.wrap(out)
        outs = tuple([LazyVar(t, None, node, pending) for t in plan.out_types])
        node.outputs = outs
        if pending > MAX_PENDING:
            realize(outs)
        if op.multiple_results:
            return tuple([self.wrap(v) for v in outs])
        return self.wrap(outs[0]) if outs else None

    def _bind_general(self, op: OpDef, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        if any(_is_tracer(x) for x in inputs):
            return self._bind_traced(op, inputs, params)
        coerced = coerce_inputs(self, op, inputs)
        in_vars = [self.var_of(x) for x in coerced]
        _check_devices(op, in_vars)
        out_types = infer_types(op, [v.type for v in in_vars], params)
        return self._finish(op, in_vars, params, out_types, None)

    def _finish(self, op: OpDef, in_vars: list[LazyVar], params: dict[str, Any], out_types: Sequence[Any], signature: Any) -> Any:
        if op.mutates or op.effect or op.data_dependent or op.name in _IMMEDIATE:
            outs = self._run_now(op, in_vars, params, out_types)
        else:
            outs = self._record(op, in_vars, params, out_types, signature)
        wrap = self.wrap
        if op.multiple_results:
            return tuple(wrap(v) for v in outs)
        return wrap(outs[0]) if outs else None

    def _record(self, op: OpDef, in_vars: Sequence[LazyVar], params: dict[str, Any], out_types: Sequence[Any], signature: Any = None) -> tuple[LazyVar, ...]:
        pending = 1
        for v in in_vars:
            pending += v.pending
        node = Node(op.name, tuple(in_vars), params, ())
        node._sig = signature
        outs = tuple(LazyVar(t, node=node, pending=pending) for t in out_types)
        node.outputs = outs
        if signature is None:
            _node_signature(node)
        if pending > MAX_PENDING:
            realize(outs)
        return outs

    def _run_now(self, op: OpDef, in_vars: Sequence[LazyVar], params: dict[str, Any], out_types: Sequence[Any]) -> tuple[LazyVar, ...]:
        realize(in_vars)
        outs = tuple(Var(t) for t in out_types)
        node = Node(op.name, tuple(in_vars), params, outs)
        env = {v.id: v.array for v in in_vars}
        with x64():
            Interpreter().run_node(node, env)
        for i in op.written_inputs(node):
            in_vars[i].array = env[in_vars[i].id]
        return tuple(self.leaf(env[v.id], _concrete(v.type, env[v.id])) for v in outs)

    def _bind_traced(self, op: OpDef, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        arrays = [_array_of(x) for x in inputs]
        out = TRACE.bind(op, arrays, params)
        if out is None:
            return None
        if op.multiple_results:
            return tuple(self.wrap(self.leaf(a)) for a in out)
        return self.wrap(self.leaf(out))


def _array_of(x: Any) -> Any:
    v = getattr(x, "_var", None)
    if isinstance(v, LazyVar):
        if not v.realized:
            realize([v])
        return v.array
    return x


def _concrete(t: Any, array: Any) -> Any:
    if isinstance(t, TensorType) and tuple(t.shape) != tuple(array.shape):
        return TensorType(t.dtype, array.shape, t.device)
    return t


def _device_ref(array: Any) -> DeviceRef:
    try:
        dev = next(iter(array.devices()))
    except Exception:  # tracers
        return DeviceRef.CPU()
    from lowering.devices import device_ref_of  # noqa: PLC0415

    return device_ref_of(dev)


def _check_devices(op: OpDef, in_vars: Sequence[LazyVar]) -> None:
    _check_device_types(op, [v.type for v in in_vars])


def _check_device_types(op: OpDef, types: Sequence[Any]) -> None:
    if len(types) < 2 or op.name == "transfer_to":
        return
    first = getattr(types[0], "device", None)
    for t in types[1:]:
        d = getattr(t, "device", first)
        if d != first:
            raise ValueError(
                f"{op.name}: inputs are on different devices ({first} and {d}); move one with `.to(device)` first"
            )


EAGER = EagerContext()


# ─── Realization ─────────────────────────────────────────────────────────


class _Plan:
    """The pending subgraph behind some vars, in topological order."""

    __slots__ = ("nodes", "leaves", "outputs", "key")

    def __init__(self, nodes: list[Node], leaves: list[LazyVar], outputs: list[LazyVar], key: tuple):
        self.nodes = nodes
        self.leaves = leaves
        self.outputs = outputs
        self.key = key


def _node_signature(node: Node) -> int:
    sig = getattr(node, "_sig", None)
    if sig is None:
        sig = node._sig = _intern_signature((node.op, param_key(node.params), tuple(v.type.key() for v in node.outputs)))
    return sig


def _plan(targets: Sequence[LazyVar]) -> _Plan:
    slot: dict[int, int] = {}
    leaves: list[LazyVar] = []
    nodes: list[Node] = []
    key: list[Any] = []  # flat: leaf (shape, dtype) pairs and node (signature, input slots..., -1) runs
    push_key = key.append
    # Iterative post-order walk: deep chains must not hit Python's recursion limit.
    stack: list[Any] = list(reversed(targets))
    push, pop = stack.append, stack.pop
    while stack:
        v = pop()
        if v.__class__ is Node:  # all inputs of this node are placed: emit it
            node = v
            if node.outputs[0].id in slot:
                continue
            nodes.append(node)
            push_key(node._sig)
            for u in node.inputs:
                push_key(slot[u.id])
            push_key(-1)
            for o in node.outputs:
                slot[o.id] = len(slot)
            continue
        if v.id in slot:
            continue
        node = v.node
        if node is None:
            slot[v.id] = len(slot)
            leaves.append(v)
            push_key(v.array.shape)
            push_key(v.type.dtype)
            continue
        if node.outputs[0].id in slot:
            continue
        push(node)
        for u in reversed(node.inputs):
            if u.id not in slot:
                push(u)
    # Outputs: the targets plus every other var of the graph a live tensor still holds.
    outputs = list(targets)
    if len(nodes) > 1 or len(nodes[0].outputs) > 1:
        wanted = {v.id for v in targets}
        for node in nodes:
            for o in node.outputs:
                if o.id not in wanted and o.owner is not None and o.owner() is not None:
                    outputs.append(o)
                    wanted.add(o.id)
    push_key("out")
    for o in outputs:
        push_key(slot[o.id])
    return _Plan(nodes, leaves, outputs, tuple(key))


def _run_nodes(nodes: Sequence[Node], leaf_ids: Sequence[int], out_ids: Sequence[int], leaves: Sequence[Any]) -> tuple:
    env = dict(zip(leaf_ids, leaves))
    interp = Interpreter()
    for n in nodes:
        interp.run_node(n, env)
    return tuple(env[i] for i in out_ids)


_programs: dict[tuple, Any] = {}
_seen: dict[tuple, None] = {}
_lock = threading.Lock()
_CACHE_SIZE = 1024


def _compiled(key: tuple, plan: _Plan, leaves: Sequence[Any]) -> Any | None:
    """The compiled program for ``plan`` (None on the first sighting of its key).

    Programs are traced and compiled with x64 on (int64/float64 stay what they
    are) and called without it: a compiled executable no longer depends on the
    flag, and the context switch is skipped on the hot path.
    """
    exe = _programs.get(key)
    if exe is not None:
        return exe
    with _lock:
        if key not in _seen:
            if len(_seen) > 4 * _CACHE_SIZE:
                _seen.clear()
            _seen[key] = None
            return None
        nodes = plan.nodes
        leaf_ids = [v.id for v in plan.leaves]
        out_ids = [v.id for v in plan.outputs]
        with x64():
            exe = jax.jit(lambda *args: _run_nodes(nodes, leaf_ids, out_ids, args)).lower(*leaves).compile()
        if len(_programs) >= _CACHE_SIZE:
            del _programs[next(iter(_programs))]  # oldest first
        _programs[key] = exe
        _stats.compiles += 1
        return exe


def realize(vars: Sequence[LazyVar]) -> None:
    """Compute every pending var in ``vars`` (and live vars of the same graph) as one program."""
    targets = [v for v in vars if v.node is not None]
    if not targets:
        return
    plan = _plan(targets)
    device = jax_device(targets[0].type.device)
    leaves = [v.array for v in plan.leaves]
    try:
        exe = _compiled((plan.key, device), plan, leaves)
        if exe is None:
            _stats.op_by_op_runs += 1
            with x64():
                results = _run_nodes(plan.nodes, [v.id for v in plan.leaves], [v.id for v in plan.outputs], leaves)
        else:
            _stats.fused_runs += 1
            results = exe(*leaves)
    except OpError:
        raise
    except Exception as e:  # an impl failed on values the rules accepted: say which graph
        ops = ", ".join(dict.fromkeys(n.op for n in plan.nodes))
        raise RuntimeError(f"realizing a tensor failed while running [{ops}]: {e}") from e
    for v, a in zip(plan.outputs, results):
        v.array = a
        v.node = None
        v.pending = 0


def bind_owner(var: LazyVar, tensor: Any) -> None:
    """Record ``tensor`` as the user-facing holder of ``var`` (weakly)."""
    var.owner = weakref.ref(tensor)
