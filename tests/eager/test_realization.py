"""MAX's eager realization semantics: ops run when called; ``F.lazy()`` records and fuses.

References: MAX's documentation of ``Tensor.real``/``realize`` and its own unit
tests (``max/tests/tests/test_tensor.py``): after ``c = a + b`` outside
``F.lazy()``, ``c.real`` is true; inside, results stay pending until observed or
awaited, and leaving the block runs nothing.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from lowering.compile import clear_cache
from lowering.eager import eager_stats, is_lazy
from maxfx.dtype import DType
from maxfx.experimental import functional as F
from maxfx.experimental import random
from maxfx.experimental.tensor import Tensor
from maxfx.graph import BufferValue, TensorValue


def test_ops_run_when_called_by_default():
    a = Tensor(np.zeros((5, 5), np.float32))
    b = a + a + 1
    assert b.real and b.storage is not None
    np.testing.assert_array_equal(b.to_numpy(), np.ones((5, 5), np.float32))
    before = eager_stats()["op_runs"]
    c = F.exp(a)
    assert c.real and eager_stats()["op_runs"] == before + 1


def test_repeated_operators_reuse_one_program_and_stay_correct():
    """The eager operator shortcut: the second ``x * y`` of the same types runs the first's program."""
    rng = np.random.default_rng(0)
    for a_np, scalar in ((rng.standard_normal(6).astype(np.float32), 2.5), (np.arange(6, dtype=np.int32), 3)):
        a = Tensor(a_np)
        for k in range(3):  # new values each time, same shapes and dtypes
            b_np = a_np + k
            b = Tensor(b_np)
            before = eager_stats()
            got = {"add": a + b, "rsub": scalar - a, "mul": a * scalar, "lt": a < b, "pow": a**2, "eq": a == b_np[0]}
            after = eager_stats()
            assert after["op_runs"] - before["op_runs"] == len(got) and all(t.real for t in got.values())
            if k:
                assert after["compiles"] == before["compiles"]
            want = {
                "add": a_np + b_np,
                "rsub": scalar - a_np,
                "mul": a_np * scalar,
                "lt": a_np < b_np,
                "pow": a_np**2,
                "eq": a_np == b_np[0],
            }
            for name, t in got.items():
                np.testing.assert_allclose(t.to_numpy(), want[name], rtol=1e-6, err_msg=name)
    with F.lazy():  # inside lazy() the same operators record instead of running
        y = Tensor(np.ones(3, np.float32)) * 2
        assert not y.real
    np.testing.assert_array_equal(y.to_numpy(), np.full(3, 2, np.float32))
    clear_cache()  # drops the operators' programs too: the next call compiles again
    before = eager_stats()["compiles"]
    np.testing.assert_array_equal((a * scalar).to_numpy(), a_np * scalar)
    assert eager_stats()["compiles"] == before + 1


def test_repeated_unary_functional_ops_reuse_one_program_and_stay_correct():
    rng = np.random.default_rng(1)
    cases = {"exp": (F.exp, np.exp), "sqrt": (F.sqrt, np.sqrt), "abs": (F.abs, np.abs), "neg": (F.negate, np.negative)}
    for k in range(3):
        x_np = rng.uniform(0.5, 2.0, 5).astype(np.float32)
        i_np = rng.integers(-9, 9, 5).astype(np.int32)
        x, i = Tensor(x_np), Tensor(i_np)
        before = eager_stats()
        got = {name: fn(x) for name, (fn, _) in cases.items()}
        got_int = F.abs(i)
        after = eager_stats()
        assert after["op_runs"] - before["op_runs"] == len(cases) + 1
        if k:
            assert after["compiles"] == before["compiles"]
        for name, (_, ref) in cases.items():
            np.testing.assert_allclose(got[name].to_numpy(), ref(x_np), rtol=1e-6, err_msg=name)
        np.testing.assert_array_equal(got_int.to_numpy(), np.abs(i_np))
        assert got_int.dtype == DType.int32


