"""Advanced indexing (``x[idx]``, ``x[mask]``, ``x[idx] = v``) against numpy: eager, ``F.lazy()``, graphs, ``jax.jit``,
``jax.grad``.

The ops are ``"advanced_indexing_getitem"``, ``"advanced_indexing_setitem"`` and
``"advanced_indexing_setitem_inplace"`` (MAX's kernel names, also reached through
``ops.custom`` / ``ops.inplace_custom`` with MAX's ``start_axis`` convention).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowering.eager import eager_stats
from lowering.ops.advanced_indexing import DataDependentShapeError, setitem
from maxfx.driver import Tensor as DriverTensor
from maxfx.dtype import DType
from maxfx.experimental import functional as F
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
from maxfx.tensor import Tensor
from tests.ops.harness import rand, run_op, session

CPU = DeviceRef.CPU()
A = np.arange(60, dtype=np.float32).reshape(3, 4, 5)

# Indices of A (shape [3, 4, 5]) as numpy data: numpy's own indexing is the reference.
GET = {
    "list": ([2, 0, -1],),
    "array 2-d": (np.array([[0, 1], [2, -3]]),),
    "second axis": (slice(None), [3, 0]),
    "two arrays broadcast": (np.array([[0], [2]]), np.array([1, 3, -1])),
    "array then slice": ([1, 2], slice(1, 4)),
    "slice then arrays": (slice(None, None, -1), [0, 1], [4, 0]),
    "int and array adjacent": (1, [0, 2]),
    "int and array apart": (0, slice(None), [1, 3]),
    "arrays apart": ([0, 2], slice(1, 3), [4, 0]),
    "None between arrays": ([0, 1], None, [2, 3]),
    "None first": (None, [2, 1]),
    "ellipsis": (Ellipsis, [-1, 0]),
    "clamped slice": ([0], slice(0, 99)),
    "empty list": ([],),
    "mask all dims": (A > 37,),
    "mask leading dims": (A[:, :, 0] > 12,),
    "mask after slice": (slice(None), np.array([True, False, True, True])),
    "mask and array": (np.array([True, False, True]), slice(None), [0, 4]),
}
GET_IDS = list(GET)

SET = {
    "rows": ([2, 0], -1.0),
    "rows from tensor": ([2, 0], np.arange(40, dtype=np.float32).reshape(2, 4, 5)),
    "column broadcast": ((slice(None), [3, 0]), np.arange(5, dtype=np.float32)),
    "points": (([0, 2], [1, 3], [4, 0]), np.array([7.0, 8.0], np.float32)),
    "arrays apart": (([0, 2], slice(1, 3), [4, 0]), np.arange(4, dtype=np.float32).reshape(2, 2)),
    "negative": (([-1], slice(None), -2), 5.0),
    "mask": ((A > 40,), 0.0),
    "mask rows with values": ((A[:, 0, 0] >= 20,), np.ones((2, 4, 5), np.float32)),
    "basic slice": ((0, slice(1, 3)), 9.0),
}
SET_IDS = list(SET)


def _np_set(x: np.ndarray, index, value) -> np.ndarray:
    out = x.copy()
    out[index] = value
    return out


def _as_tensors(index):
    """The index with numpy arrays as eager Tensors (so they are traced/recorded, not constants)."""
    entries = index if isinstance(index, tuple) else (index,)
    return tuple(Tensor(e) if isinstance(e, np.ndarray) else e for e in entries)


# ─── getitem ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", GET_IDS)
def test_getitem_eager_matches_numpy(name):
    index = GET[name]
    for idx in (index, _as_tensors(index)):
        out = Tensor(A)[idx]
        np.testing.assert_array_equal(out.to_numpy(), A[index])
        assert out.real


@pytest.mark.parametrize("name", GET_IDS)
def test_getitem_lazy_jit_and_graph_match_numpy(name):
    index = GET[name]
    with F.lazy():
        pending = Tensor(A) * 1.0
        out = pending[index]
        assert not out.real  # recorded; realized when read
    np.testing.assert_array_equal(out.to_numpy(), A[index])
    # Constant (numpy) indices, masks included, are known while tracing: they work under jit and in graphs.
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda t: t[index])(Tensor(A))), A[index])
    np.testing.assert_array_equal(run_op(lambda v: v[index], A), A[index])


def test_getitem_index_tensors_traced_and_in_graphs(rng):
    x = rand(rng, [3, 4, 5])
    i, j = np.array([[2, 0], [-1, 1]], np.int64), np.array([4, -5], np.int32)
    want = x[i, :, j]
    got_jit = jax.jit(lambda t, a, b: t[a, :, b])(Tensor(x), Tensor(i), Tensor(j))
    np.testing.assert_array_equal(np.asarray(got_jit), want)
    np.testing.assert_array_equal(run_op(lambda v, a, b: v[a, :, b], x, i, j), want)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(lambda t, a: t[a])(jnp.asarray(x), jnp.asarray(i))), x[i]
    )  # JAX arrays too


def test_getitem_symbolic_dims():
    with Graph("sym", input_types=[TensorType(DType.float32, ["n", 4, 5]), TensorType(DType.int64, ["k"])]) as g:
        x, i = (v.tensor for v in g.inputs)
        assert x[i].shape == ["k", 4, 5]
        assert x[:, i].shape == ["n", "k", 5]
        assert x[i, :, i].shape == ["k", 4]
        assert x[:, [0, 1], 1:].shape == ["n", 2, 4]
        g.output(x[i, 1:], x[[0, -1], :, [4, 0]])
    data, idx = A, np.array([2, 0, 2, 1], np.int64)
    out = session().load(g).execute(data, idx)
    np.testing.assert_array_equal(out[0].to_numpy(), data[idx, 1:])
    np.testing.assert_array_equal(out[1].to_numpy(), data[[0, -1], :, [4, 0]])


def test_getitem_dtypes(rng):
    for dtype in (np.int32, np.float16, np.bool_, np.int64):
        x = rand(rng, [4, 3], dtype)
        np.testing.assert_array_equal(Tensor(x)[[3, 1]].to_numpy(), x[[3, 1]])
        np.testing.assert_array_equal(Tensor(x)[:, np.array([True, False, True])].to_numpy(), x[:, [True, False, True]])


def test_getitem_grad_matches_numpy():
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    idx = np.array([2, 0, 2])

    def loss(t):
        return jnp.sum(t[idx, 1:] * 2.0)  # jnp reads the Tensor via __jax_array__

    g = jax.grad(loss)(Tensor(x, dtype=DType.float32))
    want = np.zeros_like(x)
    np.add.at(want, (idx[:, None], np.arange(1, 4)[None, :]), 2.0)  # repeated rows accumulate
    np.testing.assert_array_equal(np.asarray(g), want)
    mask = x > 5
    g = jax.grad(lambda t: jnp.sum(t[mask]))(Tensor(x, dtype=DType.float32))
    np.testing.assert_array_equal(np.asarray(g), mask.astype(np.float32))


# ─── setitem ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", SET_IDS)
def test_setitem_in_place_eager_and_lazy(name):
    index, value = SET[name]
    want = _np_set(A, index, value)
    t = Tensor(A)
    t[index] = value
    np.testing.assert_array_equal(t.to_numpy(), want)
    assert t.real
    t = Tensor(A)
    t[_as_tensors(index)] = Tensor(value) if isinstance(value, np.ndarray) else value  # index and value tensors
    np.testing.assert_array_equal(t.to_numpy(), want)
    with F.lazy():
        t = Tensor(A) * 1.0
        before = t
        t[index] = value
        assert not t.real and t is before  # the same object, rebound to the pending result
    np.testing.assert_array_equal(t.to_numpy(), want)


@pytest.mark.parametrize("name", SET_IDS)
def test_setitem_jit_and_graph(name):
    index, value = SET[name]
    want = _np_set(A, index, value)

    def assign(t):
        t = t * 1.0
        t[index] = value
        return t

    np.testing.assert_array_equal(np.asarray(jax.jit(assign)(Tensor(A))), want)
    np.testing.assert_array_equal(run_op(lambda v: setitem(v, index, value), A), want)


def test_setitem_traced_mask_keeps_the_shape():
    # The mask's values are unknown under jit and in graphs; x[mask] = v still has the shape of x.
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    rows = np.array([True, False, True])

    def clip(t):
        t = t * 1.0
        t[t > 6.0] = 6.0
        return t

    np.testing.assert_array_equal(np.asarray(jax.jit(clip)(Tensor(x))), np.minimum(x, 6.0))
    fill = np.array([[-1.0, -2.0, -3.0, -4.0], [-5.0, -6.0, -7.0, -8.0]], np.float32)
    got = run_op(lambda v, m, f: setitem(v, m, f), x, rows, fill)  # one value row per True row (masked_scatter)
    np.testing.assert_array_equal(got, _np_set(x, rows, fill))
    got = run_op(
        lambda v, m: setitem(v, m, np.array([0.5, 1.5, 2.5, 3.5], np.float32)), x, rows
    )  # one row for all (where)
    np.testing.assert_array_equal(got, _np_set(x, rows, [0.5, 1.5, 2.5, 3.5]))
    column = np.array([[10.0], [20.0]], np.float32)  # a value per True row, broadcast along it
    np.testing.assert_array_equal(run_op(lambda v, m, c: setitem(v, m, c), x, rows, column), _np_set(x, rows, column))
    one_row = np.ones((1, 4), np.float32)  # a leading size-1 dim: the same row for every True entry
    np.testing.assert_array_equal(run_op(lambda v, m, r: setitem(v, m, r), x, rows, one_row), _np_set(x, rows, one_row))


def test_setitem_grad_matches_numpy():
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    idx = np.array([2, 0])

    def loss(t, v):
        t = t * 1.0
        t[idx] = v * 3.0
        return jnp.sum(t * t)

    v = np.full((2, 4), 0.5, np.float32)
    gx, gv = jax.grad(loss, argnums=(0, 1))(Tensor(x, dtype=DType.float32), Tensor(v, dtype=DType.float32))
    want_x = 2 * x
    want_x[idx] = 0.0  # overwritten entries do not reach the loss
    np.testing.assert_allclose(np.asarray(gx), want_x)
    np.testing.assert_allclose(np.asarray(gv), 2 * 3.0 * (3.0 * v))


def test_buffer_setitem_with_index_arrays():
    types = [
        BufferType(DType.float32, [3, 4], CPU),
        TensorType(DType.int64, [2], CPU),
        TensorType(DType.float32, [2, 4], CPU),
    ]
    with Graph("buf", input_types=types) as g:
        buf, rows, vals = g.inputs
        buf[rows] = vals  # advanced_indexing_setitem_inplace
        buf[:, [0, -1]] = 0.0
        g.output(buf[[1]])
    state = DriverTensor.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    rows, vals = np.array([2, -3]), np.full((2, 4), 9.0, np.float32)
    (row1,) = session().load(g).execute(state, rows, vals)
    want = _np_set(np.arange(12, dtype=np.float32).reshape(3, 4), rows, vals)
    want[:, [0, -1]] = 0.0
    np.testing.assert_array_equal(state.to_numpy(), want)
    np.testing.assert_array_equal(row1.to_numpy(), want[[1]])


def test_row_writes_in_a_loop_compile_once():
    # Int positions are run-time inputs of the op, not params: t[i] = row needs one program for every i.
    t, row = Tensor(np.zeros((6, 3), np.float32)), Tensor(np.ones(3, np.float32))
    t[0] = row
    t[0, 1] = 1.0
    before = eager_stats()["compiles"]
    for i in range(1, 6):
        t[i] = row
        t[-i, 1] = 2.0
    assert eager_stats()["compiles"] == before
    want = np.ones((6, 3), np.float32)
    for i in range(1, 6):
        want[i] = 1.0
        want[-i, 1] = 2.0
    np.testing.assert_array_equal(t.to_numpy(), want)


def test_setitem_casts_values_and_refuses_floats_into_ints():
    t = Tensor(np.zeros(4, np.float32))
    t[[1, 3]] = Tensor(np.array([2, 5], np.int32))  # int values into a float tensor: cast
    np.testing.assert_array_equal(t.to_numpy(), [0, 2, 0, 5])
    i = Tensor(np.zeros(4, np.int32))
    with pytest.raises(TypeError, match="cannot store float64 values into a int32 tensor"):
        i[[0]] = 1.5
    with pytest.raises(TypeError, match="cannot store float32 values into a int32 tensor"):
        i[[0]] = Tensor([1.5])


# ─── MAX's kernels through ops.custom ────────────────────────────────────


def _max_data(start_axis: int, n: int, index_shape: list[int]):
    x = np.arange(5**4, dtype=np.float32).reshape(5, 5, 5, 5)
    indices = [((np.arange(int(np.prod(index_shape))).reshape(index_shape) + k) % 5).astype(np.int32) for k in range(n)]
    where = tuple([slice(None)] * start_axis + indices)
    return x, indices, where


@pytest.mark.parametrize("start_axis,n", [(0, 1), (1, 2), (2, 2), (0, 3)])
@pytest.mark.parametrize("symbolic_out", [False, True])
def test_custom_getitem_with_max_conventions(start_axis, n, symbolic_out):
    x, indices, where = _max_data(start_axis, n, [2, 3])
    want = x[where]
    out_shape = [f"d{i}" for i in range(want.ndim)] if symbolic_out else list(want.shape)
    types = [TensorType(DType.float32, x.shape, CPU)] + [TensorType(DType.int32, [2, 3], CPU)] * n
    with Graph("getitem", input_types=types) as g:
        out = ops.custom(
            "advanced_indexing_getitem",
            device=CPU,
            values=list(g.inputs),
            out_types=[TensorType(DType.float32, out_shape, CPU)],
            parameters={"start_axis": start_axis},
        )[0].tensor
        assert list(out.shape) == out_shape  # the declared type, checked when the graph runs
        g.output(out)
    np.testing.assert_array_equal(session().load(g).execute(x, *indices)[0].to_numpy(), want)


@pytest.mark.parametrize("start_axis,n", [(0, 1), (2, 2), (1, 3)])
def test_custom_setitem_and_inplace_with_max_conventions(start_axis, n):
    x, indices, where = _max_data(start_axis, n, [1, 2])
    region = x[where].shape
    updates = -np.arange(int(np.prod(region)), dtype=np.float32).reshape(region)
    want = _np_set(x, where, updates)
    xt = TensorType(DType.float32, x.shape, CPU)
    types = [xt, TensorType(DType.float32, region, CPU)] + [TensorType(DType.int32, [1, 2], CPU)] * n
    with Graph("setitem", input_types=types) as g:
        (out,) = ops.custom(
            "advanced_indexing_setitem",
            device=CPU,
            values=list(g.inputs),
            out_types=[xt],
            parameters={"start_axis": start_axis},
        )
        g.output(out)
    np.testing.assert_array_equal(session().load(g).execute(x, updates, *indices)[0].to_numpy(), want)
    with Graph("setitem_inplace", input_types=[xt.as_buffer(), *types[1:]]) as g:
        assert (
            ops.inplace_custom(
                "advanced_indexing_setitem_inplace",
                device=CPU,
                values=list(g.inputs),
                out_types=[],
                parameters={"start_axis": start_axis},
            )
            == []
        )
        g.output()
    buf = DriverTensor.from_numpy(x.copy())
    session().load(g).execute(buf, updates, *indices)
    np.testing.assert_array_equal(buf.to_numpy(), want)


def test_custom_kernels_on_eager_tensors_and_their_errors():
    x = Tensor(A)
    (out,) = ops.custom(
        "advanced_indexing_getitem", CPU, [x, Tensor(np.array([2, 0], np.int32))], None, {"start_axis": 1}
    )
    np.testing.assert_array_equal(out.to_numpy(), A[:, [2, 0]])
    with pytest.raises(TypeError, match="'advanced_indexing_setitem_inplace' is called with ops.inplace_custom"):
        ops.custom("advanced_indexing_setitem_inplace", CPU, [x, x, Tensor(np.array([0], np.int32))], None)
    with pytest.raises(ValueError, match="gives float32\\[3, 2, 5\\], but out_types declares int32"):
        ops.custom(
            "advanced_indexing_getitem",
            CPU,
            [x, Tensor(np.array([2, 0], np.int32))],
            [TensorType(DType.int32, [3, 2, 5], CPU)],
            {"start_axis": 1},
        )
    with pytest.raises(IndexError, match="too many indices"):
        ops.custom(
            "advanced_indexing_getitem", CPU, [x, *[Tensor(np.array([0], np.int32))] * 2], None, {"start_axis": 2}
        )


# ─── errors ───────────────────────────────────────────────────────────────


def test_out_of_range_names_the_axis_and_its_size():
    x = Tensor(A)
    msg = r"index 4 is out of range for axis 1 of size 4 \(valid: -4 to 3\)"
    with pytest.raises(IndexError, match=msg):  # numpy data: checked when the op is built, in every mode
        x[:, [0, 4]]
    with pytest.raises(IndexError, match=msg):
        jax.jit(lambda t: t[:, [0, 4]])(x)
    with pytest.raises(IndexError, match=msg):
        run_op(lambda v: v[:, [0, 4]], A)
    with pytest.raises(IndexError, match=r"index -4 is out of range for axis 0 of size 3"):
        x[np.array([-4])] = 1.0
    with pytest.raises(IndexError, match=msg):  # an eager index tensor: checked on its values
        x[:, Tensor(np.array([0, 4], np.int32))]
    with pytest.raises(IndexError, match=r"index 7 is out of range for axis 2 of size 5"):
        x[0, :, Tensor(np.array([7], np.int64))] = 1.0
    with pytest.raises(IndexError, match=r"index 3 is out of range for axis 0 of size 3"):
        x[3, [0]]


def test_out_of_range_index_tensors_clamp_inside_jit():
    # Index values unknown while tracing: reads clamp and writes are dropped (XLA's gather/scatter), as in JAX.
    x, idx = Tensor(A), Tensor(np.array([0, 9], np.int32))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda t, i: t[i])(x, idx)), A[[0, 2]])

    def assign(t, i):
        t = t * 1.0
        t[i] = -1.0
        return t

    np.testing.assert_array_equal(np.asarray(jax.jit(assign)(x, idx)), _np_set(A, [0], -1.0))


def test_boolean_mask_with_unknown_values_raises_data_dependent():
    x = Tensor(A)
    with pytest.raises(DataDependentShapeError, match="shape depends on the mask's values"):
        jax.jit(lambda t: t[t > 3.0])(x)
    with pytest.raises(IndexError, match="shape depends on the mask's values"):
        run_op(lambda v: v[v > 3.0], A)
    with F.lazy():  # a pending mask is realized: its values exist
        masked = (x * 1.0)[x > 50.0]
    np.testing.assert_array_equal(masked.to_numpy(), A[A > 50.0])


def test_index_errors():
    x = Tensor(A)
    with pytest.raises(
        IndexError,
        match=(
            "boolean index did not match indexed tensor along axis 1; size of axis is 4 but size of corresponding "
            "boolean axis is 3"
        ),
    ):
        x[:, np.array([True, False, True])]
    with pytest.raises(IndexError, match=r"indexing arrays could not be broadcast together with shapes \[2\] \[3\]"):
        x[[0, 1], [0, 1, 2]]
    with pytest.raises(IndexError, match="arrays used as indices must be of integer \\(or boolean\\) type, got float"):
        x[np.array([0.0, 1.0])]
    with pytest.raises(IndexError, match="too many indices for a tensor of rank 3"):
        x[[0], 0, 0, 0]
    with pytest.raises(TypeError, match="bool scalar index"):
        x[True]
    with pytest.raises(ValueError, match=r"updates float32\[2\] cannot be broadcast to the indexed region \[2, 4, 5\]"):
        x[[0, 1]] = Tensor([1.0, 2.0])
    with Graph("g", input_types=[TensorType(DType.float32, [3, 4]), TensorType(DType.float32, [2])]) as g:
        v, f = (i.tensor for i in g.inputs)
        with pytest.raises(IndexError, match="arrays used as indices must be of integer"):
            v[f]
