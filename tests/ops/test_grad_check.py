"""Numerical gradient check of every differentiable registry op.

Every gradient example of the op table (``tests/ops/op_table.py``), op by op
from ``lowering.registry.all_ops()``, applies the op's front to Tensors
wrapping its inputs (the differentiated ones cast to float64 where the op
allows) and runs ``jax.test_util.check_grads`` (order 1, reverse mode): JAX's
VJP through the maxfx op is compared with finite differences. Inputs outside
the example's ``wrt`` (indices, masks, packed weights) are fixed. Which ops
need an example is checked by ``tests/ops/test_registry_coverage.py``.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from jax.test_util import check_grads

import lowering.ops  # noqa: F401  (registers every op)
import maxfx
from lowering.registry import all_ops, get_op
from maxfx import functional as F
from maxfx.dtype import DType
from maxfx.experimental.tensor import Tensor
from tests.ops.op_table import OP_TABLE

RNG = np.random.default_rng(0)


def _grad_examples() -> list[Any]:
    return [
        pytest.param(name, i, id=name if i == 0 else f"{name}-{i}")
        for name, op in sorted(all_ops().items())
        if op.differentiable and name in OP_TABLE
        for i, _ in enumerate(OP_TABLE[name].grads)
    ]


def _raw_outputs(out: Any) -> Any:
    """Float outputs as JAX arrays (integer outputs such as indices carry no gradient)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    arrays = tuple(o._array() if isinstance(o, Tensor) else o for o in outs)
    return tuple(a for a in arrays if np.issubdtype(a.dtype, np.inexact))


# On a CPU these run maxfx's kernels, which round x to int16 per 32 values: at the
# scale of a finite-difference step the forward is then a staircase. Their gradient
# rule (dy @ W, custom_vjp) is the same with float products, which the check uses.
_ROUNDED_ON_CPU = {"qmatmul", "q8_0_matmul"}


@pytest.mark.parametrize("name,index", _grad_examples())
def test_grad_check(name, index, request):
    if name in _ROUNDED_ON_CPU:
        request.getfixturevalue("float_products")
    example = OP_TABLE[name].grads[index]
    front = get_op(name).front
    with jax.enable_x64(True):
        args = [jax.numpy.asarray(np.asarray(example.inputs[i], example.grad_dtype)) for i in example.wrt]

        def f(*arrays):
            differentiated = dict(zip(example.wrt, arrays))
            tensors = [
                Tensor.from_dlpack(differentiated[i]) if i in differentiated else Tensor(a)
                for i, a in enumerate(example.inputs)
            ]
            return _raw_outputs(example.call(front, *tensors))

        assert f(*args), f"{name}: the example produced no float output"
        kw = {} if example.grad_tol is None else {"atol": example.grad_tol, "rtol": example.grad_tol}
        # One jitted program per example instead of op-by-op dispatch of many small float64 primitives.
        check_grads(jax.jit(f) if example.grad_jit else f, args, order=1, modes=["rev"], **kw)


@pytest.mark.parametrize("name", ["max_pool2d", "avg_pool2d"])
def test_pools_differentiate_under_jit(name):
    front = get_op(name).front
    x = Tensor(RNG.permutation(np.linspace(-2, 2, 18)).reshape(1, 3, 3, 2).astype(np.float32))  # no ties
    g = maxfx.jit(maxfx.grad(lambda t: F.sum(F.reshape(front(t, (2, 2), stride=1), [-1]), axis=0).squeeze(0)))(x)
    assert list(g.shape) == [1, 3, 3, 2]


def test_maxfx_grad_agrees_with_finite_differences_through_tensors():
    """The same check through maxfx.grad itself (not jax.vjp): d/dx sum(softmax(x) * w)."""
    x, w = RNG.uniform(-2, 2, size=(2, 4)), RNG.uniform(-2, 2, size=(2, 4))
    front = get_op("softmax").front

    def loss(t: Tensor) -> Tensor:
        s = front(t) * Tensor(w)
        return s.sum(axis=1).sum(axis=0).squeeze(0).squeeze(0)

    g = maxfx.grad(loss)(Tensor(x, dtype=DType.float64)).to_numpy()
    eps = 1e-6
    num = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        d = np.zeros_like(x)
        d[idx] = eps
        num[idx] = (
            loss(Tensor(x + d, dtype=DType.float64)).item() - loss(Tensor(x - d, dtype=DType.float64)).item()
        ) / (2 * eps)
    np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)