def test_repeated_ops_with_params_reuse_one_program_per_params_and_stay_correct():
    """Ops with params (axis, shape, split sizes, k) keep one program per (input types, params):
    the same call on new values compiles nothing, other params get their own program."""
    rng = np.random.default_rng(2)
    cases = {
        "sum": (lambda t: F.sum(t, axis=-1), lambda a: a.sum(-1, keepdims=True)),
        "max0": (lambda t: F.max(t, axis=0), lambda a: a.max(0, keepdims=True)),
        "reshape": (lambda t: F.reshape(t, [4, 3]), lambda a: a.reshape(4, 3)),
        "transpose": (lambda t: F.transpose(t, 0, 1), lambda a: a.T),
        "softmax": (F.softmax, lambda a: np.exp(a) / np.exp(a).sum(-1, keepdims=True)),
        "row": (lambda t: t[1], lambda a: a[1]),
        "matmul": (lambda t: t @ F.transpose(t, 0, 1), lambda a: a @ a.T),
    }
    for k in range(3):
        a_np = rng.standard_normal((3, 4)).astype(np.float32)
        a = Tensor(a_np)
        before = eager_stats()
        got = {name: fn(a) for name, (fn, _) in cases.items()}
        top_values, top_indices = F.top_k(a, k=2, axis=-1)  # two results from one program
        first, second = F.split(a, [1, 3], axis=-1)
        after = eager_stats()
        if k:
            assert after["compiles"] == before["compiles"]
        for name, (_, ref) in cases.items():
            np.testing.assert_allclose(got[name].to_numpy(), ref(a_np), rtol=1e-5, atol=1e-6, err_msg=name)
        order = np.argsort(-a_np, axis=-1)[:, :2]
        np.testing.assert_array_equal(top_indices.to_numpy(), order)
        np.testing.assert_allclose(top_values.to_numpy(), np.take_along_axis(a_np, order, -1))
        np.testing.assert_array_equal(first.to_numpy(), a_np[:, :1])
        np.testing.assert_array_equal(second.to_numpy(), a_np[:, 1:])
    # Other params are another program, never the first one's.
    np.testing.assert_allclose(F.sum(a, axis=0).to_numpy(), a_np.sum(0, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(F.reshape(a, [2, 6]).to_numpy(), a_np.reshape(2, 6))
    clear_cache()  # drops the kept programs: the next call compiles again
    before = eager_stats()["compiles"]
    np.testing.assert_allclose(F.sum(a, axis=-1).to_numpy(), a_np.sum(-1, keepdims=True), rtol=1e-6)
    assert eager_stats()["compiles"] == before + 1


def test_lazy_records_until_observed_and_leaving_the_block_runs_nothing():
    a = Tensor(np.zeros((2, 2), np.float32))
    with F.lazy():
        assert is_lazy()
        b = a + a + 1
        assert not b.real and b.storage is None
    assert not is_lazy()
    assert not b.real  # leaving lazy() does not realize
    assert b.type == a.type
    assert asyncio.run(b.realize) is b and b.real
    np.testing.assert_array_equal(b.to_numpy(), np.ones((2, 2), np.float32))


def test_lazy_chain_runs_as_one_program():
    x = Tensor(np.linspace(-1, 1, 8, dtype=np.float32))

    def chain():
        with F.lazy():
            y = F.tanh(F.relu(x * 1.5 + 1.0) - 0.5)
        return y.to_numpy()

    expected = np.tanh(np.maximum(np.linspace(-1, 1, 8, dtype=np.float32) * 1.5 + 1.0, 0) - 0.5)
    np.testing.assert_allclose(chain(), expected, rtol=1e-6)  # first sighting: op by op
    before = eager_stats()
    np.testing.assert_allclose(chain(), expected, rtol=1e-6)
    after = eager_stats()
    assert after["compiles"] - before["compiles"] == 1 and after["fused_runs"] - before["fused_runs"] == 1
    assert after["op_runs"] == before["op_runs"]


def test_nested_lazy_blocks_and_an_error_inside_one_restores_the_mode():
    x = Tensor([1.0, 2.0])
    with F.lazy():
        with F.lazy():
            y = x * 2
        z = y + 1
        assert not z.real
    assert not is_lazy()
    with pytest.raises(RuntimeError), F.lazy():
        raise RuntimeError("boom")
    assert not is_lazy() and (x + 1).real
    np.testing.assert_array_equal(z.to_numpy(), [3.0, 5.0])


def test_lazy_is_per_thread():
    seen = []
    with F.lazy():
        t = threading.Thread(target=lambda: seen.append((Tensor([1.0]) + 1).real))
        t.start()
        t.join()
        assert not (Tensor([1.0]) + 1).real
    assert seen == [True]


def test_random_draws_follow_the_mode():
    assert random.normal([3]).real
    with F.lazy():
        r = random.uniform([3], range=(0, 1))
    assert not r.real
    values = r.to_numpy()
    assert ((values >= 0) & (values < 1)).all()


def test_default_mode_results_match_numpy_for_ints_and_multi_output_ops():
    i = Tensor(np.arange(6, dtype=np.int64).reshape(2, 3))
    np.testing.assert_array_equal((i * 3 + 1).to_numpy(), np.arange(6).reshape(2, 3) * 3 + 1)
    assert (i * 3).dtype == i.dtype
    values, indices = F.top_k(Tensor([3.0, 1.0, 2.0]), 2, -1)
    assert values.real and indices.real
    np.testing.assert_array_equal(values.to_numpy(), [3.0, 2.0])
    np.testing.assert_array_equal(indices.to_numpy(), [0, 2])


def test_awaiting_realize_inside_a_coroutine():
    async def main():
        with F.lazy():
            y = Tensor([1.0, 2.0]) * 4
        t = await y.realize
        return t.to_numpy().tolist()

    assert asyncio.run(main()) == [4.0, 8.0]


def test_an_eager_tensor_is_its_own_buffer_and_writes_keep_program_order():
    """MAX's test_mutation_op_order: results computed before a write keep the old value."""
    a = Tensor.zeros([1])
    b = Tensor.ones_like(a.type)
    c = a + b
    F.buffer_store(a, b)
    d = a + b
    assert [a.item(), b.item(), c.item(), d.item()] == [1.0, 1.0, 1.0, 2.0]


def test_a_write_inside_lazy_is_recorded_and_ordered():
    with F.lazy():
        a = Tensor.zeros([2])
        b = Tensor.ones_like(a.type)
        c = a + b
        F.buffer_store(a, b * 3)
        d = a + b
        assert not a.real
    np.testing.assert_array_equal(c.to_numpy(), [1.0, 1.0])  # read before the write
    np.testing.assert_array_equal(d.to_numpy(), [4.0, 4.0])  # read after it
    np.testing.assert_array_equal(a.to_numpy(), [3.0, 3.0])


def test_buffer_store_slice_on_an_eager_tensor_and_errors():
    t = Tensor(np.zeros((2, 3), np.float32))
    F.buffer_store_slice(t, Tensor(np.ones((1, 3), np.float32)), [slice(0, 1)])
    np.testing.assert_array_equal(t.to_numpy(), [[1, 1, 1], [0, 0, 0]])
    with pytest.raises(ValueError, match="shape"):
        F.buffer_store(t, Tensor(np.ones((3,), np.float32)))
    np.testing.assert_array_equal(t.to_numpy(), [[1, 1, 1], [0, 0, 0]])  # nothing half-applied


def test_cast_to_the_same_dtype_is_the_tensor_itself():
    t = Tensor([1.0, 2.0])
    assert t.cast(t.dtype) is t
    assert t.cast(DType.int32).dtype is DType.int32


def test_creations_inside_lazy_are_pending_too():
    with F.lazy():
        z = Tensor.zeros([2, 2])
        o = Tensor.ones_like(z.type)
        f = Tensor.full([3], 7, dtype=DType.int32)
        assert not (z.real or o.real or f.real)
    assert Tensor.zeros([2]).real  # outside: created at once
    np.testing.assert_array_equal((z + o).to_numpy(), np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(f.to_numpy(), [7, 7, 7])
    assert f.dtype is DType.int32


def test_graph_value_constructors_take_eager_tensors_outside_a_graph():
    """MAX: TensorValue(t) / BufferValue(t) of an eager tensor inside F.lazy() are values of the lazy graph.

    In maxfx an eager tensor is its own value and its own buffer, so both return it; BufferValue
    inside F.lazy() leaves it pending (a later recorded op may write it) until realized.
    """
    a = Tensor(np.arange(4, dtype=np.float32))
    assert TensorValue(a) is a and BufferValue(a) is a and a.real
    with F.lazy():
        b = BufferValue(a)
        assert b is a and not a.real
        F.buffer_store(b, a * 2)
    asyncio.run(a.realize)
    assert a.real
    np.testing.assert_array_equal(a.to_numpy(), [0.0, 2.0, 4.0, 6.0])
    with pytest.raises(TypeError, match="BufferValue: expected a buffer value"):
        BufferValue(np.zeros(2))


def test_constants_made_inside_a_trace_stay_concrete_and_serve_eager_ops_after():
    # One bind for every mode: an op on a traced tensor converts its Python scalar through the same (cached) constant
    # as an eager op. Made while tracing, it must still be data, or the next eager `x * 3.5` would get a dead tracer.
    import jax
    import jax.numpy as jnp

    from maxfx.experimental.tensor import Tensor as EagerTensor

    @jax.jit
    def traced(a):
        return (EagerTensor.from_dlpack(a) * 3.5 + 0.25).cast(DType.float16)

    with jax.checking_leaks():
        out = traced(jnp.arange(3, dtype=jnp.float32))
    np.testing.assert_array_equal(np.asarray(out), np.arange(3, dtype=np.float16) * 3.5 + 0.25)
    eager = EagerTensor(np.arange(3, dtype=np.float32)) * 3.5 + 0.25
    assert eager.real
    np.testing.assert_array_equal(np.asarray(eager), np.arange(3, dtype=np.float32) * 3.5 + 0.25)
