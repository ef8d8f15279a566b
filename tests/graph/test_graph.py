"""Graph construction: inputs, outputs, weights, printing, errors."""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import BufferType, BufferValue, DeviceRef, Graph, TensorType, TensorValue, Value, Weight, ops


def test_context_manager_and_current():
    with Graph("g", input_types=[TensorType(DType.float32, [2])]) as g:
        assert Graph.current is g
        x = g.inputs[0]
        assert isinstance(x, TensorValue) and isinstance(x, Value) and x.tensor is x
        g.output(ops.relu(x))
    assert Graph.current is None
    assert g.output_types == [TensorType(DType.float32, [2])]


def test_forward_constructor():
    g = Graph("fwd", forward=lambda x, y: ops.add(x, y), input_types=[TensorType(DType.float32, [3])] * 2)
    assert g.output_types[0].shape == [3]


def test_nested_graphs_restore_current():
    with Graph("outer") as outer:
        with Graph("inner") as inner:
            assert Graph.current is inner
        assert Graph.current is outer


def test_output_twice_is_an_error():
    with Graph("g", input_types=[TensorType(DType.float32, [2])]) as g:
        g.output(g.inputs[0])
        with pytest.raises(ValueError, match="already"):
            g.output(g.inputs[0])


def test_values_from_another_graph_are_rejected():
    with Graph("a", input_types=[TensorType(DType.float32, [2])]) as a:
        xa = a.inputs[0]
    with Graph("b", input_types=[TensorType(DType.float32, [2])]) as b:
        with pytest.raises(ValueError, match="different graphs"):
            ops.add(xa, b.inputs[0])


def test_values_of_a_closed_graph_are_refused_naming_it():
    """Issue 35 item 2c: an op on a value after its ``with Graph(...)`` block closed joined the closed graph
    silently.
    """
    from maxfx.experimental.tensor import Tensor

    with Graph("closed_g", input_types=[TensorType(DType.float32, [2])]) as g:
        x = g.inputs[0]
        g.output(ops.relu(x))
    n_nodes = len(g._block.nodes)
    for use in (lambda: ops.relu(x), lambda: x + 1.0, lambda: Tensor.from_graph_value(x) * 2):
        with pytest.raises(RuntimeError, match=r"Graph 'closed_g', whose `with Graph\(...\)` block has closed"):
            use()
    with Graph("other", input_types=[TensorType(DType.float32, [2])]) as other:  # not from inside another graph either
        with pytest.raises(RuntimeError, match="'closed_g'"):
            ops.exp(x)
        other.output(other.inputs[0])
    assert len(g._block.nodes) == n_nodes  # nothing was added to the closed graph
    assert g.output_types == [TensorType(DType.float32, [2])]
    with g:  # re-entering the graph allows ops on its values again
        assert ops.relu(x).type == TensorType(DType.float32, [2])


def test_op_outside_a_graph_needs_a_value():
    with pytest.raises(RuntimeError, match="no active Graph"):
        ops.constant(1.0, DType.float32)


def test_str_shows_the_ir():
    with Graph("show", input_types=[TensorType(DType.float32, ["n"])]) as g:
        g.output(ops.relu(g.inputs[0] + 1))
    text = str(g)
    assert "show(" in text and "add(" in text and "relu(" in text


def test_weights_are_deduplicated_by_name():
    w = Weight("w", DType.float32, [2], DeviceRef.CPU())
    with Graph("g", input_types=[TensorType(DType.float32, [2])]) as g:
        a = g.add_weight(w)
        assert g.add_weight(w) is a
        with pytest.raises(ValueError, match="'w'"):
            g.add_weight(Weight("w", DType.float32, [3]))
        g.output(g.inputs[0] + w)
    assert list(g.weights()) == ["w"]


def test_weight_outside_graph_is_an_error():
    w = Weight("w", DType.float32, [2])
    with pytest.raises(ValueError, match="no parent graph"):  # MAX's type and wording
        w + 1


def test_weight_properties():
    w = Weight("lin.weight", DType.float32, [4, 2], DeviceRef.CPU())
    assert w.shape == [4, 2] and w.dtype is DType.float32 and w.device == DeviceRef.CPU()
    assert w.original_dtype_and_shape == (DType.float32, [4, 2])
    assert w.type == TensorType(DType.float32, [4, 2])


def test_buffer_inputs_are_buffer_values():
    with Graph("b", input_types=[TensorType(DType.float32, [2]).as_buffer()]) as g:
        assert isinstance(g.inputs[0], BufferValue)
        with pytest.raises(TypeError):
            g.inputs[0].tensor


def test_tensor_value_has_no_truth_value():
    with Graph("t", input_types=[TensorType(DType.float32, [2])]) as g:
        with pytest.raises(TypeError, match="truth value"):
            bool(g.inputs[0])


def test_graph_rejects_non_type_inputs():
    with pytest.raises(TypeError, match="input_types"):
        Graph("bad", input_types=[np.float32])


