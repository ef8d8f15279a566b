"""Control flow: ``cond``, ``while_loop`` and ``call`` (subgraph invocation).

Branches, loop predicates/bodies and called subgraphs are nested `Block`s held
in node params. Branches and loop bodies are built in a child `GraphBuilder`,
so they may read values of the enclosing graph (closure capture); the
interpreter runs them inside ``lax.cond`` / ``lax.while_loop`` with the
enclosing environment. A called subgraph is a closed block, inlined by running
it in a fresh interpreter (its own symbolic dims, its weights looked up under
``prefix``).

Buffer writes inside a branch or loop body (``ops.buffer_store`` on a buffer
of an enclosing graph) are carried out of the node: the node takes each such
buffer as an extra input marked as mutated and returns its final value after
its regular outputs, so the interpreter rebinds the buffer after the node, in
program order (MAX orders these writes with its chain values).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowering.context import TRACE, Captured, GraphBuilder, coerce_inputs, find_context, is_weak, type_of, use_context
from lowering.dims import Dim, StaticDim, SymbolicDim
from lowering.dtypes import DType
from lowering.interpret import Interpreter, block_is_data_dependent
from lowering.ir import Block, Var
from lowering.ops._rules import OpError, fmt, fmt_all
from lowering.registry import OpDef, front, get_op, register
from lowering.types import BufferType, TensorType, Type

__all__ = [
    "cond",
    "while_loop",
    "call",
    "cond_p",
    "while_loop_p",
    "call_p",
    "mutated_outer_vars",
    "mutates_from",
    "ResultTypeError",
]


def mutates_from(start: int):
    """``OpDef.mutates`` for ops that write every buffer input from index ``start`` on.

    The number of such inputs differs per node, so this returns a function of
    the node rather than fixed indices.
    """

    def written(node) -> list[int]:
        return [i for i in range(start, len(node.inputs)) if isinstance(node.inputs[i].type, BufferType)]

    return written


def mutated_outer_vars(block: Block) -> list[Var]:
    """Vars defined outside ``block`` that its nodes write (buffers of enclosing graphs), in first-write order."""
    defined = {v.id for v in block.inputs}
    found: dict[int, Var] = {}
    for node in block.nodes:
        for i in get_op(node.op).written_inputs(node):
            v = node.inputs[i]
            if v.id not in defined and isinstance(v.type, BufferType):
                found.setdefault(v.id, v)
        defined.update(v.id for v in node.outputs)
    return list(found.values())


# ─── helpers shared by cond / while_loop ─────────────────────────────────


def _checked_results(op: str, who: str, child, res, types, count_desc: str, slot) -> list[Var]:
    """Vars of a branch/body's results, checked against the expected ``types``.

    ``count_desc`` and ``slot(i)`` word the errors ("out_types has" /
    "out_types[i]" for cond, "the loop carries" / "initial value i" for loops).
    """
    _check_count(op, who, res, types, count_desc)
    out = [_result_var(op, f"{who} result {i}", child, r, t) for i, (r, t) in enumerate(zip(res, types))]
    for i, (v, t) in enumerate(zip(out, types)):
        if v.type != t:
            raise ResultTypeError(
                f"{op}: {who} result {i} has type {fmt(v.type)} but {slot(i)} is {fmt(t)} (Results don't match "
                "expected types)"
            )
    return out


def _check_count(op: str, who: str, res: list[Any], types, count_desc: str) -> None:
    """A branch/body returned as many values as ``types`` holds (see `_checked_results` for the wording)."""
    if len(res) != len(types):
        got = ", ".join(fmt(getattr(r, "type", r)) for r in res) or "nothing"
        raise OpError(
            f"{op}: {who} returned {len(res)} value(s) ({got}) but {count_desc} {len(types)} "
            f"({fmt_all(types) or 'None'})"
        )


def _pred_type(op: str, ctx, pred: Any, what: str) -> Type | None:
    """The type of predicate ``pred``, checked to be a bool scalar (None for a Python bool)."""
    t = type_of(ctx, pred)
    if t is None:
        if not isinstance(pred, (bool, np.bool_)):
            raise OpError(f"{op}: {what} must be a bool scalar tensor, got {type(pred).__name__} {pred!r}")
    else:
        _check_pred(op, t, what)
    return t


class ResultTypeError(OpError, TypeError):
    """A branch or loop body returned a value of the wrong type (a TypeError, as
    in MAX, and an `OpError`/ValueError like maxfx's other op checks)."""


def _results(res: Any) -> list[Any]:
    """A branch/body result as a list: None → [], a value → [value], a sequence → list."""
    if res is None:
        return []
    if isinstance(res, (list, tuple)):
        return list(res)
    if isinstance(res, Iterator):
        return list(res)
    return [res]


def _result_var(op: str, what: str, child: GraphBuilder, x: Any, want: Type | None) -> Var:
    """The var of a value returned by a nested-block function (constants for Python data)."""
    x = child.capture(x)
    if isinstance(x, Captured):
        x = x.array  # concrete data returned by a branch: a constant of the expected type
    ctx = getattr(x, "__lowering_context__", None)
    if ctx is not None:
        if not ctx.is_ancestor_of(child):
            raise ValueError(f"{op}: {what} belongs to a different graph; return values of the graph being built")
        return child.var_of(x)
    if is_weak(x) and not isinstance(x, (list, tuple)) and isinstance(want, TensorType) and want.is_static():
        arr = np.asarray(x)
        if arr.shape == tuple(int(d) for d in want.shape):
            return child.constant(arr.astype(want.dtype.to_numpy()), want.dtype, want.device)
    raise TypeError(f"{op}: {what} must be a graph value, got {type(x).__name__} {x!r}")


def _check_pred(op: str, t: Type, what: str) -> None:
    if not isinstance(t, TensorType) or t.dtype is not DType.bool or any(d != 1 for d in t.shape):
        raise OpError(f"{op}: {what} must be a bool scalar tensor, got {fmt(t)}")


def _canon(x: Any, t: Type) -> Any:
    # Loop-carried and branch values must have identical avals in both
    # branches / iterations: fix dtype and drop JAX weak typing.
    return lax.convert_element_type(jnp.asarray(x), t.dtype.to_numpy())


def _build_block(
    op: str,
    parent: Any,
    name: str,
    fn: Callable[..., Any],
    in_types: list[Type],
    fn_name: str,
) -> tuple[Block, list[Any], GraphBuilder]:
    """Run ``fn`` on fresh block inputs inside a child builder; returns (block, raw results, builder).

    ``parent`` is the context that owns the op: a graph builder, or a context
    recording into one (its user code sees its own kind of values, `Context.present`).
    """
    if not callable(fn):
        raise TypeError(f"{op}: {fn_name} must be callable, got {type(fn).__name__}")
    child = parent.recording_builder().child(name)
    child.block.inputs = [Var(t) for t in in_types]
    user = parent.nested(child)
    args = [user.present(child.wrap(child, v)) for v in child.block.inputs]
    with use_context(user):
        res = fn(*args)
    return child.block, _results(res), child


def _merge_vars(*groups: list[Var]) -> list[Var]:
    seen: dict[int, Var] = {}
    for g in groups:
        for v in g:
            seen.setdefault(v.id, v)
    return list(seen.values())


def _owner(op: str, values: list[Any], eager: bool = False):
    """The context that builds ``op``: a graph builder, JAX's trace, or (``eager``) the eager context."""
    ctx = find_context(op, values)
    if ctx is not TRACE and ctx.recording_builder() is None and not (eager and _is_eager(ctx)):
        raise TypeError(
            f"{op}: needs a Graph being built (or JAX arrays under jax.jit), got context {type(ctx).__name__}"
        )
    return ctx


def _is_eager(ctx) -> bool:
    """Eager tensors (MAX's default mode): control flow runs in Python, on realized predicates."""
    return ctx is not TRACE and ctx.concrete


def _eager_truth(op: str, ctx, pred: Any, what: str) -> bool:
    """The value of an eager bool scalar (realized now), checked as a graph predicate would be."""
    if _pred_type(op, ctx, pred, what) is None:
        return bool(pred)
    return bool(np.asarray(pred).reshape(()))


def _eager_results(op: str, ctx, who: str, res: list[Any], types, count_desc: str, slot) -> list[Any]:
    """Eager results of a branch or loop body, checked against ``types`` as `_checked_results` does.

    Python numbers and arrays become tensors of the expected type, as in a graph.
    """
    _check_count(op, who, res, types, count_desc)
    out = []
    for i, (r, t) in enumerate(zip(res, types)):
        if type_of(ctx, r) is None and is_weak(r) and isinstance(t, TensorType) and t.is_static():
            r = ctx.wrap(
                ctx.constant(np.asarray(r, t.dtype.to_numpy()).reshape([int(d) for d in t.shape]), t.dtype, t.device)
            )
        got = type_of(ctx, r)
        if got != t:
            raise ResultTypeError(
                f"{op}: {who} result {i} has type {fmt(got) if got is not None else type(r).__name__} but {slot(i)} is "
                f"{fmt(t)} (Results don't match expected types)"
            )
        out.append(r)
    return out


# ─── cond ─────────────────────────────────────────────────────────────────


def _cond_rule(
    pred: Type, *buffers: Type, out_types: tuple[Type, ...], then_block: Block, else_block: Block
) -> tuple[Type, ...]:
    _check_pred("cond", pred, "pred")
    return tuple(out_types)


def _cond_interpret(interp: Interpreter, node, ins, params, env):
    buf_vars = node.inputs[1:]
    out_types = [v.type for v in node.outputs]
    buf_types = [v.type for v in buf_vars]

    def branch(block: Block):
        def run(bufs):
            local = dict(env)
            local.update((v.id, a) for v, a in zip(buf_vars, bufs))
            outs, _ = interp.run(block, [], local)
            return tuple(_canon(o, t) for o, t in zip(outs, out_types + buf_types))

        return run

    operands = tuple(_canon(b, t) for b, t in zip(ins[1:], buf_types))
    pred = jnp.reshape(ins[0], ())
    if not isinstance(pred, jax.core.Tracer):
        # Op-by-op execution (graphs with data-dependent shapes): run only the branch taken.
        return branch(params["then_block"] if bool(pred) else params["else_block"])(operands)
    return tuple(lax.cond(pred, branch(params["then_block"]), branch(params["else_block"]), operands))


cond_p = register(
    OpDef(
        "cond",
        rule=_cond_rule,
        interpret=_cond_interpret,
        multiple_results=True,
        mutates=mutates_from(1),
        effect=True,  # a cond without results exists for the writes/prints in its branches
        cross_device=True,  # a host predicate may guard buffers on accelerators, as in MAX
    )
)


@front(cond_p)
def cond(
    pred: Any, out_types: Iterable[Type] | None, then_fn: Callable[[], Any], else_fn: Callable[[], Any]
) -> list[Any]:
    """Run ``then_fn`` if ``pred`` is true, else ``else_fn`` (``jax.lax.cond``).

    Both branch functions take no arguments and may use any value of the
    enclosing graph. On eager tensors (MAX's default mode, ``F.cond``) the
    predicate is computed and only the branch it picks runs, as Python's ``if``. Each must return values matching
    ``out_types`` (a value, a
    list of values, or None when ``out_types`` is None). Branches may write
    buffers of the enclosing graph (``ops.buffer_store``, ``ops.inplace_custom``);
    the write happens only if that branch runs.

    Args:
        pred: bool scalar tensor (or a Python bool).
        out_types: the types both branches return, or None for no results.
        then_fn: called (while building) to record the true branch.
        else_fn: called (while building) to record the false branch.

    Returns:
        The results of the branch taken (an empty list when ``out_types`` is None).

    Raises:
        ValueError: ``pred`` is not a bool scalar, or a branch returns a different
            number or types of values than ``out_types``.

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("c", input_types=[TensorType(DType.bool, [], DeviceRef.CPU())]) as g:
        ...     pred = g.inputs[0]
        ...     def then_fn():
        ...         return ops.constant(1, DType.int32, device=DeviceRef.CPU())
        ...     def else_fn():
        ...         return ops.constant(0, DType.int32, device=DeviceRef.CPU())
        ...     result = ops.cond(pred, [TensorType(DType.int32, [], device=DeviceRef.CPU())], then_fn, else_fn)
        ...     g.output(*result)
        >>> model = InferenceSession().load(g)
        >>> model.execute(np.array(True))[0].to_numpy(), model.execute(np.array(False))[0].to_numpy()
        (array(1, dtype=int32), array(0, dtype=int32))
    """
    ctx = _owner("cond", [pred], eager=True)
    if _is_eager(ctx):  # eager tensors: run the branch the realized predicate picks
        types = _out_types("cond", out_types)
        taken, name = (then_fn, "then_fn") if _eager_truth("cond", ctx, pred, "pred") else (else_fn, "else_fn")
        if not callable(taken):
            raise TypeError(f"cond: {name} must be callable, got {type(taken).__name__}")
        return _eager_results("cond", ctx, name, _results(taken()), types, "out_types has", lambda i: f"out_types[{i}]")
    t = _pred_type("cond", ctx, pred, "pred")
    types = _out_types("cond", out_types)
    if ctx is TRACE:
        return _cond_traced(pred, types, then_fn, else_fn)

    blocks, result_vars = [], []
    for name, fn in (("then_fn", then_fn), ("else_fn", else_fn)):
        block, res, child = _build_block("cond", ctx, name.replace("_fn", "_block"), fn, [], name)
        vs = _checked_results("cond", name, child, res, types, "out_types has", lambda i: f"out_types[{i}]")
        blocks.append(block)
        result_vars.append(vs)
    writes = _merge_vars(*(mutated_outer_vars(b) for b in blocks))
    for block, vs in zip(blocks, result_vars):
        # Each branch also yields the final value of every buffer either branch writes.
        block.outputs = vs + writes
        block.invalidate()
    if t is None:
        (pred,) = coerce_inputs(ctx.recording_builder(), cond_p, [bool(pred)])
    outs = ctx.bind(cond_p, [pred, *writes], {"out_types": types, "then_block": blocks[0], "else_block": blocks[1]})
    return list(outs)


def _out_types(op: str, out_types: Iterable[Type] | None) -> tuple[Type, ...]:
    if out_types is None:
        return ()
    if isinstance(out_types, Type):
        out_types = [out_types]
    types = tuple(out_types)
    for i, t in enumerate(types):
        if not isinstance(t, Type):
            raise TypeError(f"{op}: out_types[{i}] must be a TensorType or BufferType, got {type(t).__name__} {t!r}")
    return types


def _cond_traced(pred, types, then_fn, else_fn) -> list[Any]:
    # Under jax.jit / grad / vmap the values are JAX arrays: use lax.cond directly.
    def branch(fn, name):
        def run():
            res = _results(fn())
            if len(res) != len(types):
                raise OpError(
                    f"cond: {name} returned {len(res)} value(s) but out_types has {len(types)} "
                    f"({fmt_all(types) or 'None'})"
                )
            return tuple(_canon(r, t) for r, t in zip(res, types))

        return run

    return list(lax.cond(jnp.reshape(jnp.asarray(pred), ()), branch(then_fn, "then_fn"), branch(else_fn, "else_fn")))


# ─── while_loop ────────────────────────────────────────────────────────────


def _while_rule(*types: Type, n_buffers: int, pred_block: Block, body_block: Block) -> tuple[Type, ...]:
    return tuple(types[n_buffers:])


def _while_interpret(interp: Interpreter, node, ins, params, env):
    k = params["n_buffers"]
    buf_vars = node.inputs[:k]
    val_types = [v.type for v in node.outputs]
    buf_types = [v.type for v in buf_vars]
    pred_block, body_block = params["pred_block"], params["body_block"]

    def local(bufs):
        e = dict(env)
        e.update((v.id, a) for v, a in zip(buf_vars, bufs))
        return e

    def cond_fn(state):
        vals, bufs = state
        outs, _ = interp.run(pred_block, list(vals), local(bufs))
        return jnp.reshape(outs[0], ())

    def body_fn(state):
        vals, bufs = state
        outs, _ = interp.run(body_block, list(vals), local(bufs))
        n = len(val_types)
        return (
            tuple(_canon(o, t) for o, t in zip(outs[:n], val_types)),
            tuple(_canon(o, t) for o, t in zip(outs[n:], buf_types)),
        )

    init = (
        tuple(_canon(a, t) for a, t in zip(ins[k:], val_types)),
        tuple(_canon(a, t) for a, t in zip(ins[:k], buf_types)),
    )
    if not any(isinstance(a, jax.core.Tracer) for a in ins) and (
        block_is_data_dependent(pred_block) or block_is_data_dependent(body_block)
    ):
        # Op-by-op execution: shapes inside the body depend on values, so iterate in Python.
        state = init
        while bool(cond_fn(state)):
            state = body_fn(state)
        vals, bufs = state
    else:
        vals, bufs = lax.while_loop(cond_fn, body_fn, init)
    return (*vals, *bufs)


while_loop_p = register(
    OpDef(
        "while_loop",
        rule=_while_rule,
        interpret=_while_interpret,
        multiple_results=True,
        mutates=mutates_from(0),
        effect=True,
        differentiable=False,  # lax.while_loop has no reverse-mode derivative
        cross_device=True,  # loop-carried values may live on several devices, as in MAX
    )
)


@front(while_loop_p)
def while_loop(
    initial_values: Iterable[Any] | Any, predicate: Callable[..., Any], body: Callable[..., Any]
) -> list[Any]:
    """Loop ``vals = body(*vals)`` while ``predicate(*vals)`` is true (``jax.lax.while_loop``).

    ``predicate`` and ``body`` receive one value per initial value, with the same
    types. ``predicate`` returns a bool scalar; ``body`` returns the new values
    (a list, or a single value when there is one), with the same types. Both may
    read values of the enclosing graph, and ``body`` may write its buffers. On
    eager tensors (``F.while_loop``) it is a Python loop that computes the
    predicate each iteration.

    Args:
        initial_values: a value or a non-empty sequence of values.
        predicate: ``(*vals) -> bool scalar``.
        body: ``(*vals) -> new vals``.

    Returns:
        The values after the last iteration.

    Raises:
        ValueError: no initial values, or ``predicate``/``body`` return the wrong
            number or types of values.
        NotImplementedError: an initial value is a `BufferValue` (as in MAX: loop
            state is immutable; load the buffer and carry the tensor instead).

    Example:
        >>> from maxfx.graph import DeviceRef, Graph, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("while_loop_example") as g:
        ...     x = ops.constant(0, dtype=DType.int32, device=DeviceRef.CPU())
        ...     y = ops.constant(5, dtype=DType.int32, device=DeviceRef.CPU())
        ...     def pred(x, y):
        ...         return ops.logical_and(x < 10, y < 15)
        ...     def body(x, y):
        ...         return [x + 1, y + 1]
        ...     results = ops.while_loop((x, y), pred, body)
        ...     g.output(*results)
        >>> [r.to_numpy() for r in InferenceSession().load(g).execute()]  # x < 10 and y < 15 turn false together
        [array(10, dtype=int32), array(15, dtype=int32)]
    """
    if isinstance(initial_values, (list, tuple)):
        vals = list(initial_values)
    elif isinstance(initial_values, Iterator):
        vals = list(initial_values)
    else:
        vals = [initial_values]
    if not vals:
        raise ValueError(
            "while_loop: While loops must have at least one iteration value; initial_values must not be empty"
        )
    for i, v in enumerate(vals):
        if isinstance(getattr(v, "type", None), BufferType):
            raise NotImplementedError(
                f"while_loop: initial value {i} is a buffer ({fmt(v.type)}); buffers cannot be loop-carried. "
                "Load it with ops.buffer_load and carry the tensor, or write the buffer from the loop body"
            )
    ctx = _owner("while_loop", vals, eager=True)
    if ctx is TRACE:
        return _while_traced(vals, predicate, body)
    if _is_eager(ctx):
        return _while_eager(ctx, vals, predicate, body)
    builder = ctx.recording_builder()
    coerced = coerce_inputs(builder, while_loop_p, [builder.capture(v) for v in vals])  # eager data: constants
    in_vars = [x if isinstance(x, Var) else builder.var_of(x) for x in coerced]
    types = [v.type for v in in_vars]
    for i, t in enumerate(types):
        if not isinstance(t, TensorType):
            raise TypeError(f"while_loop: initial value {i} must be a tensor, got {t!r}")

    pred_block, res, child = _build_block("while_loop", ctx, "while_pred", predicate, types, "predicate")
    if len(res) != 1:
        raise OpError(f"while_loop: predicate must return one bool scalar tensor, got {len(res)} values")
    p = _result_var("while_loop", "predicate result", child, res[0], TensorType(DType.bool, []))
    _check_pred("while_loop", p.type, "predicate result")
    pred_block.outputs = [p]
    effects = _effect_ops(pred_block)
    if mutated_outer_vars(pred_block) or effects:
        raise OpError(
            f"while_loop: Chain mutation detected in the predicate ({', '.join(effects) or 'buffer writes'}): "
            "the predicate must not print or write buffers; do side effects in the loop body"
        )

    body_block, res, child = _build_block("while_loop", ctx, "while_body", body, types, "body")
    out_vars = _checked_results(
        "while_loop", "body", child, res, types, "the loop carries", lambda i: f"initial value {i}"
    )
    writes = mutated_outer_vars(body_block)
    body_block.outputs = out_vars + writes
    body_block.invalidate()
    outs = ctx.bind(
        while_loop_p,
        [*writes, *in_vars],
        {"n_buffers": len(writes), "pred_block": pred_block, "body_block": body_block},
    )
    return list(outs)


def _effect_ops(block: Block) -> list[str]:
    """Names of the ops of ``block`` with side effects (prints, buffer writes)."""
    found = []
    for node in block.nodes:
        op = get_op(node.op)
        if (op.effect or op.written_inputs(node)) and node.op not in found:
            found.append(node.op)
    return found


def _while_eager(ctx, vals: list[Any], predicate: Callable[..., Any], body: Callable[..., Any]) -> list[Any]:
    """``while_loop`` on eager tensors: a Python loop, the predicate realized each iteration."""
    for name, fn in (("predicate", predicate), ("body", body)):
        if not callable(fn):
            raise TypeError(f"while_loop: {name} must be callable, got {type(fn).__name__}")
    coerced = coerce_inputs(ctx, while_loop_p, vals)
    state = [
        x if hasattr(x, "__lowering_context__") else ctx.wrap(x) for x in coerced
    ]  # Python data came back as the context's vars
    types = [type_of(ctx, x) for x in state]
    while True:
        res = _results(predicate(*state))
        if len(res) != 1:
            raise OpError(f"while_loop: predicate must return one bool scalar tensor, got {len(res)} values")
        if not _eager_truth("while_loop", ctx, res[0], "predicate result"):
            return state
        state = _eager_results(
            "while_loop", ctx, "body", _results(body(*state)), types, "the loop carries", lambda i: f"initial value {i}"
        )


def _while_traced(vals, predicate, body) -> list[Any]:
    init = tuple(jnp.asarray(v) for v in vals)

    def body_fn(state):
        res = _results(body(*state))
        if len(res) != len(state):
            raise OpError(f"while_loop: body returned {len(res)} value(s) but the loop carries {len(state)}")
        return tuple(lax.convert_element_type(jnp.asarray(r), s.dtype) for r, s in zip(res, state))

    return list(lax.while_loop(lambda s: jnp.reshape(jnp.asarray(predicate(*s)), ()), body_fn, init))


# ─── call (subgraphs) ─────────────────────────────────────────────────────


class _Unbound(dict):
    """Symbol substitution that leaves symbols without a binding as they are."""

    def __missing__(self, name: str) -> Dim:
        return SymbolicDim(name)


def _subst(d: Dim, env: Mapping[str, Dim]) -> Dim:
    return d if isinstance(d, StaticDim) else Dim(d.to_jax(env))


def _call_rule(*types: Type, block: Block, prefix: str, name: str, n_buffers: int) -> tuple[Type, ...]:
    args = types[n_buffers:]
    env: dict[str, Dim] = _Unbound()
    deferred = []
    for i, (v, got) in enumerate(zip(block.inputs, args)):
        want = v.type
        if type(want) is not type(got):
            kind = "buffer" if isinstance(want, BufferType) else "tensor"
            raise TypeError(f"call: argument {i} of subgraph {name!r} must be a {kind} ({fmt(want)}), got {fmt(got)}")
        if not isinstance(want, (TensorType, BufferType)):
            if want != got:
                raise OpError(f"call: argument {i} of subgraph {name!r} must have type {want!r}, got {got!r}")
            continue
        if want.dtype is not got.dtype or want.rank != got.rank:
            raise OpError(
                f"call: argument {i} of subgraph {name!r} has the wrong type: must be {fmt(want)}, got {fmt(got)}"
            )
        if want.device != got.device:
            raise OpError(
                f"call: argument {i} of subgraph {name!r} must be on {want.device}, got {fmt(got)} on {got.device}"
            )
        for j, (wd, gd) in enumerate(zip(want.shape, got.shape)):
            if isinstance(wd, SymbolicDim):
                bound = env.setdefault(wd.name, gd)
                if bound != gd:
                    raise OpError(
                        f"call: argument {i} of subgraph {name!r}: dim {j} ({wd.name}) is {gd}, but {wd.name} is "
                        f"already {bound}"
                    )
            elif isinstance(wd, StaticDim):
                if wd != gd:
                    raise OpError(
                        f"call: argument {i} of subgraph {name!r} has the wrong type: must be {fmt(want)}, got "
                        f"{fmt(got)} (dim {j})"
                    )
            else:
                deferred.append((i, j, want, wd, got, gd))
    for i, j, want, wd, got, gd in deferred:
        if _subst(wd, env) != gd:
            raise OpError(
                f"call: argument {i} of subgraph {name!r} must be {fmt(want)}, got {fmt(got)} (dim {j}: {wd})"
            )
    outs = []
    for v in block.outputs:
        t = v.type
        if isinstance(t, (TensorType, BufferType)):
            t = type(t)(t.dtype, [_subst(d, env) for d in t.shape], t.device)
        outs.append(t)
    return tuple(outs)


class _PrefixedWeights(Mapping):
    """The caller's weights seen by a subgraph called with ``prefix``."""

    def __init__(self, base: Mapping[str, Any], prefix: str):
        self.base, self.prefix = base, prefix

    def __getitem__(self, name: str) -> Any:
        try:
            return self.base[self.prefix + name]
        except KeyError:
            raise KeyError(self.prefix + name) from None

    def __iter__(self):
        n = len(self.prefix)
        return (k[n:] for k in self.base if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _call_interpret(interp: Interpreter, node, ins, params, env):
    block, k = params["block"], params["n_buffers"]
    weights = interp.weights if not params["prefix"] else _PrefixedWeights(interp.weights, params["prefix"])
    # A fresh interpreter: the subgraph's symbolic dims are its own names.
    outs, final = Interpreter(weights).run(block, list(ins[k:]))
    bufs = [final[v.id] for v in block.inputs if isinstance(v.type, BufferType)]
    return (*outs, *bufs)


call_p = register(
    OpDef(
        "call",
        rule=_call_rule,
        interpret=_call_interpret,
        multiple_results=True,
        mutates=mutates_from(0),
        effect=True,
        cross_device=True,  # a subgraph's inputs may live on several devices (its signature places each)
    )
)


def _renamed_weight(w: Any, prefix: str) -> Any:
    new = type(w)(
        prefix + w.name,
        w.dtype,
        list(w.shape),
        device=w.device,
        quantization_encoding=w.quantization_encoding,
        align=w.align,
        sharding_strategy=w.sharding_strategy,
    )
    for attr in ("shard_idx", "_shard_of", "_original"):
        if hasattr(w, attr):
            setattr(new, attr, getattr(w, attr))
    return new


def _register_weights(graph: Any, prefix: str) -> None:
    """Make the caller graph require the subgraph's weights (under ``prefix``) at load time."""
    weights = graph.weights() if callable(getattr(graph, "weights", None)) else {}
    if not weights:
        return
    caller = type(graph).current
    if caller is None:
        raise RuntimeError(f"call: subgraph {graph.name!r} uses weights; call it inside `with Graph(...)`")
    if caller is graph:
        raise ValueError(f"call: graph {graph.name!r} cannot call itself")
    for w in weights.values():
        caller.add_weight(_renamed_weight(w, prefix) if prefix else w)


@front(call_p)
def call(graph: Any, *args: Any, prefix: str = "") -> list[Any]:
    """Call a subgraph (from ``Graph.add_subgraph``) on ``args``; returns its outputs.

    A call at the top level of a compiled graph runs the subgraph's own
    executable, built once for all its calls (MAX's reason for subgraphs:
    repeated layers compile once; see `lowering.piecewise`); a call that writes
    buffers, or one nested in control flow or traced by ``jax.jit``, is
    inlined. Its symbolic dims are
    matched against the arguments' dims, so a subgraph over ``["n", 4]`` can be
    called on ``["batch", 4]`` (its outputs are then in terms of ``batch``).
    Buffer arguments written by the subgraph are updated in the caller.

    Args:
        graph: the subgraph to call.
        *args: one value per subgraph input, matching its input types.
        prefix: prepended to the names of the subgraph's weights, so one
            subgraph can run with different weights per call site
            (``prefix="layers.3."`` reads weight ``w`` as ``layers.3.w``).

    Returns:
        A list with one value per subgraph output.

    Raises:
        ValueError: wrong number of arguments, or an argument's type does not
            match the subgraph input.

    Example:
        >>> import numpy as np
        >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
        >>> from maxfx.dtype import DType
        >>> from maxfx.engine import InferenceSession
        >>> with Graph("main", input_types=[TensorType(DType.float32, ["batch", 2], DeviceRef.CPU())]) as g:
        ...     with g.add_subgraph("add_one", input_types=[TensorType(DType.float32, ["n", 2],
        ...     DeviceRef.CPU())]) as sub:
        ...         sub.output(sub.inputs[0] + 1)
        ...     [y] = ops.call(sub, g.inputs[0])
        ...     print(y.type)  # the subgraph's n is the caller's batch
        ...     g.output(ops.call(sub, y)[0])
        TensorType(dtype=float32, shape=[Dim('batch'), Dim(2)], device=cpu:0)
        >>> InferenceSession().load(g).execute(np.zeros((3, 2), np.float32))[0].to_numpy().tolist()
        [[2.0, 2.0], [2.0, 2.0], [2.0, 2.0]]
    """
    block = getattr(graph, "_ir", None)
    if not isinstance(block, Block):
        raise TypeError(f"call: expected a Graph (made with Graph.add_subgraph), got {type(graph).__name__}")
    name = getattr(graph, "name", block.name)
    if not isinstance(prefix, str):
        raise TypeError(f"call: prefix must be a str, got {type(prefix).__name__}")
    if not getattr(graph, "_has_output", True):
        raise ValueError(f"call: subgraph {name!r} has no outputs yet; call its output(...) before calling it")
    if len(args) != len(block.inputs):
        raise ValueError(
            f"call: Expected {len(block.inputs)} args to call to {name!r}, got {len(args)}; "
            f"inputs are ({fmt_all(v.type for v in block.inputs)})"
        )
    ctx = _owner("call", list(args))
    if ctx is TRACE:
        outs, _ = Interpreter({}).run(block, [jnp.asarray(a) for a in args])
        return list(outs)
    _register_weights(graph, prefix)
    builder = ctx.recording_builder()
    coerced = coerce_inputs(builder, call_p, [builder.capture(a) for a in args])  # eager data: constants
    in_vars = [x if isinstance(x, Var) else builder.var_of(x) for x in coerced]
    bufs = [
        v for v, s in zip(in_vars, block.inputs) if isinstance(s.type, BufferType) and isinstance(v.type, BufferType)
    ]
    outs = ctx.bind(call_p, [*bufs, *in_vars], {"block": block, "prefix": prefix, "name": name, "n_buffers": len(bufs)})
    return list(outs)
