"""Every value example of the op table (``tests/ops/op_table.py``) run three ways against numpy.

The examples are taken op by op from ``lowering.registry.all_ops()``; each
calls its op through ``maxfx.functional`` (the op's front made eager-capable
where ``F`` has no name for it):

1. eager: inputs are realized tensors and the result is realized right away;
2. fused: inputs are themselves pending (one extra node each), the op and a
   trailing identity are recorded lazily, and the whole graph is realized twice
   — the second time through the cached fused XLA program;
3. jit: the same call inside ``jax.jit`` (Tensors are pytrees holding tracers).

References are numpy (or scipy, gguf); the three maxfx results must also agree
with each other. A new op's example goes into its record in the op table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import pytest

import lowering.ops  # noqa: F401  (registers every op)
from lowering.eager import eager_stats, lazy
from lowering.registry import OpDef, all_ops, fronts
from maxfx import functional as F
from maxfx.experimental.functional import functional
from maxfx.tensor import Tensor
from tests.ops.op_table import OP_TABLE, Example

# Functional names whose ops have no value example here, and the test that checks them.
ELSEWHERE = {
    "buffer_store": "tests/eager/test_tensor.py::test_functional_graph_only",
    "buffer_store_slice": "tests/eager/test_tensor.py::test_functional_graph_only",
    "constant_external": "tests/eager/test_tensor.py::test_functional_graph_only",
    "custom": "tests/eager/test_tensor.py::test_functional_custom",
    "functional": "tests/eager/test_tensor.py::test_functional_decorator",
    "lazy": "tests/eager/test_realization.py",
}


def _front_name(op: OpDef) -> str | None:
    return next((name for name, fn in fronts().items() if fn is op.front), None)


def _eager_front(op: OpDef) -> Callable[..., Any]:
    """``maxfx.functional``'s function for ``op`` (its front made eager-capable where F has none)."""
    name = _front_name(op)
    return getattr(F, name) if name in F.__all__ else functional(op.front)


def _value_examples() -> list[Any]:
    return [
        pytest.param(name, i, id=name if i == 0 else f"{name}-{i}")
        for name in sorted(all_ops())
        if name in OP_TABLE
        for i, _ in enumerate(OP_TABLE[name].values)
    ]


def test_every_functional_name_is_tested():
    """Each ``maxfx.functional`` name reaches an op with a value example here, or is checked in ELSEWHERE."""
    with_values = {name for name, rec in OP_TABLE.items() if rec.values}
    untested = sorted(
        name
        for name in set(F.__all__) - set(ELSEWHERE)
        if not any(_front_name(op) == name for op_name, op in all_ops().items() if op_name in with_values)
    )
    assert not untested, (
        "maxfx.functional names with no value example in tests/ops/op_table.py (add one to their op's record): "
        f"{untested}"
    )
    assert set(ELSEWHERE) <= set(F.__all__), sorted(set(ELSEWHERE) - set(F.__all__))


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _numpy(out: Any) -> list[np.ndarray]:
    return [np.asarray(t.to_numpy()) for t in _as_list(out)]


def _compare(name: str, got: list[np.ndarray], example: Example, way: str) -> None:
    want = [np.asarray(w) for w in _as_list(example.reference(*example.inputs))]
    assert len(got) == len(want), f"{name} ({way}): {len(got)} outputs, expected {len(want)}"
    for g, w in zip(got, want):
        assert g.shape == w.shape, f"{name} ({way}): shape {g.shape} != {w.shape}"
        if w.dtype.kind in "fc":
            np.testing.assert_allclose(
                g.astype(np.float64), w, rtol=example.tol, atol=example.tol, err_msg=f"{name} ({way})"
            )
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{name} ({way})")


def _identity(t: Tensor) -> Tensor:
    """A pending no-op node, so that inputs and outputs of the op are part of one lazy graph."""
    return F.reshape(t, t.shape)


def _runs_at_once(op: OpDef) -> bool:
    """The registry's immediacy: such ops run when called, even on pending inputs."""
    return op.immediate or op.data_dependent or op.effect or bool(op.mutates)


@pytest.mark.parametrize("name,index", _value_examples())
def test_three_ways(name, index):
    op = all_ops()[name]
    example = OP_TABLE[name].values[index]
    f = _eager_front(op)

    def call(*tensors: Tensor) -> Any:
        return example.call(f, *tensors)

    # 1. eager (MAX's default: each op runs when called)
    eager = _numpy(call(*[Tensor(a) for a in example.inputs]))
    _compare(name, eager, example, "eager")

    # 2. fused (inside F.lazy): pending inputs, op, pending outputs; the second run goes through the compiled program
    def fused_once():
        with lazy():
            pending_inputs = [_identity(Tensor(a)) for a in example.inputs]
            outs = [_identity(o) for o in _as_list(call(*pending_inputs))]
            assert _runs_at_once(op) or all(not o.real for o in outs), (
                f"{name}: a recorded op was realized before being observed"
            )
        return _numpy(outs)

    fused_once()
    before = eager_stats()
    fused = fused_once()
    after = eager_stats()
    if not _runs_at_once(op):
        assert after["fused_runs"] > before["fused_runs"], f"{name}: second run did not use the fused program"
    _compare(name, fused, example, "fused")

    # 3. under jax.jit
    traced = _numpy(jax.jit(call)(*[Tensor(a) for a in example.inputs]))
    _compare(name, traced, example, "jit")

    # Fusion may reorder float rounding (XLA); beyond that the three must agree.
    for a, b, c in zip(eager, fused, traced):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6, err_msg=f"{name}: eager vs fused")
        np.testing.assert_allclose(a, c, rtol=2e-6, atol=1e-6, err_msg=f"{name}: eager vs jit")
