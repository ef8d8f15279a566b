"""range, hann_window and constant_external against numpy."""

import jax.numpy as jnp
import numpy as np
import pytest

from lowering.dims import Dim
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType, Weight, ops
from tests.graph_run import run_graph
from tests.ops.harness import run_op, session

CPU = DeviceRef.CPU()


# ─── range ────────────────────────────────────────────────────────────────

RANGES = [
    ((0, 10, 1), DType.int64),
    ((0, 10, 3), DType.int32),
    ((5, -3, -2), DType.int32),
    ((2, 2, 1), DType.int64),
    ((0.0, 1.0, 0.1), DType.float32),
    ((1.5, -1.0, -0.5), DType.float64),
    ((0, 7, 2), DType.float16),
    ((3, 10, 2), DType.uint8),
]


def test_range_static():
    outs = run_graph(lambda: tuple(ops.range(*args, dtype=dt, device=CPU) for args, dt in RANGES))
    for out, (args, dt) in zip(outs, RANGES):
        np.testing.assert_allclose(out, np.arange(*args, dtype=np.float64).astype(dt.to_numpy()), rtol=1e-6)
        assert out.dtype == dt.to_numpy()


def test_range_defaults_and_out_dim():
    with Graph("r"):
        r = ops.range(0, 4)
        assert r.dtype is DType.float32 and r.shape == [4] and r.device == CPU  # MAX: float32 for numeric inputs
        assert ops.range(0, 4, 1, out_dim=4, dtype=DType.int32, device=CPU).shape == [4]
        assert ops.range(0, 4, 1, out_dim="n", dtype=DType.int32, device=CPU).shape == ["n"]
    outs = run_graph(lambda: (ops.range(0, 4, 1, out_dim="n", dtype=DType.int32, device=CPU) * 3).reshape(["n", 1]))
    np.testing.assert_array_equal(outs[0], np.arange(4).reshape(4, 1) * 3)


