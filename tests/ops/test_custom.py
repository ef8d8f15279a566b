"""Custom ops registered from Python (JAX functions), invoked with custom / inplace_custom."""

import jax.numpy as jnp
import numpy as np
import pytest

from lowering.ops.custom import CustomOpNotFoundError, lookup_custom_op, register_custom_op
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, KernelLibrary, TensorType, ops
from tests.ops.harness import rand, run_op

CPU = DeviceRef.CPU()

register_custom_op("test_custom.scale_add", lambda x, y, *, factor: x * factor + y)
register_custom_op("test_custom.min_max", lambda x: (jnp.min(x, axis=-1), jnp.max(x, axis=-1)))
register_custom_op("increment", lambda b: b + 1)
register_custom_op("decrement", lambda b: b - 1)


@register_custom_op(
    "test_custom.row_sum",
    out_types=lambda types, params: [TensorType(types[0].dtype, [types[0].shape[0]], types[0].device)],
)
def _row_sum(x):
    return jnp.sum(x, axis=1)


def _tensor(arr):
    from maxfx.driver import Tensor  # noqa: PLC0415 - driver is loaded on first use

    return Tensor.from_numpy(arr)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_custom_op_with_parameters(rng, dtype):
    x, y = rand(rng, [2, 3], dtype), rand(rng, [2, 3], dtype)

    def f(a, b):
        return ops.custom("test_custom.scale_add", CPU, [a, b], [a.type], parameters={"factor": 3})

    np.testing.assert_allclose(run_op(f, x, y), x * 3 + y, rtol=1e-6)


def test_custom_op_several_outputs_symbolic_dims_and_default_out_types(rng):
    x = rand(rng, [4, 5])

    def f(a):
        lo, hi = ops.custom("test_custom.min_max", CPU, [a], [TensorType(DType.float32, ["n"], CPU)] * 2)
        [s] = ops.custom("test_custom.row_sum", CPU, [a], None)  # out_types from the registration
        assert list(s.shape) == ["n"]
        return lo, hi, s

    lo, hi, s = run_op(f, x, symbolic=[["n", None]])
    np.testing.assert_array_equal(lo, x.min(-1))
    np.testing.assert_array_equal(hi, x.max(-1))
    np.testing.assert_allclose(s, x.sum(1), rtol=1e-5)


def test_inplace_custom_updates_buffer_and_returns_outputs():
    register_custom_op("test_custom.push", lambda b, v: (jnp.sum(b), b * 2 + v))
    with Graph("push", input_types=[BufferType(DType.float32, [3], CPU), TensorType(DType.float32, [3], CPU)]) as g:
        buf, v = g.inputs
        [total] = ops.inplace_custom("test_custom.push", CPU, [buf, v], [TensorType(DType.float32, [], CPU)])
        g.output(total, ops.buffer_load(buf))
    state = np.array([1.0, 2.0, 3.0], np.float32)
    t = _tensor(state.copy())
    total, after = InferenceSession().load(g).execute(t, np.ones(3, np.float32))
    assert float(total.to_numpy()) == 6.0
    np.testing.assert_array_equal(after.to_numpy(), state * 2 + 1)
    np.testing.assert_array_equal(t.to_numpy(), state * 2 + 1)


def test_inplace_custom_in_cond_branches_doc_example():
    with Graph("inc_dec", input_types=[BufferType(DType.int32, [2], CPU), TensorType(DType.bool, [], CPU)]) as g:
        buffer, pred = g.inputs

        def then_fn():
            ops.inplace_custom("increment", device=buffer.device, values=[buffer])

        def else_fn():
            ops.inplace_custom("decrement", device=buffer.device, values=[buffer])

        ops.cond(pred, None, then_fn, else_fn)
        g.output(ops.buffer_load(buffer))
    model = InferenceSession().load(g)
    t = _tensor(np.array([10, 20], np.int32))
    model.execute(t, np.array(True))
    model.execute(t, np.array(True))
    model.execute(t, np.array(False))
    np.testing.assert_array_equal(t.to_numpy(), [11, 21])


def test_unknown_custom_op_is_a_clear_error():
    with Graph("unknown", input_types=[TensorType(DType.float32, [2], CPU)]) as g:
        x = g.inputs[0]
        with pytest.raises(
            ValueError, match=r"custom op 'my_mojo_kernel' is not registered.*'increment'.*Mojo kernels"
        ) as info:
            ops.custom("my_mojo_kernel", CPU, [x], [x.type])
        assert isinstance(info.value, KeyError)
        with pytest.raises(ValueError, match="'my_mojo_kernel' is not registered"):
            ops.inplace_custom("my_mojo_kernel", CPU, [ops.buffer_create(BufferType(DType.float32, [2], CPU))])
    with pytest.raises(CustomOpNotFoundError):
        lookup_custom_op("my_mojo_kernel")
    lib = KernelLibrary()
    lib.verify_custom_op("increment")
    assert "increment" in lib and "my_mojo_kernel" not in lib


def test_custom_errors():
    with Graph("errors", input_types=[TensorType(DType.float32, [2], CPU), BufferType(DType.int32, [2], CPU)]) as g:
        x, buf = g.inputs
        with pytest.raises(
            ValueError, match=r"custom: custom op 'increment' output 0 is float32\[2\] but float32\[3\] was expected"
        ):
            ops.custom("increment", CPU, [x], [TensorType(DType.float32, [3], CPU)])
        with pytest.raises(
            ValueError, match=r"custom: custom op 'increment' returned 1 value\(s\) but 2 were expected"
        ):
            ops.custom("increment", CPU, [x], [x.type, x.type])
        with pytest.raises(ValueError, match=r"custom: custom op 'test_custom.scale_add' failed on inputs"):
            ops.custom("test_custom.scale_add", CPU, [x, x], [x.type])  # missing the factor parameter
        with pytest.raises(TypeError, match="custom: value 0 is a buffer.*inplace_custom"):
            ops.custom("increment", CPU, [buf], [x.type])
        with pytest.raises(TypeError, match="inplace_custom: expected at least one BufferValue"):
            ops.inplace_custom("increment", CPU, [x])
        with pytest.raises(TypeError, match="custom: out_types is required"):
            ops.custom("increment", CPU, [x], None)
        with pytest.raises(TypeError, match="custom: parameter 'factor' must be"):
            ops.custom("test_custom.scale_add", CPU, [x, x], [x.type], parameters={"factor": [1]})


def test_graphs_keep_the_function_they_were_built_with():
    register_custom_op("test_custom.versioned", lambda x: x + 1)
    with Graph("v1", input_types=[TensorType(DType.float32, [2], CPU)]) as g1:
        g1.output(*ops.custom("test_custom.versioned", CPU, [g1.inputs[0]], [g1.inputs[0].type]))
    register_custom_op("test_custom.versioned", lambda x: x + 100)
    with Graph("v2", input_types=[TensorType(DType.float32, [2], CPU)]) as g2:
        g2.output(*ops.custom("test_custom.versioned", CPU, [g2.inputs[0]], [g2.inputs[0].type]))
    x = np.zeros(2, np.float32)
    assert InferenceSession().load(g1).execute(x)[0].to_numpy().tolist() == [1, 1]
    assert InferenceSession().load(g2).execute(x)[0].to_numpy().tolist() == [100, 100]
