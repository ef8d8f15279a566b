"""matmul against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import Graph, TensorType, ops
from tests.ops.harness import rand, run_op


@pytest.mark.parametrize("lshape,rshape", [
    ([3, 4], [4, 5]),
    ([2, 3, 4], [4, 5]),
    ([2, 1, 3, 4], [5, 4, 2]),
    ([4], [4, 5]),
    ([3, 4], [4]),
    ([4], [4]),
])
def test_matmul_shapes(rng, lshape, rshape):
    a, b = rand(rng, lshape), rand(rng, rshape)
    np.testing.assert_allclose(run_op(ops.matmul, a, b), np.matmul(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.int32, 0), (np.int64, 0), (DType.bfloat16, 3e-2), (np.float16, 3e-3)])
def test_matmul_dtypes(rng, dtype, tol):
    a, b = rand(rng, [3, 8], dtype), rand(rng, [8, 2], dtype)
    out = run_op(lambda x, y: x @ y, a, b)
    assert out.dtype == a.dtype
    np.testing.assert_allclose(out.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64), rtol=tol, atol=tol * 8)


def test_matmul_symbolic_batch(rng):
    w = rand(rng, [4, 3])
    for batch in (1, 5):
        x = rand(rng, [batch, 4])
        np.testing.assert_allclose(run_op(ops.matmul, x, w, symbolic=[["batch", None], None]), x @ w, rtol=1e-5)


def test_matmul_errors():
    with Graph("mm", input_types=[TensorType(DType.float32, [2, 3]), TensorType(DType.float32, [4, 5]), TensorType(DType.int32, [3, 2])]) as g:
        a, b, c = g.inputs
        with pytest.raises(ValueError, match=r"matmul.*float32\[2, 3\].*float32\[4, 5\]"):
            ops.matmul(a, b)
        with pytest.raises(ValueError, match="matmul"):
            ops.matmul(a, c)
        with pytest.raises(ValueError, match="rank"):
            ops.matmul(ops.constant(1.0, DType.float32), a)


def test_matmul_under_jit_and_grad(rng):
    a, b = rand(rng, [2, 3, 4]), rand(rng, [4, 5])
    np.testing.assert_allclose(np.asarray(jax.jit(ops.matmul)(a, b)), a @ b, rtol=1e-5, atol=1e-5)
    grad = jax.grad(lambda x: jnp.sum(ops.matmul(x, b)))(a)
    np.testing.assert_allclose(np.asarray(grad), np.broadcast_to(b.sum(1), a.shape), rtol=1e-5)
    with pytest.raises(ValueError, match=r"matmul: contracting dims differ.*float32\[2, 3, 4\].*float32\[5, 4\]"):
        ops.matmul(jnp.asarray(a), jnp.asarray(b.T))
