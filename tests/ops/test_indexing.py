"""slice_tensor, gather, gather_nd against numpy."""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import Graph, TensorType, ops
from tests.ops.harness import rand, run_op

COVERED_OPS = {"slice_tensor", "gather", "gather_nd"}

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