def test_range_symbolic_bounds():
    # ops.range(0, x.shape[0]): a length in terms of the input's symbolic dim.
    with Graph("r", input_types=[TensorType(DType.float32, ["seq", 2])]) as g:
        seq = g.inputs[0].tensor.shape[0]
        a = ops.range(0, seq, dtype=DType.int64, device=CPU)
        b = ops.range(1, seq, 2, dtype=DType.int64, device=CPU)
        c = ops.range(seq, 0, -1, dtype=DType.int64, device=CPU)
        assert a.shape == ["seq"] and b.shape == [Dim("seq") // 2] and c.shape == ["seq"]
        g.output(a, b, c)
    model = session().load(g)
    for n in (5, 6):
        outs = [o.to_numpy() for o in model.execute(np.zeros((n, 2), np.float32))]
        for out, ref in zip(outs, [np.arange(n), np.arange(1, n, 2), np.arange(n, 0, -1)]):
            np.testing.assert_array_equal(out, ref)


def test_range_with_tensor_bounds():
    types = [
        TensorType(DType.int64, []),
        TensorType(DType.int64, []),
        TensorType(DType.float32, []),
        TensorType(DType.float32, ["seq"]),
    ]

    def fn(start, stop, fstart, x):
        return (
            ops.range(start, 100, 3, out_dim=4, dtype=DType.int64, device=CPU),
            ops.range(start, stop, 1, out_dim="seq", dtype=DType.int32, device=CPU),  # length bound by x's shape
            ops.range(fstart, 0.0, -0.5, out_dim=3),  # Python numbers take the tensors' dtype
        )

    outs = run_graph(fn, np.int64(5), np.int64(8), np.float32(1.5), np.zeros(3, np.float32), types=types)
    for out, ref, dt in zip(outs, [[5, 8, 11, 14], [5, 6, 7], [1.5, 1.0, 0.5]], [np.int64, np.int32, np.float32]):
        np.testing.assert_array_equal(out, ref)
        assert out.dtype == dt


def test_range_tensor_bounds_at_run_time():
    with Graph("r", input_types=[TensorType(DType.int64, []), TensorType(DType.int64, [])]) as g:
        g.output(ops.range(g.inputs[0], g.inputs[1], 1, out_dim=3, dtype=DType.int64, device=CPU))
    model = session().load(g)
    np.testing.assert_array_equal(model.execute(np.int64(2), np.int64(5))[0].to_numpy(), [2, 3, 4])
    # A compiled graph cannot read the bounds' values to size its output: out_dim must be known by then.
    with Graph("r", input_types=[TensorType(DType.int64, [])]) as g:
        g.output(ops.range(0, g.inputs[0], 1, out_dim="n", dtype=DType.int64, device=CPU))
    with pytest.raises(ValueError, match="range: out_dim n is not bound"):
        session().load(g).execute(np.int64(4))
    # On concrete arrays (eager use) the values are checked against out_dim.
    np.testing.assert_array_equal(
        ops.range(jnp.int32(1), jnp.int32(4), 1, out_dim=3, dtype=DType.int32, device=CPU), [1, 2, 3]
    )
    with pytest.raises(ValueError, match="range: out_dim 3 is 3 but range.* has 5 elements"):
        ops.range(jnp.int32(0), jnp.int32(5), 1, out_dim=3, dtype=DType.int32, device=CPU)
    with pytest.raises(ValueError, match="range: stop - start"):
        ops.range(jnp.int32(5), jnp.int32(2), 1, out_dim=3, dtype=DType.int32, device=CPU)


def test_range_in_a_graph_run_op_by_op(rng):
    # With nonzero in the graph it runs op by op: tensor bounds are concrete, so a new out_dim symbol
    # is bound from them, and a range over nonzero's count uses the symbol it bound.
    types = [TensorType(DType.float32, [6]), TensorType(DType.int64, []), TensorType(DType.int64, [])]
    with Graph("r", input_types=types) as g:
        x, s, e = g.inputs
        nz = ops.nonzero(x, "nz")
        by_count = ops.range(0, Dim("nz"), dtype=DType.int64, device=CPU)
        by_values = ops.range(s, e, 1, out_dim="m", dtype=DType.int64, device=CPU)
        g.output(nz, by_count, by_values.reshape(["m", 1]))
    model = session().load(g)
    for k in (2, 5):
        x = np.zeros(6, np.float32)
        x[:k] = 1
        out_nz, out_count, out_values = (o.to_numpy() for o in model.execute(x, np.int64(1), np.int64(1 + k)))
        np.testing.assert_array_equal(out_nz, np.argwhere(x))
        np.testing.assert_array_equal(out_count, np.arange(k))
        np.testing.assert_array_equal(out_values, np.arange(1, 1 + k).reshape(-1, 1))


def test_range_errors():
    with Graph(
        "r", input_types=[TensorType(DType.int32, []), TensorType(DType.int64, []), TensorType(DType.int64, [2])]
    ) as g:
        i32, i64, vec = g.inputs
        with pytest.raises(ValueError, match="range: step must be non-zero"):
            ops.range(0, 10, 0, dtype=DType.int64, device=CPU)
        with pytest.raises(ValueError, match="range: stop - start .* must be zero or have the sign of step"):
            ops.range(0, 10, -1, dtype=DType.int64, device=CPU)
        with pytest.raises(ValueError, match="range: out_dim 3 differs from the length 10"):
            ops.range(0, 10, 1, out_dim=3, dtype=DType.int64, device=CPU)
        with pytest.raises(
            ValueError,
            match="range: Dynamic ranges must provide an explicit out_dim: tensor-valued start/stop/step need out_dim",
        ):
            ops.range(0, i64, 1, dtype=DType.int64, device=CPU)
        with pytest.raises(ValueError, match="range: start, stop and step must have the same dtype"):
            ops.range(i32, i64, 1, out_dim="n", dtype=DType.int64, device=CPU)
        with pytest.raises(ValueError, match="range: start 0.5 is not representable in int32"):
            ops.range(0.5, 3, dtype=DType.int32, device=CPU)
        with pytest.raises(ValueError, match="range: step 0.5 is not representable in the bounds' dtype int64"):
            ops.range(0, i64, 0.5, out_dim="n", dtype=DType.int64, device=CPU)
        with pytest.raises(ValueError, match=r"range: values from 5 to -1 are out of range for uint8"):
            ops.range(5, -3, -2, dtype=DType.uint8, device=CPU)
        with pytest.raises(
            ValueError,
            match=r"range expected scalar values as inputs! stop must be a scalar \(rank 0\), got int64\[2\]",
        ):
            ops.range(0, vec, 1, out_dim=2, dtype=DType.int64, device=CPU)
        with pytest.raises(TypeError, match="range: stop must be a number"):
            ops.range(0, "10", dtype=DType.int64, device=CPU)
        with pytest.raises(TypeError, match="range: dtype must be a DType"):
            ops.range(0, 10, dtype=np.int64, device=CPU)


# ─── hann_window ──────────────────────────────────────────────────────────


def _hann_ref(n, periodic):
    if n <= 1:
        return np.ones(n)  # MAX (like torch): a 1-sample window is [1.0]
    m = n + 1 if periodic else n
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / (m - 1))


