"""cond, while_loop and call against Python/numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, Weight, ops
from tests.ops.harness import rand, run_op

CPU = DeviceRef.CPU()


def _tensor(arr):
    from maxfx.driver import Tensor  # noqa: PLC0415 - driver is loaded on first use

    return Tensor.from_numpy(arr)


# ─── cond ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("pred", [True, False])
def test_cond_takes_the_right_branch(rng, dtype, pred):
    x = rand(rng, [3, 2], dtype, 1, 5)

    def f(p, v):
        return ops.cond(p, [v.type], lambda: v + v, lambda: v * v)

    out = run_op(f, np.array(pred), x, symbolic=[None, ["batch", None]])
    np.testing.assert_allclose(out, x + x if pred else x * x, rtol=1e-3)
    assert out.dtype == x.dtype


def test_cond_doc_example_constants_and_several_results():
    types = [TensorType(DType.int32, [], CPU), TensorType(DType.float32, [2], CPU)]
    with Graph("cond", input_types=[TensorType(DType.bool, [])]) as g:
        outs = ops.cond(
            g.inputs[0],
            types,
            lambda: [ops.constant(1, DType.int32, CPU), ops.constant([1.0, 2.0], DType.float32, CPU)],
            lambda: (ops.constant(0, DType.int32, CPU), ops.constant([3.0, 4.0], DType.float32, CPU)),
        )
        assert [o.type for o in outs] == types
        g.output(*outs)
    model = InferenceSession().load(g)
    a, b = model.execute(np.array(True))
    assert a.to_numpy() == 1 and b.to_numpy().tolist() == [1.0, 2.0]
    a, b = model.execute(np.array(False))
    assert a.to_numpy() == 0 and b.to_numpy().tolist() == [3.0, 4.0]


def test_cond_python_bool_pred_and_captured_values(rng):
    x, y = rand(rng, [4]), rand(rng, [4])
    out = run_op(lambda a, b: ops.cond(False, [a.type], lambda: a + b, lambda: a - b), x, y)
    np.testing.assert_allclose(out, x - y, rtol=1e-6)


def test_cond_with_buffer_mutation_in_branches():
    with Graph("cond_buf", input_types=[BufferType(DType.float32, [3], CPU), TensorType(DType.bool, [])]) as g:
        buf, pred = g.inputs
        before = ops.buffer_load(buf)

        def then_fn():
            ops.buffer_store(buf, ops.buffer_load(buf) + 1)

        def else_fn():
            ops.buffer_store(buf, ops.buffer_load(buf) * 10)

        assert ops.cond(pred, None, then_fn, else_fn) == []
        g.output(before, ops.buffer_load(buf))
    model = InferenceSession().load(g)
    state = np.array([1.0, 2.0, 3.0], np.float32)
    t = _tensor(state.copy())
    before, after = model.execute(t, np.array(True))
    np.testing.assert_array_equal(before.to_numpy(), state)
    np.testing.assert_array_equal(after.to_numpy(), state + 1)
    np.testing.assert_array_equal(t.to_numpy(), state + 1)
    model.execute(t, np.array(False))
    np.testing.assert_array_equal(t.to_numpy(), (state + 1) * 10)


def test_cond_write_in_one_branch_and_nested_cond():
    types = [BufferType(DType.int32, [2], CPU), TensorType(DType.bool, []), TensorType(DType.bool, [])]
    with Graph("nested", input_types=types) as g:
        buf, p, q = g.inputs

        def outer_then():
            def inner_then():
                ops.buffer_store(buf, ops.buffer_load(buf) + 100)

            ops.cond(q, None, inner_then, lambda: None)
            ops.buffer_store_slice(buf, 7, [0])

        ops.cond(p, None, outer_then, lambda: None)
        g.output(ops.buffer_load(buf))
    model = InferenceSession().load(g)
    for pv, qv in [(True, True), (True, False), (False, True)]:
        start = np.array([1, 2], np.int32)
        t = _tensor(start.copy())
        model.execute(t, np.array(pv), np.array(qv))
        want = start.copy()
        if pv:
            want = want + (100 if qv else 0)
            want[0] = 7
        np.testing.assert_array_equal(t.to_numpy(), want)


def test_cond_errors():
    with Graph(
        "e", input_types=[TensorType(DType.int32, []), TensorType(DType.bool, [2]), TensorType(DType.bool, [])]
    ) as g:
        i, bv, b = g.inputs
        t = [TensorType(DType.float32, [], CPU)]
        one = lambda: ops.constant(1.0, DType.float32, CPU)  # noqa: E731
        with pytest.raises(ValueError, match=r"cond: pred must be a bool scalar.*int32\[\]"):
            ops.cond(i, t, one, one)
        with pytest.raises(ValueError, match=r"cond: pred must be a bool scalar.*bool\[2\]"):
            ops.cond(bv, t, one, one)
        with pytest.raises(ValueError, match=r"cond: pred"):
            ops.cond(1, t, one, one)
        with pytest.raises(
            ValueError, match=r"cond: else_fn result 0 has type int32\[\] but out_types\[0\] is float32\[\]"
        ):
            ops.cond(b, t, one, lambda: ops.constant(1, DType.int32, CPU))
        with pytest.raises(ValueError, match=r"cond: then_fn returned 2 value\(s\).*out_types has 1"):
            ops.cond(b, t, lambda: [one(), one()], one)
        with pytest.raises(ValueError, match=r"cond: then_fn returned 1 value\(s\).*out_types has 0"):
            ops.cond(b, None, one, lambda: None)
        with pytest.raises(TypeError, match=r"cond: out_types\[0\]"):
            ops.cond(b, [DType.float32], one, one)


# ─── while_loop ─────────────────────────────────────────────────────────────


def test_while_loop_doc_examples():
    with Graph("while_loop_example") as g:
        x = ops.constant(0, dtype=DType.int32, device=CPU)
        y = ops.constant(5, dtype=DType.int32, device=CPU)
        [r] = ops.while_loop(x, lambda x: x < 10, lambda x: x + 1)
        rx, ry = ops.while_loop((x, y), lambda x, y: ops.logical_and(x < 10, y < 15), lambda x, y: [x + 1, y + 1])
        assert r.type == TensorType(DType.int32, [], CPU)
        g.output(r, rx, ry)
    outs = [o.to_numpy() for o in InferenceSession().load(g).execute()]
    assert [int(o) for o in outs] == [10, 10, 15]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_while_loop_sum_with_symbolic_size(rng, dtype):
    x = rand(rng, [5, 3], dtype)

    def f(v):
        i0 = ops.constant(0, DType.int64, CPU)
        _, acc = ops.while_loop([i0, v * 0], lambda i, a: i < 4, lambda i, a: [i + 1, a + v])
        return acc

    out = run_op(f, x, symbolic=[["n", "m"]])
    np.testing.assert_allclose(out, x * 4, rtol=1e-5)
    assert out.dtype == x.dtype
    # The compiled model accepts any size for n.
    x2 = rand(rng, [2, 7], dtype)
    np.testing.assert_allclose(run_op(f, x2, symbolic=[["n", "m"]]), x2 * 4, rtol=1e-5)


def test_while_loop_fibonacci():
    def fib(n):
        a, b = 0, 1
        for _ in range(n):
            a, b = b, a + b
        return a

    with Graph("fib", input_types=[TensorType(DType.int64, [])]) as g:
        n = g.inputs[0]
        zero = ops.constant(0, DType.int64, CPU)
        one = ops.constant(1, DType.int64, CPU)
        _, a, _ = ops.while_loop([zero, zero, one], lambda i, a, b: i < n, lambda i, a, b: [i + 1, b, a + b])
        g.output(a)
    model = InferenceSession().load(g)
    for k in (0, 1, 2, 10, 50):
        assert int(model.execute(np.int64(k))[0].to_numpy()) == fib(k)


def test_while_loop_body_writes_outer_buffer():
    with Graph("count", input_types=[BufferType(DType.int32, [1], CPU), TensorType(DType.int32, [])]) as g:
        buf, n = g.inputs

        def body(i):
            ops.buffer_store(buf, ops.buffer_load(buf) * 2)
            return i + 1

        [i] = ops.while_loop(ops.constant(0, DType.int32, CPU), lambda i: i < n, body)
        g.output(i)
    model = InferenceSession().load(g)
    t = _tensor(np.array([3], np.int32))
    assert int(model.execute(t, np.int32(4))[0].to_numpy()) == 4
    np.testing.assert_array_equal(t.to_numpy(), [3 * 2**4])


def test_while_loop_errors():
    with Graph("e", input_types=[TensorType(DType.float32, [2]), BufferType(DType.float32, [2])]) as g:
        x, buf = g.inputs
        with pytest.raises(ValueError, match="while_loop: While loops must have at least one iteration value"):
            ops.while_loop([], lambda: True, lambda: [])
        with pytest.raises(NotImplementedError, match="while_loop: initial value 0 is a buffer"):
            ops.while_loop([buf], lambda b: True, lambda b: b)
        with pytest.raises(ValueError, match=r"while_loop: predicate result must be a bool scalar.*float32\[2\]"):
            ops.while_loop(x, lambda v: v, lambda v: v)
        with pytest.raises(
            ValueError, match=r"while_loop: body result 0 has type int32\[2\] but initial value 0 is float32\[2\]"
        ):
            ops.while_loop(x, lambda v: ops.constant(True, DType.bool, CPU), lambda v: v.cast(DType.int32))
        with pytest.raises(ValueError, match=r"while_loop: body returned 2 value\(s\)"):
            ops.while_loop(x, lambda v: ops.constant(True, DType.bool, CPU), lambda v: [v, v])


# ─── call ─────────────────────────────────────────────────────────────────


def test_call_subgraph_twice_with_prefixed_weights(rng):
    x, y = rand(rng, [3, 2]), rand(rng, [1, 2])
    with Graph("main", input_types=[TensorType(DType.float32, ["n", 2]), TensorType(DType.float32, ["m", 2])]) as g:
        with g.add_subgraph("scale_shift", input_types=[TensorType(DType.float32, ["k", 2])]) as sub:
            w = Weight("w", DType.float32, [2], CPU)
            sub.output(sub.inputs[0] * w + 1)
        [a] = ops.call(sub, g.inputs[0], prefix="layers.0.")
        [b] = ops.call(sub, g.inputs[1], prefix="layers.1.")
        # The subgraph's dim k becomes the caller's n / m.
        assert list(a.shape) == ["n", 2] and list(b.shape) == ["m", 2]
        g.output(a, b)
    assert sorted(g.weights()) == ["layers.0.w", "layers.1.w"]
    w0, w1 = np.array([1, 2], np.float32), np.array([10, 20], np.float32)
    model = InferenceSession().load(g, weights_registry={"layers.0.w": w0, "layers.1.w": w1})
    a, b = model.execute(x, y)
    np.testing.assert_allclose(a.to_numpy(), x * w0 + 1, rtol=1e-6)
    np.testing.assert_allclose(b.to_numpy(), y * w1 + 1, rtol=1e-6)
    with pytest.raises(ValueError, match="layers.1.w"):
        InferenceSession().load(g, weights_registry={"layers.0.w": w0})


def test_call_doc_example_and_buffer_argument():
    t = TensorType(DType.float32, [4], CPU)
    with Graph("main", input_types=[t, BufferType(DType.float32, [4], CPU)]) as g:
        with g.add_subgraph("add_one", input_types=[t]) as sub:
            sub.output(ops.add(sub.inputs[0].tensor, ops.constant(1, DType.float32, device=CPU)))
        with g.add_subgraph("accumulate", input_types=[BufferType(DType.float32, [4], CPU), t]) as acc:
            b, v = acc.inputs
            ops.buffer_store(b, ops.buffer_load(b) + v)
            acc.output(v * 2)
        [r] = ops.call(sub, g.inputs[0])
        [r2] = ops.call(acc, g.inputs[1], r)
        g.output(r, r2)
    model = InferenceSession().load(g)
    x = np.arange(4, dtype=np.float32)
    state = _tensor(np.ones(4, np.float32))
    r, r2 = model.execute(x, state)
    np.testing.assert_array_equal(r.to_numpy(), x + 1)
    np.testing.assert_array_equal(r2.to_numpy(), (x + 1) * 2)
    np.testing.assert_array_equal(state.to_numpy(), x + 2)


def test_call_errors():
    with Graph("main", input_types=[TensorType(DType.float32, [3]), TensorType(DType.int32, [3])]) as g:
        x, i = g.inputs
        with g.add_subgraph("f", input_types=[TensorType(DType.float32, [3]), TensorType(DType.float32, [3])]) as sub:
            sub.output(sub.inputs[0] + sub.inputs[1])
        with pytest.raises(ValueError, match="call: Expected 2 args to call to 'f', got 1"):
            ops.call(sub, x)
        with pytest.raises(
            ValueError,
            match=r"call: argument 1 of subgraph 'f' has the wrong type: must be float32\[3\], got int32\[3\]",
        ):
            ops.call(sub, x, i)
        empty = g.add_subgraph("empty", input_types=[TensorType(DType.float32, [3])])
        with pytest.raises(ValueError, match="call: subgraph 'empty' has no outputs"):
            ops.call(empty, x)
        with pytest.raises(TypeError, match="call: expected a Graph"):
            ops.call(lambda v: v, x)


def test_cond_and_while_loop_under_jax_jit():
    @jax.jit
    def f(p, x):
        [y] = ops.cond(p, [TensorType(DType.float32, [3])], lambda: x + 1, lambda: x * 3)
        _, acc = ops.while_loop([jnp.int32(0), x], lambda i, a: i < 3, lambda i, a: [i + 1, a + x])
        return y, acc

    x = jnp.arange(3, dtype=jnp.float32)
    y, acc = f(False, x)
    np.testing.assert_allclose(y, np.arange(3) * 3)
    np.testing.assert_allclose(acc, np.arange(3) * 4)


def test_cond_and_while_loop_run_op_by_op_on_concrete_values(monkeypatch):
    # Graphs with data-dependent shapes run op by op on concrete arrays: cond runs
    # only the branch taken and a data-dependent loop body iterates in Python.
    import lowering.ops.control_flow as cf  # noqa: PLC0415
    from lowering.interpret import run_block  # noqa: PLC0415

    monkeypatch.setattr(cf, "block_is_data_dependent", lambda block: True)
    with Graph("eager", input_types=[TensorType(DType.bool, []), TensorType(DType.int32, [])]) as g:
        p, n = g.inputs
        [y] = ops.cond(p, [n.type], lambda: n + 1, lambda: n - 1)
        [i] = ops.while_loop(ops.constant(0, DType.int32, CPU), lambda i: i < y, lambda i: i + 2)
        g.output(y, i)
    for pv, want in [(True, (6, 6)), (False, (4, 4))]:
        outs, _ = run_block(g._ir, [jnp.asarray(pv), jnp.asarray(5, jnp.int32)])
        assert (int(outs[0]), int(outs[1])) == want


def test_cond_and_while_loop_on_eager_tensors_run_as_python_control_flow():
    """MAX's F.cond / F.while_loop on eager tensors: the realized predicate picks the branch; results match numpy."""
    from maxfx.experimental import functional as F
    from maxfx.experimental.tensor import Tensor

    x = Tensor(np.float32(3.0))
    calls = []

    def then_fn():
        calls.append("then")
        return x * 2

    def else_fn():
        calls.append("else")
        return x - 1

    assert F.cond(x > 2, [x.type], then_fn, else_fn)[0].item() == 6.0
    assert F.cond(x > 5, [x.type], then_fn, else_fn)[0].item() == 2.0
    assert calls == ["then", "else"]  # only the branch taken runs
    assert F.cond(x > 2, [x.type], lambda: 7.0, lambda: x)[0].item() == 7.0  # Python data takes the declared type
    assert F.cond(True, None, lambda: None, lambda: None) == []

    # Collatz steps of 27, against a plain Python loop.
    n, steps = 27, 0
    while n != 1:
        n, steps = (n // 2 if n % 2 == 0 else 3 * n + 1), steps + 1
    out = F.while_loop(
        (Tensor(np.int64(27)), Tensor(np.int64(0))),
        lambda v, s: v != 1,
        lambda v, s: [F.where(v % 2 == 0, v // 2, 3 * v + 1), s + 1],
    )
    assert [t.item() for t in out] == [1, steps]
    with F.lazy():  # inside lazy() the predicate is realized, the rest stays pending
        y = x * 2
        (r,) = F.cond(y > 2, [x.type], lambda: y + 1, lambda: y)
    assert r.item() == 7.0


def test_eager_cond_and_while_loop_errors():
    from maxfx.experimental import functional as F
    from maxfx.experimental.tensor import Tensor

    x = Tensor(np.float32(3.0))
    with pytest.raises(ValueError, match=r"cond: pred must be a bool scalar tensor, got float32\[\]"):
        F.cond(x, [x.type], lambda: x, lambda: x)
    with pytest.raises(TypeError, match=r"then_fn result 0 has type int32\[\] but out_types\[0\] is float32\[\]"):
        F.cond(x > 2, [x.type], lambda: Tensor(np.int32(1)), lambda: x)
    with pytest.raises(ValueError, match="predicate result must be a bool scalar tensor"):
        F.while_loop([x], lambda v: v, lambda v: v)
    with pytest.raises(ValueError, match=r"body returned 2 value\(s\) .* but the loop carries 1"):
        F.while_loop([x], lambda v: v < 9, lambda v: [v, v])


def test_cond_and_while_loop_inside_a_compiled_module_branch_on_a_symbolic_dim():
    """MAX's Tensor.from_dim example: F.cond on a runtime batch size inside Module.compile; a loop over
    the module's own weights, checked against numpy."""
    from maxfx.driver import CPU
    from maxfx.experimental import functional as F
    from maxfx.experimental.nn import Linear, Module
    from maxfx.experimental.tensor import Tensor

    class ScaleByBatch(Module):
        def forward(self, x):
            pred = Tensor.from_dim(x.shape[0]) <= 2  # scalar bool tensor, known when the graph runs
            (out,) = F.cond(pred, [TensorType(x.dtype, x.shape, device=x.device)], lambda: x * 2.0, lambda: x * 4.0)
            return out

    model = ScaleByBatch().compile(TensorType(DType.float32, ["batch", 4], device=DeviceRef.CPU()))
    np.testing.assert_array_equal(model(Tensor(np.ones((1, 4), np.float32))).to_numpy(), np.full((1, 4), 2.0))
    np.testing.assert_array_equal(model(Tensor(np.ones((3, 4), np.float32))).to_numpy(), np.full((3, 4), 4.0))

    class Repeat(Module):  # apply the layer once per row of the batch
        def __init__(self):
            self.lin = Linear(4, 4)

        def forward(self, x):
            n = Tensor.from_dim(x.shape[0])
            start = Tensor(0, dtype=DType.int64, device=CPU())  # eager data inside the trace: a constant
            steps, y = F.while_loop((start, x), lambda i, y: i < n, lambda i, y: [i + 1, self.lin(y) * 0.5])
            return y, steps

    m = Repeat()
    compiled = m.compile(TensorType(DType.float32, ["batch", 4], device=DeviceRef.CPU()))
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    y, steps = compiled(Tensor(x))
    w, b = m.lin.weight.to_numpy(), m.lin.bias.to_numpy()
    want = x
    for _ in range(3):
        want = (want @ w.T + b) * 0.5
    np.testing.assert_allclose(y.to_numpy(), want, rtol=1e-5, atol=1e-6)
    assert steps.item() == 3


def test_from_dim_static_anywhere_symbolic_only_in_a_graph():
    from maxfx.experimental.tensor import Tensor
    from maxfx.graph import Dim

    five = Tensor.from_dim(Dim(5))
    assert (five.dtype, list(five.shape), five.item()) == (DType.int64, [], 5)
    with pytest.raises(ValueError, match=r"Tensor.from_dim\(batch\): a symbolic dimension has no value in eager mode"):
        Tensor.from_dim("batch")