def test_graph_path_is_not_supported():
    with pytest.raises(ValueError, match="not supported"):
        Graph("p", path="model.mlir")


def test_constants_of_equal_bytes_but_different_shapes_keep_their_types():
    # A 0-d and a 1-element constant hold the same bytes; cached rules must not confuse them.
    with Graph("consts"):
        vec = ops.constant(np.zeros((1,)), DType.int64)
        scalar = ops.constant(0, DType.int64)
    assert vec.shape == [1] and scalar.shape == []


def test_tensor_value_from_tensor_likes_and_ops_take_objects_that_convert_themselves():
    """MAX's TensorValue(value) and HasTensorValue: graph values, __tensorvalue__(), Shape, Dim, eager tensors."""
    from maxfx.engine import InferenceSession
    from maxfx.experimental.tensor import Tensor
    from maxfx.graph import Dim, Shape

    eager = Tensor(np.array([10.0, 20.0], np.float32))
    with Graph("likes", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())]) as g:
        x = g.inputs[0].tensor

        class Doubled:  # another library's object that converts itself
            def __tensorvalue__(self):
                return x * 2

        assert TensorValue(x)._var is x._var and TensorValue(g.inputs[0])._var is x._var
        from_obj = TensorValue(Doubled())
        from_eager = TensorValue(eager)  # a constant of this graph
        dims = TensorValue(Shape([3, 4]))
        dim = TensorValue(Dim(5))
        assert (dims.dtype, list(dims.shape), dim.dtype, list(dim.shape)) == (DType.int64, [2], DType.int64, [])
        total = ops.add(Doubled(), from_eager) + from_obj  # ops convert the object too
        g.output(total, dims, dim)
    out = InferenceSession().load(g).execute(np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(out[0].to_numpy(), np.array([14.0, 28.0], np.float32))
    np.testing.assert_array_equal(out[1].to_numpy(), [3, 4])
    assert out[2].to_numpy() == 5


def test_tensor_value_and_buffer_value_refuse_the_wrong_kind():
    with Graph(
        "kinds",
        input_types=[TensorType(DType.float32, [2], DeviceRef.CPU()), BufferType(DType.float32, [2], DeviceRef.CPU())],
    ) as g:
        x, buf = g.inputs
        assert isinstance(BufferValue(buf), BufferValue)
        with pytest.raises(TypeError, match="TensorValue: expected a tensor value, got a value of type BufferType"):
            TensorValue(buf)
        with pytest.raises(TypeError, match=r"BufferValue: expected a buffer value .* TensorType"):
            BufferValue(x)
        with pytest.raises(
            TypeError, match=r"got int \(make Python numbers and arrays graph constants with ops.constant"
        ):
            TensorValue(3)
    from maxfx.experimental.tensor import Tensor

    eager = Tensor([1.0])  # outside a graph an eager tensor is its own value (MAX: a value of the lazy graph)
    assert TensorValue(eager) is eager and BufferValue(eager) is eager


def test_graph_debug_is_maxs_graph_debug_config_view():
    """``max.graph.GraphDebugConfig``: Graph.debug's type; ``source_tracebacks`` shares the session options' state."""
    from maxfx.engine import InferenceSession
    from maxfx.graph import GraphDebugConfig

    assert isinstance(Graph.debug, GraphDebugConfig)
    view = GraphDebugConfig()
    try:
        view.source_tracebacks = True
        assert Graph.debug.source_tracebacks is True and InferenceSession.debug.source_tracebacks is True
    finally:
        view.source_tracebacks = False
    assert view.source_tracebacks is False


def test_objects_converting_to_buffer_values_are_buffer_value_like():
    """MAX's ``BufferValueLike = BufferValue | HasBufferValue``: ops take an object with ``__buffervalue__()``."""
    from maxfx.engine import InferenceSession
    from maxfx.graph.value import BufferValueLike, HasBufferValue

    class Cache:  # a user's wrapper around a graph buffer
        def __init__(self, buffer):
            self.buffer = buffer

        def __buffervalue__(self):
            return self.buffer

    with Graph(
        "store",
        input_types=[BufferType(DType.float32, [3], DeviceRef.CPU()), TensorType(DType.float32, [3], DeviceRef.CPU())],
    ) as g:
        cache = Cache(g.inputs[0].buffer)
        assert isinstance(cache, HasBufferValue) and isinstance(g.inputs[0].buffer, BufferValueLike)
        ops.buffer_store(cache, g.inputs[1] * 2)
        g.output(ops.buffer_load(cache))
    from maxfx.driver import Tensor as DriverTensor

    buf = DriverTensor.from_numpy(np.zeros(3, np.float32))
    (out,) = InferenceSession().load(g).execute(buf, np.array([1.0, 2.0, 3.0], np.float32))
    np.testing.assert_allclose(out.to_numpy(), [2.0, 4.0, 6.0])
    np.testing.assert_allclose(buf.to_numpy(), [2.0, 4.0, 6.0])
