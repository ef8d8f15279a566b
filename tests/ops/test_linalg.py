"""matmul against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import Graph, TensorType, ops
from tests.ops.harness import build, rand, run_op, session


@pytest.mark.parametrize(
    "lshape,rshape",
    [
        ([3, 4], [4, 5]),
        ([2, 3, 4], [4, 5]),
        ([2, 1, 3, 4], [5, 4, 2]),
        ([4], [4, 5]),
        ([3, 4], [4]),
        ([4], [4]),
    ],
)
def test_matmul_shapes(rng, lshape, rshape):
    a, b = rand(rng, lshape), rand(rng, rshape)
    np.testing.assert_allclose(run_op(ops.matmul, a, b), np.matmul(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "dtype,tol", [(np.float64, 1e-12), (np.int32, 0), (np.int64, 0), (DType.bfloat16, 3e-2), (np.float16, 3e-3)]
)
def test_matmul_dtypes(rng, dtype, tol):
    a, b = rand(rng, [3, 8], dtype), rand(rng, [8, 2], dtype)
    out = run_op(lambda x, y: x @ y, a, b)
    assert out.dtype == a.dtype
    np.testing.assert_allclose(
        out.astype(np.float64), a.astype(np.float64) @ b.astype(np.float64), rtol=tol, atol=tol * 8
    )


@pytest.mark.parametrize("lshape,rshape", [([2, 3], [3, 2]), ([2, 3], [3]), ([3], [3, 2]), ([2, 4, 3], [3, 5])])
def test_matmul_of_bools_is_numpys_boolean_product(rng, lshape, rshape):
    """MAX builds bool matmuls (its test_matmul_static[bool]); the values follow numpy: any(a and b)."""
    a, b = rng.random(lshape) < 0.4, rng.random(rshape) < 0.4
    got = run_op(ops.matmul, a, b)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, np.matmul(a, b))


def test_matmul_symbolic_batch(rng):
    w = rand(rng, [4, 3])
    for batch in (1, 5):
        x = rand(rng, [batch, 4])
        np.testing.assert_allclose(run_op(ops.matmul, x, w, symbolic=[["batch", None], None]), x @ w, rtol=1e-5)


def test_matmul_errors():
    with Graph(
        "mm",
        input_types=[
            TensorType(DType.float32, [2, 3]),
            TensorType(DType.float32, [4, 5]),
            TensorType(DType.int32, [3, 2]),
        ],
    ) as g:
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


# ─── x @ w.T reads w in place (lowering/ops/linalg.py: _transposed_from) ──


@pytest.mark.parametrize("lshape", [[3, 4], [2, 3, 4], [4]])
def test_matmul_by_a_transposed_matrix_in_a_graph(rng, lshape):
    a, w = rand(rng, lshape), rand(rng, [5, 4])
    np.testing.assert_allclose(run_op(lambda x, y: x @ y.T, a, w), np.matmul(a, w.T), rtol=1e-5, atol=1e-5)


def test_a_compiled_graph_multiplying_by_a_transposed_weight_copies_no_weight(rng):
    a, w = rand(rng, [1, 64]), rand(rng, [96, 64])
    model = session().load(build(lambda x, y: x @ y.T, a, w))
    hlo = model._compiled.optimized_hlo([((1, 64), np.float32), ((96, 64), np.float32)])
    assert "transpose(" not in hlo and "f32[64,96]" not in hlo, hlo


def test_matmul_by_a_transposed_matrix_eager_jit_and_grad(rng):
    from maxfx.tensor import Tensor  # noqa: PLC0415

    a, w = rand(rng, [3, 4]), rand(rng, [5, 4])
    x, wt = Tensor(a), Tensor(w)
    np.testing.assert_allclose((x @ wt.T).to_numpy(), a @ w.T, rtol=1e-5)

    def loss(x, w):
        return jnp.sum((Tensor.from_dlpack(x) @ Tensor.from_dlpack(w).T)._array() ** 2)

    value, grad_w = jax.jit(jax.value_and_grad(loss, argnums=1))(jnp.asarray(a), jnp.asarray(w))
    np.testing.assert_allclose(value, np.sum((a @ w.T) ** 2), rtol=1e-5)
    np.testing.assert_allclose(grad_w, 2 * (a @ w.T).T @ a, rtol=1e-4)


def test_jitted_matmul_by_a_transposed_weight_copies_no_weight(rng):
    """XLA's CPU backend would copy w transposed on every call; the product reads it in place."""
    from maxfx.tensor import Tensor  # noqa: PLC0415

    a, w = rand(rng, [1, 64]), rand(rng, [96, 64])

    def proj(x, w):
        return (Tensor.from_dlpack(x) @ Tensor.from_dlpack(w).T)._array()

    hlo = jax.jit(proj).lower(jnp.asarray(a), jnp.asarray(w)).compile().as_text()
    assert "transpose(" not in hlo and "f32[64,96]" not in hlo, hlo
    np.testing.assert_allclose(jax.jit(proj)(jnp.asarray(a), jnp.asarray(w)), a @ w.T, rtol=1e-5)


def test_a_matrix_written_after_its_transpose_was_taken_keeps_the_old_transpose(rng):
    from maxfx.tensor import Tensor  # noqa: PLC0415

    a, w = rand(rng, [2, 3]), rand(rng, [3, 3])
    x, wt = Tensor(a), Tensor(w)
    t = wt.T
    wt[0, :] = np.zeros(3, np.float32)  # new storage for wt; t still holds the old values
    np.testing.assert_allclose((x @ t).to_numpy(), a @ w.T, rtol=1e-5)
