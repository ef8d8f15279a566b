"""``ops.rms_norm`` and ``ops.group_norm`` against numpy, in a graph, eagerly and under ``jax.jit``."""

import jax
import ml_dtypes
import numpy as np
import pytest

from maxfx.experimental.tensor import Tensor
from maxfx.graph import ops
from tests.ops.harness import rand, run_op

BF16 = ml_dtypes.bfloat16


def _rms_ref(x, w, eps, offset=0.0, multiply_before_cast=False):
    x32 = x.astype(np.float32)
    normed = x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + eps)
    if multiply_before_cast:
        return (normed * (w.astype(np.float32) + offset)).astype(x.dtype)
    return normed.astype(x.dtype).astype(np.float32) * (w.astype(np.float32) + offset)


def _group_ref(x, gamma, beta, groups, eps):
    n, c = x.shape[:2]
    g = x.astype(np.float64).reshape(n, groups, -1)
    normed = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    return normed * gamma.reshape(per_channel) + beta.reshape(per_channel)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
@pytest.mark.parametrize("offset, before", [(0.0, False), (1.0, True), (0.5, False)])
def test_rms_norm_matches_numpy(rng, dtype, offset, before):
    x = rand(rng, [2, 3, 8], dtype)
    w = rand(rng, [8], dtype, 0.5, 1.5)
    out = run_op(lambda a, b: ops.rms_norm(a, b, 1e-5, weight_offset=offset, multiply_before_cast=before), x, w)
    want = _rms_ref(x, w, 1e-5, offset, before)
    tol = 3e-2 if dtype is BF16 else 1e-5
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("shape, groups", [([2, 4, 3], 2), ([1, 6, 2, 3], 3), ([3, 4], 4)])
def test_group_norm_matches_numpy(rng, shape, groups):
    x = rand(rng, shape)
    gamma, beta = rand(rng, [shape[1]], np.float32, 0.5, 2), rand(rng, [shape[1]])
    out = run_op(lambda a, g, b: ops.group_norm(a, g, b, groups, 1e-5), x, gamma, beta)
    np.testing.assert_allclose(out, _group_ref(x, gamma, beta, groups, 1e-5), rtol=1e-4, atol=1e-5)


def test_norms_run_eagerly_and_under_jit(rng):
    x, w = rand(rng, [4, 6]), rand(rng, [6], np.float32, 0.5, 1.5)
    eager = ops.rms_norm(Tensor(x), Tensor(w), 1e-6)
    np.testing.assert_allclose(eager.to_numpy(), _rms_ref(x, w, 1e-6), rtol=1e-5)
    jitted = jax.jit(lambda a, b: ops.rms_norm(a, b, 1e-6))(x, w)
    np.testing.assert_allclose(np.asarray(jitted), _rms_ref(x, w, 1e-6), rtol=1e-5)
    gamma, beta = np.ones(6, np.float32), np.zeros(6, np.float32)
    grouped = ops.group_norm(Tensor(x), Tensor(gamma), Tensor(beta), 3, 1e-5)
    np.testing.assert_allclose(grouped.to_numpy(), _group_ref(x, gamma, beta, 3, 1e-5), rtol=1e-4, atol=1e-5)


def test_norm_errors_name_the_op_and_the_shapes():
    x = Tensor(np.ones([2, 4], np.float32))
    with pytest.raises(ValueError, match=r"rms_norm: weight must have shape \[4\].*got \[3\]"):
        ops.rms_norm(x, Tensor(np.ones([3], np.float32)), 1e-6)
    with pytest.raises(ValueError, match="rms_norm: epsilon must be positive"):
        ops.rms_norm(x, Tensor(np.ones([4], np.float32)), 0.0)
    with pytest.raises(TypeError, match="rms_norm: input must be a floating-point tensor"):
        ops.rms_norm(Tensor(np.ones([2, 4], np.int32)), Tensor(np.ones([4], np.float32)), 1e-6)
    with pytest.raises(ValueError, match="group_norm: the 4 channels .* num_groups=3"):
        ops.group_norm(x, Tensor(np.ones([4], np.float32)), Tensor(np.zeros([4], np.float32)), 3, 1e-5)
    with pytest.raises(ValueError, match=r"group_norm: beta must have shape \[4\]"):
        ops.group_norm(x, Tensor(np.ones([4], np.float32)), Tensor(np.zeros([2], np.float32)), 2, 1e-5)
