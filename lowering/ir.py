"""The IR: typed variables, op nodes and blocks.

A `Block` is a straight-line list of `Node`s over `Var`s. Each node names an op
of the registry, its input vars, its static params and its output vars (which
carry their `TensorType`/`BufferType`). Control-flow ops keep their branch and
body blocks in params; a nested block may read vars of its enclosing block.

`Block.structure_key()` is a hashable fingerprint of the whole block (op names,
wiring, params, types) independent of var ids: two graphs built the same way get
the same key and so share compiled executables.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lowering.dims import Dim, StaticDim
from lowering.types import DeviceRef, Type

__all__ = ["Var", "Node", "Block", "param_key", "holds_graph_values", "ConstantValue"]

_var_ids = itertools.count()


class Var:
    """A typed SSA value of a block."""

    __slots__ = ("id", "type", "__weakref__")

    def __init__(self, type: Type):
        self.id = next(_var_ids)
        self.type = type

    def __repr__(self) -> str:
        return f"%{self.id}: {self.type!r}"


@dataclass(eq=False)
class Node:
    """One op application: ``outputs = op(*inputs, **params)``.

    ``location`` is the user's ``file:line`` that created it, recorded when
    ``Graph.debug.source_tracebacks`` is on (not part of the structure key).
    """

    op: str
    inputs: tuple[Var, ...]
    params: dict[str, Any]
    outputs: tuple[Var, ...]
    location: str | None = None


@dataclass(eq=False)
class Block:
    """A list of nodes with declared inputs and outputs."""

    name: str = "block"
    inputs: list[Var] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    outputs: list[Var] = field(default_factory=list)
    _key: Any = field(default=None, repr=False)

    def structure_key(self) -> str:
        """SHA-256 fingerprint of op names, wiring, params and types."""
        if self._key is None:
            h = hashlib.sha256()
            h.update(repr(self._structure()).encode())
            self._key = h.hexdigest()
        return self._key

    def _structure(self, numbering: dict[int, int] | None = None) -> tuple:
        numbering = {} if numbering is None else numbering

        def num(v: Var) -> Any:
            # Vars of an enclosing block get ("outer", n) so nested blocks stay position-independent.
            return numbering.setdefault(v.id, len(numbering))

        ins = tuple((num(v), _type_key(v.type)) for v in self.inputs)
        nodes = tuple(
            (
                n.op,
                tuple(num(v) for v in n.inputs),
                tuple(sorted((k, param_key(p, numbering)) for k, p in n.params.items())),
                tuple((num(v), _type_key(v.type)) for v in n.outputs),
            )
            for n in self.nodes
        )
        outs = tuple(num(v) for v in self.outputs)
        return (ins, nodes, outs)

    def invalidate(self) -> None:
        """Forget the cached structure key (after mutating the block)."""
        self._key = None

    def free_vars(self) -> list[Var]:
        """Vars read by this block (or its nested blocks) but defined outside it."""
        defined = {v.id for v in self.inputs}
        seen: dict[int, Var] = {}
        for n in self.nodes:
            for v in itertools.chain(n.inputs, _nested_free_vars(n.params)):
                if v.id not in defined:
                    seen.setdefault(v.id, v)
            defined.update(v.id for v in n.outputs)
        for v in self.outputs:
            if v.id not in defined:
                seen.setdefault(v.id, v)
        return list(seen.values())

    def format(self, indent: str = "") -> str:
        """Readable text form of the block.

        A subgraph ``call`` names its callee (``callee = @name``, as MAX prints
        it); each called subgraph is printed once, after the block.
        """
        callees: dict[str, Block] = {}
        lines = [self._format_body(indent, callees)]
        printed: set[str] = set()
        while len(printed) < len(callees):
            for name, block in list(callees.items()):
                if name not in printed:
                    printed.add(name)
                    lines.append(block._format_body(indent, callees))
        return "\n".join(lines)

    def _format_body(self, indent: str, callees: dict[str, Block]) -> str:
        lines = [f"{indent}{self.name}({', '.join(f'%{v.id}: {v.type}' for v in self.inputs)}) {{"]
        for n in self.nodes:
            outs = ", ".join(f"%{v.id}" for v in n.outputs)
            args = ", ".join(f"%{v.id}" for v in n.inputs)
            shown = {k: p for k, p in n.params.items() if not isinstance(p, Block)}
            if n.op == "call":
                callees.setdefault(n.params["name"], n.params["block"])
                params = ", ".join([f"callee = @{shown.pop('name')}", *(f"{k}={_short(p)}" for k, p in shown.items())])
            else:
                params = ", ".join(f"{k}={_short(p)}" for k, p in shown.items())
            lhs = f"{outs} = " if outs else ""
            types = " : " + ", ".join(str(v.type) for v in n.outputs) if n.outputs else ""
            lines.append(f"{indent}  {lhs}{n.op}({args}{', ' if args and params else ''}{params}){types}")
            if n.op == "call":
                continue
            for p in n.params.values():
                for b in blocks_in(p):
                    lines.append(b._format_body(indent + "    ", callees))
        lines.append(f"{indent}  return {', '.join(f'%{v.id}' for v in self.outputs)}")
        lines.append(f"{indent}}}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def blocks_in(p: Any) -> Iterable[Block]:
    """The blocks held by a node param: the param itself, or those in a (nested) list or tuple."""
    if isinstance(p, Block):
        yield p
    elif isinstance(p, (tuple, list)):
        for x in p:
            yield from blocks_in(x)


def weight_reads(nodes: Iterable[Node], prefix: str = "") -> Iterator[tuple[str, Node]]:
    """``(qualified weight name, weight node)`` for every weight read by ``nodes`` and their nested blocks.

    A subgraph ``call`` reads its weights under the call's prefix (prefixes nest).
    """
    for n in nodes:
        if n.op == "weight":
            yield prefix + n.params["name"], n
        inner = prefix + n.params["prefix"] if n.op == "call" else prefix
        for p in n.params.values():
            for b in blocks_in(p):
                yield from weight_reads(b.nodes, inner)


def uses_op(nodes: Iterable[Node], op: str) -> bool:
    """Whether ``op`` is applied by ``nodes`` or inside their nested blocks (branches, loop bodies, subgraphs)."""
    return any(n.op == op or any(uses_op(b.nodes, op) for p in n.params.values() for b in blocks_in(p)) for n in nodes)


def _nested_free_vars(params: Mapping[str, Any]) -> Iterable[Var]:
    for p in params.values():
        for b in blocks_in(p):
            yield from b.free_vars()


def _short(p: Any) -> str:
    if isinstance(p, ConstantValue):
        return repr(p)
    s = str(p) if isinstance(p, (enum.Enum, DeviceRef)) else repr(p)
    return s if len(s) < 60 else s[:57] + "..."


def _type_key(t: Type) -> Any:
    return t.key() if hasattr(t, "key") else repr(t)


class ConstantValue:
    """A numpy array held as a node param, hashed by content (not identity)."""

    __slots__ = ("array", "_digest")

    def __init__(self, array: np.ndarray):
        self.array = array
        self._digest = None

    def digest(self) -> str:
        if self._digest is None:
            # Shape and dtype come from the original array: ascontiguousarray makes 0-d arrays 1-d.
            a = self.array
            data = np.ascontiguousarray(a).view(np.uint8).tobytes()
            self._digest = hashlib.sha256(data + str((a.shape, a.dtype)).encode()).hexdigest()
        return self._digest

    def __repr__(self) -> str:
        a = self.array
        if a.size <= 8:
            return f"const({a.tolist()!r}, {a.dtype})"
        return f"const(<{a.dtype}{list(a.shape)}>)"


def holds_graph_values(p: Any) -> bool:
    """True if a param (recursively) holds a `Block` or `Var`.

    Their meaning depends on the enclosing graph (captured vars and their
    types), so rules over such params are not memoised.
    """
    if isinstance(p, (Block, Var)):
        return True
    if isinstance(p, (tuple, list)):
        return any(holds_graph_values(x) for x in p)
    if isinstance(p, dict):
        return any(holds_graph_values(x) for x in p.values())
    return False


def param_key(p: Any, numbering: dict[int, int] | None = None) -> Any:
    """A hashable, deterministic key for a node param."""
    if p is None or isinstance(p, (bool, int, float, str, bytes)):
        return (type(p).__name__, p)
    if isinstance(p, Dim):
        return (
            "dim",
            str(p.dim) if p.__class__ is StaticDim else str(p),
        )  # str(StaticDim(n)) == str(n), without formatting
    if isinstance(p, ConstantValue):
        return ("const", p.digest())
    if isinstance(p, np.ndarray):
        return ("const", ConstantValue(p).digest())
    if isinstance(p, (tuple, list)):
        return ("seq", tuple(param_key(x, numbering) for x in p))
    if isinstance(p, dict):
        return ("dict", tuple(sorted((str(k), param_key(v, numbering)) for k, v in p.items())))
    if isinstance(p, Block):
        return ("block", p._structure({} if numbering is None else numbering))
    if isinstance(p, Var):
        if numbering is None:
            return ("var", "id", p.id)  # ids are never reused
        return ("var", numbering.setdefault(p.id, len(numbering)))
    if isinstance(p, slice):
        return ("slice", param_key((p.start, p.stop, p.step), numbering))
    if isinstance(p, Type):
        return ("type", p.key() if hasattr(p, "key") else repr(p))
    if hasattr(p, "__maxfx_param_key__"):
        return p.__maxfx_param_key__()
    if isinstance(p, np.generic):
        return ("npscalar", str(p.dtype), p.item())
    try:
        hash(p)
    except TypeError:
        return ("obj", id(p))
    return ("hashable", type(p).__qualname__, p)