def test_hann_window():
    cases = [(n, p) for n in (0, 1, 2, 8, 11) for p in (True, False)]
    outs = run_graph(lambda: tuple(ops.hann_window(n, CPU, periodic=p) for n, p in cases))
    for out, (n, p) in zip(outs, cases):
        np.testing.assert_allclose(out, _hann_ref(n, p), atol=1e-6)
        assert out.dtype == np.float32
        if not p and n > 1:
            np.testing.assert_allclose(out, np.hanning(n), atol=1e-6)
    # The documented identity: hann_window(L, periodic=True) == hann_window(L + 1, periodic=False)[:-1].
    np.testing.assert_allclose(outs[cases.index((8, True))], _hann_ref(9, False)[:-1], atol=1e-6)


def test_eager_hann_window_needs_no_device():
    """MAX's F.hann_window docstring: ``F.hann_window(4, periodic=True)`` holds [0.0, 0.5, 1.0, 0.5]."""
    from maxfx.experimental import functional as F

    window = F.hann_window(4, periodic=True)
    np.testing.assert_allclose(window.to_numpy(), np.hanning(5)[:-1], atol=1e-6)
    assert window.device == CPU.to_device()


@pytest.mark.parametrize("dtype", [DType.float16, DType.bfloat16, DType.float64])
def test_hann_window_dtypes(dtype):
    (out,) = run_graph(lambda: ops.hann_window(6, CPU, dtype=dtype))
    assert out.dtype == dtype.to_numpy()
    np.testing.assert_allclose(
        out.astype(np.float64), _hann_ref(6, True), atol=1e-2 if dtype is not DType.float64 else 1e-12
    )


def test_hann_window_errors():
    with Graph("h"):
        with pytest.raises(ValueError, match="hann_window: window_length must be non-negative, got -1"):
            ops.hann_window(-1, CPU)
        with pytest.raises(TypeError, match="hann_window: window_length must be an integer, got float 2.0"):
            ops.hann_window(2.0, CPU)
        with pytest.raises(TypeError, match="hann_window: window_length must be an integer, got bool"):
            ops.hann_window(True, CPU)
        with pytest.raises(ValueError, match="hann_window: dtype must be a floating-point type, got int32"):
            ops.hann_window(4, CPU, dtype=DType.int32)


# ─── constant_external ───────────────────────────────────────────────────


