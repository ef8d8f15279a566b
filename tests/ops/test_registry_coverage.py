"""The op table (``tests/ops/op_table.py``) covers the registry, op for op.

Every op the library registers has a record, every record names a registered
op, every differentiable op has a gradient example (or says why not), and the
test modules a record names exist and test the op.
"""

import re
from pathlib import Path

import numpy as np

import lowering.ops  # noqa: F401  (registers every op)
from lowering.registry import OpDef, all_ops, fronts
from tests.ops.op_table import OP_TABLE, Example

TESTS = Path(__file__).resolve().parent
WHERE = "tests/ops/op_table.py (OP_TABLE)"


def library_ops() -> dict[str, OpDef]:
    """``all_ops()`` less the ops registered outside the library (user code, docs/pages/ops.md's example)."""
    return {
        name: op
        for name, op in all_ops().items()
        if op.front is None or (op.front.__module__ or "").split(".")[0] in ("lowering", "maxfx")
    }


def test_every_registered_op_has_a_record():
    missing = sorted(set(library_ops()) - set(OP_TABLE))
    assert not missing, (
        f"registered ops without a record: {missing}; add one per op to {WHERE}: its value example (numpy reference), "
        "gradient example if differentiable, and the tests/ops module with its graph tests"
    )


def test_every_record_is_a_registered_op():
    stale = sorted(set(OP_TABLE) - set(library_ops()))
    assert not stale, f"records in {WHERE} for ops the registry does not have: {stale}"


def test_gradient_examples_match_differentiability():
    ops = all_ops()
    need = sorted(n for n, rec in OP_TABLE.items() if ops[n].differentiable and bool(rec.grads) == bool(rec.no_grad))
    assert not need, (
        f"differentiable ops whose record in {WHERE} needs a gradient example, grad(...), or else a no_grad reason "
        f"(not both): {need}"
    )
    stale = sorted(n for n, rec in OP_TABLE.items() if not ops[n].differentiable and (rec.grads or rec.no_grad))
    assert not stale, (
        f"ops registered with differentiable=False whose record in {WHERE} has a gradient example or no_grad: {stale}"
    )


def _malformed(name: str, ex: Example) -> str | None:
    if ex.reference is None and not ex.wrt:
        return f"{name}: an example with neither a reference nor differentiated inputs checks nothing"
    if not all(isinstance(a, np.ndarray) for a in ex.inputs):
        return f"{name}: example inputs must be numpy arrays"
    if not all(0 <= i < len(ex.inputs) and np.issubdtype(ex.inputs[i].dtype, np.floating) for i in ex.wrt):
        return f"{name}: wrt must index float inputs, got {ex.wrt}"
    return None


def test_examples_are_well_formed():
    problems = [p for name, rec in OP_TABLE.items() for ex in rec.examples if (p := _malformed(name, ex))]
    assert not problems, "\n".join(problems)


def _module_problems(name: str) -> list[str]:
    rec, op = OP_TABLE[name], all_ops()[name]
    if not rec.tested_in:
        return [f"{name}: its record in {WHERE} names no tests/ops module"]
    front = next((key for key, fn in fronts().items() if fn is op.front), None)
    # The op's front (``ops.max`` serves reduce_max), its name in quotes, or, for an op without a front, its name.
    mention = rf"\bops\.{front}\b|[\"']{name}[\"']" if front else rf"\b{name}\b"
    problems = []
    for module in rec.tested_in:
        path = TESTS / f"{module}.py"
        if not path.exists():
            problems.append(f"{name}: {WHERE} names tests/ops/{module}.py, which does not exist")
        elif not re.search(mention, path.read_text()):
            problems.append(f"{name}: tests/ops/{module}.py never uses the op (no match for {mention!r})")
    return problems


def test_records_name_modules_that_test_the_op():
    problems = [p for name in sorted(OP_TABLE) for p in _module_problems(name)]
    assert not problems, "\n".join(problems)
