"""Graph construction: inputs, outputs, weights, printing, errors."""

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.graph import BufferValue, DeviceRef, Graph, TensorType, TensorValue, Value, Weight, ops


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
