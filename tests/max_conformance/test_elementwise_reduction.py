"""MAX graph-API conformance of the elementwise, reduction, linalg, creation and random ops.

Behaviours MAX's own unit tests rely on (bool operands accepted at graph build,
error wording, overloads), checked here against numpy or MAX's documented
behaviour.
"""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import DeviceRef, Graph, TensorType, ops
from tests.ops.harness import run_op


def _graph(*types):
    return Graph("conformance", input_types=list(types))


def _t(dtype, shape, device=None):
    return TensorType(dtype, shape, device or DeviceRef.CPU())


# ─── elementwise ──────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_bool_arithmetic_builds_with_bool_result(name):
    with _graph(_t(DType.bool, [2, "n"]), _t(DType.bool, ["n"])) as g:
        a, b = (v.tensor for v in g.inputs)
        out = getattr(ops, name)(a, b)
        assert out.type == _t(DType.bool, [2, "n"])


def test_div_dtypes():
    with _graph(_t(DType.int8, [3]), _t(DType.uint16, [3]), _t(DType.bfloat16, [3])) as g:
        i, u, f = (v.tensor for v in g.inputs)
        assert (i / i).dtype == DType.float64  # ints: true division in float64
        assert (u / 2).dtype == DType.float64
        assert (f / f).dtype == DType.bfloat16


def test_ceil_values():
    x = np.array([-1.5, -0.5, 0.0, 0.2, 2.0, 2.7], np.float32)
    np.testing.assert_array_equal(run_op(ops.ceil, x), np.ceil(x))
    i = np.array([-3, 4], np.int32)
    np.testing.assert_array_equal(run_op(ops.ceil, i), i)


@pytest.mark.parametrize("op", [ops.sub, ops.div, ops.outer])
def test_mismatched_devices_say_same_device(op):
    with _graph(_t(DType.float32, [3]), _t(DType.float32, [3], DeviceRef.GPU(1))) as g:
        a, b = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match=r"different devices \(cpu:0 and gpu:1\); they must be on the same device"):
            op(a, b)


def test_outer_requires_vectors():
    with _graph(_t(DType.float32, [2, 3]), _t(DType.float32, [4]), _t(DType.float32, [])) as g:
        m, v, s = (x.tensor for x in g.inputs)
        assert ops.outer(v, v).shape == [4, 4]
        with pytest.raises(ValueError, match=r"outer: lhs must be a rank-1 vector, got float32\[2, 3\]"):
            ops.outer(m, v)
        with pytest.raises(ValueError, match=r"outer: rhs must be a rank-1 vector, got float32\[\]"):
            ops.outer(v, s)


def test_where_error_messages():
    with _graph(_t(DType.float32, [3]), _t(DType.int32, [3]), _t(DType.bool, [2, 4]), _t(DType.int32, [2, 6]), _t(DType.int32, [3], DeviceRef.GPU())) as g:
        f, i, c, i26, gi = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match=r"where: Expected condition to be a boolean tensor, but got a tensor with dtype DType.float32"):
            ops.where(f, i, i)
        with pytest.raises(ValueError, match=r"where: .*\[2, 4\].*\[2, 6\].*are neither equivalent nor broadcastable"):
            ops.where(c, i26, i26)
        cond = f > 0
        want = (
            "where: Input values must be on the same device\n"
            f"    condition: {cond.type!r}\n    x: {i.type!r}\n    y: {gi.type!r}"
        )
        with pytest.raises(ValueError) as e:
            ops.where(cond, i, gi)
        assert str(e.value) == want


# ─── reductions ───────────────────────────────────────────────────────────


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "max", "min", "cumsum"])
def test_bool_reductions_build_and_keep_bool(name):
    with _graph(_t(DType.bool, [3, "n"])) as g:
        out = getattr(ops, name)(g.inputs[0].tensor, axis=0)
        assert out.dtype == DType.bool
        assert out.shape == ([3, "n"] if name == "cumsum" else [1, "n"])


@pytest.mark.parametrize("name", ["argmax", "argmin", "max", "min"])
def test_reducing_an_empty_axis_builds(name):
    with _graph(_t(DType.float32, [2, 0])) as g:
        out = getattr(ops, name)(g.inputs[0].tensor, axis=-1)
        assert out.shape == [2, 1]


def test_prod_and_reduction_errors():
    with _graph(_t(DType.int16, [2, 3]), _t(DType.float32, [])) as g:
        x, s = (v.tensor for v in g.inputs)
        assert ops.prod(x, axis=0).type == _t(DType.int16, [1, 3])
        with pytest.raises(ValueError, match="prod: axis 2 is out of range"):
            ops.prod(x, axis=2)
        with pytest.raises(ValueError, match="prod: input must have rank >= 1"):
            ops.prod(s)
    x = np.array([[1, -2, 3], [4, 5, 0]], np.int16)
    np.testing.assert_array_equal(run_op(lambda v: ops.prod(v, axis=0), x), np.prod(x, axis=0, keepdims=True))


def test_min_max_overloads():
    x = np.array([[1.0, 5.0, 2.0], [4.0, 0.0, 6.0]], np.float32)
    y = np.array([3.0, 3.0, 3.0], np.float32)
    mx, mn, rmx, rmn = run_op(lambda a, b: [ops.max(a, b), ops.min(a, b), ops.max(a, axis=0), ops.min(a)], x, y)
    np.testing.assert_array_equal(mx, np.maximum(x, y))
    np.testing.assert_array_equal(mn, np.minimum(x, y))
    np.testing.assert_array_equal(rmx, x.max(0, keepdims=True))
    np.testing.assert_array_equal(rmn, x.min(-1, keepdims=True))
    with _graph(_t(DType.int8, [1]), _t(DType.int8, [1])) as g:
        a, b = (v.tensor for v in g.inputs)
        for op in (ops.max, ops.min):
            with pytest.raises(ValueError, match="not both"):
                op(a, b, axis=-1)
