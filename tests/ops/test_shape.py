"""Shape and layout ops against numpy, with symbolic dims and build/run-time errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import maxfx
from maxfx import functional as F
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import Dim, Graph, TensorType, ops
from maxfx.tensor import Tensor
from tests.ops.harness import build, rand, run_op

DTYPES = [np.float32, np.int32, np.bool_, np.float16]


def _shapes(g):
    return [list(t.shape) for t in g.output_types]


def _graph(*types):
    return Graph("errors", input_types=[TensorType(dt, shape) for dt, shape in types])


# ─── movement ops, several dtypes per compiled graph ─────────────────────


@pytest.mark.parametrize("dtype", DTYPES)
def test_movement_ops(rng, dtype):
    x = rand(rng, [2, 3, 4], dtype)
    outs = run_op(
        lambda v: [
            ops.reshape(v, [6, 4]),
            ops.reshape(v, [-1, 2]),
            ops.reshape(v, [4, -1, 3]),
            ops.flatten(v),
            ops.flatten(v, 1),
            ops.flatten(v, 0, 1),
            ops.squeeze(ops.unsqueeze(v, -1), -1),
            ops.unsqueeze(v, 0),
            ops.unsqueeze(v, -2),
            ops.transpose(v, 0, -1),
            ops.permute(v, [2, 0, 1]),
            ops.permute(v, [-1, -3, -2]),
            ops.broadcast_to(v, [5, 2, 3, 4]),
            ops.tile(v, [1, 2, 3]),
        ],
        x,
    )
    expected = [
        x.reshape(6, 4),
        x.reshape(-1, 2),
        x.reshape(4, -1, 3),
        x.reshape(-1),
        x.reshape(2, 12),
        x.reshape(6, 4),
        x,
        x[None],
        np.expand_dims(x, -2),
        np.swapaxes(x, 0, -1),
        np.transpose(x, [2, 0, 1]),
        np.transpose(x, [2, 0, 1]),
        np.broadcast_to(x, [5, 2, 3, 4]),
        np.tile(x, [1, 2, 3]),
    ]
    for i, (got, want) in enumerate(zip(outs, expected)):
        assert got.dtype == x.dtype, i
        np.testing.assert_array_equal(got, want, err_msg=f"output {i}")


def test_squeeze_unsqueeze_negative_axes(rng):
    x = rand(rng, [3, 1, 2])
    a, b, c = run_op(lambda v: [ops.squeeze(v, -2), ops.squeeze(v, 1), ops.unsqueeze(v, -4)], x)
    np.testing.assert_array_equal(a, x[:, 0])
    np.testing.assert_array_equal(b, x[:, 0])
    np.testing.assert_array_equal(c, x[None])


def test_broadcast_to_size_one_dims(rng):
    x = rand(rng, [3, 1])
    a, b = run_op(lambda v: [ops.broadcast_to(v, [3, 4]), ops.broadcast_to(v, (2, 3, 5))], x)
    np.testing.assert_array_equal(a, np.broadcast_to(x, [3, 4]))
    np.testing.assert_array_equal(b, np.broadcast_to(x, [2, 3, 5]))


def test_tensorvalue_shape_methods(rng):
    x = rand(rng, [2, 3, 4])
    outs = run_op(
        lambda v: [
            v.reshape([4, 6]),
            v.flatten(),
            v.flatten(1, 2),
            v.permute([1, 2, 0]),
            v.transpose(0, 1),
            v.T,
            v.broadcast_to([2, 2, 3, 4]),
            v.rebind([2, 3, 4]),
        ],
        x,
    )
    expected = [
        x.reshape(4, 6),
        x.reshape(-1),
        x.reshape(2, 12),
        x.transpose(1, 2, 0),
        x.swapaxes(0, 1),
        x.swapaxes(-1, -2),
        np.broadcast_to(x, [2, 2, 3, 4]),
        x,
    ]
    for got, want in zip(outs, expected):
        np.testing.assert_array_equal(got, want)


# ─── symbolic dims ───────────────────────────────────────────────────────


def test_reshape_symbolic_dims(rng):
    x = rand(rng, [2, 4])
    g = build(
        lambda v: [
            ops.reshape(v, ["batch", 2, 2]),
            ops.reshape(v, [-1, 2]),
            ops.reshape(v, [-1]),
            ops.flatten(ops.reshape(v, ["batch", 2, 2]), 1),
        ],
        x,
        symbolic=[["batch", None]],
    )
    assert _shapes(g) == [["batch", 2, 2], [Dim("batch") * 2, 2], [Dim("batch") * 4], ["batch", 4]]
    model = InferenceSession().load(g)
    for batch in (1, 3):
        x = rand(rng, [batch, 4])
        outs = [o.to_numpy() for o in model.execute(x)]
        for got, want in zip(outs, [x.reshape(batch, 2, 2), x.reshape(-1, 2), x.reshape(-1), x]):
            np.testing.assert_array_equal(got, want)


def test_reshape_infers_symbolic_quotient(rng):
    with Graph("r", input_types=[TensorType(DType.float32, ["batch", "seq", 4])]) as g:
        x = g.inputs[0].tensor
        y = ops.reshape(x, ["batch", -1])
        z = ops.reshape(x, [-1, 2])
        assert str(y.shape[1]) == "seq * 4"
        assert str(z.shape[0]) == "batch * seq * 2"
        g.output(y, z)
    x = rand(rng, [2, 3, 4])
    y, z = [o.to_numpy() for o in InferenceSession().load(g).execute(x)]
    np.testing.assert_array_equal(y, x.reshape(2, -1))
    np.testing.assert_array_equal(z, x.reshape(-1, 2))


def test_symbolic_concat_stack_split_chunk_broadcast(rng):
    def fn(a, b):
        cat = ops.concat([a, b], axis=-1)
        rows = ops.concat([a, a], axis=0)
        st = ops.stack([a, a, a], axis=-1)
        left, right = ops.split(cat, [2, 3], axis=1)
        halves = ops.chunk(ops.concat([a, a], axis=1), 2, axis=1)  # MAX: the chunked dim must be static
        wide = ops.broadcast_to(ops.unsqueeze(a, 0), [4, "batch", 2])
        return [cat, rows, st, left, right, *halves, wide]

    a, b = rand(rng, [2, 2]), rand(rng, [2, 3])
    g = build(fn, a, b, symbolic=[["batch", None], ["batch", None]])
    assert _shapes(g)[0] == ["batch", 5]
    assert str(_shapes(g)[1][0]) == "batch * 2"
    assert _shapes(g)[5] == ["batch", 2]
    model = InferenceSession().load(g)
    for batch in (1, 4):
        a, b = rand(rng, [batch, 2]), rand(rng, [batch, 3])
        outs = [o.to_numpy() for o in model.execute(a, b)]
        cat = np.concatenate([a, b], -1)
        want = [
            cat,
            np.concatenate([a, a]),
            np.stack([a, a, a], -1),
            cat[:, :2],
            cat[:, 2:],
            a,
            a,
            np.broadcast_to(a, [4, batch, 2]),
        ]
        for got, w in zip(outs, want):
            np.testing.assert_array_equal(got, w)


def test_shape_to_tensor_static_and_symbolic(rng):
    with Graph("s", input_types=[TensorType(DType.float32, ["batch", 3])]) as g:
        x = g.inputs[0].tensor
        static = ops.shape_to_tensor([2, 5])
        dynamic = ops.shape_to_tensor(x.shape)
        flat = ops.shape_to_tensor(ops.flatten(x).shape)
        assert static.dtype == DType.int64 and list(dynamic.shape) == [2]
        g.output(static, dynamic, flat)
    # Static shapes are plain constants; only symbolic ones need the run-time op.
    assert str(g).count("shape_to_tensor(") == 2
    model = InferenceSession().load(g)
    for batch in (2, 5):
        static, dynamic, flat = [o.to_numpy() for o in model.execute(rand(rng, [batch, 3]))]
        assert dynamic.dtype == np.int64
        np.testing.assert_array_equal(static, [2, 5])
        np.testing.assert_array_equal(dynamic, [batch, 3])
        np.testing.assert_array_equal(flat, [batch * 3])


def test_shape_to_tensor_documented_example():
    with Graph("doc") as g:
        x = ops.constant(np.zeros((1,)), DType.int64)
        result = ops.stack([x, ops.shape_to_tensor(x.shape)])
        assert result.dtype == DType.int64 and list(result.shape) == [2, 1]
        g.output(result)
    np.testing.assert_array_equal(InferenceSession().load(g).execute()[0].to_numpy(), [[0], [1]])


# ─── rebind ──────────────────────────────────────────────────────────────


def test_rebind_asserts_at_run_time(rng):
    with Graph("rb", input_types=[TensorType(DType.float32, ["batch", 4])]) as g:
        x = g.inputs[0].tensor
        y = ops.rebind(x, [3, 4], message="need exactly 3 rows")
        assert list(y.shape) == [3, 4]
        g.output(y)
    model = InferenceSession().load(g)
    x = rand(rng, [3, 4])
    np.testing.assert_array_equal(model.execute(x)[0].to_numpy(), x)
    with pytest.raises(ValueError, match="rebind: need exactly 3 rows"):
        model.execute(rand(rng, [2, 4]))


def test_rebind_binds_new_symbols_for_later_ops(rng):
    with Graph("rb", input_types=[TensorType(DType.float32, ["a"]), TensorType(DType.float32, ["b"])]) as g:
        x, y = (v.tensor for v in g.inputs)
        # Both must have the same length "n": later ops may rely on it.
        x2, y2 = ops.rebind(x, ["n"], message="x"), ops.rebind(y, ["n"], message="lengths differ")
        s = ops.concat([ops.unsqueeze(x2, 0), ops.unsqueeze(y2, 0)], 0)
        g.output(ops.reshape(s, [2, "n"]), ops.shape_to_tensor(x2.shape))
    model = InferenceSession().load(g)
    a, b = rand(rng, [5]), rand(rng, [5])
    out, n = [o.to_numpy() for o in model.execute(a, b)]
    np.testing.assert_array_equal(out, np.stack([a, b]))
    np.testing.assert_array_equal(n, [5])
    with pytest.raises(ValueError, match="rebind: lengths differ"):
        model.execute(rand(rng, [5]), rand(rng, [4]))


def test_rebind_build_time_errors():
    with _graph((DType.float32, [2, 3]), (DType.float32, ["batch", 3])) as g:
        x, s = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match=r"rebind: cannot rebind float32\[2, 3\] to \[2, 4\].*\(wrong features\)"):
            ops.rebind(x, [2, 4], message="wrong features")
        with pytest.raises(ValueError, match="rebind: .*rank 2 vs 1"):
            ops.rebind(s, ["n"])
        with pytest.raises(ValueError, match="rebind: .*dim 1 is 3, not 5"):
            ops.rebind(s, ["batch", 5])
        with pytest.raises(TypeError, match="rebind: shape"):
            ops.rebind(x, 3)


# ─── concat / stack / split / chunk ──────────────────────────────────────


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_concat_stack_split_chunk(rng, dtype):
    a, b, c = rand(rng, [2, 3], dtype), rand(rng, [2, 1], dtype), rand(rng, [2, 3], dtype)
    outs = run_op(
        lambda u, v, w: [
            ops.concat([u, v, w], axis=1),
            ops.concat([u, w], axis=-2),
            ops.stack([u, w]),
            ops.stack([u, w], axis=-1),
            ops.stack([u, w, u], axis=1),
            *ops.split(u, [1, 0, 2], axis=-1),
            *ops.chunk(u, 3, axis=1),
        ],
        a,
        b,
        c,
    )
    want = [
        np.concatenate([a, b, c], 1),
        np.concatenate([a, c], 0),
        np.stack([a, c]),
        np.stack([a, c], -1),
        np.stack([a, c, a], 1),
        a[:, :1],
        a[:, 1:1],
        a[:, 1:],
        a[:, :1],
        a[:, 1:2],
        a[:, 2:],
    ]
    for i, (got, w) in enumerate(zip(outs, want)):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, w, err_msg=f"output {i}")


def test_split_and_chunk_return_lists(rng):
    with _graph((DType.float32, [4, 6])) as g:
        x = g.inputs[0].tensor
        parts = ops.split(x, [1, 3])
        chunks = ops.chunk(x, 3, axis=-1)
        assert isinstance(parts, list) and [list(p.shape) for p in parts] == [[1, 6], [3, 6]]
        assert isinstance(chunks, list) and [list(c.shape) for c in chunks] == [[4, 2]] * 3


# ─── repeat_interleave / tile / pad ──────────────────────────────────────


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_repeat_interleave(rng, dtype):
    x = rand(rng, [2, 3], dtype)
    outs = run_op(
        lambda v, r: [
            ops.repeat_interleave(v, 2, axis=0),
            ops.repeat_interleave(v, 3, axis=-1),
            ops.repeat_interleave(v, 2),
            ops.repeat_interleave(v, [2, 3], axis=0),
            ops.repeat_interleave(v, [1, 0, 2], axis=1),
            ops.repeat_interleave(v, r, axis=1, out_dim=6),
            ops.repeat_interleave(v, [4], axis=0),
        ],
        x,
        np.array([3, 1, 2], np.int64),
    )
    want = [
        np.repeat(x, 2, 0),
        np.repeat(x, 3, -1),
        np.repeat(x, 2),
        np.repeat(x, [2, 3], 0),
        np.repeat(x, [1, 0, 2], 1),
        np.repeat(x, [3, 1, 2], 1),
        np.repeat(x, 4, 0),
    ]
    for i, (got, w) in enumerate(zip(outs, want)):
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, w, err_msg=f"output {i}")


def test_repeat_interleave_documented_examples():
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    a0, a1, none, tensor = run_op(
        lambda v, r: [
            ops.repeat_interleave(v, repeats=2, axis=0),
            ops.repeat_interleave(v, repeats=2, axis=1),
            ops.repeat_interleave(v, repeats=2),
            ops.repeat_interleave(v, repeats=r, axis=0, out_dim=5),
        ],
        x,
        np.array([2, 3], np.int64),
    )
    np.testing.assert_array_equal(a0, [[1.0, 2.0], [1.0, 2.0], [3.0, 4.0], [3.0, 4.0]])
    np.testing.assert_array_equal(a1, [[1.0, 1.0, 2.0, 2.0], [3.0, 3.0, 4.0, 4.0]])
    np.testing.assert_array_equal(none, [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0])
    np.testing.assert_array_equal(tensor, [[1.0, 2.0], [1.0, 2.0], [3.0, 4.0], [3.0, 4.0], [3.0, 4.0]])


def test_repeat_interleave_symbolic_input(rng):
    g = build(lambda v: ops.repeat_interleave(v, 2, axis=0), rand(rng, [2, 3]), symbolic=[["batch", None]])
    assert str(_shapes(g)[0][0]) == "batch * 2"
    model = InferenceSession().load(g)
    for batch in (1, 3):
        x = rand(rng, [batch, 3])
        np.testing.assert_array_equal(model.execute(x)[0].to_numpy(), np.repeat(x, 2, 0))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_pad(rng, dtype):
    x = rand(rng, [2, 3], dtype)
    fill = True if dtype == np.bool_ else 7
    a, b, c = run_op(
        lambda v: [ops.pad(v, [1, 0, 2, 1]), ops.pad(v, (0, 2, 1, 1), value=fill), ops.pad(v, [0, 0, 0, 0])], x
    )
    np.testing.assert_array_equal(a, np.pad(x, [(1, 0), (2, 1)]))
    np.testing.assert_array_equal(b, np.pad(x, [(0, 2), (1, 1)], constant_values=fill))
    np.testing.assert_array_equal(c, x)
    assert a.dtype == np.dtype(dtype)


def test_pad_and_tile_symbolic(rng):
    g = build(
        lambda v: [ops.pad(v, [1, 1, 0, 2], value=-1.0), ops.tile(v, [2, 1])],
        rand(rng, [2, 3]),
        symbolic=[["batch", None]],
    )
    assert str(_shapes(g)[0][0]) == "batch + 2" and str(_shapes(g)[1][0]) == "batch * 2"
    model = InferenceSession().load(g)
    for batch in (1, 4):
        x = rand(rng, [batch, 3])
        p, t = [o.to_numpy() for o in model.execute(x)]
        np.testing.assert_array_equal(p, np.pad(x, [(1, 1), (0, 2)], constant_values=-1.0))
        np.testing.assert_array_equal(t, np.tile(x, [2, 1]))


# ─── band_part / as_interleaved_complex ──────────────────────────────────


def _np_band(x, lower, upper, exclude):
    m, n = np.indices(x.shape[-2:])
    keep = np.ones(x.shape[-2:], bool)
    if lower is not None:
        keep &= (m - n) <= lower
    if upper is not None:
        keep &= (n - m) <= upper
    if exclude:
        keep = ~keep
    return np.where(keep, x, np.zeros((), x.dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
@pytest.mark.parametrize("exclude", [False, True])
def test_band_part(rng, dtype, exclude):
    x = rand(rng, [2, 4, 5], dtype)
    cases = [(None, None), (0, None), (None, 0), (1, 2), (0, 0), (3, 4), (-1, 1), (2, -1)]
    outs = run_op(lambda v: [ops.band_part(v, lo, up, exclude) for lo, up in cases], x)
    for (lo, up), got in zip(cases, outs):
        # MAX: -1 means no bound (None).
        lo_, up_ = (None if b == -1 else b for b in (lo, up))
        np.testing.assert_array_equal(got, _np_band(x, lo_, up_, exclude), err_msg=f"{lo}, {up}")


def test_band_part_causal_mask_symbolic(rng):
    g = build(lambda v: ops.band_part(v, num_upper=0), rand(rng, [3, 3]), symbolic=[["n", "n"]])
    model = InferenceSession().load(g)
    for n in (2, 5):
        x = np.ones((n, n), np.float32)
        np.testing.assert_array_equal(model.execute(x)[0].to_numpy(), np.tril(x))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_as_interleaved_complex(rng, dtype):
    x = rand(rng, [3, 8], dtype)
    out = run_op(ops.as_interleaved_complex, x)
    np.testing.assert_array_equal(out, x.reshape(3, 4, 2))
    with pytest.raises(TypeError, match=r"as_interleaved_complex: the last dim of .*\[2, d\] must be static"):
        build(
            ops.as_interleaved_complex, rand(rng, [2, 4], dtype), symbolic=[[None, "d"]]
        )  # MAX: a symbolic last dim is a TypeError


def test_as_interleaved_complex_symbolic_even_dim(rng):
    with Graph("c", input_types=[TensorType(DType.float32, [3, "half"])]) as g:
        x = g.inputs[0].tensor
        y = ops.as_interleaved_complex(ops.concat([x, x], axis=-1))
        assert str(y.shape[1]) == "half" and y.shape[2] == 2
        g.output(y)
    x = rand(rng, [3, 2])
    np.testing.assert_array_equal(
        InferenceSession().load(g).execute(x)[0].to_numpy(), np.concatenate([x, x], -1).reshape(3, 2, 2)
    )


# ─── tracing (jax.jit / grad) ─────────────────────────────────────────────


def test_shape_ops_on_jax_arrays_under_jit_and_grad(rng):
    x = jnp.asarray(rand(rng, [2, 3]))

    def f(a):
        b = ops.concat([ops.reshape(a, [3, 2]), ops.transpose(a, 0, 1)], axis=1)
        c = ops.pad(ops.band_part(ops.tile(b, [1, 1]), 0, None), [1, 0, 0, 1])
        parts = ops.split(ops.repeat_interleave(c, 2, axis=0), [3, 5], axis=0)
        return (
            jnp.sum(parts[0] * 2.0)
            + jnp.sum(parts[1])
            + jnp.sum(ops.stack(ops.chunk(ops.rebind(a, [2, 3]), 3, axis=1)))
        )

    np.testing.assert_allclose(jax.jit(f)(x), f(x), rtol=1e-6)
    g = jax.grad(f)(x)
    assert g.shape == (2, 3) and np.all(np.isfinite(g))
    with pytest.raises(ValueError, match="rebind"):
        ops.rebind(x, [3, 2])


# ─── errors ──────────────────────────────────────────────────────────────


def test_reshape_errors():
    with _graph((DType.float32, [2, 3]), (DType.float32, ["batch", 3])) as g:
        x, s = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError,
            match=(
                r"number of elements must match: input float32\[2, 3\] has 6 elements "
                r"but target shape \[4, 2\] has 8"
            ),
        ):
            ops.reshape(x, [4, 2])
        with pytest.raises(ValueError, match="reshape: cannot reshape .* 6 is not divisible by 4"):
            ops.reshape(x, [4, -1])
        with pytest.raises(ValueError, match="reshape: at most one -1"):
            ops.reshape(x, [-1, -1])
        with pytest.raises(ValueError, match="reshape: negative dim"):
            ops.reshape(x, [-2, -3])
        with pytest.raises(ValueError, match="(?s)reshape: .*batch \\* 3"):
            ops.reshape(s, ["n", 3])
        with pytest.raises(ValueError, match="reshape: cannot infer the -1"):
            ops.reshape(s, [2, -1])
        with pytest.raises(TypeError, match="reshape: shape entries"):
            ops.reshape(x, [2.0, 3])


def test_axis_and_dim_errors():
    with _graph((DType.float32, [2, 3]), (DType.float32, [])) as g:
        x, scalar = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match="flatten: start_dim 1 comes after end_dim 0"):
            ops.flatten(x, 1, 0)
        with pytest.raises(ValueError, match="flatten: end_dim 2 is out of range"):
            ops.flatten(x, 0, 2)
        with pytest.raises(ValueError, match=r"squeeze: dim 1 of float32\[2, 3\] must have size 1"):
            ops.squeeze(x, 1)
        with pytest.raises(ValueError, match="squeeze: axis -3 is out of range"):
            ops.squeeze(x, -3)
        with pytest.raises(ValueError, match="unsqueeze: axis 3 is out of range for rank 2"):
            ops.unsqueeze(x, 3)
        with pytest.raises(ValueError, match="unsqueeze: axis -4"):
            ops.unsqueeze(x, -4)
        with pytest.raises(
            ValueError, match=r"transpose: Axis axis_2 out of range \(expected to be in range of \[-2, 1\], but got 2\)"
        ):
            ops.transpose(x, 0, 2)
        with pytest.raises(ValueError, match="transpose"):
            ops.transpose(scalar, -1, -2)
        with pytest.raises(ValueError, match="permute: dims \\[0, 0\\] is not a permutation"):
            ops.permute(x, [0, 0])
        with pytest.raises(ValueError, match="permute: dims \\[0\\] must list all 2 dims"):
            ops.permute(x, [0])
        with pytest.raises(TypeError, match="squeeze: axis must be an int"):
            ops.squeeze(x, "0")


def test_broadcast_to_errors():
    with _graph((DType.float32, [2, 3]), (DType.int64, [2])) as g:
        x, shape = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError,
            match=(
                r"\[broadcast_to\] input dimension at index 1 \(3\) must be either 1 "
                r"or equal to corresponding output dimension at index 1 \(4\); "
                r"cannot broadcast float32\[2, 3\] to \[2, 4\]"
            ),
        ):
            ops.broadcast_to(x, [2, 4])
        with pytest.raises(ValueError, match="broadcast_to: cannot broadcast .* lower-rank"):
            ops.broadcast_to(x, [3])
        with pytest.raises(ValueError, match="broadcast_to: a tensor-valued shape needs out_dims"):
            ops.broadcast_to(x, shape)
        y = ops.broadcast_to(x, shape, out_dims=[2, 3])
        assert list(y.shape) == [2, 3]
        with pytest.raises(ValueError, match="broadcast_to: shape tensor int64\\[2\\] has 2 entries"):
            ops.broadcast_to(x, shape, out_dims=[1, 2, 3])


def test_broadcast_to_with_tensor_shape_runs(rng):
    x = rand(rng, [1, 3])
    out = run_op(lambda v, s: ops.broadcast_to(v, s, out_dims=[4, 3]), x, np.array([4, 3], np.int64))
    np.testing.assert_array_equal(out, np.broadcast_to(x, [4, 3]))


def test_concat_stack_errors():
    with _graph((DType.float32, [2, 3]), (DType.float32, [3, 3]), (DType.int32, [2, 3]), (DType.float32, [2])) as g:
        a, b, i, r1 = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError,
            match=r"concat: All inputs to concat must have the same dtype, got float32\[2, 3\], int32\[2, 3\]",
        ):
            ops.concat([a, i])
        with pytest.raises(ValueError, match="concat: All inputs to concat must be the same rank"):
            ops.concat([a, r1])
        with pytest.raises(ValueError, match="concat: inputs must match in every dim but axis 1"):
            ops.concat([a, b], axis=1)
        with pytest.raises(ValueError, match="concat: axis 2 is out of range"):
            ops.concat([a, a], axis=2)
        with pytest.raises(ValueError, match="concat: original_vals must contain"):
            ops.concat([])
        with pytest.raises(
            ValueError,
            match=r"stack: inputs must have the same shape; input 0 is float32\[2, 3\], input 1 is float32\[3, 3\]",
        ):
            ops.stack([a, b])
        with pytest.raises(
            ValueError, match=r"stack: Axis out of range \(expected to be in range of \[-3, 2\], but got 3\)"
        ):
            ops.stack([a, a], axis=3)
        with pytest.raises(ValueError, match="stack: All inputs to stack must have the same dtype"):
            ops.stack([a, i])


def test_split_chunk_tile_errors():
    with _graph((DType.float32, [5, 4]), (DType.float32, ["batch", 4])) as g:
        x, s = (v.tensor for v in g.inputs)
        with pytest.raises(
            ValueError,
            match=(
                r"split: Split sizes must sum to dimension value; x\.shape\[axis\]=Dim\(5\) != sum\(sizes=\[2, 2\]\) "
                r"\(input float32\[5, 4\], axis 0\)"
            ),
        ):
            ops.split(x, [2, 2])
        with pytest.raises(ValueError, match=r"split: Split sizes must be positive: sizes=\[6, -1\]"):
            ops.split(x, [6, -1])
        # API_INVENTORY §6 row 20: chunks must divide the dim evenly.
        with pytest.raises(ValueError, match=r"chunk: chunks=2 must statically divide dim 0 of float32\[5, 4\]"):
            ops.chunk(x, 2)
        with pytest.raises(
            TypeError, match=r"chunk: dim 0 of float32\[batch, 4\] must be static to chunk, got symbolic dim batch"
        ):
            ops.chunk(s, 2)
        with pytest.raises(ValueError, match="chunk: chunks must be positive"):
            ops.chunk(x, 0, axis=1)
        with pytest.raises(ValueError, match="tile: repeats \\[2\\] must have one entry per dim"):
            ops.tile(x, [2])
        with pytest.raises(ValueError, match=r"tile: repeats must be positive, got \[1, 0\]"):
            ops.tile(x, [1, 0])


def test_repeat_interleave_sized_by_repeat_values():
    # MAX: a new symbolic out_dim is the sum of the repeats, known when the graph runs.
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    counts = np.array([2, 0, 3], np.int64)
    with _graph((DType.float32, [2, 3]), (DType.int64, [3])) as g:
        x, r = (v.tensor for v in g.inputs)
        out = ops.repeat_interleave(x, r, axis=1, out_dim="total")
        assert list(out.shape) == [2, Dim("total")]
        g.output(out)
    got = InferenceSession().load(g).execute(a, counts)[0].to_numpy()
    np.testing.assert_array_equal(got, np.repeat(a, counts, axis=1))
    eager = F.repeat_interleave(Tensor(a), Tensor(counts), axis=1, out_dim="total")
    np.testing.assert_array_equal(eager.to_numpy(), np.repeat(a, counts, axis=1))
    with pytest.raises(ValueError, match="under jax.jit/vmap sum\\(repeats\\) is unknown"):
        maxfx.jit(lambda v, c: F.repeat_interleave(v, c, axis=1, out_dim="total"))(Tensor(a), Tensor(counts))


def test_repeat_interleave_errors():
    with _graph((DType.float32, [2, 3]), (DType.int64, [3]), (DType.float32, [3])) as g:
        x, r, fr = (v.tensor for v in g.inputs)
        for bad in (0, -2):
            with pytest.raises(ValueError, match="repeat_interleave: repeats must be positive"):
                ops.repeat_interleave(x, bad)
        with pytest.raises(ValueError, match="repeat_interleave: axis 2 is out of range"):
            ops.repeat_interleave(x, 2, axis=2)
        with pytest.raises(ValueError, match="repeat_interleave: tensor-valued repeats need out_dim"):
            ops.repeat_interleave(x, r, axis=1)
        with pytest.raises(ValueError, match=r"repeat_interleave: repeats int64\[3\] must have 1 or 2 entries"):
            ops.repeat_interleave(x, r, axis=0, out_dim=4)
        with pytest.raises(ValueError, match="repeat_interleave: repeats must have an integer dtype"):
            ops.repeat_interleave(x, fr, axis=1, out_dim=4)
        with pytest.raises(ValueError, match="repeat_interleave: out_dim 7 differs from sum"):
            ops.repeat_interleave(x, [1, 2, 3], axis=1, out_dim=7)
        with pytest.raises(TypeError, match="repeat_interleave: axis must be an int"):
            ops.repeat_interleave(x, 2, axis=1.5)


def test_pad_band_part_interleaved_shape_to_tensor_errors():
    with _graph((DType.float32, [2, 3]), (DType.int32, [2, 3]), (DType.float32, [3]), (DType.float32, [2, 5])) as g:
        x, i, v, odd = (t.tensor for t in g.inputs)
        with pytest.raises(ValueError, match="pad: unsupported padding mode 'wrap'"):
            ops.pad(x, [1, 1, 1, 1], mode="wrap")
        with pytest.raises(ValueError, match=r"pad: paddings must have 2 \* rank = 4 values"):
            ops.pad(x, [1, 1])
        with pytest.raises(ValueError, match="pad: paddings must be non-negative"):
            ops.pad(x, [1, -1, 0, 0])
        with pytest.raises(ValueError, match="pad: Unsafe cast"):
            ops.pad(i, [1, 1, 1, 1], value=0.5)
        with pytest.raises(ValueError, match=r"band_part: input must have at least 2 dimensions .*float32\[3\]"):
            ops.band_part(v, 0, 0)
        with pytest.raises(
            ValueError,
            match=r"band_part: num_lower=2 is out of bounds for float32\[2, 3\] \(expected 0 <= num_lower < 2",
        ):
            ops.band_part(x, 2, None)
        with pytest.raises(
            ValueError, match=r"band_part: num_upper must be non-negative \(or None, or -1 meaning None\), got -2"
        ):
            ops.band_part(x, None, -2)
        with pytest.raises(TypeError, match="band_part: num_lower must be an int"):
            ops.band_part(x, 0.5, None)
        with pytest.raises(
            ValueError, match=r"as_interleaved_complex: the last dim of float32\[2, 5\] must be divisible by 2"
        ):
            ops.as_interleaved_complex(odd)
        with pytest.raises(TypeError, match="shape_to_tensor: shape entries"):
            ops.shape_to_tensor([1.5])
