"""Reductions, scans and normalisations against numpy (keepdim everywhere, int64 indices)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lowering.x64 import x64
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import Graph, TensorType, ops
from tests.ops.harness import build, rand, run_op

BF16 = ml_dtypes.bfloat16


def _tol(dtype):
    dt = np.dtype(dtype)
    if dt in (np.float16, np.dtype(BF16)):
        return {"rtol": 2e-2, "atol": 2e-2}
    return {"rtol": 1e-5, "atol": 1e-5}


def _close(out, expected, dtype):
    assert out.dtype == np.dtype(dtype), (out.dtype, dtype)
    np.testing.assert_allclose(np.asarray(out, np.float64), np.asarray(expected, np.float64), **_tol(dtype))


# ─── keepdim reductions ───────────────────────────────────────────────────


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int32, np.int64])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_keepdim_reductions(rng, dtype, axis):
    x = rand(rng, [3, 4, 5], dtype, -5, 5)
    outs = run_op(
        lambda v: [
            ops.sum(v, axis),
            ops.mean(v, axis),
            ops.max(v, axis=axis),
            ops.min(v, axis=axis),
            ops.argmax(v, axis),
            ops.argmin(v, axis),
        ],
        x,
    )
    xf = x.astype(np.float64)
    n = x.shape[axis]
    s, m, mx, mn, amax, amin = outs
    _close(s, xf.sum(axis, keepdims=True), dtype)
    if np.dtype(dtype).kind == "i":
        # Integer mean keeps the dtype: floor of the exact mean.
        np.testing.assert_array_equal(m, np.floor_divide(x.sum(axis, keepdims=True, dtype=dtype), n))
        assert m.dtype == np.dtype(dtype)
    else:
        _close(m, xf.mean(axis, keepdims=True), dtype)
    _close(mx, xf.max(axis, keepdims=True), dtype)
    _close(mn, xf.min(axis, keepdims=True), dtype)
    for got, fn in ((amax, np.argmax), (amin, np.argmin)):
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, np.expand_dims(fn(xf, axis=axis), axis))


def test_narrow_int_mean_does_not_wrap():
    u = np.array([[250, 251, 255]], np.uint8)
    i = np.array([[-128, -128, 127, -1]], np.int8)
    mu, mi = run_op(lambda a, b: [ops.mean(a), ops.mean(b)], u, i)
    assert mu.dtype == np.uint8 and mi.dtype == np.int8
    np.testing.assert_array_equal(mu, [[252]])
    np.testing.assert_array_equal(mi, [[-33]])  # floor(-130 / 4)


def test_argmax_argmin_first_index_on_ties():
    x = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, 0, 5, 5]], np.float32)
    amax, amin = run_op(lambda v: [ops.argmax(v), ops.argmin(v)], x)
    np.testing.assert_array_equal(amax, [[1], [0], [2]])
    np.testing.assert_array_equal(amin, [[3], [0], [0]])


def test_bool_max_min_reduce():
    x = np.array([[True, False], [False, False]])
    mx, mn, am = run_op(lambda v: [ops.max(v), ops.min(v, axis=0), ops.argmax(v)], x)
    np.testing.assert_array_equal(mx, [[True], [False]])
    np.testing.assert_array_equal(mn, [[False, False]])
    np.testing.assert_array_equal(am, [[0], [0]])


def test_max_min_axis_none_reduces_last_axis(rng):
    x = rand(rng, [2, 3])
    mx, mn = run_op(lambda v: [ops.max(v), ops.min(v, axis=None)], x)
    np.testing.assert_array_equal(mx, x.max(-1, keepdims=True))
    np.testing.assert_array_equal(mn, x.min(-1, keepdims=True))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_max_min_elementwise_broadcast(rng, dtype):
    a, b = rand(rng, [2, 3], dtype), rand(rng, [3], dtype)
    mx, mn = run_op(lambda u, v: [ops.max(u, v), ops.min(u, v)], a, b)
    np.testing.assert_array_equal(mx, np.maximum(a, b))
    np.testing.assert_array_equal(mn, np.minimum(a, b))
    assert mx.dtype == np.dtype(dtype)


def test_max_min_with_python_scalar_and_promotion(rng):
    a = rand(rng, [4])
    h = rand(rng, [4], np.float16)
    clipped, promoted = run_op(lambda u, v: [ops.min(ops.max(u, 0.0), 1.0), ops.max(u, v)], a, h)
    np.testing.assert_array_equal(clipped, np.clip(a, 0.0, 1.0))
    assert promoted.dtype == np.float32
    np.testing.assert_array_equal(promoted, np.maximum(a, h.astype(np.float32)))


def test_symbolic_batch_mean_and_argmax(rng):
    x1, x5 = rand(rng, [1, 3]), rand(rng, [5, 3])
    g = build(
        lambda v: [ops.mean(v), ops.argmax(v, 0), ops.max(v, axis=0), ops.sum(v, 0)], x1, symbolic=[["batch", None]]
    )
    assert [list(t.shape) for t in g.output_types] == [["batch", 1], [1, 3], [1, 3], [1, 3]]
    model = InferenceSession().load(g)
    for x in (x1, x5):
        mean, am, mx, s = [o.to_numpy() for o in model.execute(x)]
        np.testing.assert_allclose(mean, x.mean(-1, keepdims=True), rtol=1e-6)
        np.testing.assert_array_equal(am, x.argmax(0)[None])
        np.testing.assert_array_equal(mx, x.max(0, keepdims=True))
        np.testing.assert_allclose(s, x.sum(0, keepdims=True), rtol=1e-6)


def test_tensorvalue_reduction_methods(rng):
    x = rand(rng, [3, 4])
    am, mx, mn, mean, var, std = run_op(
        lambda v: [v.argmax(), v.max(), v.min(axis=0), v.mean(axis=0), v.var(), v.stdev(axis=0)], x
    )
    np.testing.assert_array_equal(am, x.argmax(-1)[:, None])
    np.testing.assert_array_equal(mx, x.max(-1, keepdims=True))
    np.testing.assert_array_equal(mn, x.min(0, keepdims=True))
    np.testing.assert_allclose(mean, x.mean(0, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(var, x.var(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(std, x.std(0, keepdims=True), rtol=1e-5, atol=1e-6)


# ─── cumsum ───────────────────────────────────────────────────────────────


def _np_cumsum(x, axis, exclusive, reverse):
    y = np.flip(x, axis) if reverse else x
    c = np.cumsum(y, axis=axis, dtype=np.float64 if x.dtype.kind == "f" else x.dtype)
    if exclusive:
        c = c - y
    return np.flip(c, axis) if reverse else c


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32, np.int64])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum(rng, dtype, exclusive, reverse):
    x = rand(rng, [3, 4], dtype, -4, 4)
    a0, a1 = run_op(
        lambda v: [ops.cumsum(v, 0, exclusive, reverse), ops.cumsum(v, axis=-1, exclusive=exclusive, reverse=reverse)],
        x,
    )
    xr = x.astype(np.float64) if np.dtype(dtype).kind == "f" else x
    for got, axis in ((a0, 0), (a1, -1)):
        expected = _np_cumsum(xr, axis, exclusive, reverse)
        if np.dtype(dtype).kind == "i":
            assert got.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got, expected)
        else:
            _close(got, expected, dtype)


def test_cumsum_documented_example():
    x = np.array([1, 2, 3], np.int32)
    outs = run_op(
        lambda v: [
            ops.cumsum(v),
            ops.cumsum(v, exclusive=True),
            ops.cumsum(v, reverse=True),
            ops.cumsum(v, exclusive=True, reverse=True),
        ],
        x,
    )
    for got, want in zip(outs, ([1, 3, 6], [0, 1, 3], [6, 5, 3], [5, 3, 0])):
        np.testing.assert_array_equal(got, want)


# ─── softmax / logsoftmax ─────────────────────────────────────────────────


def _np_softmax(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.float64])
def test_softmax_logsoftmax(rng, dtype):
    x = rand(rng, [3, 5], dtype, -4, 4)
    s_last, s0, ls_last, ls0 = run_op(
        lambda v: [ops.softmax(v), ops.softmax(v, axis=0), ops.logsoftmax(v), ops.logsoftmax(v, 0)], x
    )
    _close(s_last, _np_softmax(x, -1), dtype)
    _close(s0, _np_softmax(x, 0), dtype)
    _close(ls_last, np.log(_np_softmax(x, -1)), dtype)
    _close(ls0, np.log(_np_softmax(x, 0)), dtype)


def test_softmax_large_logits_are_stable():
    x = np.array([[1000.0, 1000.0], [-1000.0, 0.0]], np.float32)
    s, ls = run_op(lambda v: [ops.softmax(v), ops.logsoftmax(v)], x)
    np.testing.assert_allclose(s, [[0.5, 0.5], [0.0, 1.0]], atol=1e-6)
    np.testing.assert_allclose(ls, [[np.log(0.5), np.log(0.5)], [-1000.0, 0.0]], atol=1e-4)


# ─── top_k / argsort ──────────────────────────────────────────────────────


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16])
@pytest.mark.parametrize("axis", [-1, 0])
def test_top_k(rng, dtype, axis):
    x = rand(rng, [4, 6], dtype, -20, 20)
    values, indices = run_op(lambda v: ops.top_k(v, 3, axis=axis), x)
    order = np.argsort(-x.astype(np.float64), axis=axis, kind="stable")
    expected_idx = np.take(order, np.arange(3), axis=axis)
    assert indices.dtype == np.int64 and values.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(indices, expected_idx)
    np.testing.assert_array_equal(values, np.take_along_axis(x, expected_idx, axis=axis))


def test_top_k_ties_keep_lower_index_first():
    x = np.array([1.0, 5.0, 3.0, 5.0, 3.0], np.float32)
    values, indices = run_op(lambda v: ops.top_k(v, 4), x)
    np.testing.assert_array_equal(values, [5, 5, 3, 3])
    np.testing.assert_array_equal(indices, [1, 3, 2, 4])


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float64])
def test_argsort(rng, dtype):
    x = rand(rng, [9], dtype, -4, 4)  # ints have ties: the sort is stable
    up, down = run_op(lambda v: [ops.argsort(v), ops.argsort(v, ascending=False)], x)
    assert up.dtype == np.int64 and down.dtype == np.int64
    np.testing.assert_array_equal(up, np.argsort(x, kind="stable"))
    np.testing.assert_array_equal(down, np.argsort(-x.astype(np.float64), kind="stable"))


def test_top_k_argsort_symbolic(rng):
    g = build(
        lambda v: [*ops.top_k(v, 2), ops.argsort(ops.reshape(v, [-1]))], rand(rng, [2, 4]), symbolic=[["n", None]]
    )
    assert list(g.output_types[0].shape) == ["n", 2]
    model = InferenceSession().load(g)
    for n in (1, 3):
        x = rand(rng, [n, 4])
        values, indices, order = [o.to_numpy() for o in model.execute(x)]
        np.testing.assert_array_equal(values, -np.sort(-x, axis=-1)[:, :2])
        np.testing.assert_array_equal(indices, np.argsort(-x, axis=-1, kind="stable")[:, :2])
        np.testing.assert_array_equal(order, np.argsort(x.reshape(-1), kind="stable"))


# ─── layer_norm ───────────────────────────────────────────────────────────


def _np_layer_norm(x, gamma, beta, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma.astype(np.float64) + beta.astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_layer_norm(rng, dtype):
    x, gamma, beta = rand(rng, [2, 3, 8], dtype), rand(rng, [8], dtype), rand(rng, [8], dtype)
    out = run_op(lambda v, g, b: ops.layer_norm(v, g, b, 1e-5), x, gamma, beta)
    _close(out, _np_layer_norm(x, gamma, beta, 1e-5), dtype)


def test_layer_norm_symbolic_batch_and_constant_params(rng):
    gamma, beta = np.linspace(0.5, 1.5, 4).astype(np.float32), np.linspace(-1, 1, 4).astype(np.float32)
    g = build(lambda v: ops.layer_norm(v, gamma, beta, epsilon=1e-3), rand(rng, [2, 4]), symbolic=[["batch", None]])
    model = InferenceSession().load(g)
    for batch in (1, 6):
        x = rand(rng, [batch, 4])
        np.testing.assert_allclose(
            model.execute(x)[0].to_numpy(), _np_layer_norm(x, gamma, beta, 1e-3), rtol=1e-4, atol=1e-5
        )


# ─── tracing (jax.jit / grad) ─────────────────────────────────────────────


def test_ops_run_on_jax_arrays_under_jit_and_grad(rng):
    x = rand(rng, [3, 4])

    def f(a):
        return jnp.sum(ops.softmax(a) * ops.cumsum(a)) + jnp.sum(ops.max(a, axis=0)) + jnp.sum(ops.top_k(a, 2)[0])

    np.testing.assert_allclose(jax.jit(f)(x), f(jnp.asarray(x)), rtol=1e-5)
    grad = jax.grad(f)(jnp.asarray(x))
    eps = 1e-3
    e = np.zeros_like(x)
    e[1, 2] = eps
    numeric = (f(jnp.asarray(x + e)) - f(jnp.asarray(x - e))) / (2 * eps)
    np.testing.assert_allclose(grad[1, 2], numeric, rtol=2e-2, atol=2e-3)
    # int64 results need x64 for the whole jit (maxfx turns it on around its own tracing).
    with x64():
        am = jax.jit(lambda a: ops.argmax(a, 0))(x)
    assert am.dtype == jnp.int64 and am.shape == (1, 4)
    np.testing.assert_array_equal(am, x.argmax(0)[None])


# ─── errors ───────────────────────────────────────────────────────────────


def _graph(*types):
    return Graph("errors", input_types=[TensorType(dt, shape) for dt, shape in types])


def test_axis_errors():
    with _graph((DType.float32, [2, 3]), (DType.float32, [])) as g:
        x, s = g.inputs[0].tensor, g.inputs[1].tensor
        for name in ("sum", "mean", "argmax", "argmin", "softmax", "logsoftmax", "cumsum"):
            fn = getattr(ops, name)
            with pytest.raises(ValueError, match=f"{name}: axis 2 is out of range"):
                fn(x, 2)
            with pytest.raises(TypeError, match=name):
                fn(x, 1.0)
        with pytest.raises(ValueError, match="max: axis -3"):
            ops.max(x, axis=-3)
        with pytest.raises(ValueError, match="min: axis 5"):
            ops.min(x, axis=5)
        with pytest.raises(ValueError, match="sum: input must have rank >= 1"):
            ops.sum(s)
        with pytest.raises(ValueError, match=r"top_k: axis \(2\) out of bound"):
            ops.top_k(x, 1, axis=2)


def test_dtype_errors():
    with _graph((DType.bool, [2, 3]), (DType.int32, [2, 3]), (DType.float32, [3])) as g:
        b, i, f = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match=r"softmax: input must have a floating-point dtype, got int32\[2, 3\]"):
            ops.softmax(i)
        with pytest.raises(ValueError, match="logsoftmax"):
            ops.logsoftmax(i)
        with pytest.raises(ValueError, match="layer_norm"):
            ops.layer_norm(i, i, i, 1e-5)
        with pytest.raises(ValueError, match="maximum: incompatible input dtypes"):
            ops.max(i, f)
        with pytest.raises(ValueError, match="minimum: Unsafe cast"):
            ops.min(i, 0.5)


def test_shape_and_parameter_errors():
    with _graph((DType.float32, [2, 3]), (DType.float32, [3]), (DType.float32, [4]), (DType.float32, [2, 0])) as g:
        x, v3, v4, empty = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError,
            match=r"top_k: k \(4\) cannot be larger than dimension size along axis 1 \(3\) of float32\[2, 3\]",
        ):
            ops.top_k(x, 4)
        with pytest.raises(IndexError, match=r"top_k: axis \(3\) out of bound"):
            ops.top_k(x, 1, axis=3)
        with pytest.raises(ValueError, match="top_k: k must be non-negative"):
            ops.top_k(x, -1)
        with pytest.raises(TypeError, match="top_k: k must be an int"):
            ops.top_k(x, 1.5)
        with pytest.raises(
            ValueError, match=r"argsort only implemented for input tensors of rank 1, got float32\[2, 3\]"
        ):
            ops.argsort(x)
        with pytest.raises(
            ValueError, match=r"layer_norm: gamma shape \[Dim\(4\)\] does not match dimension of reduction \[3\]"
        ):
            ops.layer_norm(x, v4, v3, 1e-5)
        with pytest.raises(
            ValueError, match=r"layer_norm: beta shape \[Dim\(4\)\] does not match dimension of reduction"
        ):
            ops.layer_norm(x, v3, v4, 1e-5)
        for eps in (0.0, -1e-5):
            with pytest.raises(ValueError, match="layer_norm: epsilon must be positive"):
                ops.layer_norm(x, v3, v3, eps)
        with pytest.raises(ValueError, match="max: shapes"):
            ops.max(x, v4)
        ops.argmax(empty)  # builds, as in MAX; running it fails (test_empty_axis_fails_when_run)


@pytest.mark.parametrize("name", ["argmax", "argmin", "max", "min"])
def test_empty_axis_fails_when_run(name):
    fn = getattr(ops, name)
    with pytest.raises(ValueError, match=rf"{name}: cannot reduce the empty axis -1 of a tensor of shape \[2, 0\]"):
        run_op(lambda v: fn(v, axis=-1), np.zeros((2, 0), np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
def test_prod(rng, dtype):
    x = rand(rng, [3, 4], dtype, low=-2, high=2)
    out0, out1 = run_op(lambda v: [ops.prod(v, axis=0), ops.prod(v)], x)
    _close(out0, np.prod(x.astype(np.float64), axis=0, keepdims=True), dtype)
    _close(out1, np.prod(x.astype(np.float64), axis=-1, keepdims=True), dtype)


def test_bool_reductions_compute_as_ints():
    # bool reduces as 0/1 ints cast back to bool: sum = any, prod = all, mean = floor(mean) = all, cumsum = running any.
    x = np.array([[True, False, False], [True, True, True], [False, False, False]])
    s, p, m, c = run_op(lambda v: [ops.sum(v), ops.prod(v), ops.mean(v), ops.cumsum(v)], x)
    np.testing.assert_array_equal(s, x.any(-1, keepdims=True))
    np.testing.assert_array_equal(p, x.all(-1, keepdims=True))
    np.testing.assert_array_equal(m, x.all(-1, keepdims=True))
    np.testing.assert_array_equal(c, np.logical_or.accumulate(x, axis=-1))
    assert s.dtype == p.dtype == m.dtype == c.dtype == np.bool_


def test_max_min_with_y_and_axis_is_an_error():
    with _graph((DType.float32, [2, 3]), (DType.float32, [2, 3])) as g:
        x, y = (v.tensor for v in g.inputs)
        for fn, name in ((ops.max, "max"), (ops.min, "min")):
            with pytest.raises(ValueError, match=rf"{name}: pass either y .* or axis .*, not both; got axis=0"):
                fn(x, y, axis=0)
