"""slice_tensor (x[...]), gather, gather_nd, scatter, scatter_nd, masked_scatter and nonzero against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowering.dims import Dim
from maxfx.dtype import DType
from maxfx.graph import DeviceRef, Graph, TensorType, ops
from tests.ops.harness import build, rand, run_op, session

# ─── slice_tensor ─────────────────────────────────────────────────────────

INDICES = [
    (0,),
    (-1,),
    (1, -2, 3),
    (slice(1, None),),
    (slice(None, None, -1),),
    (slice(3, -5, -1),),  # stop -dim-1: just before the first element
    (slice(-1, -5, -2), slice(1, None, 2)),
    (slice(None, None, -2), 1),
    (slice(4, None),),  # start == dim: empty
    (slice(2, 1),),  # empty
    (Ellipsis, 0),
    (Ellipsis,),
    (),
    (None, 1, slice(0, 2)),
    (1, Ellipsis, None),
    (slice(-3, -1), None, slice(None, None, 2), Ellipsis),
]


@pytest.mark.parametrize("index", INDICES, ids=[repr(i) for i in INDICES])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
def test_slice_tensor_matches_numpy(rng, index, dtype):
    x = rand(rng, [4, 3, 5], dtype)
    out = run_op(lambda v: v[index], x)
    np.testing.assert_array_equal(out, x[index])
    assert out.dtype == x.dtype


def test_slice_tensor_front_and_run_time_indices(rng):
    x = rand(rng, [4, 3, 5])
    # The MAX spelling (a list), scalar int tensors as run-time positions (negative counts from the end),
    # and a slice starting at a tensor position whose length is given by out_dim.
    outs = run_op(
        lambda v, i, s: (
            ops.slice_tensor(v, [slice(None, None, -1)]),
            ops.slice_tensor(v, [..., None, slice(None)]),
            ops.slice_tensor(v, [np.array(2), np.int64(-1)]),  # numpy integer scalars are ints
            v[i, :, i],
            v[(slice(s, None), 2), 1],
        ),
        x,
        np.int64(-1),
        np.int32(1),
    )
    for out, ref in zip(outs, [x[::-1], x[..., None, :], x[2, -1], x[-1, :, -1], x[1:3, 1]]):
        np.testing.assert_array_equal(out, ref)


def test_slice_symbolic_dims(rng):
    with Graph("s", input_types=[TensorType(DType.float32, ["batch", 3])]) as g:
        x = g.inputs[0].tensor
        batch = Dim("batch")
        assert x[1:].shape == [batch - 1, 3]
        assert x[:, :2].shape == [batch, 2]
        assert x[-2:].shape == [2, 3]
        assert x[1:-1, 0].shape == [batch - 2]
        assert x[::-1].shape == [batch, 3]
        assert x[::2].shape == [(batch + 1) // 2, 3]
        assert x[1:, "rows"].shape == ["rows", 3]  # (slice, out_dim) names the result dim
    for n in (4, 5):
        x = rand(rng, [n, 3])
        outs = run_op(
            lambda v: (v[1:], v[:, :2], v[-2:], v[::2], v[::-1], v[2::-2], (v[1:, "rows"] * 2).reshape(["rows", 3])),
            x,
            symbolic=[["batch", None]],
        )
        for out, ref in zip(outs, [x[1:], x[:, :2], x[-2:], x[::2], x[::-1], x[2::-2], x[1:] * 2]):
            np.testing.assert_array_equal(out, ref)


def test_slice_with_dim_bounds(rng):
    # A bound that is another input's symbolic dim: x[:, :k] where y has shape [k].
    x, y = rand(rng, [3, 6]), rand(rng, [4])
    out = run_op(lambda v, w: v[:, : w.shape[0]], x, y, symbolic=[["batch", None], ["k"]])
    np.testing.assert_array_equal(out, x[:, :4])
    with Graph("s", input_types=[TensorType(DType.float32, ["batch", 6]), TensorType(DType.float32, ["k"])]) as g:
        assert g.inputs[0].tensor[:, Dim("k") :].shape == ["batch", 6 - Dim("k")]


def test_slice_symbolic_bounds_checked_at_run_time(rng):
    g = build(lambda v: v[:3], rand(rng, [4, 2]), symbolic=[["batch", None]])
    model = session().load(g)
    np.testing.assert_array_equal(model.execute(np.ones((5, 2), np.float32))[0].to_numpy(), np.ones((3, 2)))
    with pytest.raises(
        IndexError, match=r"slice_tensor: rmo.slice stop index 3 out of range for dimension size 2 \(axis 0"
    ):
        model.execute(np.ones((2, 2), np.float32))


def test_slice_errors():
    with Graph(
        "s",
        input_types=[TensorType(DType.float32, [4, 3]), TensorType(DType.float32, []), TensorType(DType.int64, [2])],
    ) as g:
        x, f, iv = (v.tensor for v in g.inputs)
        with pytest.raises(IndexError, match=r"slice_tensor: index 4 is out of range for axis 0 of size 4"):
            x[4]
        with pytest.raises(IndexError, match=r"slice_tensor: index -4 is out of range for axis 1 of size 3"):
            x[:, -4]
        with pytest.raises(ValueError, match="slice_tensor: index"):  # also a ValueError, as MAX raises
            x[4]
        with pytest.raises(IndexError, match=r"slice_tensor: rmo.slice stop index 5 out of range .* -4 <= stop <= 4"):
            x[:5]
        with pytest.raises(IndexError, match=r"slice_tensor: rmo.slice start index 4 out of range .* -5 <= start <= 3"):
            x[4::-1]
        with pytest.raises(IndexError, match="slice_tensor: too many indices"):
            x[0, 0, 0]
        with pytest.raises(IndexError, match="slice_tensor: .*single Ellipsis"):
            x[..., ...]
        with pytest.raises(ValueError, match="slice_tensor: slice step .* cannot be zero"):
            x[::0]
        with pytest.raises(TypeError, match="slice_tensor: unsupported index 'a'"):
            x["a"]
        with pytest.raises(TypeError, match="slice_tensor: unsupported index 1.5"):
            x[1.5]
        with pytest.raises(TypeError, match="slice_tensor: slice start"):
            x[0.5:]
        with pytest.raises(TypeError, match="slice_tensor: tensor indices must have an integer dtype"):
            x[f]
        with pytest.raises(ValueError, match="slice_tensor: a tensor index must be a scalar"):
            ops.slice_tensor(x, [iv])  # x[iv] is advanced indexing (tests/ops/test_advanced_indexing.py)
        with pytest.raises(ValueError, match="slice_tensor: .*needs an out_dim"):
            x[iv[0] :]
        with pytest.raises(ValueError, match="slice_tensor: .*has 2 elements, but out_dim is 3"):
            ops.slice_tensor(x, [(slice(0, 2), 3)])


def test_slice_traced_by_jax():
    x = jnp.arange(12.0).reshape(4, 3)
    out = jax.jit(lambda a: ops.slice_tensor(a, [slice(None, None, -1), 1]))(x)
    np.testing.assert_array_equal(out, np.asarray(x)[::-1, 1])


# ─── gather / gather_nd ───────────────────────────────────────────────────


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_gather(rng, axis, idx_dtype):
    x = rand(rng, [4, 5, 3])
    n = x.shape[axis]
    idx = rng.integers(-n, n, size=(2, 3)).astype(idx_dtype)  # negative indices count from the end
    np.testing.assert_array_equal(run_op(lambda v, i: ops.gather(v, i, axis), x, idx), np.take(x, idx, axis=axis))


def test_gather_symbolic_and_int_data(rng):
    x = rand(rng, [6, 5], np.int32)
    idx = np.array([4, 0, 4], np.int64)
    out = run_op(lambda v, i: ops.gather(v, i, axis=1), x, idx, symbolic=[["batch", None], None])
    np.testing.assert_array_equal(out, x[:, idx])
    with Graph("g", input_types=[TensorType(DType.float32, ["batch", 5]), TensorType(DType.int64, ["k"])]) as g:
        assert ops.gather(g.inputs[0], g.inputs[1], axis=0).shape == ["k", 5]


def test_gather_errors():
    with Graph(
        "g",
        input_types=[TensorType(DType.float32, [4, 5]), TensorType(DType.float32, [2]), TensorType(DType.int16, [2])],
    ) as g:
        x, fi, si = g.inputs
        ii = ops.constant([0], DType.int32, DeviceRef.CPU())
        with pytest.raises(ValueError, match="gather: indices must have dtype int32 or int64, got float32"):
            ops.gather(x, fi, 0)
        with pytest.raises(ValueError, match="gather: indices must have dtype int32 or int64, got int16"):
            ops.gather(x, si, 0)
        with pytest.raises(IndexError, match="gather: axis 2 is out of range for rank 2"):
            ops.gather(x, ii, 2)
        with pytest.raises(ValueError, match="gather: axis -3"):
            ops.gather(x, ii, -3)


def _gather_nd_ref(x, idx, b):
    if b:
        return np.stack([_gather_nd_ref(x[i], idx[i], b - 1) for i in range(x.shape[0])])
    flat = idx.reshape(-1, idx.shape[-1])
    return np.stack([x[tuple(r)] for r in flat]).reshape(idx.shape[:-1] + x.shape[idx.shape[-1] :])


@pytest.mark.parametrize(
    "xshape,ishape,b",
    [
        ([4, 5, 3], [2, 2], 0),
        ([4, 5, 3], [6, 1], 0),
        ([4, 5, 3], [2, 3], 0),
        ([4, 5, 3], [4, 2, 1], 1),
        ([2, 4, 5, 3], [2, 4, 3, 1], 2),
    ],
)
def test_gather_nd(rng, xshape, ishape, b):
    x = rand(rng, xshape)
    k = ishape[-1]
    idx = np.stack([rng.integers(0, xshape[b + j], size=ishape[:-1]) for j in range(k)], axis=-1).astype(np.int64)
    np.testing.assert_array_equal(
        run_op(lambda v, i: ops.gather_nd(v, i, batch_dims=b), x, idx), _gather_nd_ref(x, idx, b)
    )


def test_gather_nd_documented_shape():
    types = [TensorType(DType.bfloat16, ["a", "b", "c", "d", "e"]), TensorType(DType.int32, ["a", "f", 3])]
    with Graph("gather_nd", input_types=types) as g:
        out = ops.gather_nd(g.inputs[0], g.inputs[1], batch_dims=1)
        assert out.shape == ["a", "f", "e"] and out.dtype is DType.bfloat16


def test_gather_nd_errors():
    types = [
        TensorType(DType.float32, [4, 5]),
        TensorType(DType.int32, [2, 3]),
        TensorType(DType.int32, [3, 1]),
        TensorType(DType.int32, [2, "k"]),
    ]
    with Graph("g", input_types=types) as g:
        x, i3, i1, ik = g.inputs
        with pytest.raises(ValueError, match="gather_nd: indices .* index 3 dims"):
            ops.gather_nd(x, i3)
        with pytest.raises(ValueError, match="gather_nd: batch dim 0 differs"):
            ops.gather_nd(x, i1, batch_dims=1)
        with pytest.raises(ValueError, match="gather_nd: batch_dims=2"):
            ops.gather_nd(x, i1, batch_dims=2)
        with pytest.raises(ValueError, match="gather_nd: the last dim of indices must be static"):
            ops.gather_nd(x, ik)
        with pytest.raises(ValueError, match="gather_nd: indices must have an integer dtype"):
            ops.gather_nd(x, ops.constant([[0.0]], DType.float32, DeviceRef.CPU()))


# ─── scatter / scatter_nd ────────────────────────────────────────────────


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_scatter_elements(rng, axis, dtype):
    x = rand(rng, [4, 5], dtype)
    upd = rand(rng, [2, 3], dtype)
    # Distinct positions along the axis for each position of the other axis: the result is unambiguous.
    if axis == 0:
        idx = np.stack([rng.permutation(4)[:2] for _ in range(3)], axis=1)
    else:
        idx = np.stack([rng.permutation(5)[:3] for _ in range(2)], axis=0)
    ref = x.copy()
    for i in range(2):
        for j in range(3):
            if axis == 0:
                ref[idx[i, j], j] = upd[i, j]
            else:
                ref[i, idx[i, j]] = upd[i, j]
    idx = (idx - np.where(rng.random(idx.shape) < 0.5, x.shape[axis], 0)).astype(np.int64)  # half of them negative
    np.testing.assert_array_equal(run_op(lambda v, u, i: ops.scatter(v, u, i, axis=axis), x, upd, idx), ref)


def test_scatter_documented_example():
    x = np.array([1, 2, 3, 4, 5], np.int32)
    out = run_op(
        lambda v, u, i: ops.scatter(v, u, i, axis=0), x, np.array([10, 20], np.int32), np.array([0, 3], np.int64)
    )
    np.testing.assert_array_equal(out, [10, 2, 3, 20, 5])


@pytest.mark.parametrize("ishape,k", [([3, 2], 2), ([2, 2, 1], 1), ([4, 3], 3)])
def test_scatter_nd(rng, ishape, k):
    x = rand(rng, [4, 5, 3])
    n_upd = int(np.prod(ishape[:-1]))
    # Distinct positions (sampled without replacement) so no two updates collide.
    flat = rng.choice(int(np.prod(x.shape[:k])), size=n_upd, replace=False)
    idx = np.stack(np.unravel_index(flat, x.shape[:k]), axis=-1).reshape(ishape).astype(np.int32)
    upd = rand(rng, ishape[:-1] + list(x.shape[k:]))
    ref = x.copy()
    ref[tuple(idx.reshape(-1, k).T)] = upd.reshape((-1,) + x.shape[k:])
    np.testing.assert_array_equal(run_op(ops.scatter_nd, x, upd, idx), ref)


def test_scatter_symbolic_and_traced(rng):
    x, u = rand(rng, [6, 2]), rand(rng, [6, 1])
    i = np.zeros((6, 1), np.int64)
    out = run_op(
        lambda v, uu, ii: ops.scatter(v, uu, ii, axis=1), x, u, i, symbolic=[["n", None], ["n", None], ["n", None]]
    )
    ref = x.copy()
    ref[:, 0] = u[:, 0]
    np.testing.assert_array_equal(out, ref)
    traced = jax.jit(lambda a, b, c: ops.scatter_nd(a, b, c))(jnp.zeros((3, 2)), jnp.ones((1, 2)), jnp.array([[-1]]))
    np.testing.assert_array_equal(traced, [[0, 0], [0, 0], [1, 1]])


def test_scatter_errors():
    types = [
        TensorType(DType.float32, [4, 5]),
        TensorType(DType.float32, [2, 3]),
        TensorType(DType.int64, [2, 2]),
        TensorType(DType.int64, [2, 3]),
    ]
    with Graph("s", input_types=types) as g:
        x, u, i22, i23 = g.inputs
        with pytest.raises(
            ValueError, match="scatter: The input dtype 'DType.float32' and updates dtype 'DType.int32' must match."
        ):
            ops.scatter(x, ops.cast(u, DType.int32), i23)
        with pytest.raises(
            ValueError, match="scatter: Invalid indices dtype: 'DType.float32'. Indices must be of type int32 or int64."
        ):
            ops.scatter(x, u, ops.cast(i23, DType.float32))
        with pytest.raises(IndexError, match=r"scatter: Invalid axis value 2. Axis must be in range \[-2, 1\]"):
            ops.scatter(x, u, i23, axis=2)
        with pytest.raises(ValueError, match=r"scatter_nd: updates float32\[2, 3\] must have shape .*\[2\]"):
            ops.scatter_nd(x, u, i22)
        with pytest.raises(ValueError, match="scatter_nd: index vectors of length 3"):
            ops.scatter_nd(x, u, i23)
        with pytest.raises(ValueError, match="scatter_nd: Invalid indices dtype: 'DType.float32'"):
            ops.scatter_nd(x, u, ops.cast(i22, DType.float32))


@pytest.mark.parametrize(
    ("op", "ufunc"),
    [
        (ops.scatter_add, np.add),
        (ops.scatter_max, np.maximum),
        (ops.scatter_min, np.minimum),
        (ops.scatter_mul, np.multiply),
    ],
)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_reductions_combine_duplicates(rng, op, ufunc, axis):
    x = rand(rng, [4, 5])
    upd = rand(rng, [3, 5] if axis == 0 else [4, 6])
    idx = rng.integers(-x.shape[axis], x.shape[axis], upd.shape).astype(np.int32)  # duplicates and negative indices
    ref = x.copy()
    grid = list(np.indices(idx.shape))
    grid[axis] = idx % x.shape[axis]
    ufunc.at(ref, tuple(grid), upd)
    np.testing.assert_allclose(run_op(lambda v, u, i: op(v, u, i, axis=axis), x, upd, idx), ref, rtol=1e-6)


@pytest.mark.parametrize(
    ("op", "ufunc"),
    [
        (ops.scatter_nd_add, np.add),
        (ops.scatter_nd_max, np.maximum),
        (ops.scatter_nd_min, np.minimum),
        (ops.scatter_nd_mul, np.multiply),
    ],
)
def test_scatter_nd_reductions_combine_duplicates(rng, op, ufunc):
    x = rand(rng, [4, 3, 2])
    idx = np.array([[1, 2], [0, 0], [1, 2], [-1, 1]], np.int64)  # element slices [2]; one position twice
    upd = rand(rng, [4, 2])
    ref = x.copy()
    ufunc.at(ref, (idx[:, 0] % 4, idx[:, 1]), upd)
    np.testing.assert_allclose(run_op(op, x, upd, idx), ref, rtol=1e-6)


def test_scatter_family_messages_and_devices():

    cpu, gpu = DeviceRef.CPU(), DeviceRef.GPU()
    types = [
        TensorType(DType.float32, [5, 3], cpu),
        TensorType(DType.float32, [2, 3], gpu),
        TensorType(DType.int64, [2, 1], cpu),
        TensorType(DType.float64, [2, 3], cpu),
    ]
    with Graph("s", input_types=types) as g:
        x, u_gpu, i, u64 = (v.tensor for v in g.inputs)
        for name in ("scatter_nd", "scatter_nd_max", "scatter_nd_add"):
            with pytest.raises(
                ValueError,
                match=(
                    rf"{name}: Input values must be on the same device\n    input: TensorType\(dtype=float32, "
                    rf"shape=\[Dim\(5\), Dim\(3\)\], device=cpu:0\)\n    updates: .*device=gpu:0\)"
                ),
            ):
                getattr(ops, name)(x, u_gpu, i)
            with pytest.raises(
                ValueError,
                match=rf"{name}: The input dtype \(DType.float32\) and updates dtype \(DType.float64\) must match",
            ):
                getattr(ops, name)(x, u64, i)
        for name in ("scatter_max", "scatter_min", "scatter_mul", "scatter_add"):
            with pytest.raises(ValueError, match=rf"{name}: Invalid axis value -3. Axis must be in range \[-2, 1\]"):
                getattr(ops, name)(x, u64, i, axis=-3)
            with pytest.raises(
                ValueError,
                match=rf"{name}: The input dtype 'DType.float32' and updates dtype 'DType.float64' must match.",
            ):
                getattr(ops, name)(x, u64, i, axis=0)


def test_scatter_shapes_are_checked_when_the_graph_runs():
    # As in MAX, the graph builds; running it reports the mismatch.
    cases = [
        ([4, 5], [2, 3], [2, 2], r"scatter: updates \(2, 3\) and indices \(2, 2\) must have the same shape"),
        ([4, 5], [6], [6], r"scatter: input \(4, 5\), updates \(6,\) and indices \(6,\) must have the same rank"),
        ([4, 5], [2, 6], [2, 6], r"scatter: dim 1 of indices \(2, 6\) exceeds that of input \(4, 5\)"),
    ]
    for xs, us, js, msg in cases:
        with Graph(
            "s", input_types=[TensorType(DType.float32, xs), TensorType(DType.float32, us), TensorType(DType.int64, js)]
        ) as g:
            g.output(ops.scatter(*(v.tensor for v in g.inputs), axis=0))
        args = [np.zeros(xs, np.float32), np.zeros(us, np.float32), np.zeros(js, np.int64)]
        with pytest.raises(ValueError, match=msg):
            session().load(g).execute(*args)


# ─── masked_scatter ──────────────────────────────────────────────────────


def test_masked_scatter(rng):
    x = rand(rng, [3, 4])
    upd = np.arange(14, dtype=np.float32) + 100  # more updates than true positions: the first ones are used
    mask = x > 0
    ref = x.copy()
    ref[mask] = upd[: mask.sum()]
    row_mask = np.array([[True, False, False, True]])  # broadcast over the rows
    ref_rows = x.copy()
    ref_rows[np.broadcast_to(row_mask, x.shape)] = upd[:6]
    outs = run_op(
        lambda v, m, u: (
            ops.masked_scatter(v, m, u, out_dim="n"),
            ops.masked_scatter(v, row_mask, u, out_dim=6),
            ops.masked_scatter(v, ops.cast(m, DType.int32), u, out_dim="n"),  # nonzero means true
        ),
        x,
        mask,
        upd,
    )
    for out, r in zip(outs, [ref, ref_rows, ref]):
        np.testing.assert_array_equal(out, r)


def test_masked_scatter_documented_example():
    x = np.array([[1, 2], [3, 4]], np.int32)
    mask = np.array([[True, False], [False, True]])
    out = run_op(
        lambda v, m, u: ops.masked_scatter(v, m, u, out_dim="num_updates"), x, mask, np.array([10, 20], np.int32)
    )
    np.testing.assert_array_equal(out, [[10, 2], [3, 20]])


def test_masked_scatter_errors():
    types = [TensorType(DType.float32, [3, 4]), TensorType(DType.bool, [3, 4]), TensorType(DType.float32, [2])]
    with Graph("m", input_types=types) as g:
        x, m, u = g.inputs
        with pytest.raises(ValueError, match="masked_scatter: input .* and updates .* must have the same dtype"):
            ops.masked_scatter(x, m, ops.cast(u, DType.int32), "n")
        with pytest.raises(ValueError, match="masked_scatter"):
            ops.masked_scatter(x, ops.constant([True, False], DType.bool, DeviceRef.CPU()), u, "n")
        with pytest.raises(
            ValueError, match="masked_scatter: updates float32.2. have 2 elements, fewer than out_dim 3"
        ):
            ops.masked_scatter(x, m, u, 3)
        with pytest.raises(TypeError, match="masked_scatter: out_dim"):
            ops.masked_scatter(x, m, u, 1.5)


# ─── nonzero ─────────────────────────────────────────────────────────────


def test_nonzero_count_differs_between_calls(rng):
    x0 = rand(rng, [3, 4])
    g = build(lambda v: ops.nonzero(v, "nz"), x0)
    (out_t,) = g.output_types
    assert out_t.dtype is DType.int64 and out_t.shape == ["nz", 2]
    model = session().load(g)
    for density in (0.0, 0.2, 0.7, 1.0):
        x = ((rng.random((3, 4)) < density) * rng.uniform(-2, 2, (3, 4))).astype(np.float32)
        out = model.execute(x)[0].to_numpy()
        np.testing.assert_array_equal(out, np.argwhere(x))
        assert out.dtype == np.int64


@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.float16])
def test_nonzero_dtypes_and_ranks(rng, dtype):
    for shape in ([7], [2, 3, 2]):
        x = rand(rng, shape, dtype, -1, 2)
        np.testing.assert_array_equal(run_op(lambda v: ops.nonzero(v, "n"), x), np.argwhere(x))


def test_nonzero_symbol_is_bound_for_later_ops(rng):
    # Values at the nonzero positions: gather_nd over nonzero's [nz, 2] indices, then a reshape using "nz".
    def fn(v):
        idx = ops.nonzero(v, "nz")
        vals = ops.gather_nd(v, idx)
        return ops.reshape(vals * 2, ["nz", 1])

    g = build(fn, rand(rng, [3, 4]))
    model = session().load(g)
    for density in (0.3, 0.8):
        x = ((rng.random((3, 4)) < density) * rng.uniform(1, 2, (3, 4))).astype(np.float32)
        np.testing.assert_array_equal(model.execute(x)[0].to_numpy(), (x[x != 0] * 2).reshape(-1, 1))


def test_nonzero_static_out_dim():
    x = np.array([[0, 1], [2, 0]], np.int32)
    np.testing.assert_array_equal(run_op(lambda v: ops.nonzero(v, 2), x), [[0, 1], [1, 0]])
    model = session().load(build(lambda v: ops.nonzero(v, 2), x))
    with pytest.raises(ValueError, match="nonzero: out_dim is 2 but the input has 3 nonzero elements"):
        model.execute(np.array([[1, 1], [2, 0]], np.int32))
    # Under jax.jit the count is unknown: an int out_dim pads (or truncates) like jnp.nonzero(size=...).
    padded = jax.jit(lambda a: ops.nonzero(a, 3))(jnp.asarray(x))
    np.testing.assert_array_equal(padded, [[0, 1], [1, 0], [0, 0]])
    with pytest.raises(ValueError, match="nonzero: under jax.jit"):
        jax.jit(lambda a: ops.nonzero(a, "n"))(jnp.asarray(x))
    with Graph("nz", input_types=[TensorType(DType.float32, [3])]):
        with pytest.raises(TypeError, match="nonzero: out_dim"):
            ops.nonzero(ops.constant([1.0, 0.0, 2.0], DType.float32, DeviceRef.CPU()), 2.5)
