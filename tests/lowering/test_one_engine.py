"""One engine: every mode binds through one plan, runs impls in one place, caches in one table.

The graph API, eager tensors and ops on JAX arrays/tracers differ only in what
their context does with a `BindPlan`; these tests hold them to that.
"""

from __future__ import annotations

import ast
import doctest
import importlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowering.ops  # noqa: F401  (registers the ops)
from lowering import eager
from lowering.executables import EXECUTABLES, ExecutableCache
from lowering.plan import bind_plan
from lowering.registry import all_ops, get_op
from lowering.types import DeviceRef, TensorType
from maxfx import functional as F
from maxfx.dtype import DType
from maxfx.graph import Graph, ops
from maxfx.tensor import Tensor

ROOT = Path(__file__).resolve().parents[2]


def _impl_calls() -> list[str]:
    """Every ``<something>.impl(...)`` call in the library."""
    found = []
    for package in ("maxfx", "lowering", "custom_calls"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "impl":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_exactly_one_place_calls_an_op_implementation():
    calls = _impl_calls()
    assert calls == ["lowering/interpret.py:" + calls[0].split(":")[1]], calls


# ─── one plan ─────────────────────────────────────────────────────────────


def test_the_plan_is_shared_across_contexts():
    add = get_op("add")
    t = TensorType(DType.int32, [3])
    assert bind_plan(add, (t, int), {}) is bind_plan(add, (t, int), {})
    with Graph("g", input_types=[t]) as g:
        y = g.inputs[0].tensor + 2
        g.output(y)
    x = Tensor(np.arange(3, dtype=np.int32))
    assert (x + 2).type == y.type  # same plan, same output type in graph and eager


def _in_graph(fn, *arrays):
    types = [TensorType(DType.from_numpy(a.dtype), a.shape) for a in arrays]
    with Graph("g", input_types=types) as g:
        g.output(fn(*[v.tensor for v in g.inputs]))
    return g


def _eager(fn, *arrays):
    return fn(*[Tensor(a) for a in arrays]).to_numpy()


def _traced(fn, *arrays):
    return np.asarray(jax.jit(lambda *xs: fn(*xs))(*[jnp.asarray(a) for a in arrays]))


MODES = {"graph": _in_graph, "eager": _eager, "jit": _traced}

_I32 = np.arange(3, dtype=np.int32)


@pytest.mark.parametrize(
    "case, fn",
    [
        ("python float into int32", lambda x: ops.add(x, 1.5)),
        ("numpy float array into int32", lambda x: ops.mul(x, np.array([0.5, 1.0, 2.0]))),
        ("bad broadcast", lambda x: ops.add(x, np.ones((2,), np.int32))),
        ("string operand", lambda x: ops.sub(x, "1")),
    ],
)
def test_bad_input_is_refused_the_same_way_in_every_mode(case, fn):
    errors = {}
    for mode, run in MODES.items():
        with pytest.raises((TypeError, ValueError)) as info:
            run(fn, _I32)
        errors[mode] = (type(info.value), str(info.value))
    assert len(set(errors.values())) == 1, f"{case}: {errors}"


@pytest.mark.parametrize(
    "fn, expected",
    [
        (lambda x: ops.add(x, 2), _I32 + 2),
        (lambda x: ops.mul(x, np.array([1, 2, 3])), _I32 * np.array([1, 2, 3], np.int32)),
        (lambda x: x - 1, _I32 - 1),
        (lambda x: ops.max(x, np.int32(1)), np.maximum(_I32, 1)),
    ],
)
def test_untyped_data_is_accepted_the_same_way_in_every_mode(fn, expected):
    with Graph("g", input_types=[TensorType(DType.int32, [3])]) as g:
        out = fn(g.inputs[0].tensor)
        g.output(out)
    assert out.type.dtype is DType.int32
    np.testing.assert_array_equal(_eager(fn, _I32), expected)
    np.testing.assert_array_equal(_traced(fn, _I32), expected)


def test_jax_arrays_are_typed_values_in_every_mode():
    """A jax.Array keeps its dtype: next to an eager tensor, in a graph and under jit alike."""
    x = np.arange(3, dtype=np.float32)
    j = jnp.asarray([1, 2, 3], dtype=jnp.int32)
    with pytest.raises(ValueError, match="incompatible input dtypes"):
        F.add(Tensor(x), j)
    with (
        Graph("g", input_types=[TensorType(DType.float32, [3])]) as g,
        pytest.raises(ValueError, match="incompatible input dtypes"),
    ):
        ops.add(g.inputs[0].tensor, j)
    np.testing.assert_array_equal(F.add(Tensor(x), j.astype(jnp.float32)).to_numpy(), x + [1, 2, 3])


# ─── immediacy is a registry flag ─────────────────────────────────────────


def test_immediate_ops_are_flagged_in_the_registry():
    flagged = {name for name, op in all_ops().items() if op.immediate}
    assert {"transfer_to", "custom", "inplace_custom"} <= flagged
    assert not get_op("add").immediate
    src = (ROOT / "lowering" / "eager.py").read_text()
    assert "_IMMEDIATE" not in src  # no hard-coded name list beside the flag


def test_eager_records_ordinary_ops_and_runs_immediate_ones():
    x = Tensor([1.0, 2.0])
    with F.lazy():
        y = x + 1
    assert not y.real
    found = F.nonzero(y - 2, out_dim="n")  # data-dependent shape: runs at once
    assert found.real
    np.testing.assert_array_equal(found.to_numpy(), [[1]])


# ─── one executable cache ─────────────────────────────────────────────────


def test_eager_realization_uses_the_shared_executable_cache():
    EXECUTABLES.clear()
    x = Tensor(np.arange(5, dtype=np.float32))
    for _ in range(3):  # inside F.lazy: first sighting runs op by op, the second compiles, the third hits
        with F.lazy():
            y = F.exp(x) * 3 - 1
        y.to_numpy()
    (F.exp(x) * 3 - 1).to_numpy()  # MAX's default mode: each op is a program of its own, in the same cache
    kinds = [k[0] for k in EXECUTABLES._entries]
    assert kinds.count("eager") >= 1 and kinds.count("op") == 3


def test_executable_cache_is_bounded_lru():
    cache = ExecutableCache(capacity=3)
    for i in range(5):
        cache.put(("eager", i), i)
    assert len(cache) == 3 and cache.get(("eager", 0)) is None
    cache.get(("eager", 2))
    cache.put(("eager", 5), 5)
    assert cache.get(("eager", 2)) == 2 and cache.get(("eager", 3)) is None
    with pytest.raises(ValueError, match="capacity"):
        ExecutableCache(0)


def test_pending_work_is_an_ir_block_run_by_the_interpreter():
    x = Tensor([1.0, 4.0])
    with F.lazy():
        y = F.sqrt(x) + 1
    block = eager.pending_block([y._var])
    assert [n.op for n in block.nodes] == ["sqrt", "add"]
    np.testing.assert_allclose(y.to_numpy(), [2.0, 3.0])


def test_captured_data_lands_on_the_device_of_the_graph_values():
    """An eager tensor or JAX array next to graph values becomes a constant on their device (building only)."""
    gpu = DeviceRef.GPU()
    with Graph("g", input_types=[TensorType(DType.float32, [3], gpu)]) as g:
        y = ops.add(g.inputs[0].tensor, Tensor([1.0, 2.0, 3.0]))
        z = ops.mul(g.inputs[0].tensor, jnp.ones(3, jnp.float32))
        g.output(y, z)
    assert y.type.device == gpu and z.type.device == gpu
    constants = [n for n in g._ir.nodes if n.op == "constant"]
    assert [n.outputs[0].type.device for n in constants] == [gpu, gpu]


@pytest.mark.parametrize(
    "module",
    [
        "lowering.plan",
        "lowering.executables",
        "lowering.registry",
        "lowering.piecewise",
        "maxfx.experimental._random_state",
    ],
)
def test_engine_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
    if module.endswith("_random_state"):
        importlib.import_module(module).seed(0)  # the example re-seeds the process-wide stream
