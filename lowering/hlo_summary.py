"""Kernel summaries of a compiled XLA program: one line per kernel it launches (MAX's ``Model.kernel_summaries``).

XLA's optimized HLO runs a sequence of instructions in its entry computation;
each ``fusion`` is one kernel built from the ops of the computation it calls,
and each other computing instruction (a ``dot``, a ``custom-call``, a
``while``...) is one more. `kernel_summaries` names each: a fusion as
``Kind(op, op, ...)`` (its fusion kind: Loop, Input, Output, Custom, and the
distinct ops it fuses, in order), another instruction by its opcode
(a custom call with its target).

Example:
    >>> hlo = '''
    ... %fused_computation (p: f32[4]) -> f32[4] {
    ...   %p = f32[4]{0} parameter(0)
    ...   %e = f32[4]{0} exponential(%p)
    ...   ROOT %m = f32[4]{0} multiply(%e, %e)
    ... }
    ... ENTRY %main (x: f32[4]) -> f32[4] {
    ...   %x = f32[4]{0} parameter(0)
    ...   ROOT %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_computation
    ... }'''
    >>> kernel_summaries(hlo)
    ['Loop(exponential, multiply)']
"""

from __future__ import annotations

import re

__all__ = ["kernel_summaries"]

_HEADER = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s*\(")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*(.*)$")
_OPCODE = re.compile(r"(?:^|[\s}\]])([a-z][a-z0-9\-]*)\(")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_KIND = re.compile(r"kind=k(\w+)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
# Instructions that move no data or only name it: not kernels.
_FREE = {
    "parameter",
    "constant",
    "tuple",
    "get-tuple-element",
    "bitcast",
    "after-all",
    "partition-id",
    "replica-id",
    "opt-barrier",
}


def _computations(hlo: str) -> tuple[dict[str, list[str]], str | None]:
    comps: dict[str, list[str]] = {}
    entry = current = None
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header and line.rstrip().endswith("{"):
            current = header.group(2)
            comps[current] = []
            if header.group(1):
                entry = current
        elif line.strip() == "}":
            current = None
        elif current is not None:
            comps[current].append(line)
    return comps, entry


def _opcode(line: str) -> str | None:
    m = _INSTRUCTION.match(line)
    if not m:
        return None
    op = _OPCODE.search(m.group(1))
    return op.group(1) if op else None


def _fused_ops(comps: dict[str, list[str]], name: str, seen: set[str]) -> list[str]:
    ops: list[str] = []
    for line in comps.get(name, ()):
        op = _opcode(line)
        if op is None or op in _FREE:
            continue
        called = _CALLS.search(line)
        if op == "fusion" and called and called.group(1) not in seen:
            seen.add(called.group(1))
            ops.extend(_fused_ops(comps, called.group(1), seen))
            continue
        label = _TARGET.search(line).group(1) if op == "custom-call" and _TARGET.search(line) else op
        ops.append(label)
    return list(dict.fromkeys(ops))


def kernel_summaries(hlo: str) -> list[str]:
    """One string per kernel of the entry computation of optimized HLO text (``compiled.as_text()``)."""
    comps, entry = _computations(hlo)
    if entry is None:
        return []
    out = []
    for line in comps[entry]:
        op = _opcode(line)
        if op is None or op in _FREE:
            continue
        if op == "fusion":
            called = _CALLS.search(line)
            kind = _KIND.search(line)
            inner = _fused_ops(comps, called.group(1), {called.group(1)}) if called else []
            out.append(f"{kind.group(1) if kind else 'Fusion'}({', '.join(inner)})")
        elif op == "custom-call" and _TARGET.search(line):
            out.append(f"custom-call({_TARGET.search(line).group(1)})")
        else:
            out.append(op)
    return out
