"""The eager Tensor: construction, properties, realization, printing, errors, JAX interop."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowering import eager
from lowering.eager import MAX_PENDING, eager_stats
from maxfx import functional as F
from maxfx import random
from maxfx.driver import CPU, Accelerator, accelerator_count
from maxfx.driver import Tensor as DriverTensor
from maxfx.dtype import DType
from maxfx.experimental import _tensor
from maxfx.experimental import tensor as tensor_module
from maxfx.graph import Graph, TensorType, ops
from maxfx.tensor import ComputeGraph, Tensor, default_device, default_dtype, defaults, driver_tensor_type

# ─── construction ─────────────────────────────────────────────────────────


def test_aliases_are_the_same_objects():
    import maxfx
    import maxfx.experimental as exp

    assert maxfx.tensor is tensor_module and maxfx.functional is exp.functional and maxfx.random is exp.random
    assert exp.Tensor is Tensor and tensor_module.TensorType is TensorType


def test_constant_default_dtypes():
    assert Tensor([1, 2, 3]).dtype is DType.float32  # Python data → default dtype (float32 on CPU)
    assert Tensor([True, False]).dtype is DType.bool
    assert Tensor(np.array([1, 2], np.int32)).dtype is DType.int32  # arrays keep theirs
    assert Tensor([1, 2], dtype=DType.int64).dtype is DType.int64
    assert Tensor([1, 2, 3, 4]).shape == [4]
    assert Tensor([[1.0]], dtype=DType.float16).dtype is DType.float16


def test_constant_rejects_bad_data():
    with pytest.raises(ValueError, match="out of range for dtype int8"):
        Tensor([300], dtype=DType.int8)
    with pytest.raises(TypeError, match="needs data"):
        Tensor()


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ([[1.0, 2.0], [3.0]], "at depth 1, value[0] has 2 items but value[1] has 1 item"),
        ([[[1.0, 2.0]], [[3.0]]], "at depth 2, value[0][0] has 2 items but value[1][0] has 1 item"),
        ([1.0, [2.0]], "at depth 1, value[0] is a scalar but value[1] has 1 item"),
        ([[True, False], [True]], "at depth 1, value[0] has 2 items but value[1] has 1 item"),
    ],
)
def test_ragged_nested_list_names_depth_and_lengths(data, where):
    """Issue 35 item 2b: numpy's "inhomogeneous shape" message became one that says where the list is ragged."""
    with pytest.raises(ValueError, match="inhomogeneous"):
        np.array(data, dtype=np.float32)  # what numpy says (and what Tensor used to raise)
    for make in (Tensor, lambda d: ops.constant(d, DType.float32, device=CPU())):
        with pytest.raises(ValueError) as e:
            make(data)
        assert "the nested list is ragged" in str(e.value) and where in str(e.value)
        assert "inhomogeneous" not in str(e.value)
    # a rectangular list of the same numbers is fine, as numpy builds it
    np.testing.assert_array_equal(
        Tensor([[1.0, 2.0], [3.0, 4.0]]).to_numpy(), np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    )


