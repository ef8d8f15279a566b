"""The self-contained graph examples of seeds 000 and 002, with ``max`` → ``maxfx``.

The 002 reference lost its newlines; each example is restored line by line. Where
an example uses a name it never imports (``DeviceRef``, ``TensorType``), the
import is added and marked ``# added``. Printed shapes are checked against the
comments in the examples.
"""

import numpy as np

from maxfx.dtype import DType
from maxfx.graph import DeviceRef, Graph, TensorType, TensorValue, Value, ops


def test_000_graph_relu(capsys):
    from maxfx.driver import CPU
    from maxfx.engine import InferenceSession

    cpu = CPU()
    input_type = TensorType(DType.float32, shape=[5], device=cpu)
    with Graph("relu_graph", input_types=[input_type]) as graph:
        x = graph.inputs[0]
        y = ops.relu(x)
        graph.output(y)
    session = InferenceSession(devices=[cpu])
    model = session.load(graph)
    input_data = np.array([1.0, -2.0, 3.0, -4.0, 5.0], dtype=np.float32)
    result = model.execute(input_data)
    print(np.from_dlpack(result[0]))
    assert capsys.readouterr().out == "[1. 0. 3. 0. 5.]\n"


def test_002_graph_forward_linear():
    from dataclasses import dataclass

    @dataclass
    class Linear:
        weight: np.ndarray
        bias: np.ndarray

        def __call__(self, x: TensorValue) -> TensorValue:
            weight_tensor = ops.constant(self.weight, dtype=DType.float32, device=DeviceRef.CPU())
            bias_tensor = ops.constant(self.bias, dtype=DType.float32, device=DeviceRef.CPU())
            return ops.matmul(x, weight_tensor) + bias_tensor

    linear_graph = Graph(
        "linear", Linear(np.ones((2, 2)), np.ones((2,))), input_types=[TensorType(DType.float32, (2,))]
    )
    assert linear_graph.output_types == [TensorType(DType.float32, [2])]
    from maxfx.engine import InferenceSession

    out = InferenceSession().load(linear_graph).execute(np.array([1.0, 2.0], np.float32))[0].to_numpy()
    np.testing.assert_allclose(out, np.array([1.0, 2.0]) @ np.ones((2, 2)) + 1)


def test_002_tensor_value_demo():
    matrix = np.array([[1, 2], [3, 4]], dtype=np.float32)
    with Graph("tensor_demo") as graph:
        tensor = ops.constant(matrix, dtype=DType.float32, device=DeviceRef.CPU())
        assert tensor.shape == [2, 2] and str(tensor.shape) == "[Dim(2), Dim(2)]"
        assert str(tensor.dtype) == "DType.float32"
        transposed = tensor.T
        doubled = tensor * 2
        assert transposed.shape == [2, 2] and doubled.shape == [2, 2]


def _input_2x3():
    return TensorType(DType.float32, (2, 3), device=DeviceRef.CPU())


def test_002_reductions_keep_the_axis():
    for method in ("argmax", "max", "mean", "min", "stdev", "var"):
        with Graph(f"{method}_demo", input_types=[_input_2x3()]) as graph:
            x = graph.inputs[0].tensor
            out = getattr(x, method)(axis=1)
            assert x.shape == [2, 3]
            assert out.shape == [2, 1], method
    with Graph("argmax_dtype", input_types=[_input_2x3()]) as graph:
        assert graph.inputs[0].tensor.argmax(axis=1).dtype is DType.int64


def test_002_shape_methods():
    matrix = np.array([[1, 2], [3, 4]], dtype=np.float32)
    with Graph("shape_methods") as graph:
        tensor = ops.constant(matrix, dtype=DType.float32, device=DeviceRef.CPU())
        assert tensor.broadcast_to((3, 2, 2)).shape == [3, 2, 2]
        casted = tensor.cast(DType.int32)
        assert str(tensor.dtype) == "DType.float32" and str(casted.dtype) == "DType.int32"
        assert tensor.flatten().shape == [4]
        assert tensor.rank == 2
        assert tensor.reshape((1, 4)).shape == [1, 4]
    matrix23 = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    with Graph("transpose_demo") as graph:
        tensor = ops.constant(matrix23, dtype=DType.float32, device=DeviceRef.CPU())
        assert tensor.transpose(dim_1=0, dim_2=1).shape == [3, 2]


def test_002_to_device():
    matrix = np.array([[1, 2], [3, 4]], dtype=np.float32)
    with Graph("to_device_example") as graph:
        tensor = ops.constant(matrix, dtype=DType.float32, device=DeviceRef.CPU())
        gpu_tensor = tensor.to(DeviceRef.GPU())
        assert str(tensor.device) == "cpu:0"
        assert str(gpu_tensor.device) == "gpu:0"


