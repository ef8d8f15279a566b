"""slice_tensor, gather, gather_nd against numpy."""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import Graph, TensorType, ops
from tests.ops.harness import rand, run_op

COVERED_OPS = {"slice_tensor", "gather", "gather_nd", "scatter", "scatter_nd", "masked_scatter", "nonzero"}

INDICES = [
    (0,),
    (-1,),
    (slice(1, None),),
    (slice(None, None, -1),),
    (slice(None, None, -2), 1),
    (Ellipsis, 0),
    (None, 1, slice(0, 2)),
    (1, Ellipsis, None),
    (slice(-3, -1), slice(None, None, 2)),
]


@pytest.mark.parametrize("index", INDICES, ids=[repr(i) for i in INDICES])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_])
def test_slice_tensor_matches_numpy(rng, index, dtype):
    x = rand(rng, [4, 3, 5], dtype)
    np.testing.assert_array_equal(run_op(lambda v: v[index], x), x[index])


def test_slice_symbolic_dim(rng):
    with Graph("s", input_types=[TensorType(DType.float32, ["batch", 3])]) as g:
        y = g.inputs[0].tensor[1:, :2]
        assert y.shape == [TensorType(DType.float32, ["batch"]).shape[0] - 1, 2]
    x = rand(rng, [5, 3])
    np.testing.assert_array_equal(run_op(lambda v: v[1:, :2], x, symbolic=[["batch", None]]), x[1:, :2])


def test_slice_errors():
    with Graph("s", input_types=[TensorType(DType.float32, [4, 3])]) as g:
        x = g.inputs[0].tensor
        with pytest.raises(IndexError, match=r"slice_tensor.*index 4.*size 4"):
            x[4]
        with pytest.raises(IndexError, match="too many"):
            x[0, 0, 0]
        with pytest.raises(TypeError, match="slice_tensor"):
            x["a"]
        with pytest.raises(ValueError, match="step"):
            x[::0]


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_gather(rng, axis, idx_dtype):
    x = rand(rng, [4, 5, 3])
    idx = rng.integers(0, x.shape[axis], size=(2, 3)).astype(idx_dtype)
    np.testing.assert_array_equal(run_op(lambda v, i: ops.gather(v, i, axis), x, idx), np.take(x, idx, axis=axis))


def test_gather_errors():
    with Graph("g", input_types=[TensorType(DType.float32, [4, 5]), TensorType(DType.float32, [2])]) as g:
        with pytest.raises(ValueError, match="gather: indices"):
            ops.gather(g.inputs[0], g.inputs[1], 0)
        with pytest.raises(ValueError, match="axis 2"):
            ops.gather(g.inputs[0], ops.constant([0], DType.int32), 2)


def _gather_nd_ref(x, idx, b):
    if b:
        return np.stack([_gather_nd_ref(x[i], idx[i], b - 1) for i in range(x.shape[0])])
    flat = idx.reshape(-1, idx.shape[-1])
    return np.stack([x[tuple(r)] for r in flat]).reshape(idx.shape[:-1] + x.shape[idx.shape[-1]:])


@pytest.mark.parametrize("xshape,ishape,b", [([4, 5, 3], [2, 2], 0), ([4, 5, 3], [6, 1], 0), ([4, 5, 3], [4, 2, 1], 1), ([2, 4, 5, 3], [2, 4, 3, 1], 2)])
def test_gather_nd(rng, xshape, ishape, b):
    x = rand(rng, xshape)
    k = ishape[-1]
    idx = np.stack([rng.integers(0, xshape[b + j], size=ishape[:-1]) for j in range(k)], axis=-1).astype(np.int64)
    np.testing.assert_array_equal(run_op(lambda v, i: ops.gather_nd(v, i, batch_dims=b), x, idx), _gather_nd_ref(x, idx, b))


def test_gather_nd_errors():
    with Graph("g", input_types=[TensorType(DType.float32, [4, 5]), TensorType(DType.int32, [2, 3]), TensorType(DType.int32, [3, 1])]) as g:
        with pytest.raises(ValueError, match="gather_nd"):
            ops.gather_nd(g.inputs[0], g.inputs[1])
        with pytest.raises(ValueError, match="batch dim 0"):
            ops.gather_nd(g.inputs[0], g.inputs[2], batch_dims=1)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements(rng, axis):
    x = rand(rng, [4, 5])
    upd = rand(rng, [2, 3])
    # Distinct indices along the axis for each position of the other axis: the result is unambiguous.
    if axis == 0:
        idx = np.stack([rng.permutation(4)[:2] for _ in range(3)], axis=1)
    else:
        idx = np.stack([rng.permutation(5)[:3] for _ in range(2)], axis=0)
    idx = idx.astype(np.int64)
    ref = x.copy()
    for i in range(2):
        for j in range(3):
            if axis == 0:
                ref[idx[i, j], j] = upd[i, j]
            else:
                ref[i, idx[i, j]] = upd[i, j]
    np.testing.assert_array_equal(run_op(lambda v, u, i: ops.scatter(v, u, i, axis=axis), x, upd, idx), ref)


def test_scatter_nd(rng):
    x = rand(rng, [4, 5, 3])
    idx = np.array([[0, 1], [3, 4], [2, 0]], np.int64)
    upd = rand(rng, [3, 3])
    ref = x.copy()
    ref[idx[:, 0], idx[:, 1]] = upd
    np.testing.assert_array_equal(run_op(ops.scatter_nd, x, upd, idx), ref)


def test_scatter_errors():
    with Graph("s", input_types=[TensorType(DType.float32, [4, 5]), TensorType(DType.float32, [2, 3]), TensorType(DType.int64, [2, 2])]) as g:
        x, u, i = g.inputs
        with pytest.raises(ValueError, match="scatter: indices"):
            ops.scatter(x, u, i)
        with pytest.raises(ValueError, match="scatter_nd: updates"):
            ops.scatter_nd(x, u, i)


def test_masked_scatter(rng):
    x = rand(rng, [3, 4])
    mask = x > 0
    upd = np.arange(12, dtype=np.float32) + 100
    ref = x.copy()
    ref[mask] = upd[: mask.sum()]
    np.testing.assert_array_equal(run_op(lambda v, m, u: ops.masked_scatter(v, m, u, out_dim="n"), x, mask, upd), ref)


def test_nonzero_has_a_data_dependent_size(rng):
    with Graph("nz", input_types=[TensorType(DType.float32, [3, 4])]) as g:
        idx = ops.nonzero(g.inputs[0], "n")
        assert idx.dtype is DType.int64 and idx.shape == ["n", 2]
        g.output(idx)
    from maxfx.engine import InferenceSession

    model = InferenceSession().load(g)
    for density in (0.2, 0.7):
        x = (rng.random((3, 4)) < density).astype(np.float32)
        np.testing.assert_array_equal(model.execute(x)[0].to_numpy(), np.argwhere(x))
