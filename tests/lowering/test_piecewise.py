"""Top-level subgraph calls compile once per subgraph and run per call site (lowering.piecewise).

MAX documents subgraphs as the way to cut compile time of repeated layers; these
tests check the results against numpy and count the executables built.
"""

import numpy as np
import pytest

from lowering.compile import clear_cache, compile_stats
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, TensorType, Weight, ops

CPU = DeviceRef.CPU()


def _layers_graph(n_layers: int) -> Graph:
    """``x -> relu(x @ w_i + b_i)`` for i < n_layers (one subgraph), then a reshape by the caller's batch dim."""
    x_t = TensorType(DType.float32, ["batch", 4], CPU)
    with Graph("layers", input_types=[x_t]) as g:
        with g.add_subgraph("layer", input_types=[TensorType(DType.float32, ["rows", 4], CPU)]) as sub:
            w, b = Weight("w", DType.float32, [4, 4], CPU), Weight("b", DType.float32, [4], CPU)
            sub.output(ops.relu(sub.inputs[0] @ w + b))
        h = g.inputs[0]
        for i in range(n_layers):
            [h] = ops.call(sub, h, prefix=f"layers.{i}.")
        scale = g.add_weight(Weight("scale", DType.float32, [], CPU))
        g.output(ops.reshape(h * scale, ["batch", 2, 2]))
    return g


def _np_layers(x, weights, n_layers):
    for i in range(n_layers):
        x = np.maximum(x @ weights[f"layers.{i}.w"] + weights[f"layers.{i}.b"], 0)
    return (x * weights["scale"]).reshape(len(x), 2, 2)


def test_each_subgraph_compiles_once_whatever_the_number_of_calls(rng):
    n = 6
    weights = {
        f"layers.{i}.{k}": rng.normal(size=s).astype(np.float32)
        for i in range(n)
        for k, s in (("w", (4, 4)), ("b", (4,)))
    }
    weights["scale"] = np.float32(3.0)
    model = InferenceSession().load(_layers_graph(n), weights_registry=weights)
    clear_cache()
    before = compile_stats()["compiles"]
    for batch in (3, 5):
        x = rng.normal(size=(batch, 4)).astype(np.float32)
        np.testing.assert_allclose(model.execute(x)[0].to_numpy(), _np_layers(x, weights, n), rtol=1e-5, atol=1e-5)
    # Per batch size: the layer once (for six calls) and the tail (scale, reshape) once.
    assert compile_stats()["compiles"] - before == 4
    model.execute(np.zeros((3, 4), np.float32))
    assert compile_stats()["compiles"] - before == 4


def test_a_call_that_writes_a_buffer_stays_inlined():
    t = TensorType(DType.float32, [4], CPU)
    with Graph("main", input_types=[t]) as g:
        with g.add_subgraph("accumulate", input_types=[BufferType(DType.float32, [4], CPU), t]) as acc:
            b, v = acc.inputs
            ops.buffer_store(b, ops.buffer_load(b) + v)
            acc.output(v * 2)
        buf = ops.buffer_create(BufferType(DType.float32, [4], CPU))
        ops.buffer_store(buf, g.inputs[0])
        [r] = ops.call(acc, buf, g.inputs[0])
        g.output(r, ops.buffer_load(buf))
    model = InferenceSession().load(g)
    assert model._compiled._pieces is None
    x = np.arange(4, dtype=np.float32)
    r, total = model.execute(x)
    np.testing.assert_array_equal(r.to_numpy(), x * 2)
    np.testing.assert_array_equal(total.to_numpy(), x * 2)


def test_a_graph_returning_a_weight_and_a_call(rng):
    t = TensorType(DType.float32, [3], CPU)
    with Graph("main", input_types=[t]) as g:
        with g.add_subgraph("neg", input_types=[t]) as sub:
            sub.output(-sub.inputs[0])
        w = g.add_weight(Weight("w", DType.float32, [3], CPU))
        [a] = ops.call(sub, w)  # a weight as a call's operand
        g.output(a, w, ops.call(sub, g.inputs[0])[0])
    w_np, x = rng.normal(size=3).astype(np.float32), rng.normal(size=3).astype(np.float32)
    out = InferenceSession().load(g, weights_registry={"w": w_np}).execute(x)
    for got, want in zip(out, (-w_np, w_np, -x)):
        np.testing.assert_array_equal(got.to_numpy(), want)


def test_piece_inputs_are_checked_like_the_whole_graph():
    model = InferenceSession().load(
        _layers_graph(2),
        weights_registry={
            **{f"layers.{i}.{k}": np.zeros(s, np.float32) for i in range(2) for k, s in (("w", (4, 4)), ("b", (4,)))},
            "scale": np.float32(1),
        },
    )
    with pytest.raises(ValueError, match="float32"):
        model.execute(np.zeros((2, 4), np.int32))
