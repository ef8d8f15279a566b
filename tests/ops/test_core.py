"""constant, cast and weight ops against numpy."""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType, Weight, ops
from tests.ops.harness import rand, run_op


@pytest.mark.parametrize(
    "value,dtype,expected",
    [
        ([1, 2, 3], DType.int32, np.array([1, 2, 3], np.int32)),
        (2.5, DType.float32, np.float32(2.5)),
        (2.5, None, np.float32(2.5)),
        (np.array([[1.0, 2.0]]), DType.float32, np.array([[1.0, 2.0]], np.float32)),
        (16777217, DType.float32, np.float32(16777216.0)),
    ],
)
def test_constant(value, dtype, expected):
    with Graph("c") as g:
        device = DeviceRef.CPU() if isinstance(value, list) else None  # a list needs both (MAX's rule, below)
        g.output(ops.constant(value, dtype, device))
    out = InferenceSession().load(g).execute()[0].to_numpy()
    np.testing.assert_array_equal(out, expected)
    assert out.dtype == expected.dtype


def test_constant_out_of_range_is_an_error():
    with Graph("c"):
        with pytest.raises(ValueError, match="out of range"):
            ops.constant([300], DType.uint8, DeviceRef.CPU())


def test_a_list_constant_in_a_graph_needs_dtype_and_device():
    """MAX's rule (its tests: test_array_constant_no_dtype / _no_device); eager constants keep their defaults."""
    with Graph("c"):
        with pytest.raises(TypeError, match=r"constant: a list constant in a Graph needs dtype \(e\.g\."):
            ops.constant([[0, 1, 2]], device=DeviceRef.CPU())
        with pytest.raises(TypeError, match="needs device"):
            ops.constant([[0, 1, 2]], DType.int8)
        with pytest.raises(TypeError, match="needs dtype and device"):
            ops.constant([1.0])
        assert ops.constant(np.array([1, 2], np.int32)).type == TensorType(
            DType.int32, [2], DeviceRef.CPU()
        )  # numpy brings its dtype
    from maxfx.experimental import functional as F  # noqa: PLC0415

    eager = F.constant([1.0, 2.0])  # eager: float32 on the default device, no dtype or device needed
    assert eager.dtype == DType.float32 and eager.to_numpy().tolist() == [1.0, 2.0]


@pytest.mark.parametrize(
    "src,dst",
    [
        (np.float32, DType.int32),
        (np.int32, DType.float32),
        (np.float32, DType.bool),
        (np.float32, DType.float16),
        (np.int64, DType.uint8),
    ],
)
def test_cast(rng, src, dst):
    x = rand(rng, [3, 4], src, 0, 100)
    out = run_op(lambda v: ops.cast(v, dst), x)
    expected = (x != 0) if dst is DType.bool else x.astype(dst.to_numpy())
    np.testing.assert_array_equal(out, expected)


def test_cast_truncates_toward_zero():
    x = np.array([1.7, -1.7, 2.5], np.float32)
    np.testing.assert_array_equal(run_op(lambda v: v.cast(DType.int32), x), [1, -1, 2])


def test_weight_is_an_argument_not_a_constant():
    w = Weight("w", DType.float32, [2])
    with Graph("w", input_types=[TensorType(DType.float32, [2])]) as g:
        g.output(g.inputs[0] + w)
    assert "const(" not in str(g)
    sess = InferenceSession()
    a = sess.load(g, weights_registry={"w": np.array([1, 2], np.float32)})
    b = sess.load(g, weights_registry={"w": np.array([10, 20], np.float32)})
    x = np.zeros(2, np.float32)
    np.testing.assert_array_equal(a.execute(x)[0].to_numpy(), [1, 2])
    np.testing.assert_array_equal(b.execute(x)[0].to_numpy(), [10, 20])


def test_weight_missing_or_mismatched_value():
    w = Weight("w", DType.float32, [2])
    with Graph("w", input_types=[TensorType(DType.float32, [2])]) as g:
        g.output(g.inputs[0] + w)
    with pytest.raises(ValueError, match="'w'.*missing"):
        InferenceSession().load(g)
    with pytest.raises(ValueError, match="'w' expects float32\\[2\\], got float32\\[3\\]: dimension 0 mismatch"):
        InferenceSession().load(g, weights_registry={"w": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="'w'.*dtype"):
        InferenceSession().load(g, weights_registry={"w": np.zeros(2, np.int32)})