def test_filled_and_range_constructors():
    np.testing.assert_array_equal(Tensor.zeros([2, 3]).to_numpy(), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(Tensor.ones([2], dtype=DType.int32).to_numpy(), [1, 1])
    np.testing.assert_array_equal(Tensor.full([2, 2], 7.5).to_numpy(), np.full((2, 2), 7.5, np.float32))
    np.testing.assert_array_equal(Tensor.arange(5).to_numpy(), np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(Tensor.arange(2, 10, 3, dtype=DType.int64).to_numpy(), [2, 5, 8])
    np.testing.assert_array_equal(Tensor.range(3).to_numpy(), [0.0, 1.0, 2.0])
    t = TensorType(DType.int32, [2, 3])
    np.testing.assert_array_equal(Tensor.range_like(t).to_numpy(), [[0, 1, 2], [0, 1, 2]])
    assert Tensor.zeros_like(t).dtype is DType.int32 and Tensor.ones_like(t).to_numpy().sum() == 6
    np.testing.assert_array_equal(Tensor.full_like(Tensor.zeros([2]), 3.0).to_numpy(), [3.0, 3.0])
    with pytest.raises(ValueError, match="step must not be zero"):
        Tensor.arange(0, 3, 0)
    with pytest.raises(ValueError, match="negative dims"):
        Tensor.zeros([-1])


def test_dlpack_and_storage_roundtrip():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tensor.from_dlpack(a)
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    np.testing.assert_array_equal(np.asarray(Tensor.from_dlpack(jnp.asarray(a))), a)
    d = DriverTensor.from_numpy(a.copy())
    s = Tensor(storage=d)
    d[0, 0] = 100.0  # the eager tensor copied the (mutable) driver tensor
    assert s.to_numpy()[0, 0] == 0.0
    assert driver_tensor_type(d) == TensorType(DType.float32, [2, 3])
    np.testing.assert_array_equal(s.driver_tensor.to_numpy(), a)


# ─── properties and realization ──────────────────────────────────────────


def test_properties():
    x = Tensor([[1.0, 2.0, 3.0]])
    assert x.shape == [1, 3] and x.shape == (1, 3) and x.rank == 2
    assert x.dtype is DType.float32 and x.device == CPU() and x.num_elements() == 3
    assert x.type == TensorType(DType.float32, [1, 3])
    with F.lazy():
        y = x * 2
    assert not y.real and y.storage is None
    assert not y.real and asyncio.run(y.realize) is y and y.real
    assert isinstance(y.storage, DriverTensor)
    assert y.T.shape == [3, 1]


def test_one_program_per_structure_and_scalars_are_inputs():
    x = Tensor(np.arange(4, dtype=np.float32))
    before = eager_stats()
    for i in range(20):
        with F.lazy():
            y = x * i + 0.5
        np.testing.assert_array_equal(y.to_numpy(), np.arange(4) * i + 0.5)
    after = eager_stats()
    # First sighting runs op by op, the second compiles, the rest reuse the executable.
    assert after["compiles"] - before["compiles"] == 1
    assert after["fused_runs"] - before["fused_runs"] == 19


def test_live_intermediates_are_realized_with_the_target():
    x = Tensor([1.0, 2.0])
    a = x * 3
    b = a + 1
    b.realize
    assert a.real  # computed by the same program, not recomputed later
    np.testing.assert_array_equal(a.to_numpy(), [3.0, 6.0])


def test_long_eager_loop_is_bounded_and_has_no_recursion():
    x = Tensor([0.0, 1.0])
    y = x
    for _ in range(10_000):
        y = y + 1
        assert y._var.pending <= MAX_PENDING
    np.testing.assert_array_equal(y.to_numpy(), [10_000.0, 10_001.0])


def test_unrealized_tensors_are_freed():
    x = Tensor([1.0])
    t = x * 2
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is None
    # A realized result drops its producing graph.
    y = x * 2 + 1
    y.realize
    assert y._var.node is None


def test_compute_graph_evaluates_all_registered_tensors():
    g = ComputeGraph()
    x = Tensor([1.0, 2.0])
    with F.lazy():
        a, b = x + 1, x * 10
    g.add_unrealized(a)
    g.add_unrealized(b)
    assert "add" in str(g.graph) and "mul" in str(g.graph)
    asyncio.run(g.evaluate(a))
    assert a.real and b.real
    np.testing.assert_array_equal(b.to_numpy(), [10.0, 20.0])


# ─── printing and scalars ────────────────────────────────────────────────


def test_printing_formats():
    assert str(Tensor(3)) == "TensorType(dtype=float32, shape=[], device=cpu:0): 3.0"
    assert str(Tensor([0.1, -0.0])) == "TensorType(dtype=float32, shape=[Dim(2)], device=cpu:0): [0.1, -0.0]"
    assert str(Tensor(np.array([1, 2], np.int64))).endswith(": [1, 2]")
    assert str(Tensor([True, False])).endswith(": [True, False]")
    big = str(Tensor(np.arange(2000, dtype=np.int32)))
    assert big.endswith(": [0, 1, 2, ..., 1997, 1998, 1999]")
    assert f"{Tensor(2.5):.2f}" == "2.50"


def test_item_and_python_conversions():
    assert Tensor(2.5).item() == 2.5 and Tensor([[7]], dtype=DType.int32).item() == 7
    assert float(Tensor(1.5)) == 1.5 and int(Tensor(3, dtype=DType.int32)) == 3
    assert bool(Tensor(1.0)) and not bool(Tensor(0.0))
    # MAX 26.7: the eager Tensor's item() raises a TypeError; the driver Buffer's keeps its ValueError (issue 35 item 3)
    for many in (Tensor([1.0, 2.0]), Tensor.zeros([2, 3])):
        with pytest.raises(TypeError, match="exactly one element") as e:
            many.item()
        assert not isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="calling `item` on a tensor with 2 items"):
        DriverTensor.from_numpy(np.array([1.0, 2.0], np.float32)).item()
    with pytest.raises(TypeError):
        float(Tensor([1.0, 2.0]))  # as float(np.array([1.0, 2.0])) does
    with pytest.raises(ValueError, match="ambiguous"):
        bool(Tensor([1.0, 2.0]))
    assert len(Tensor.zeros([3, 2])) == 3
    assert [r.to_numpy().tolist() for r in Tensor([[1.0], [2.0]])] == [[1.0], [2.0]]


def test_indexing_and_setitem():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(a)
    np.testing.assert_array_equal(t[1].to_numpy(), a[1])
    np.testing.assert_array_equal(t[::-1, 1::2].to_numpy(), a[::-1, 1::2])
    np.testing.assert_array_equal(t[..., None].to_numpy(), a[..., None])
    assert t[1, 2].shape == [] and t[1, 2].item() == 6.0
    with pytest.raises(IndexError, match="out of range"):
        t[3]
    t[0, :] = 9.0
    t[1] = Tensor([1.0, 2.0, 3.0, 4.0])
    expect = a.copy()
    expect[0, :] = 9.0
    expect[1] = [1, 2, 3, 4]
    np.testing.assert_array_equal(t.to_numpy(), expect)
    i = Tensor.zeros([2], dtype=DType.int32)
    with pytest.raises(TypeError, match="cannot store float64"):
        i[0] = 1.5


def test_reductions_keep_the_axis_and_methods():
    a = np.array([[1.0, 5.0, 2.0], [4.0, 0.0, 3.0]], np.float32)
    t = Tensor(a)
    assert t.mean(axis=1).shape == [2, 1]
    np.testing.assert_array_equal(t.max().to_numpy(), a.max(-1, keepdims=True))
    np.testing.assert_array_equal(t.argmax(axis=0).to_numpy(), [[1, 0, 1]])
    assert t.argmax().dtype is DType.int64
    np.testing.assert_array_equal(t.sum(axis=0).to_numpy(), a.sum(0, keepdims=True))
    np.testing.assert_array_equal(t.clip(1.0, 4.0).to_numpy(), np.clip(a, 1, 4))
    np.testing.assert_array_equal(t.permute([1, 0]).to_numpy(), a.T)
    np.testing.assert_array_equal(t.transpose(0, 1).reshape([3, 2]).to_numpy(), a.T)
    np.testing.assert_array_equal(t.cast(DType.int32).to_numpy(), a.astype(np.int32))
    np.testing.assert_array_equal(t.unsqueeze(0).squeeze(0).to_numpy(), a)
    parts = t.split([1, 2], axis=1)
    np.testing.assert_array_equal(parts[1].to_numpy(), a[:, 1:])


# ─── errors at the call site ─────────────────────────────────────────────


def test_shape_and_dtype_errors_are_raised_at_the_call():
    with pytest.raises(ValueError, match=r"add: shapes \[2, 3\] and \[4\] cannot be broadcast"):
        Tensor.ones([2, 3]) + Tensor.ones([4])
    with pytest.raises(ValueError, match="matmul: contracting dims differ"):
        Tensor.ones([2, 3]) @ Tensor.ones([4, 2])
    with pytest.raises(ValueError, match="add: incompatible input dtypes"):
        Tensor.ones([2], dtype=DType.int32) + Tensor.ones([2])
    with pytest.raises(ValueError, match="Unsafe cast"):
        Tensor.ones([2], dtype=DType.int32) + 1.5
    with pytest.raises(ValueError, match="reshape"):
        Tensor.ones([2, 3]).reshape([4])


@pytest.mark.gpu
@pytest.mark.skipif(accelerator_count() == 0, reason="needs a GPU")
def test_mixing_devices_is_an_error():
    a = Tensor.ones([2], device=CPU())
    b = Tensor.ones([2], dtype=DType.float32, device=Accelerator())
    with pytest.raises(ValueError, match="different devices"):
        a + b
    np.testing.assert_array_equal((a + b.to(CPU())).to_numpy(), [2.0, 2.0])


# ─── defaults ────────────────────────────────────────────────────────────


def test_defaults_and_contexts(monkeypatch):
    dtype, device = defaults()
    assert (dtype, device) == (DType.float32, CPU())  # tests run with MAXFX_DEFAULT_DEVICE=cpu
    with default_dtype(DType.float16):
        assert Tensor([1.0]).dtype is DType.float16
        with default_device(CPU()):
            assert Tensor.zeros([1]).device == CPU()
    assert Tensor([1.0]).dtype is DType.float32
    monkeypatch.setenv("MAXFX_DEFAULT_DEVICE", "tpu")
    with pytest.raises(ValueError, match="MAXFX_DEFAULT_DEVICE"):
        defaults()


# ─── JAX interop ─────────────────────────────────────────────────────────


def test_tensors_are_pytrees_under_jit_and_vmap():
    x = Tensor([[1.0, -1.0], [2.0, -3.0]])
    out = jax.jit(lambda t: (t @ t.T).mean(axis=1))(x)
    assert isinstance(out, Tensor)
    xa = x.to_numpy()
    np.testing.assert_allclose(out.to_numpy(), (xa @ xa.T).mean(1, keepdims=True))
    v = jax.vmap(lambda t: F.relu(t) * 2)(x)
    np.testing.assert_array_equal(v.to_numpy(), np.maximum(xa, 0) * 2)
    assert [np.asarray(a).tolist() for a in jax.tree_util.tree_leaves({"w": x})] == [xa.tolist()]


def test_grad_through_tensor_ops():
    w = Tensor([1.0, -2.0, 3.0])
    g = jax.grad(lambda w: jnp.sum(F.relu(w) * w))(w)  # jnp.sum reads the Tensor via __jax_array__
    assert isinstance(g, Tensor)
    np.testing.assert_array_equal(g.to_numpy(), [2.0, 0.0, 6.0])  # d/dw relu(w) * w = 2w for w > 0


def test_jnp_accepts_tensors():
    np.testing.assert_allclose(np.asarray(jnp.sin(Tensor([0.5, 1.0]))), np.sin([0.5, 1.0]), rtol=1e-6)


def test_graph_valued_tensors_record_into_the_graph():
    with Graph("g", input_types=[TensorType(DType.float32, [3])]) as g:
        t = Tensor.from_graph_value(g.inputs[0])
        out = F.relu(t) * 2
        assert isinstance(out, Tensor) and not out.real
        with pytest.raises(TypeError, match="symbolic graph value"):
            out.item()
        g.output(out)
    from maxfx.engine import InferenceSession

    res = InferenceSession().load(g).execute(np.array([1.0, -2.0, 3.0], np.float32))[0].to_numpy()
    np.testing.assert_array_equal(res, [2.0, 0.0, 6.0])


# ─── random ──────────────────────────────────────────────────────────────


def test_random_is_lazy_and_deterministic():
    random.seed(3)
    with F.lazy():
        a = random.uniform([5], range=(2, 4))
    assert not a.real
    b = random.gaussian([5])
    random.seed(3)
    np.testing.assert_array_equal(random.uniform([5], range=(2, 4)).to_numpy(), a.to_numpy())
    np.testing.assert_array_equal(random.normal([5]).to_numpy(), b.to_numpy())
    assert not np.array_equal(random.normal([5]).to_numpy(), b.to_numpy())
    assert ((a.to_numpy() >= 2) & (a.to_numpy() < 4)).all()
    assert Tensor.randn([3, 2]).shape == [3, 2]
    with pytest.raises(ValueError, match="std must be > 0"):
        random.gaussian([2], std=0)
    with pytest.raises(ValueError, match="min < max"):
        random.uniform([2], range=(1, 1))
    like = random.gaussian_like(TensorType(DType.float32, [4]))
    assert isinstance(like, Tensor) and like.shape == [4]
    with Graph("r") as g:
        v = random.uniform_like(TensorType(DType.float32, [3]))
        assert v.type == TensorType(DType.float32, [3])
        g.output(v)


# ─── functional extras ───────────────────────────────────────────────────


def test_functional_decorator():
    @F.functional
    def swish(x):
        return x * ops.sigmoid(x)

    out = swish(Tensor([0.0, 1.0]))
    np.testing.assert_allclose(out.to_numpy(), [0.0, 1 / (1 + np.exp(-1))], rtol=1e-6)
    with Graph("s", input_types=[TensorType(DType.float32, [2])]) as g:
        assert type(swish(g.inputs[0])).__name__ == "TensorValue"
        g.output(swish(g.inputs[0]))


def test_functional_call_is_one_realization():
    """MAX: a call of an F.functional function records its ops and runs them as one program when it returns."""
    seen = {}

    @F.functional
    def f(x):
        b = ops.exp(x * 2) + 1
        seen["inner_real"] = b.real
        return b - x, {"doubled": x * 2}

    x = Tensor(np.arange(4, dtype=np.float32))
    f(x)
    before = eager_stats()
    y, extra = f(x)
    after = eager_stats()
    assert seen["inner_real"] is False and y.real and extra["doubled"].real
    assert (after["fused_runs"] - before["fused_runs"], after["op_runs"] - before["op_runs"]) == (1, 0)
    xn = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(y.to_numpy(), np.exp(xn * 2) + 1 - xn, rtol=1e-6)
    with F.lazy():  # inside lazy() the call stays pending like any op
        z, _ = f(x)
    assert not z.real


def test_functional_graph_only():
    # An eager tensor is its own buffer (MAX); more in tests/eager/test_realization.py.
    t = Tensor.zeros([2])
    F.buffer_store(t, Tensor.ones([2]))
    np.testing.assert_array_equal(t.to_numpy(), [1.0, 1.0])
    buf_t = TensorType(DType.float32, [3]).as_buffer()
    with Graph("b", input_types=[buf_t]) as g:
        F.buffer_store_slice(g.inputs[0], Tensor([5.0]), [slice(1, 2)])
        F.buffer_store(g.inputs[0], ops.buffer_load(g.inputs[0]) * 2)
        ext = F.constant_external("w", TensorType(DType.float32, [3]))
        g.output(ext + 1)
    from maxfx.engine import InferenceSession

    buf = DriverTensor.from_numpy(np.ones(3, np.float32))
    out = InferenceSession().load(g, weights_registry={"w": np.full(3, 2.0, np.float32)}).execute(buf)
    np.testing.assert_array_equal(buf.to_numpy(), [2.0, 10.0, 2.0])
    np.testing.assert_array_equal(out[0].to_numpy(), [3.0, 3.0, 3.0])
    with pytest.raises((TypeError, RuntimeError, ValueError), match="constant_external|weight|Graph"):
        F.constant_external("w", TensorType(DType.float32, [3])).to_numpy()


def test_functional_custom():
    from lowering.ops.custom import register_custom_op

    name = "test_eager_row_sum"
    register_custom_op(name, lambda x: jnp.sum(x, axis=-1, keepdims=True))
    x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    (out,) = F.custom(name, CPU(), [x], [TensorType(DType.float32, [2, 1])])
    np.testing.assert_array_equal(out.to_numpy(), [[3.0], [7.0]])


# ─── cold start ──────────────────────────────────────────────────────────


def test_guide_example_in_a_fresh_process():
    code = (
        "from maxfx import functional as F\nfrom maxfx.tensor import Tensor\nprint(F.relu(Tensor([1.0, -2.0, 3.0])))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "TensorType(dtype=float32, shape=[Dim(3)], device=cpu:0): [1.0, 0.0, 3.0]\n"


def test_eager_module_exports():
    assert isinstance(_tensor.EAGER, eager.EagerContext)
