"""Buffer ops (create, load, store, store_slice) and in-place update of buffer inputs."""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, ops
from tests.ops.harness import rand

CPU = DeviceRef.CPU()


def _tensor(arr):
    from maxfx.driver import Tensor  # noqa: PLC0415 - driver is loaded on first use

    return Tensor.from_numpy(arr)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64, np.bool_])
def test_buffer_input_is_updated_in_place(rng, dtype):
    dt = DType.from_numpy(np.dtype(dtype))
    with Graph("acc", input_types=[BufferType(dt, ["n", 2], CPU), TensorType(dt, ["n", 2], CPU)]) as g:
        buf, x = g.inputs
        before = ops.buffer_load(buf)
        new = ops.logical_or(before, x) if dt is DType.bool else before + x
        ops.buffer_store(buf, new)
        g.output(before, ops.buffer_load(buf))
    model = InferenceSession().load(g)
    state0 = rand(rng, [3, 2], dtype, 0, 5)
    x = rand(rng, [3, 2], dtype, 0, 5)
    add = np.logical_or if dtype is np.bool_ else np.add
    t = _tensor(state0.copy())
    before, after = model.execute(t, x)
    np.testing.assert_array_equal(before.to_numpy(), state0)  # a load is a copy
    np.testing.assert_array_equal(after.to_numpy(), add(state0, x))
    np.testing.assert_array_equal(t.to_numpy(), add(state0, x))
    model.execute(t, x)  # state carries across executions
    np.testing.assert_array_equal(t.to_numpy(), add(add(state0, x), x))


def test_buffer_create_is_zeros_with_symbolic_shape(rng):
    with Graph("create", input_types=[TensorType(DType.float32, ["n", 3], CPU)]) as g:
        x = g.inputs[0]
        buf = ops.buffer_create(BufferType(DType.float32, ["n", 3], CPU))
        assert buf.type == BufferType(DType.float32, ["n", 3], CPU)
        zeros = ops.buffer_load(buf)
        ops.buffer_store(buf, x * 2)
        g.output(zeros, ops.buffer_load(buf))
    model = InferenceSession().load(g)
    for n in (1, 4):
        x = rand(rng, [n, 3])
        zeros, doubled = model.execute(x)
        np.testing.assert_array_equal(zeros.to_numpy(), np.zeros((n, 3), np.float32))
        np.testing.assert_allclose(doubled.to_numpy(), x * 2)


def test_buffer_store_python_data_broadcasts():
    with Graph("fill", input_types=[BufferType(DType.int32, [2, 3], CPU)]) as g:
        ops.buffer_store(g.inputs[0], 7)
        g.output(ops.buffer_load(g.inputs[0]))
    t = _tensor(np.zeros((2, 3), np.int32))
    InferenceSession().load(g).execute(t)
    np.testing.assert_array_equal(t.to_numpy(), np.full((2, 3), 7))


@pytest.mark.parametrize(
    "index,source_shape",
    [
        ((1,), (4, 5)),
        ((-1, slice(1, 4)), (3, 5)),
        ((slice(None), 2), (3, 5)),
        ((Ellipsis, slice(0, 5, 2)), (3, 4, 3)),
        ((0, Ellipsis, 4), (4,)),
        ((slice(2, None), slice(None, None, -1), slice(1, 3)), (1, 4, 2)),
    ],
)
def test_buffer_store_slice_against_numpy(rng, index, source_shape):
    state = rand(rng, [3, 4, 5])
    src = rand(rng, list(source_shape))
    with Graph(
        "slice",
        input_types=[BufferType(DType.float32, [3, 4, 5], CPU), TensorType(DType.float32, list(source_shape), CPU)],
    ) as g:
        ops.buffer_store_slice(g.inputs[0], g.inputs[1], index)
        g.output(ops.buffer_load(g.inputs[0]))
    t = _tensor(state.copy())
    out = InferenceSession().load(g).execute(t, src)[0].to_numpy()
    want = state.copy()
    want[index] = src
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(t.to_numpy(), want)


def test_buffer_store_slice_runtime_index_setitem_and_symbolic_dim(rng):
    state = rand(rng, [6, 2], np.int64)
    row = rand(rng, [2], np.int64)
    with Graph(
        "kv",
        input_types=[
            BufferType(DType.int64, ["seq", 2], CPU),
            TensorType(DType.int64, [2], CPU),
            TensorType(DType.int32, [], CPU),
        ],
    ) as g:
        buf, r, pos = g.inputs
        ops.buffer_store_slice(buf, r, [pos])  # position known only at run time
        buf[0, :] = -1  # BufferValue.__setitem__ → buffer_store_slice
        ops.buffer_store_slice(buf, np.int64(5), [(slice(1, 3), 2), 1])  # (slice, out_dim) on a symbolic dim
        g.output(ops.buffer_load(buf))
    t = _tensor(state.copy())
    InferenceSession().load(g).execute(t, row, np.int32(4))
    want = state.copy()
    want[4] = row
    want[0, :] = -1
    want[1:3, 1] = 5
    np.testing.assert_array_equal(t.to_numpy(), want)


def test_buffer_errors():
    types = [
        BufferType(DType.float32, [2, 3], CPU),
        TensorType(DType.float32, [2, 3], CPU),
        TensorType(DType.int32, [2, 3], CPU),
        TensorType(DType.float32, [3], CPU),
    ]
    with Graph("errors", input_types=types) as g:
        buf, x, xi, row = g.inputs
        with pytest.raises(TypeError, match="buffer_load: x must be a BufferValue"):
            ops.buffer_load(x)
        with pytest.raises(TypeError, match="buffer_store: destination must be a BufferValue"):
            ops.buffer_store(x, x)
        with pytest.raises(
            ValueError, match=r"buffer_store: source dtype int32 does not match the buffer's dtype float32"
        ):
            ops.buffer_store(buf, xi)
        with pytest.raises(
            ValueError,
            match=(
                r"buffer_store: expected source to have shape \[Dim\(2\), Dim\(3\)\], but source had shape "
                r"\[Dim\(3\)\]"
            ),
        ):
            ops.buffer_store(buf, row)
        with pytest.raises(ValueError, match=r"buffer_store_slice: expected source to have shape \[Dim\(3\)\]"):
            ops.buffer_store_slice(buf, x, [0])
        with pytest.raises(IndexError, match="buffer_store_slice: index 2 is out of bounds for axis 0 with size 2"):
            ops.buffer_store_slice(buf, row, [2])
        with pytest.raises(IndexError, match=r"buffer_store_slice: too many indices \(3\)"):
            ops.buffer_store_slice(buf, row, [0, 0, 0])
        with pytest.raises(TypeError, match="buffer_store_slice: index 0 must be an int, slice"):
            ops.buffer_store_slice(buf, row, ["a"])
        with pytest.raises(TypeError, match="buffer_store_slice: tensor index for axis 0 must be an integer scalar"):
            ops.buffer_store_slice(buf, row, [row])
        with pytest.raises(TypeError, match="buffer_create: type must be a BufferType"):
            ops.buffer_create(DType.float32)
        with pytest.raises(ValueError, match="buffer_store: cannot store float data"):
            ops.buffer_store(ops.buffer_create(BufferType(DType.int32, [2], CPU)), 1.5)