def test_constant_external():
    t = TensorType(DType.float32, [2])
    with Graph("ext", input_types=[t]) as g:
        a = ops.constant_external("bias", t)
        assert ops.constant_external("bias", TensorType(DType.float32, [2])) is a  # same name and type: same value
        with pytest.raises(ValueError, match="constant_external: 'bias' is already a weight of type"):
            ops.constant_external("bias", TensorType(DType.float32, [3]))
        g.output(g.inputs[0] + a * 2)
    model = InferenceSession().load(g, weights_registry={"bias": np.array([1, 2], np.float32)})
    np.testing.assert_array_equal(model.execute(np.ones(2, np.float32))[0].to_numpy(), [3, 5])
    with pytest.raises(ValueError, match="'bias'"):
        InferenceSession().load(g)


def test_constant_external_shares_names_with_weights():
    t = TensorType(DType.float32, [2])
    w = Weight("w", DType.float32, [2])
    with Graph("ext", input_types=[t]) as g:
        v = g.inputs[0] + w
        assert ops.constant_external("w", t)._var is w._var
        with pytest.raises(ValueError, match="constant_external: 'w'"):
            ops.constant_external("w", TensorType(DType.int32, [2]))
        g.output(v)


def test_constant_external_errors():
    t = TensorType(DType.float32, [2])
    with pytest.raises(RuntimeError, match="constant_external: no active Graph"):
        ops.constant_external("w", t)
    with Graph("ext"):
        with pytest.raises(TypeError, match="constant_external: type must be a TensorType"):
            ops.constant_external("w", DType.float32)
        with pytest.raises(TypeError, match="constant_external: name must be a str"):
            ops.constant_external(3, t)
        assert ops.constant_external("", t).type == t  # an empty name is a valid registry key (MAX)


def test_creation_ops_in_a_harness_graph():
    # range and hann_window next to graph inputs (the common use: positions and windows for a signal).
    x = np.arange(8, dtype=np.float32)
    out = run_op(lambda v: v * ops.hann_window(8, CPU) + ops.range(0, 8, dtype=DType.float32, device=CPU), x)
    np.testing.assert_allclose(out, x * _hann_ref(8, True) + np.arange(8), rtol=1e-6)


def test_range_int64_limits_and_max_checks():
    # The length and the integer bounds must fit int64 (MAX's dims and bound constants are int64).
    with Graph("r") as g:
        big = ops.range(0, 2**63 - 1, 1, dtype=DType.int64, device=CPU)  # 2**63 - 1 elements: the largest length
        assert big.shape == [2**63 - 1]
        for start, stop, step in [(0, 2**63, 1), (2**62, 2**63, 1)]:
            with pytest.raises(ValueError, match=r"range: stop \d+ is out of the int64 range"):
                ops.range(start, stop, step, dtype=DType.int64, device=CPU)
        for start, stop, step in [(0, -(2**63), -1), (-(2**63), 0, 1)]:
            with pytest.raises(ValueError, match=r"range: the length 9223372036854775808 exceeds the int64 maximum"):
                ops.range(start, stop, step, dtype=DType.int64, device=CPU)
        lo, hi, one = (ops.constant(v, DType.int64, device=CPU) for v in (-(2**63), 0, 1))
        with pytest.raises(ValueError, match="exceeds the int64 maximum"):
            ops.range(lo, hi, one, 2**63, dtype=DType.int64, device=CPU)
        gpu_start = ops.constant(0, DType.int32, device=DeviceRef.GPU())
        with pytest.raises(ValueError, match="Range input values must be on CPU"):
            ops.range(gpu_start, 5, out_dim=5, dtype=DType.int32, device=DeviceRef.GPU())
    with pytest.raises(ValueError, match="Dynamic ranges must provide an explicit out_dim"):
        with Graph("r", input_types=[TensorType(DType.int32, [])]) as g:
            ops.range(g.inputs[0], 5, dtype=DType.int32, device=CPU)
