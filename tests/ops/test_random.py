"""random_normal / random_uniform: distribution, determinism, the key as a value, errors."""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import DeviceRef, Graph, TensorType, ops
from tests.ops.harness import session

CPU = DeviceRef.CPU()
KEY = TensorType(DType.uint32, [2], CPU)


def _sample(fn, key):
    with Graph("r", input_types=[KEY]) as g:
        g.output(fn(g.inputs[0]))
    return session().load(g).execute(np.asarray(key, np.uint32))[0].to_numpy()


def test_normal_moments_and_determinism():
    draw = lambda k: ops.random_normal(k, [20000], DType.float32, CPU, mean=2.0, std=0.5)  # noqa: E731
    a = _sample(draw, [0, 1])
    assert a.shape == (20000,) and a.dtype == np.float32
    assert abs(a.mean() - 2.0) < 0.02 and abs(a.std() - 0.5) < 0.02
    np.testing.assert_array_equal(a, _sample(draw, [0, 1]))  # same key, same samples
    assert not np.array_equal(a, _sample(draw, [0, 2]))  # next counter, new samples


@pytest.mark.parametrize("dtype", [DType.float32, DType.bfloat16, DType.float16])
def test_uniform_range_is_half_open(dtype):
    out = _sample(lambda k: ops.random_uniform(k, [4000], dtype, CPU, low=-1.0, high=3.0), [7, 0]).astype(np.float64)
    assert out.min() >= -1.0 and out.max() < 3.0
    assert abs(out.mean() - 1.0) < 0.1
    hist, _ = np.histogram(out, bins=4, range=(-1, 3))
    assert hist.min() > 800  # roughly flat


def test_errors_name_the_op():
    with Graph("e", input_types=[KEY, TensorType(DType.int32, [2], CPU)]) as g:
        with pytest.raises(ValueError, match="random_normal: std must be > 0"):
            ops.random_normal(g.inputs[0], [2], DType.float32, CPU, std=0.0)
        with pytest.raises(ValueError, match="random_uniform: the range must satisfy low < high"):
            ops.random_uniform(g.inputs[0], [2], DType.float32, CPU, low=1.0, high=1.0)
        with pytest.raises(ValueError, match="floating-point dtype"):
            ops.random_uniform(g.inputs[0], [2], DType.int32, CPU)
        with pytest.raises(ValueError, match="uint32 tensor of shape \\[2\\]"):
            ops.random_normal(g.inputs[1], [2], DType.float32, CPU)
