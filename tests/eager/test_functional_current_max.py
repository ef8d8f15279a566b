"""Functional ops of MAX's current ``max.experimental.functional`` beyond the seed documents' names.

Modular's current guides call ``F.uniform``, ``F.normal`` and ``F.acos``; MAX's
module also has creation ops, ``clamp``/``clip``, ``elementwise_max``/``min``,
``bottom_k``, ``prod`` and the norms. Each is checked against numpy, eagerly
and (where shapes may be symbolic) inside a Graph.
"""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.experimental import functional as F
from maxfx.experimental.tensor import Tensor
from maxfx.graph import DeviceRef, Graph, TensorType


def test_the_extras_stay_out_of_the_documented_list():
    extras = {
        "acos",
        "ceil",
        "clamp",
        "clip",
        "uniform",
        "normal",
        "full",
        "bottom_k",
        "prod",
        "rms_norm",
        "group_norm",
        "ensure_context",
    }
    assert all(hasattr(F, name) for name in extras) and not extras & set(F.__all__)


def test_creation_ops_eagerly_and_in_a_graph():
    np.testing.assert_array_equal(F.full([2, 3], 7.0).to_numpy(), np.full((2, 3), 7.0, np.float32))
    assert F.zeros([4], dtype=DType.int32).to_numpy().tolist() == [0, 0, 0, 0]
    like = Tensor(np.arange(6, dtype=np.int64).reshape(2, 3))
    ones = F.ones_like(like)
    assert ones.dtype == DType.int64 and ones.to_numpy().tolist() == [[1, 1, 1], [1, 1, 1]]
    assert F.full_like(like.type, 2).to_numpy().sum() == 12  # a TensorType works as the template too
    assert F.arange(4).to_numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
    with Graph("filled", input_types=[TensorType(DType.float32, ["batch", 3], DeviceRef.CPU())]) as g:
        x = g.inputs[0].tensor
        assert F.in_graph_context()
        g.output(x + F.full(x.shape, 0.5), F.zeros_like(x))
    assert not F.in_graph_context()
    outs = InferenceSession().load(g).execute(np.ones((4, 3), np.float32))
    np.testing.assert_array_equal(outs[0].to_numpy(), np.full((4, 3), 1.5, np.float32))
    np.testing.assert_array_equal(outs[1].to_numpy(), np.zeros((4, 3), np.float32))


def test_random_creation_ops_have_the_asked_shape_range_and_moments():
    u = F.uniform([2000], range=(2.0, 3.0)).to_numpy()
    assert u.shape == (2000,) and u.min() >= 2.0 and u.max() < 3.0
    n = F.normal([4000], mean=1.0, std=2.0).to_numpy()
    assert abs(n.mean() - 1.0) < 0.15 and abs(n.std() - 2.0) < 0.15
    assert F.gaussian is F.normal and F.normal_like is F.gaussian_like
    like = F.uniform_like(Tensor(np.zeros((3, 2), np.float32)), range=(0.0, 0.5))
    assert list(like.shape) == [3, 2] and float(like.to_numpy().max()) < 0.5


def test_clamp_and_elementwise_min_max_match_numpy(rng):
    x_np = rng.uniform(-3, 3, (4, 5)).astype(np.float32)
    lo_np = rng.uniform(-1, 0, (5,)).astype(np.float32)
    x, lo = Tensor(x_np), Tensor(lo_np)
    np.testing.assert_array_equal(F.clamp(x, -1.0, 1.0).to_numpy(), np.clip(x_np, -1.0, 1.0))
    np.testing.assert_array_equal(F.clip(x, lo, 0.5).to_numpy(), np.maximum(np.minimum(x_np, 0.5), lo_np))
    np.testing.assert_array_equal(F.elementwise_max(x, lo).to_numpy(), np.maximum(x_np, lo_np))
    np.testing.assert_array_equal(F.elementwise_min(x, 0.0).to_numpy(), np.minimum(x_np, 0.0))
    with pytest.raises(TypeError, match="clamp: lower_bound and upper_bound are both required"):
        F.clamp(x, None, 1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8, np.int8])
def test_bottom_k_matches_a_stable_numpy_sort(rng, dtype):
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info is None:
        x_np = rng.standard_normal((3, 7)).astype(dtype)
    else:  # include the extremes, where a plain negation would overflow
        x_np = rng.integers(info.min, info.max, (3, 7), endpoint=True).astype(dtype)
        x_np[0, 0], x_np[1, 1] = info.min, info.max
    values, indices = F.bottom_k(Tensor(x_np), 3, axis=-1)
    order = np.argsort(x_np, axis=-1, kind="stable")[:, :3]
    np.testing.assert_array_equal(indices.to_numpy(), order)
    np.testing.assert_array_equal(values.to_numpy(), np.take_along_axis(x_np, order, -1))
    assert values.dtype == DType.from_numpy(np.dtype(dtype)) and indices.dtype == DType.int64


def test_prod_unary_and_norm_extras_match_numpy():
    x_np = np.array([[1.0, 2.0, 3.0], [0.5, 4.0, -1.0]], np.float32)
    x = Tensor(x_np)
    np.testing.assert_allclose(F.prod(x).to_numpy(), x_np.prod(-1, keepdims=True))
    np.testing.assert_allclose(F.prod(x, axis=None).to_numpy(), [x_np.prod()])
    np.testing.assert_allclose(
        F.acos(Tensor([1.0, 0.0, -1.0])).to_numpy(), np.arccos([1.0, 0.0, -1.0]).astype(np.float32), rtol=1e-6
    )
    np.testing.assert_array_equal(F.ceil(x * 0.5).to_numpy(), np.ceil(x_np * 0.5))
    np.testing.assert_array_equal(
        F.floor_div(Tensor(np.array([7, -7], np.int32)), 2).to_numpy(), np.array([3, -4], np.int32)
    )
    w = np.array([1.0, 2.0, 0.5], np.float32)
    np.testing.assert_allclose(
        F.rms_norm(x, Tensor(w), 1e-6).to_numpy(),
        x_np / np.sqrt((x_np**2).mean(-1, keepdims=True) + 1e-6) * w,
        rtol=1e-5,
    )


def test_ensure_context_lets_python_data_become_eager_values():
    from maxfx.graph import ops

    with F.ensure_context():
        t = ops.constant(2.0, DType.float32, DeviceRef.CPU())
    assert isinstance(t, Tensor) and t.item() == 2.0
