"""Replaying a `Block` as a pure JAX function.

`run_block` walks the nodes in order, looking up each op's impl in the
registry. Symbolic dims are bound from the concrete input shapes first, so
params holding dims (``reshape(x, ["batch", -1])``) become ints before the impl
sees them. Buffer mutations rebind the buffer's var to its new value; the final
values of buffer inputs are returned next to the outputs so that callers can
write them back.

Under ``jax.jit`` this is tracing: the result is one XLA program.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from lowering.dims import Dim, StaticDim, UnboundDimError, bind_symbols
from lowering.ir import Block, ConstantValue, Node
from lowering.registry import OpDef, get_op
from lowering.types import Type

__all__ = ["Interpreter", "apply_impl", "resolve_params", "run_block"]


def apply_impl(op: OpDef, args: Sequence[Any], params: Mapping[str, Any]) -> Any:
    """Run ``op``'s JAX implementation on ``args``: the one place the library calls an impl.

    Graph replay, eager realization (op by op or traced by ``jax.jit``) and ops
    applied to JAX arrays and tracers all come here, so an op behaves the same
    in every mode.

    Raises:
        TypeError: the op has no implementation of its own (it runs nested blocks
            or reads weights, so it only exists inside a Graph).
    """
    if op.impl is None:
        raise TypeError(
            f"{op.name}: exists only inside a Graph (it runs nested blocks or reads weights); build one with `with "
            "Graph(...)`"
        )
    with contextlib.nullcontext() if jax.config.jax_enable_x64 else _quiet_truncation():
        return op.impl(*args, **params)


@contextlib.contextmanager
def _quiet_truncation():
    # Under a user's jax.jit without x64, MAX's 64-bit results are 32-bit (documented in
    # docs/pages/eager.md); JAX would warn about that once per op, from inside maxfx.
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r"Explicitly requested dtype (u?int64|float64|complex128) requested in .* is not available",
            category=UserWarning,
        )
        yield


def block_is_data_dependent(block: Block) -> bool:
    """True when a node of ``block`` (or of a block nested in its params) sizes outputs from values."""
    for node in block.nodes:
        if get_op(node.op).sizes_outputs_from_values(node.params):
            return True
        for p in node.params.values():
            for b in p if isinstance(p, (tuple, list)) else (p,):
                if isinstance(b, Block) and block_is_data_dependent(b):
                    return True
    return False


def resolve_params(params: Mapping[str, Any], dims: Mapping[str, int]) -> dict[str, Any]:
    """``params`` with every `Dim` replaced by its concrete int under ``dims``."""
    return {k: _resolve(v, dims) for k, v in params.items()}


def _resolve(v: Any, dims: Mapping[str, int]) -> Any:
    if isinstance(v, Dim):
        if isinstance(v, StaticDim):
            return v.dim
        try:
            return v.evaluate(dims)
        except UnboundDimError:
            return v  # a size the op itself determines (nonzero's out_dim), bound after it runs
    if isinstance(v, tuple):
        return tuple(_resolve(x, dims) for x in v)
    if isinstance(v, list):
        return [_resolve(x, dims) for x in v]
    if isinstance(v, ConstantValue):
        return v.array
    return v


class Interpreter:
    """Evaluates blocks over JAX values.

    Attributes:
        weights: weight name → array, read by ``weight`` nodes.
        dims: symbol name → size, filled from input shapes as blocks run.
    """

    def __init__(self, weights: Mapping[str, Any] | None = None, dims: dict[str, int] | None = None):
        self.weights = weights or {}
        self.dims: dict[str, int] = {} if dims is None else dims

    def bind_dims(self, types: Sequence[Type], values: Sequence[Any], what: str) -> None:
        """Bind symbolic dims of ``types`` to the shapes of ``values``."""
        for i, (t, v) in enumerate(zip(types, values)):
            shape = getattr(t, "shape", None)
            if shape is None:
                continue
            err = bind_symbols(shape, getattr(v, "shape", ()), self.dims)
            if err:
                raise ValueError(f"{what} {i}: {err}")

    def run(
        self, block: Block, args: Sequence[Any], env: dict[int, Any] | None = None
    ) -> tuple[list[Any], dict[int, Any]]:
        """Run ``block`` on ``args``; returns (outputs, final environment).

        ``env`` holds values of enclosing blocks (closure capture); it is copied,
        and the returned environment shows buffer vars rebound by mutations.
        """
        env = dict(env or {})
        self.bind_dims([v.type for v in block.inputs], args, "input")
        for v, a in zip(block.inputs, args):
            env[v.id] = a
        for node in block.nodes:
            self.run_node(node, env)
        return [env[v.id] for v in block.outputs], env

    def run_node(self, node: Node, env: dict[int, Any]) -> None:
        op = get_op(node.op)
        ins = [env[v.id] for v in node.inputs]
        params = resolve_params(node.params, self.dims)
        if op.interpret is not None:
            outs = op.interpret(self, node, ins, params, env)
        else:
            outs = apply_impl(op, ins, params)
        n_out = len(node.outputs)
        written = op.written_inputs(node)
        if not isinstance(outs, (tuple, list)):
            outs = (outs,) if (n_out or written) else ()
        outs = tuple(outs)
        for v, a in zip(node.outputs, outs[:n_out]):
            env[v.id] = a
        for idx, a in zip(written, outs[n_out:]):
            env[node.inputs[idx].id] = a
        if op.sizes_outputs_from_values(node.params):
            self.bind_dims([v.type for v in node.outputs], outs[:n_out], f"{node.op} output")


def run_block(
    block: Block, args: Sequence[Any], weights: Mapping[str, Any] | None = None, interp: Interpreter | None = None
) -> tuple[list[Any], list[Any]]:
    """Run a top-level block: returns (outputs, final values of its inputs).

    The final input values differ from ``args`` only for mutated buffers.
    ``interp`` (default: a plain `Interpreter` over ``weights``) runs the nodes.
    """
    interp = Interpreter(weights) if interp is None else interp
    outs, env = interp.run(block, args)
    return outs, [env[v.id] for v in block.inputs]
