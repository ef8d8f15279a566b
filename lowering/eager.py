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
from lowering.interpret import Interpreter, resolve_params
from lowering.ir import Block, Node, Var, _var_ids, param_key
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
        node: the `PendingNode` that computes it while pending; None once realized.
        index: which output of ``node`` it is.
        array: its value once realized (a JAX array or tracer).
        owner: weak reference to the user-facing tensor holding it (if any).
        pending: estimate of the number of pending nodes behind it.
    """

    __slots__ = ("node", "index", "array", "owner", "pending")

    def __init__(self, type: Any, array: Any = None, node: PendingNode | None = None, pending: int = 0, index: int = 0):
        self.id = next(_var_ids)
        self.type = type
        self.array = array
        self.node = node
        self.index = index
        self.owner = None
        self.pending = pending

    @property
    def realized(self) -> bool:
        return self.node is None


class PendingNode:
    """One recorded op application of the eager graph.

    Its outputs are referenced *weakly*: vars point at their node, never the
    other way round, so the pending graph has no reference cycles and dead
    intermediates are freed by reference counting alone (no garbage-collector
    pauses in tight eager loops).
    """

    __slots__ = ("op", "inputs", "params", "sig", "outs")

    def __init__(self, op: OpDef, inputs: tuple[LazyVar, ...], params: dict[str, Any], sig: int):
        self.op = op
        self.inputs = inputs
        self.params = params
        self.sig = sig
        self.outs: tuple[weakref.ref, ...] = ()

    def live_outputs(self) -> list[LazyVar]:
        return [o for o in (r() for r in self.outs) if o is not None]


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
_NO_PARAMS: dict[str, Any] = {}
_Tracer = jax.core.Tracer


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

    def bind_binary(self, op: OpDef, lhs: Any, rhs: Any) -> Any:
        """`bind` for a parameterless binary op whose operands are eager tensors or Python scalars.

        The operators (``x * 2``, ``a + b``) come here; it is `bind` minus the
        generic argument handling, because this is the path of every eager step.
        """
        lv = None if lhs.__class__ in _SCALARS else lhs._var
        rv = None if rhs.__class__ in _SCALARS else rhs._var
        if (lv is not None and isinstance(lv.array, _Tracer)) or (rv is not None and isinstance(rv.array, _Tracer)):
            return self._bind_traced(op, (lhs, rhs), {})
        key = (op, lhs.__class__ if lv is None else lv.type, rhs.__class__ if rv is None else rv.type, ())
        plan = _bind_plans.get(key)
        if plan is None or plan.immediate or not plan.single:
            return self.bind(op, (lhs, rhs), {})
        la, ra = plan.actions
        if la is not None:
            lv = self.cast(lhs, la[1]) if la[0] == "cast" else _scalar_leaf(op.name, lhs, la[1] if la[0] == "weak" else None, plan.device)
        if ra is not None:
            rv = self.cast(rhs, ra[1]) if ra[0] == "cast" else _scalar_leaf(op.name, rhs, ra[1] if ra[0] == "weak" else None, plan.device)
        pending = 1 + lv.pending + rv.pending
        node = PendingNode(op, (lv, rv), _NO_PARAMS, plan.signature)
        out = LazyVar(plan.out_types[0], None, node, pending)
        node.outs = (weakref.ref(out),)
        if pending > MAX_PENDING:
            realize((out,))
        return self.wrap(out)

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
        if plan.immediate or op.impl is None:
            return self._finish(op, in_vars, params, plan.out_types, plan.signature)
        # The common case, kept tight: record one node with one output.
        pending = 1
        for v in in_vars:
            pending += v.pending
        node = PendingNode(op, tuple(in_vars), params, plan.signature)
        if plan.single:
            out = LazyVar(plan.out_types[0], None, node, pending)
            node.outs = (weakref.ref(out),)
            if pending > MAX_PENDING:
                realize((out,))
            return self.wrap(out)
        outs = tuple([LazyVar(t, None, node, pending, i) for i, t in enumerate(plan.out_types)])
        node.outs = tuple([weakref.ref(o) for o in outs])
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
        if op.impl is None:
            raise TypeError(f"{op.name}: exists only inside a Graph (it runs nested blocks or reads weights); build one with `with Graph(...)`")
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
        if signature is None:
            signature = _intern_signature((op.name, param_key(params), tuple(t.key() for t in out_types)))
        node = PendingNode(op, tuple(in_vars), params, signature)
        outs = tuple(LazyVar(t, None, node, pending, i) for i, t in enumerate(out_types))
        node.outs = tuple(weakref.ref(o) for o in outs)
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
    """The pending subgraph behind some vars, in topological order.

    ``steps`` holds ``(node, input slots, first output slot)``: values live in a
    flat list of slots (leaves first), so programs never look at var ids.
    """

    __slots__ = ("steps", "leaves", "leaf_slots", "outputs", "out_slots", "n_slots", "key")

    def __init__(self, steps, leaves, leaf_slots, outputs, out_slots, n_slots, key):
        self.steps = steps
        self.leaves = leaves
        self.leaf_slots = leaf_slots
        self.outputs = outputs
        self.out_slots = out_slots
        self.n_slots = n_slots
        self.key = key


def _plan(targets: Sequence[LazyVar]) -> _Plan:
    slot: dict[int, int] = {}  # leaf var id -> slot
    base: dict[int, int] = {}  # id(node) -> its first output slot
    leaves: list[LazyVar] = []
    leaf_slots: list[int] = []
    steps: list[tuple] = []
    key: list[Any] = []  # flat: leaf (shape, dtype) pairs and node (signature, input slots..., -1) runs
    n = 0
    # Iterative post-order walk (deep chains must not hit Python's recursion limit).
    # Leaves get their slots when their consumer is expanded; the numbering is
    # deterministic, so equal graphs give equal keys.
    stack: list[Any] = list(reversed(targets))
    push, pop = stack.append, stack.pop
    while stack:
        v = pop()
        if v.__class__ is PendingNode:  # all inputs of this node are placed: emit it
            if id(v) in base:
                continue
            ins = tuple([slot[u.id] if u.node is None else base[id(u.node)] + u.index for u in v.inputs])
            base[id(v)] = n
            steps.append((v, ins, n))
            key.append(v.sig)
            key.extend(ins)
            key.append(-1)
            n += len(v.outs)
            continue
        node = v.node
        if id(node) in base:
            continue
        push(node)
        for u in reversed(node.inputs):
            un = u.node
            if un is None:
                if u.id not in slot:
                    slot[u.id] = n
                    leaf_slots.append(n)
                    leaves.append(u)
                    key.append(u.array.shape)
                    key.append(u.type.dtype)
                    n += 1
            elif id(un) not in base:
                push(u)
    # Outputs: the targets plus every other var of the graph a live tensor still holds.
    outputs = list(targets)
    if len(steps) > 1 or len(steps[0][0].outs) > 1:
        wanted = {v.id for v in targets}
        for node, _, _ in steps:
            for ref in node.outs:
                o = ref()
                if o is not None and o.owner is not None and o.id not in wanted and o.owner() is not None:
                    outputs.append(o)
                    wanted.add(o.id)
    out_slots = tuple([base[id(o.node)] + o.index for o in outputs])
    key.append("out")
    key.extend(out_slots)
    return _Plan(steps, leaves, leaf_slots, outputs, out_slots, n, tuple(key))


def _run_plan(steps: Sequence[tuple], n_slots: int, leaf_slots: Sequence[int], out_slots: Sequence[int], leaves: Sequence[Any]) -> tuple:
    """Evaluate the steps on ``leaves`` with each op's impl (traced by jax.jit, or eagerly)."""
    env: list[Any] = [None] * n_slots
    for s, a in zip(leaf_slots, leaves):
        env[s] = a
    for node, ins, first in steps:
        op = node.op
        out = op.impl(*[env[i] for i in ins], **resolve_params(node.params, {}))
        if len(node.outs) == 1 and not op.multiple_results:
            env[first] = out
        else:
            for k, a in enumerate(out):
                env[first + k] = a
    return tuple([env[s] for s in out_slots])


