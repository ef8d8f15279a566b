"""InferenceSession / Model: execution, symbolic dims, cache, input errors."""

import numpy as np
import pytest

from lowering.compile import compile_stats
from maxfx.driver import CPU, Tensor
from maxfx.dtype import DType
from maxfx.engine import InferenceSession, TensorSpec
from maxfx.graph import Graph, TensorType, ops


def _relu_graph(shape):
    with Graph("relu", input_types=[TensorType(DType.float32, shape)]) as g:
        g.output(ops.relu(g.inputs[0]))
    return g


def test_symbolic_batch_compiles_once_per_shape():
    model = InferenceSession().load(_relu_graph(["batch", 2]))
    before = compile_stats()["compiles"]
    for batch in (1, 7, 64, 7, 1):
        x = np.linspace(-1, 1, batch * 2, dtype=np.float32).reshape(batch, 2)
        np.testing.assert_array_equal(model.execute(x)[0].to_numpy(), np.maximum(x, 0))
    assert compile_stats()["compiles"] - before == 3


def test_identical_graphs_share_executables():
    sess = InferenceSession()
    x = np.ones((3, 4), np.float32)
    sess.load(_relu_graph([3, 4])).execute(x)
    before = compile_stats()["compiles"]
    sess.load(_relu_graph([3, 4])).execute(x)
    assert compile_stats()["compiles"] == before


def test_execute_rejects_wrong_inputs_naming_them():
    model = InferenceSession().load(_relu_graph(["batch", 2]))
    with pytest.raises(ValueError, match=r"input 0.*dtype float32.*int32"):
        model.execute(np.zeros((1, 2), np.int32))
    with pytest.raises(ValueError, match=r"input 0.*dim 1: expected 2, got 3"):
        model.execute(np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="rank"):
        model.execute(np.zeros((2,), np.float32))
    with pytest.raises(ValueError, match="expected 1 inputs"):
        model.execute()


def test_symbolic_dims_must_agree_across_inputs():
    t = TensorType(DType.float32, ["n"])
    with Graph("add", input_types=[t, t]) as g:
        g.output(g.inputs[0] + g.inputs[1])
    model = InferenceSession().load(g)
    with pytest.raises(ValueError, match="input 1.*n"):
        model.execute(np.zeros(3, np.float32), np.zeros(4, np.float32))


def test_driver_tensors_and_scalars_as_inputs():
    with Graph("s", input_types=[TensorType(DType.float32, [2]), TensorType(DType.float32, [])]) as g:
        g.output(g.inputs[0] + g.inputs[1])
    out = InferenceSession().load(g).execute(Tensor.from_numpy(np.array([1, 2], np.float32)), 3.0)
    np.testing.assert_array_equal(out[0].to_numpy(), [4, 5])


def test_python_lists_convert_to_the_declared_dtype():
    """Issue 35 item 2d: ``execute([[1.0, 2.0]])`` said "expected float32, got float64"; Python data takes the input's
    dtype.
    """
    model = InferenceSession().load(_relu_graph(["batch", 2]))
    data = [[1.0, -2.0], [-3.5, 4.0]]
    out = model.execute(data)[0].to_numpy()
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.maximum(np.array(data, np.float32), 0))
    np.testing.assert_array_equal(model(((1, -2),))[0].to_numpy(), [[1.0, 0.0]])  # int tuples into float32
    with Graph("i8", input_types=[TensorType(DType.int8, [2])]) as g:
        g.output(g.inputs[0] + 1)
    int8 = InferenceSession().load(g)
    out = int8.execute([1, -2])[0].to_numpy()
    assert out.dtype == np.int8 and out.tolist() == [2, -1]
    # values that do not fit are refused (no silent wrap or truncation), saying what to pass instead
    for bad, why in (([1000, 1], r"1000 is out of the range \[-128, 127\]"), ([1.5, 2.0], "float array")):
        with pytest.raises(ValueError, match=rf"input 0 \('input0'.*{why}.*pass a numpy array of dtype int8"):
            int8.execute(bad)
    with pytest.raises(ValueError, match=r"input 0.*ragged: at depth 1"):
        model.execute([[1.0, 2.0], [3.0]])
    with pytest.raises(
        ValueError, match=r"input 0.*dtype float32.*float64"
    ):  # a numpy array keeps its dtype (no silent cast)
        model.execute(np.array(data))


def test_call_with_keywords_and_metadata():
    with Graph("kw", input_types=[TensorType(DType.float32, ["b", 2])]) as g:
        g.output(g.inputs[0] + 1)
    model = InferenceSession().load(g)
    np.testing.assert_array_equal(model(input0=np.zeros((1, 2), np.float32))[0].to_numpy(), [[1, 1]])
    assert model.input_metadata == [TensorSpec([None, 2], DType.float32, "input0")]
    assert model.output_metadata[0].shape == [None, 2]


def test_load_requires_outputs_and_rejects_paths():
    with Graph("empty") as g:
        pass
    with pytest.raises(ValueError, match="no outputs"):
        InferenceSession().load(g)
    with pytest.raises(RuntimeError, match="path"):
        InferenceSession().load("model.maxgraph")


def test_default_session_device_is_cpu():
    assert InferenceSession().devices == [CPU()]
    assert InferenceSession(devices=None).devices == [CPU()]


def test_stablehlo_text_is_available():
    model = InferenceSession().load(_relu_graph(["batch", 2]))
    text = model._stablehlo(np.zeros((3, 2), np.float32))
    assert "stablehlo.maximum" in text and "tensor<3x2xf32>" in text