def test_002_value_example(capsys):
    with Graph("value_example") as graph:
        a = ops.constant(np.array([1, 2, 3]), dtype=DType.float32, device=DeviceRef.CPU())
        b = ops.constant(np.array([4, 5, 6]), dtype=DType.float32, device=DeviceRef.CPU())
        c = a + b
        print(f"Type of c: {type(c)}")
        print(f"Is c a Value? {isinstance(c, Value)}")
    assert "Is c a Value? True" in capsys.readouterr().out


def test_002_acos_graph():
    from maxfx.engine import InferenceSession

    def acos_graph():
        input_type = TensorType(dtype=DType.float32, shape=(3,), device=DeviceRef.CPU())
        with Graph("acos_graph", input_types=(input_type,)) as graph:
            x = graph.inputs[0]
            out = ops.acos(x)
            graph.output(out)
        return graph

    out = InferenceSession().load(acos_graph()).execute(np.array([-2.0, 0.0, 2.0], np.float32))[0].to_numpy()
    np.testing.assert_allclose(out, [np.pi, np.pi / 2, 0.0], rtol=1e-6, atol=1e-6)  # clamped, not NaN


def test_002_cond():
    from maxfx.engine import InferenceSession

    device = DeviceRef.CPU()
    with Graph("cond", input_types=[TensorType(DType.bool, [], device=device)]) as graph:
        pred = graph.inputs[0]

        def then_fn():
            return ops.constant(1, DType.int32, device=DeviceRef.CPU())

        def else_fn():
            return ops.constant(0, DType.int32, device=DeviceRef.CPU())

        result = ops.cond(pred, [TensorType(DType.int32, [], device=device)], then_fn, else_fn)
        graph.output(*result)
    model = InferenceSession().load(graph)
    assert model.execute(np.bool_(True))[0].to_numpy() == 1
    assert model.execute(np.bool_(False))[0].to_numpy() == 0


def test_002_gather_nd_type():
    input_shape = ["a", "b", "c", "d", "e"]
    indices_shape = ["a", "f", 3]
    input_type = TensorType(DType.bfloat16, input_shape)
    indices_type = TensorType(DType.int32, indices_shape)
    with Graph("gather_nd", input_types=[input_type, indices_type]) as graph:
        input, indices = graph.inputs
        gathered = ops.gather_nd(input, indices, batch_dims=1)
        assert gathered.type == TensorType(DType.bfloat16, ["a", "f", "e"])


def test_002_print_example(capfd):
    from maxfx.engine import InferenceSession

    def add_tensors(a: np.ndarray, b: np.ndarray):
        input_type = TensorType(dtype=DType.float32, shape=(1,), device=DeviceRef.CPU())
        with Graph("simple_add_graph", input_types=(input_type, input_type)) as graph:
            lhs, rhs = graph.inputs
            out = ops.add(lhs, rhs)
            ops.print(out, label="addition_output")
            graph.output(out)
        print("final graph:", graph)
        session = InferenceSession()
        return session.load(graph).execute(a, b)[0].to_numpy()

    out = add_tensors(np.array([1.0], np.float32), np.array([2.0], np.float32))
    assert out.tolist() == [3.0]
    printed = capfd.readouterr().out
    assert "final graph:" in printed and "addition_output" in printed


def test_002_while_loops():
    from maxfx.engine import InferenceSession

    with Graph("while_loop_example") as g:
        x = ops.constant(0, dtype=DType.int32, device=DeviceRef.CPU())

        def pred(x):
            return x < 10

        def body(x):
            return x + 1

        result = ops.while_loop(x, pred, body)
        g.output(*result)
    assert InferenceSession().load(g).execute()[0].to_numpy() == 10

    with Graph("while_loop_example2") as g:
        x = ops.constant(0, dtype=DType.int32, device=DeviceRef.CPU())
        y = ops.constant(5, dtype=DType.int32, device=DeviceRef.CPU())

        def pred2(x, y):
            return ops.logical_and(x < 10, y < 15)

        def body2(x, y):
            return [x + 1, y + 1]

        results = ops.while_loop((x, y), pred2, body2)
        g.output(*results)
    outs = InferenceSession().load(g).execute()
    assert [o.to_numpy().item() for o in outs] == [10, 15]


def test_002_tensor_type_example():
    with Graph() as g:
        tensor_type = TensorType(DType.float32, [2, 3])
        assert str(tensor_type.dtype) == "DType.float32"
        assert tensor_type.shape == [2, 3]


def test_002_graph_weights_example():
    # Create a graph and get its weights interface
    graph = Graph("my_model")
    weights = graph.weights()
    # Allocate weights with hierarchical naming
    attn_weight = weights.transformer.layers[0].attention.weight.allocate(dtype=DType.float32, shape=(768, 768))
    # Creates weight named "transformer.layers.0.attention.weight"
    assert attn_weight.name == "transformer.layers.0.attention.weight"
    # Check if a weight exists before allocating
    if weights.transformer.layers[0].mlp.weight.exists():
        weights.transformer.layers[0].mlp.weight.allocate(dtype=DType.float16, shape=(768, 3072))
    assert list(graph.weights()) == ["transformer.layers.0.attention.weight"]
    assert weights.transformer.layers[0].attention.weight.exists()
