"""range, hann_window and constant_external against numpy."""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import DeviceRef, Graph, TensorType, ops
from tests.ops.harness import run_op

COVERED_OPS = {"range", "hann_window"}  # constant_external records a `weight` node (see test_core)
CPU = DeviceRef.CPU()


def _run(fn):
    with Graph("c") as g:
        g.output(fn())
    return InferenceSession().load(g).execute()[0].to_numpy()


@pytest.mark.parametrize("args,dtype", [((0, 10, 1), DType.int64), ((0, 10, 3), DType.int32), ((5, -3, -2), DType.int32), ((0.0, 1.0, 0.25), DType.float32), ((2, 2, 1), DType.int64)])
def test_range_static(args, dtype):
    out = _run(lambda: ops.range(*args, dtype=dtype, device=CPU))
    np.testing.assert_array_equal(out, np.arange(*args).astype(dtype.to_numpy()))
    assert out.dtype == dtype.to_numpy()


def test_range_with_tensor_bounds():
    with Graph("r", input_types=[TensorType(DType.int64, [])]) as g:
        g.output(ops.range(g.inputs[0], 100, 3, out_dim=4, dtype=DType.int64, device=CPU))
    out = InferenceSession().load(g).execute(np.int64(5))[0].to_numpy()
    np.testing.assert_array_equal(out, [5, 8, 11, 14])


def test_range_errors():
    with Graph("r"):
        with pytest.raises(ValueError, match="step must be non-zero"):
            ops.range(0, 10, 0, dtype=DType.int64, device=CPU)
        with pytest.raises(ValueError, match="does not lead"):
            ops.range(0, 10, -1, dtype=DType.int64, device=CPU)
        with pytest.raises(ValueError, match="out_dim"):
            ops.range(0, 10, 1, out_dim=3, dtype=DType.int64, device=CPU)


def _hann_ref(n, periodic):
    if n == 0:
        return np.zeros(0)
    m = n + 1 if periodic else n
    if m == 1:
        return np.ones(1)
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / (m - 1))


@pytest.mark.parametrize("n", [0, 1, 2, 8, 11])
@pytest.mark.parametrize("periodic", [True, False])
def test_hann_window(n, periodic):
    out = _run(lambda: ops.hann_window(n, CPU, periodic=periodic))
    np.testing.assert_allclose(out, _hann_ref(n, periodic), atol=1e-6)
    if not periodic and n > 1:
        np.testing.assert_allclose(out, np.hanning(n), atol=1e-6)


def test_hann_window_errors():
    with Graph("h"):
        with pytest.raises(ValueError, match="window_length"):
            ops.hann_window(-1, CPU)
        with pytest.raises(TypeError, match="window_length"):
            ops.hann_window(2.0, CPU)


def test_constant_external():
    t = TensorType(DType.float32, [2])
    with Graph("ext", input_types=[t]) as g:
        a = ops.constant_external("bias", t)
        assert ops.constant_external("bias", t) is a
        with pytest.raises(ValueError, match="bias"):
            ops.constant_external("bias", TensorType(DType.float32, [3]))
        g.output(g.inputs[0] + a)
    model = InferenceSession().load(g, weights_registry={"bias": np.array([1, 2], np.float32)})
    np.testing.assert_array_equal(model.execute(np.zeros(2, np.float32))[0].to_numpy(), [1, 2])
    with pytest.raises(ValueError, match="bias"):
        InferenceSession().load(g)