def plan_as_block(targets: Sequence[LazyVar], name: str = "compute_graph") -> Block:
    """The pending work behind ``targets`` as an IR `Block` (for printing and inspection)."""
    plan = _plan(targets)
    vars_: dict[int, Var] = {}
    block = Block(name)
    for v, s in zip(plan.leaves, plan.leaf_slots):
        vars_[s] = v
        block.inputs.append(v)
    for node, ins, first in plan.steps:
        outs = tuple(Var(r().type) if r() is not None else Var(None) for r in node.outs)
        for k, o in enumerate(outs):
            vars_[first + k] = o
        block.nodes.append(Node(node.op.name, tuple(vars_[i] for i in ins), node.params, outs))
    block.outputs = [vars_[s] for s in plan.out_slots]
    return block


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
        steps, n_slots, leaf_slots, out_slots = plan.steps, plan.n_slots, plan.leaf_slots, plan.out_slots
        with x64():
            exe = jax.jit(lambda *args: _run_plan(steps, n_slots, leaf_slots, out_slots, args)).lower(*leaves).compile()
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
    key = (plan.key, device)
    leaves = [v.array for v in plan.leaves]
    try:
        run = _programs.get(key)
        if run is not None:  # the hot path: a cached executable's C++ entry point
            _stats.fused_runs += 1
            results = run(*leaves)
        else:
            exe = _compiled(key, plan, leaves)
            if exe is None:
                _stats.op_by_op_runs += 1
                # Under an enclosing jax trace (a pending tensor captured by a jitted
                # function) jnp ops would be staged into that trace; the leaves are
                # concrete, so compute now and keep the tensor concrete.
                with x64(), jax.core.eval_context():
                    results = _run_plan(plan.steps, plan.n_slots, plan.leaf_slots, plan.out_slots, leaves)
            else:
                _stats.fused_runs += 1
                results = exe(*leaves)
                # Calling the executable's C++ entry point (made by the first call) skips a Python frame.
                _programs[key] = getattr(exe, "_call", None) or exe
    except OpError:
        raise
    except Exception as e:  # an impl failed on values the rules accepted: say which graph
        ops = ", ".join(dict.fromkeys(step[0].op.name for step in plan.steps))
        raise RuntimeError(f"realizing a tensor failed while running [{ops}]: {e}") from e
    for v, a in zip(plan.outputs, results):
        v.array = a
        v.node = None
        v.pending = 0


def bind_owner(var: LazyVar, tensor: Any) -> None:
    """Record ``tensor`` as the user-facing holder of ``var`` (weakly)."""
    var.owner = weakref.ref(tensor)
