"""Compiling a block's top-level subgraph calls once each, and running them per call site.

MAX documents subgraphs (``Graph.add_subgraph`` with ``ops.call``) as the way
"to improve compile times for operations that are used repeatedly in a model".
Inlined into one XLA program, twelve calls of one transformer block would
still compile twelve blocks. So when a compiled block calls a subgraph at its
top level, `split_at_calls` cuts it into pieces: each call is a piece of its
own, keyed by the subgraph's structure and the call's argument and weight
avals (not the weight *names*), so every call site of a subgraph shares one
executable; the runs of other nodes between calls are pieces too. `Pieces`
runs them in order, each through the process-wide `EXECUTABLES` cache.

The price: XLA cannot fuse across a call boundary, and each piece is one more
dispatch (microseconds on a CPU). Calls that write buffers stay inlined, as
does everything in blocks that mutate buffer inputs or have data-dependent
shapes.

Example:
    >>> import numpy as np
    >>> from maxfx.graph import DeviceRef, Graph, TensorType, ops
    >>> from maxfx.dtype import DType
    >>> t = TensorType(DType.float32, [2], DeviceRef.CPU())
    >>> with Graph("twice", input_types=[t]) as g:
    ...     with g.add_subgraph("inc", input_types=[t]) as sub:
    ...         sub.output(sub.inputs[0] + 1)
    ...     g.output(ops.call(sub, ops.call(sub, g.inputs[0])[0])[0] * 2)
    >>> [[n.op for n in p.nodes] for p in split_at_calls(g._ir)]
    [['call'], ['call'], ['constant', 'mul']]
    >>> from maxfx.engine import InferenceSession
    >>> InferenceSession().load(g).execute(np.zeros(2, np.float32))[0].to_numpy().tolist()
    [4.0, 4.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from lowering.executables import EXECUTABLES
from lowering.interpret import Interpreter
from lowering.ir import Block, Node, Var, weight_reads
from lowering.logs import compiling
from lowering.registry import get_op
from lowering.types import BufferType
from lowering.x64 import jit

__all__ = ["Piece", "Pieces", "split_at_calls"]

# The two ops the split reads by name: subgraph calls, and weight reads (to give each piece only its weights).
_CALL, _WEIGHT = "call", "weight"


@dataclass(frozen=True)
class Piece:
    """Part of a block run as one executable.

    Attributes:
        block: a closed block (its inputs are everything it reads from outside).
        ins: the caller's vars bound to ``block.inputs``.
        outs: the caller's vars bound to ``block.outputs``.
        weights: name inside ``block`` → name in the caller's weights.
        nodes: the caller's nodes this piece stands for.
        own_dims: whether the block names its own symbolic dims (a subgraph), not the caller's.
    """

    block: Block
    ins: tuple[Var, ...]
    outs: tuple[Var, ...]
    weights: tuple[tuple[str, str], ...]
    nodes: tuple[Node, ...]
    own_dims: bool


def _separate_call(node: Node) -> bool:
    """A top-level call compiled on its own: one that writes no buffers."""
    if node.op != _CALL or node.params.get("n_buffers", 0):
        return False
    return not any(isinstance(v.type, BufferType) for v in node.params["block"].inputs)


def _weight_names(nodes: Sequence[Node]) -> list[str]:
    """Caller weight names read by ``nodes``, sorted (subgraph calls read theirs under the call's prefix)."""
    return sorted({name for name, _ in weight_reads(nodes)})


def split_at_calls(block: Block) -> list[Piece]:
    """``block``'s top-level nodes as pieces: one per separately compiled call, one per run between.

    Top-level weight reads float: each is read inside the segment that uses it
    (a weight read costs nothing), so they never make a segment of their own.
    Returns an empty list when ``block`` has no such call (it is then compiled whole).
    """
    if not any(_separate_call(n) for n in block.nodes):
        return []
    used_later = _uses_after(block)
    weight_defs = {v.id: n for n in block.nodes if n.op == _WEIGHT for v in n.outputs}
    pieces: list[Piece] = []
    run: list[Node] = []

    def flush(used: set[int], extra: Sequence[Var] = ()) -> None:
        # A call's (or the block's) operands that are weights are read here too.
        reads = [weight_defs[v.id] for v in extra if v.id in weight_defs]
        if run or reads:
            pieces.append(_segment(list(run), used | {v.id for v in extra}, weight_defs, reads))
            run.clear()

    for i, node in enumerate(block.nodes):
        if node.op == _WEIGHT or _dead(node, used_later[i + 1]):
            continue  # weight reads join their users' segments; unused nodes are dropped
        if _separate_call(node):
            flush(used_later[i], node.inputs)
            sub, prefix = node.params["block"], node.params["prefix"]
            names = _weight_names(sub.nodes)
            pieces.append(
                Piece(
                    sub, tuple(node.inputs), tuple(node.outputs), tuple((n, prefix + n) for n in names), (node,), True
                )
            )
        else:
            run.append(node)
    flush(used_later[-1], block.outputs)
    return pieces


def _dead(node: Node, used_later: set[int]) -> bool:
    """A node nothing reads and that has no effect: dropped instead of compiled into a piece."""
    op = get_op(node.op)
    if op.effect or op.written_inputs(node):
        return False
    return bool(node.outputs) and not any(v.id in used_later for v in node.outputs)


def _uses_after(block: Block) -> list[set[int]]:
    """``out[i]``: ids of vars read by node ``i`` or later (nested blocks included), or returned."""
    live = {v.id for v in block.outputs}
    out = [live]
    for node in reversed(block.nodes):
        live = live | {v.id for v in node.inputs} | {v.id for v in Block(nodes=[node]).free_vars()}
        out.append(live)
    out.reverse()
    return out


def _segment(
    nodes: list[Node], used_later: set[int], weight_defs: Mapping[int, Node], reads: Sequence[Node] = ()
) -> Piece:
    pulled = {id(n): n for n in reads}
    pulled.update(
        (id(weight_defs[v.id]), weight_defs[v.id]) for v in Block(nodes=nodes).free_vars() if v.id in weight_defs
    )
    nodes = [*pulled.values(), *nodes]
    free = Block(nodes=nodes).free_vars()
    outs = tuple(v for n in nodes for v in n.outputs if v.id in used_later)
    inner = Block("segment", inputs=list(free), nodes=nodes, outputs=list(outs))
    names = _weight_names(nodes)
    return Piece(inner, tuple(free), outs, tuple((n, n) for n in names), tuple(nodes), False)


def _aval(x: Any) -> tuple:
    return (tuple(x.shape), str(x.dtype))


class Pieces:
    """Runs a block as its pieces, each through the shared executable cache.

    Args:
        block: the top-level block (no buffer inputs, no data-dependent shapes).
        pieces: ``split_at_calls(block)``.
        device: the JAX device everything runs on.
    """

    def __init__(self, block: Block, pieces: list[Piece], device: jax.Device):
        self.block, self.pieces, self.device = block, pieces, device
        self.compiles = 0

    def _executable(
        self, piece: Piece, args: Sequence[Any], weights: Mapping[str, Any], dims: Mapping[str, int]
    ) -> Any:
        piece_dims = () if piece.own_dims else tuple(sorted(dims.items()))
        key = (
            "piece",
            piece.block.structure_key(),
            tuple(_aval(a) for a in args),
            tuple((n, _aval(w)) for n, w in weights.items()),
            piece_dims,
            self.device.id,
            self.device.platform,
        )
        exe = EXECUTABLES.get(key)
        if exe is None:
            block = piece.block

            def program(args: list[Any], weights: dict[str, Any]) -> list[Any]:
                return Interpreter(weights, dict(piece_dims)).run(block, args)[0]

            with compiling("piece", block.name):
                exe = jit(program).lower(list(args), dict(weights)).compile()
            self.compiles += 1
            EXECUTABLES.put(key, exe)
        return exe

    def run(
        self, args: Sequence[Any], weights: Mapping[str, Any], dims: Mapping[str, int], *, compile_only: bool = False
    ) -> list[Any]:
        """Outputs of the block on ``args`` (placed arrays), ``dims`` being the inputs' symbol binding.

        ``compile_only``: build every piece's executable for these shapes, passing
        shape structs from piece to piece instead of running.
        """
        env = {v.id: a for v, a in zip(self.block.inputs, args)}
        for piece in self.pieces:
            ins = [env[v.id] for v in piece.ins]
            ws = {inner: weights[outer] for inner, outer in piece.weights}
            exe = self._executable(piece, ins, ws, dims)
            outs = exe.out_info if compile_only else exe(ins, ws)
            env.update((v.id, o) for v, o in zip(piece.outs, outs))
        return [env[v.id] for v in self.block.outputs]
