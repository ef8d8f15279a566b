"""Eager execution: ops run at once (MAX's default), or recorded and fused inside `lazy`.

As in MAX, an op on eager tensors runs when it is called, so ``(a + b).real``
is true; inside ``with lazy():`` (``F.lazy()``) ops are only recorded and run
together, fused into one program, when a result is observed.

Binding is `Context.bind`, as everywhere: the op's memoised `BindPlan` converts
the inputs and has checked the op's rule (so shape and dtype errors surface at
the call line), then `EagerContext.apply` acts on the realized or pending vars:

- default mode, realized inputs: the op runs now as a one-op program, compiled
  once per op, params and input avals (`_run_op`); the plan keeps that
  program's C++ entry, so the next call with the same kinds goes straight to it;
- inside `lazy` (or on a pending input): a `PendingNode` is recorded and the
  result is a pending `LazyVar`. A tensor is *realized* when someone needs its
  values; `realize` then gathers every pending node it depends on and runs
  them as one program:

  - the program's inputs (*leaves*) are the already-realized arrays and the
    constants the ops captured; its key is the graph's structure plus the leaves'
    shapes and dtypes, never their values, so a loop body maps to one key;
  - on a cache miss the pending sub-graph is cut into an IR `Block` and run by
    the one interpreter (`lowering.interpret`): op by op the first time its key
    is seen (no XLA compile of a graph that may never recur), traced by
    ``jax.jit`` into one executable from the second time on, kept in the
    process-wide `EXECUTABLES` cache that graphs and compiled Modules share;
  - the requested tensors and every other still-referenced tensor of that graph
    come back from the same run, so nothing alive is computed twice.

Inside ``jax.jit``/``grad``/``vmap`` eager tensors hold tracers and ops apply
their implementation in the trace (`TraceContext.apply`). Ops the registry marks
``immediate`` (transfers, custom kernels), and ops with side effects, buffer
writes or data-dependent output shapes, run at once.

Memory stays bounded: realized vars drop their producer (so the graph behind
them can be freed), tensors are referenced weakly by the graph, and a var with
more than ``MAX_PENDING`` pending ancestors is realized when it is created.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from lowering.context import TRACE, Context, type_of
from lowering.device_memory import check_fits_device
from lowering.devices import array_device_ref, has_hardware, jax_device
from lowering.dims import StaticDim, format_shape
from lowering.dtypes import DType
from lowering.executables import EXECUTABLES
from lowering.interpret import Interpreter, run_block
from lowering.ir import Block, Node, Var, _var_ids
from lowering.logs import compiling
from lowering.plan import PYTHON_SCALARS, BindPlan, bind_plan, clear_plans, signature
from lowering.registry import OpDef, OpError, get_op
from lowering.types import DeviceRef, TensorType
from lowering.x64 import jit, run, to_device

__all__ = [
    "LazyVar",
    "PendingNode",
    "EagerContext",
    "realize",
    "pending_block",
    "eager_stats",
    "lazy",
    "is_lazy",
    "placed_leaf",
    "MAX_PENDING",
    "write_lock",
]

MAX_PENDING = 512
"""A var whose pending graph grows past this many nodes is realized on creation."""

_lazy: contextvars.ContextVar[bool] = contextvars.ContextVar("maxfx_lazy", default=False)


@contextlib.contextmanager
def lazy() -> Iterator[None]:
    """Record eager ops instead of running them; they run, fused, when a result is observed.

    MAX's ``F.lazy()``: outside it every op runs when called (``t.real`` is
    true); inside, results stay pending (``t.real`` is false) until printed,
    read, awaited with ``t.realize``, or used by an op that needs values.
    Leaving the block does not run anything. Nested blocks are fine.

    Example:
        >>> from maxfx.experimental import functional as F
        >>> from maxfx.experimental.tensor import Tensor
        >>> x = Tensor([1.0, 2.0])
        >>> (x + 1).real
        True
        >>> with F.lazy():
        ...     y = x * 2 + 1
        >>> y.real
        False
        >>> y.to_numpy().tolist(), y.real
        ([3.0, 5.0], True)
    """
    token = _lazy.set(True)
    try:
        yield
    finally:
        _lazy.reset(token)


def is_lazy() -> bool:
    """Whether eager ops are being recorded (inside `lazy`) rather than run at once."""
    return _lazy.get()


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
        self.op_runs = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "compiles": self.compiles,
            "fused_runs": self.fused_runs,
            "op_by_op_runs": self.op_by_op_runs,
            "op_runs": self.op_runs,
        }


_stats = _Stats()


def eager_stats() -> dict[str, int]:
    """Counts of compiles, fused-program runs, op-by-op (interpreted) runs and default-mode op runs (for
    tests/benchmarks).
    """
    return _stats.as_dict()


# ─── Constants ────────────────────────────────────────────────────────────

_SMALL = 16
_const_cache: collections.OrderedDict[tuple, jax.Array] = collections.OrderedDict()


def _device_constant(array: np.ndarray, device: jax.Device) -> jax.Array:
    """``array`` on ``device``; small constants are cached (they recur in loops: ``x * 2``)."""
    if array.size > _SMALL:
        return to_device(array, device)
    key = (array.dtype.str, array.shape, array.tobytes(), device)
    hit = _const_cache.get(key)
    if hit is None:
        hit = to_device(array, device)
        _const_cache[key] = hit
        if len(_const_cache) > 4096:
            _const_cache.popitem(last=False)
    return hit


# ─── Recording ────────────────────────────────────────────────────────────


# A binding's plan keeps the C++ entry of its one-op program (`BindPlan.entry`): dropping the
# executables drops those shortcuts with them.
EXECUTABLES.on_clear(clear_plans)


def _remember_entry(op: OpDef, plan: BindPlan, in_vars: Sequence[LazyVar]) -> None:
    """Keep on ``plan`` the entry of the program `_run_op` just ran for it, when the plan pins its inputs.

    Only static tensor types fix every input's shape, dtype and device, which is
    what the program was compiled for; ops that check input values run those
    checks on every call, so they keep the general path.
    """
    if op.check_values is None and all(_static(t) for t in plan.in_types):
        plan.entry = EXECUTABLES.get(_op_key(plan.signature, in_vars))


_Tracer = jax.core.Tracer
_scalar_leaves: collections.OrderedDict[tuple, LazyVar] = collections.OrderedDict()
EXECUTABLES.on_clear(_scalar_leaves.clear)


def placed_leaf(array: np.ndarray, dtype: DType, device: DeviceRef) -> LazyVar:
    """Host data ``array`` as an eager var on ``device``.

    On a device this machine has, a realized leaf. Inside `lazy`, a device it
    does not have (a virtual GPU, one a test mocks) gets a pending transfer from
    the host instead, as in MAX, where ``F.lazy()`` only records: shapes,
    dtypes and devices are checked as ops are recorded, and realizing the
    work raises (it needs the device). Outside `lazy` such a device is an error
    at once.

    Example:
        >>> with lazy():
        ...     v = placed_leaf(np.zeros(2, np.float32), DType.float32, DeviceRef.GPU(63))
        >>> v.type, v.realized
        (TensorType(dtype=float32, shape=[Dim(2)], device=gpu:63), False)
    """
    if has_hardware(device) or not _lazy.get():
        return LazyVar(TensorType(dtype, array.shape, device), array=to_device(array, jax_device(device)))
    host = placed_leaf(array, dtype, DeviceRef.CPU())
    op = get_op("transfer_to")
    return record(op, (host,), {"device": device}, [TensorType(dtype, array.shape, device)])[0]


def _off_hardware(in_vars: Sequence[LazyVar], out_types: Sequence[Any]) -> bool:
    """Whether any input or output lives on a device without hardware here (see `placed_leaf`)."""
    types = [v.type for v in in_vars] + list(out_types)
    return any(isinstance(t, TensorType) and not has_hardware(t.device) for t in types)


_WRITE_LOCKS = tuple(threading.RLock() for _ in range(64))


def write_lock(tensor: Any) -> threading.RLock:
    """The lock serializing in-place writes to ``tensor`` (its read-modify-write of the storage).

    Locks are striped by object id (64 of them) rather than stored per tensor:
    no allocation per tensor, and two tensors sharing a stripe only means their
    writes wait for each other.

    Example:
        >>> with write_lock(object()):  # the section that reads, modifies and rebinds a tensor's value
        ...     pass
    """
    return _WRITE_LOCKS[(id(tensor) >> 4) % len(_WRITE_LOCKS)]


class EagerContext(Context):
    """Records ops on eager tensors into a pending graph, realized when observed.

    Binding is `Context.bind`, as in every context: the memoised `BindPlan`
    converts the inputs (`data` caches Python scalars' leaves) and has run the
    op's rule. ``apply`` then runs the op now (MAX's default mode; once a plan
    has run, straight from the program entry kept on it), records a
    `PendingNode` (inside `lazy`), runs an immediate op through the
    interpreter, or, when an input holds a tracer, runs the implementation in
    the enclosing JAX trace.

    Args:
        wrap: ``wrap(var) -> tensor`` makes the user-facing object for a new var
            (``maxfx``'s `Tensor`); by default the `LazyVar` itself.
    """

    concrete = True

    def __init__(self, wrap: Callable[[LazyVar], Any] | None = None):
        self.wrap = wrap or (lambda v: v)
        self.default_device = DeviceRef.CPU()

    # ─── What Context.bind needs ─────────────────────────────────────────

    def kind_of(self, op: OpDef, x: Any) -> Any:
        v = getattr(x, "_var", x)
        if isinstance(v, LazyVar):
            return v.type
        if isinstance(x, jax.Array) and not isinstance(x, _Tracer):
            return TensorType(DType.from_numpy(x.dtype), x.shape, _device_ref(x))  # typed data on its device (`var_of`)
        return super().kind_of(op, x)

    def kinds(self, op: OpDef, inputs: Sequence[Any]) -> list[Any]:
        kinds = []
        traced = False
        for x in inputs:  # the common inputs (tensors, Python scalars) without a method call each
            v = x if x.__class__ is LazyVar else getattr(x, "_var", None)
            if v.__class__ is LazyVar:
                kinds.append(v.type)
                traced = traced or isinstance(v.array, _Tracer)
            elif x.__class__ in PYTHON_SCALARS:
                kinds.append(x.__class__)
            else:
                kinds.append(self.kind_of(op, x))
                traced = traced or isinstance(x, _Tracer)
        if traced:
            # The op runs in a JAX trace: its tensors are typed as JAX values are (`type_of`), since placement is the
            # trace's business there and the same-device rule must not fire on the devices the tensors came from.
            for i, x in enumerate(inputs):
                v = getattr(x, "_var", x)
                if v.__class__ is LazyVar and v.array is not None:
                    kinds[i] = type_of(TRACE, v.array)
        if op.mutates and not callable(op.mutates):
            for i in op.mutates:  # a tensor written by the op stands for a buffer of its type
                if isinstance(kinds[i], TensorType):
                    kinds[i] = kinds[i].as_buffer()
        return kinds

    def data(self, op: OpDef, x: Any, dtype: DType, device: DeviceRef | None, *, promoted: bool) -> LazyVar:
        if x.__class__ not in PYTHON_SCALARS:
            return super().data(op, x, dtype, device, promoted=promoted)
        # Python scalars recur in loops (``x * 2``'s 2): their realized leaves are cached.
        key = (x.__class__, x, dtype, device, promoted)
        leaf = _scalar_leaves.get(key)
        if leaf is None:
            leaf = super().data(op, x, dtype, device, promoted=promoted)
            if leaf.node is None:  # not a pending transfer to a device this machine lacks (inside lazy)
                _scalar_leaves[key] = leaf
                if len(_scalar_leaves) > 4096:
                    _scalar_leaves.popitem(last=False)
        return leaf

    def constant(self, array: np.ndarray, dtype: DType, device: DeviceRef | None) -> LazyVar:
        device = device or self.default_device
        arr = np.asarray(array, dtype.to_numpy())
        if not has_hardware(device):
            return placed_leaf(arr, dtype, device)
        # Concrete even while a JAX trace is active (an op on a traced tensor with a Python scalar): the constant is
        # data the trace captures, and it is cached, so it must not be a tracer of that trace.
        with jax.core.eval_context():
            return LazyVar(TensorType(dtype, arr.shape, device), array=_device_constant(arr, jax_device(device)))

    def cast(self, x: Any, dtype: DType) -> LazyVar:
        v = self._input_var(x, "cast")
        op = get_op("cast")
        params = {"dtype": dtype}
        # Applied like any op: run now, recorded inside lazy, or in the enclosing trace when v holds a tracer.
        return self.var_of(self.apply(op, bind_plan(op, (v.type,), params), (v,), params), "cast")

    # An eager tensor is its own buffer (MAX: ``F.buffer_store(t, v)`` writes ``t``): the buffer
    # ops' fronts bind here with the tensor as their destination.
    tensors_are_buffers = True

    def capture(self, x: Any, device: DeviceRef | None = None) -> Any:
        """A concrete ``jax.Array`` as a realized leaf (on its own device, with its dtype); other values unchanged.

        Eager values need no capturing (the graph builder's counterpart makes
        constants); JAX arrays are typed eager data here, as in `var_of`.
        """
        if isinstance(x, jax.Array) and not isinstance(x, _Tracer):
            return self.leaf(x)
        return x

    def var_of(self, x: Any, op_name: str = "eager op") -> LazyVar:
        """The var behind eager input ``x``: the one coercion point of eager inputs.

        A concrete ``jax.Array`` is what MAX calls an array-like (DLPack data with
        its own dtype): it becomes a realized leaf on its own device with its own
        dtype (`kind_of` types it so), also for ops that pick their context
        themselves (``while_loop``, ``call``).
        """
        if isinstance(x, LazyVar):
            return x
        v = getattr(x, "_var", None)
        if isinstance(v, LazyVar):
            return v
        if isinstance(x, jax.Array) and not isinstance(x, _Tracer):
            return self.leaf(x)
        raise TypeError(
            f"{op_name}: expected an eager Tensor or a jax.Array, got {type(x).__name__}; "
            "wrap the data first with maxfx.experimental.tensor.Tensor(data) (or Tensor.from_dlpack)"
        )

    def _input_var(self, x: Any, op_name: str) -> LazyVar:
        """`var_of` for an op's input, which may also be a raw tracer (the op then runs in its trace)."""
        return self.leaf(x) if isinstance(x, _Tracer) else self.var_of(x, op_name)

    def leaf(self, array: Any, type: TensorType | None = None) -> LazyVar:
        """A realized var holding ``array`` (a JAX array or tracer)."""
        if type is None:
            type = TensorType(DType.from_numpy(array.dtype), array.shape, _device_ref(array))
        return LazyVar(type, array=array)

    # ─── Binding ─────────────────────────────────────────────────────────

    def _host_inputs_on_device(self, op: OpDef, in_vars: list[LazyVar]) -> list[LazyVar]:
        """``in_vars`` with the op's host inputs (MAX reads them on the CPU) moved to the device it runs on.

        The op's one program runs on one device and reads them there, so a CPU
        copy next to GPU inputs is transferred (recorded inside `lazy`).
        """
        device = next(
            (
                v.type.device
                for i, v in enumerate(in_vars)
                if i not in op.host_inputs and isinstance(v.type, TensorType)
            ),
            None,
        )
        moved = list(in_vars)
        for i in op.host_inputs:
            v = in_vars[i]
            if device is not None and isinstance(v.type, TensorType) and v.type.device != device:
                transfer = get_op("transfer_to")
                params = {"device": device}
                moved[i] = self.var_of(self.apply(transfer, bind_plan(transfer, (v.type,), params), [v], params))
        return moved

    def apply(self, op: OpDef, plan: BindPlan, inputs: Sequence[Any], params: dict[str, Any]) -> Any:
        in_vars = []
        traced = False
        for x in inputs:
            v = x if x.__class__ is LazyVar else getattr(x, "_var", None)
            if v.__class__ is not LazyVar:
                v = self._input_var(x, op.name)
            if isinstance(v.array, _Tracer):
                traced = True
            in_vars.append(v)
        if traced:
            return self._apply_traced(op, plan, in_vars, params)
        entry = plan.entry
        if entry is not None and not _lazy.get():
            # MAX's default mode on realized inputs: the op's program, straight from the entry kept on its plan.
            arrays = [v.array for v in in_vars if v.node is None]
            if len(arrays) == len(in_vars):
                try:
                    results = entry(*arrays)
                except Exception as e:
                    raise RuntimeError(f"running {op.name} failed: {e}") from e
                _stats.op_runs += 1
                if plan.single:  # every elementwise op: no tuple of outputs to build
                    return self.wrap(LazyVar(plan.out_types[0], results[0]))
                return self._wrap_outputs(op, plan, [LazyVar(t, a) for t, a in zip(plan.out_types, results)])
        if op.host_inputs:
            in_vars = self._host_inputs_on_device(op, in_vars)
        written = () if callable(op.mutates) else op.mutates
        if written and _lazy.get() and op.impl is not None:
            return self._record_writes(op, plan, in_vars, params, written)
        if plan.immediate or op.impl is None:
            if _lazy.get() and op.impl is not None and not op.effect and _off_hardware(in_vars, plan.out_types):
                # A transfer (or other at-once op) for a device this machine lacks: recorded, like MAX's F.lazy().
                outs = record(op, in_vars, params, plan.out_types, plan.signature)
            else:
                outs = self._run_now(op, in_vars, params, plan.out_types)
            return self._wrap_outputs(op, plan, outs)
        outs = record(op, in_vars, params, plan.out_types, plan.signature)
        if not _lazy.get() and all(v.node is None for v in in_vars):
            # `record` just ran the op's one-op program: the next call goes straight to it.
            _remember_entry(op, plan, in_vars)
        return self._wrap_outputs(op, plan, outs)

    def _wrap_outputs(self, op: OpDef, plan: BindPlan, outs: Sequence[LazyVar]) -> Any:
        """The user-facing result of a binding: one value, a tuple (multiple results) or None."""
        if plan.single:
            return self.wrap(outs[0])
        if op.multiple_results:
            return tuple([self.wrap(v) for v in outs])
        return self.wrap(outs[0]) if outs else None

    def _record_writes(
        self, op: OpDef, plan: BindPlan, in_vars: tuple[LazyVar, ...], params: dict[str, Any], written: Sequence[int]
    ) -> Any:
        """Inside `lazy`: record an op that writes eager tensors, without running it.

        The written tensors' new values become extra outputs of the pending node,
        and each tensor is rebound to its new value (so ``t.real`` is false until
        realized). Ops recorded earlier keep reading the old values: program order
        holds without running anything.
        """
        n = len(plan.out_types)
        outs = record(op, in_vars, params, (*plan.out_types, *[in_vars[i].type for i in written]))
        for i, new in zip(written, outs[n:]):
            owner = in_vars[i].owner() if in_vars[i].owner is not None else None
            if owner is not None:
                owner._var = new
                new.owner = weakref.ref(owner)
        results = [self.wrap(v) for v in outs[:n]]
        return tuple(results) if op.multiple_results else (results[0] if results else None)

    def _run_now(
        self, op: OpDef, in_vars: Sequence[LazyVar], params: dict[str, Any], out_types: Sequence[Any]
    ) -> tuple[LazyVar, ...]:
        if op.mutates:  # a buffer write reads and replaces its tensors' values: one writer per tensor at a time
            owners = [v.owner() if v.owner is not None else v for v in in_vars]
            locks = sorted({id(lock): lock for lock in map(write_lock, owners)}.items())  # a fixed order: no deadlock
            with contextlib.ExitStack() as stack:
                for _, lock in locks:
                    stack.enter_context(lock)
                return self._run_now_unlocked(op, in_vars, params, out_types)
        return self._run_now_unlocked(op, in_vars, params, out_types)

    def _run_now_unlocked(
        self, op: OpDef, in_vars: Sequence[LazyVar], params: dict[str, Any], out_types: Sequence[Any]
    ) -> tuple[LazyVar, ...]:
        realize(in_vars)
        if op.check_values is not None:
            op.check_values(*[v.array for v in in_vars], **params)
        outs = tuple(Var(t) for t in out_types)
        node = Node(op.name, tuple(in_vars), params, outs)
        env = {v.id: v.array for v in in_vars}
        run(Interpreter().run_node, node, env)
        for i in op.written_inputs(node):
            in_vars[i].array = env[in_vars[i].id]
        return tuple(self.leaf(env[v.id], _concrete(v.type, env[v.id])) for v in outs)

    def _apply_traced(self, op: OpDef, plan: BindPlan, in_vars: Sequence[LazyVar], params: dict[str, Any]) -> Any:
        """Inside ``jax.jit``/``grad``/``vmap`` (an input holds a tracer): the op's implementation runs in the trace."""
        if op.mutates and not callable(op.mutates):
            raise TypeError(f"{op.name}: mutates a buffer and cannot run on immutable JAX arrays")
        out = TRACE.apply(op, plan, [_array_of(v) for v in in_vars], params)
        if out is None:
            return None
        if op.multiple_results:
            return tuple(self.wrap(self.leaf(a)) for a in out)
        return self.wrap(self.leaf(out))


def _array_of(x: Any) -> Any:
    v = getattr(x, "_var", x)
    if isinstance(v, LazyVar):
        if not v.realized:
            realize([v])
        return v.array
    return x


def _concrete(t: Any, array: Any) -> Any:
    if isinstance(t, TensorType) and tuple(t.shape) != tuple(array.shape):
        return TensorType(t.dtype, array.shape, t.device)
    return t


_device_ref = array_device_ref  # one decision for eager ops and Tensor leaves (lowering.devices)


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


def _as_block(plan: _Plan, name: str = "compute_graph") -> Block:
    """The pending sub-graph of ``plan`` cut out as an IR `Block`: leaves in, wanted vars out."""
    vars_: dict[int, Var] = {}
    block = Block(name)
    for v, s in zip(plan.leaves, plan.leaf_slots):
        vars_[s] = v
        block.inputs.append(v)
    for node, ins, first in plan.steps:
        outs = []
        for r in node.outs:
            o = r()
            outs.append(o if o is not None else Var(None))
        for k, o in enumerate(outs):
            vars_[first + k] = o
        block.nodes.append(Node(node.op.name, tuple(vars_[i] for i in ins), node.params, tuple(outs)))
    block.outputs = [vars_[s] for s in plan.out_slots]
    return block


def pending_block(targets: Sequence[LazyVar], name: str = "compute_graph") -> Block:
    """The pending work behind ``targets`` as an IR `Block` (what `realize` would run)."""
    return _as_block(_plan([v for v in targets if v.node is not None]), name)


def _run(block: Block, leaves: Sequence[Any]) -> tuple:
    outs, _ = run_block(block, leaves)
    return tuple(outs)


_seen: dict[tuple, None] = {}
_seen_lock = threading.Lock()


def _compiled(key: tuple, block: Block, leaves: Sequence[Any]) -> Any | None:
    """The compiled program for ``block`` (None on the first sighting of its key).

    A graph that never recurs is not worth an XLA compile: the first sighting
    runs op by op; the second compiles it into `EXECUTABLES`. Programs are
    traced and compiled with x64 on (int64/float64 stay what they are) and
    called without it: a compiled executable no longer depends on the flag.
    """
    with _seen_lock:
        if key not in _seen:
            if len(_seen) > 4 * EXECUTABLES.capacity:
                _seen.clear()
            _seen[key] = None
            return None
    with compiling("eager program", block.name):
        exe = jit(lambda *args: _run(block, args)).lower(*leaves).compile()
    _stats.compiles += 1
    return exe


def _op_executable(
    key: tuple, op: OpDef, in_vars: Sequence[LazyVar], params: dict[str, Any], out_types: Sequence[Any]
) -> Any:
    """The compiled one-op program for ``key`` (op signature and input avals), built on first use."""
    check_fits_device(op.name, out_types, jax_device(out_types[0].device) if out_types else None)
    ins = tuple([Var(v.type) for v in in_vars])  # fresh vars: the cached program must not hold arrays
    outs = tuple([Var(t) for t in out_types])
    block = Block(op.name, list(ins), [Node(op.name, ins, params, outs)], list(outs))
    with compiling("op", op.name):
        exe = jit(lambda *args: _run(block, args)).lower(*[v.array for v in in_vars]).compile()
    _stats.compiles += 1
    return exe


def _op_key(sig: int, in_vars: Sequence[LazyVar]) -> tuple:
    """The executable-cache key of a one-op program: its signature, input avals and device."""
    return ("op", sig, *[(v.array.shape, v.type.dtype) for v in in_vars], in_vars[0].type.device if in_vars else None)


def _static(kind: Any) -> bool:
    """A Python scalar kind, or a tensor type whose dims are all known numbers (so it fixes the aval)."""
    return not isinstance(kind, TensorType) or all(type(d) is StaticDim for d in kind.shape)


def record(
    op: OpDef, in_vars: tuple[LazyVar, ...], params: dict[str, Any], out_types: Sequence[Any], sig: int | None = None
) -> tuple[LazyVar, ...]:
    """Add a pending node (the one place they are made); realize at once past `MAX_PENDING`, or outside `lazy`."""
    if not _lazy.get():
        for v in in_vars:
            if v.node is not None:
                break
        else:  # MAX's default mode on realized inputs: run the op now, no pending node
            return _run_op(op, in_vars, params, out_types, signature(op, params, out_types) if sig is None else sig)
    pending = 1
    for v in in_vars:
        pending += v.pending
    node = PendingNode(op, in_vars, params, signature(op, params, out_types) if sig is None else sig)
    if len(out_types) == 1:  # the common case, kept tight
        outs = (LazyVar(out_types[0], None, node, pending),)
        node.outs = (weakref.ref(outs[0]),)
    else:
        outs = tuple([LazyVar(t, None, node, pending, i) for i, t in enumerate(out_types)])
        node.outs = tuple([weakref.ref(o) for o in outs])
    if pending > MAX_PENDING or not _lazy.get():
        realize(outs)  # MAX's default: run now (or bound the pending graph inside lazy)
    return outs


def _run_op(
    op: OpDef, in_vars: Sequence[LazyVar], params: dict[str, Any], out_types: Sequence[Any], sig: int
) -> tuple[LazyVar, ...]:
    """Run one op on realized vars now (MAX's default eager mode): one cached executable per op and input avals.

    Like JAX's eager dispatch, each (op, params, input shapes and dtypes) compiles
    once; the call itself is asynchronous on the device.
    """
    if op.check_values is not None:  # inputs are concrete here: value checks the compiled program cannot raise
        op.check_values(*[v.array for v in in_vars], **params)
    key = _op_key(sig, in_vars)
    exe = EXECUTABLES.get(key)
    try:
        if exe is None:
            exe = _op_executable(key, op, in_vars, params, out_types)
            results = exe(*[v.array for v in in_vars])
            # Cache the executable's C++ entry point, which its first call creates: one Python frame less per op.
            EXECUTABLES.put(key, getattr(exe, "_call", None) or exe)
        else:
            results = exe(*[v.array for v in in_vars])
    except (OpError, MemoryError):
        raise
    except Exception as e:  # an impl failed on values the rule accepted: say which op
        raise RuntimeError(f"running {op.name} failed: {e}") from e
    _stats.op_runs += 1
    return tuple([LazyVar(t, a) for t, a in zip(out_types, results)])


def _run_device(ref: DeviceRef) -> jax.Device:
    """The JAX device that runs work on ``ref``; a clear error for one this machine lacks (recorded in `lazy`)."""
    try:
        return jax_device(ref)
    except ValueError as e:
        raise ValueError(
            f"cannot realize a tensor on {ref}: {e}. Inside F.lazy() ops for such a device (a virtual or absent GPU) "
            "are recorded and checked, but computing their values needs the device"
        ) from None


def _check_static(op_name: str, t: TensorType) -> None:
    """Refuse to compute a result with a named dim: it has no size outside a graph."""
    named = [d for d in t.shape if not isinstance(d, StaticDim)]
    if named:
        raise OpError(
            f"cannot realize a tensor of shape {format_shape(t.shape)} (from {op_name}): dim {named[0]} is symbolic. "
            "Inside F.lazy() ops on tensors with named dims are recorded and checked, but computing values needs "
            "every size; give static sizes, or build a graph (Graph, Module.compile) whose inputs carry the names"
        )


def realize(vars: Sequence[LazyVar]) -> None:
    """Compute every pending var in ``vars`` (and live vars of the same graph) as one program.

    The pending sub-graph is keyed by its structure and the leaves' shapes and
    dtypes (never their values) and runs from the shared executable cache; on a
    miss it is cut into an IR `Block` and run by the one interpreter (op by op
    the first time, compiled from the second).
    """
    targets = [v for v in vars if v.node is not None]
    if not targets:
        return
    plan = _plan(targets)
    key = ("eager", plan.key, _run_device(targets[0].type.device))
    leaves = [v.array for v in plan.leaves]
    block = None
    try:
        cached = EXECUTABLES.get(key)
        if cached is not None:  # the hot path: a cached executable's C++ entry point
            _stats.fused_runs += 1
            results = cached(*leaves)
        else:
            for v in targets:  # name what was asked for first; the loop below also catches named dims behind it
                _check_static(v.node.op.name, v.type)
            block = _as_block(plan)
            for node in block.nodes:  # a new program: refuse results no device could hold before running it
                for t in (o.type for o in node.outputs):
                    if isinstance(t, TensorType):
                        _check_static(node.op, t)
                        _run_device(t.device)
                check_fits_device(node.op, [o.type for o in node.outputs], key[2])
            exe = _compiled(key, block, leaves)
            if exe is None:
                _stats.op_by_op_runs += 1
                # Under an enclosing jax trace (a pending tensor captured by a jitted
                # function) jnp ops would be staged into that trace; the leaves are
                # concrete, so compute now and keep the tensor concrete.
                with jax.core.eval_context():
                    results = run(_run, block, leaves)
            else:
                _stats.fused_runs += 1
                results = exe(*leaves)
                # Calling the executable's C++ entry point (made by the first call) skips a Python frame.
                EXECUTABLES.put(key, getattr(exe, "_call", None) or exe)
    except (OpError, MemoryError):
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
