"""jax.Array and numpy inputs to eager ops and Modules (issue 18 item 4).

A concrete ``jax.Array`` is MAX's array-like: eager ops take it as a tensor on
its own device with its own dtype, and the same call gives the same numbers
eagerly, under ``maxfx.jit`` and under ``jax.jit``. numpy data is MAX's weak
data (like a Python scalar): it mixes with tensors, and an op given numpy data
alone raises a TypeError naming the op. Expected values come from numpy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import maxfx
from maxfx.experimental import functional as F
from maxfx.experimental import nn
from maxfx.experimental._tensor import EAGER
from maxfx.experimental.tensor import Tensor

X = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
W = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# (name, fn of one array input, numpy reference)
CASES = [
    ("relu", lambda a: F.relu(a), lambda x: np.maximum(x, 0)),
    ("exp", lambda a: F.exp(a), np.exp),
    ("add_tensor", lambda a: a + Tensor(X) if isinstance(a, np.ndarray) else F.add(a, Tensor(X)), lambda x: x + X),
    ("matmul", lambda a: F.matmul(a, Tensor(W)), lambda x: x @ W),
    ("sum_axis", lambda a: F.sum(a, axis=1), lambda x: x.sum(axis=1, keepdims=True)),
    ("softmax", lambda a: F.softmax(a), _np_softmax),
    ("concat", lambda a: F.concat([a, Tensor(X)], axis=0), lambda x: np.concatenate([x, X], 0)),
]
IDS = [c[0] for c in CASES]


def _run(mode: str, fn, arr):
    if mode == "eager":
        return fn(arr)
    if mode == "maxfx.jit":
        return maxfx.jit(fn)(arr)
    return jax.jit(fn)(arr)


@pytest.mark.parametrize("mode", ["eager", "maxfx.jit", "jax.jit"])
@pytest.mark.parametrize("name,fn,ref", CASES, ids=IDS)
def test_functional_takes_jax_arrays(mode, name, fn, ref):
    out = _run(mode, fn, jnp.asarray(X))
    np.testing.assert_allclose(np.asarray(out), ref(X), rtol=1e-6, atol=1e-6)


def test_jax_array_keeps_its_dtype():
    a = jnp.asarray(np.array([[1, 2, 3]], np.int32))
    out = F.add(a, Tensor(np.array([[1, 1, 1]], np.int32)))
    assert isinstance(out, Tensor)
    assert out.dtype == maxfx.dtype.DType.int32
    assert np.asarray(out).tolist() == [[2, 3, 4]]
    h = F.exp(jnp.zeros((2,), jnp.float16))
    assert h.dtype == maxfx.dtype.DType.float16


@pytest.mark.parametrize("mode", ["eager", "maxfx.jit"])
def test_numpy_data_mixes_with_tensors(mode):
    # numpy arrays are weak data (MAX): next to a tensor they become constants of its dtype
    t = Tensor(W)
    out = (
        _run(mode, lambda x: F.matmul(Tensor(X), x) + np.float32(1.0), t)
        if mode == "eager"
        else maxfx.jit(lambda x: F.add(x, X))(Tensor(X))
    )
    expect = X @ W + 1 if mode == "eager" else X + X
    np.testing.assert_allclose(np.asarray(out), expect, rtol=1e-6)


def test_numpy_alone_is_a_type_error_naming_the_op():
    with pytest.raises(TypeError, match="relu"):
        F.relu(X)


def test_non_tensor_input_error_names_op_and_fix():
    with pytest.raises(TypeError, match=r"^custom_op: expected an eager Tensor or a jax.Array, got str; wrap"):
        EAGER.var_of("not a tensor", "custom_op")


def test_var_of_wraps_jax_array_on_its_device():
    a = jnp.asarray(X)
    v = EAGER.var_of(a, "op")
    assert v.realized and v.array is a
    assert tuple(v.type.shape) == (2, 3) and v.type.dtype == maxfx.dtype.DType.float32


def test_buffer_store_takes_a_jax_array_source():
    t = Tensor(np.zeros((2, 3), np.float32))
    F.buffer_store(t, jnp.asarray(X))
    np.testing.assert_array_equal(np.asarray(t), X)


class _MLP(nn.Module):
    def __init__(self):
        self.l1 = nn.Linear(3, 4)
        self.l2 = nn.Linear(4, 2)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def _mlp_ref(m: _MLP, x: np.ndarray) -> np.ndarray:
    def lin(layer, h):
        return h @ np.asarray(layer.weight).T + np.asarray(layer.bias)

    return lin(m.l2, np.maximum(lin(m.l1, x), 0))


@pytest.mark.parametrize("mode", ["eager", "maxfx.jit", "jax.jit"])
@pytest.mark.parametrize("kind", ["jax", "numpy"])
def test_modules_take_arrays(mode, kind):
    if kind == "numpy" and mode == "jax.jit":
        pytest.skip("jax.jit turns numpy arguments into tracers: the jax case covers it")
    arr = jnp.asarray(X) if kind == "jax" else X
    lin = nn.Linear(3, 4)
    mlp = _MLP()
    ref_lin = X @ np.asarray(lin.weight).T + np.asarray(lin.bias)
    np.testing.assert_allclose(np.asarray(_run(mode, lin, arr)), ref_lin, rtol=1e-5, atol=1e-6)
    # Eagerly, numpy data is weak (MAX): ``ndarray @ Tensor`` is numpy's own matmul and the
    # following F.relu rejects the numpy result, so an eager Module body of F ops takes
    # numpy data wrapped as a Tensor; under jit numpy arguments become JAX values.
    mlp_in = Tensor(arr) if kind == "numpy" and mode == "eager" else arr
    np.testing.assert_allclose(np.asarray(_run(mode, mlp, mlp_in)), _mlp_ref(mlp, X), rtol=1e-5, atol=1e-6)


# ─── weak numpy data out of an int dtype's range (issue 35 item 1c) ──────


def test_weak_int_array_out_of_range_is_refused_as_in_the_graph():
    """``int8 + np.array([1000, 1])`` wrapped to ``[-23, 3]`` eagerly; MAX's promotion refuses it (one check, same
    error).
    """
    from lowering.dtypes import check_weak_array
    from lowering.registry import OpError
    from maxfx.dtype import DType
    from maxfx.graph import DeviceRef, Graph, TensorType, dtype_promotion, ops

    t = Tensor(np.array([1, 2], np.int8))
    data = np.array([1000, 1])
    with pytest.raises(ValueError) as promo:
        with Graph("promote"):
            dtype_promotion._promote_to_strong(data, DType.int8, DeviceRef.CPU())
    with pytest.raises(ValueError) as direct:
        check_weak_array(DType.int8, data)
    with pytest.raises(OpError) as eager:
        ops.add(t, data)
    with pytest.raises(OpError) as graph:
        with Graph("g", input_types=[TensorType(DType.int8, [2], DeviceRef.CPU())]) as g:
            ops.add(g.inputs[0], data)
    msg = str(promo.value)
    assert "1000" in msg and "[-128, 127]" in msg and str(direct.value) == msg
    assert str(eager.value) == f"add: {msg}" == str(graph.value)
    # in range it still works (numpy's int8 sum)
    np.testing.assert_array_equal(
        ops.add(t, np.array([100, -3])).to_numpy(), np.array([1, 2], np.int8) + np.array([100, -3], np.int8)
    )
