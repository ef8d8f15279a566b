"""Behaviours of Modular's current documentation pages (issue 16, item 6), each against what the docs show.

- the MLP-block tutorial imports the graph-API layers as ``from max.nn import legacy as nn``;
- the modules page compiles with ``session.compile(graph)`` then binds weights with
  ``session.init(compiled, weights_registry=...)``, and names the children of a
  ``Sequential`` held in ``self.layers`` ``layers.0.fc1.weight``;
- the eager pages print a multi-dimensional tensor as one flat list after its type.
"""

from __future__ import annotations

import numpy as np
import pytest

import maxfx.nn
from maxfx.dtype import DType
from maxfx.engine import CompiledModel, InferenceSession
from maxfx.experimental.tensor import Tensor, _default_device, _default_dtype, defaults_like
from maxfx.graph import DeviceRef, Graph, TensorType, ops
from maxfx.nn import legacy as nn

CPU = DeviceRef.CPU()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8, DType.float32, CPU)
        self.fc2 = nn.Linear(8, 4, DType.float32, CPU)

    def __call__(self, x):
        return self.fc2(ops.relu(self.fc1(x)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential([Block(), Block()])

    def __call__(self, x):
        return self.layers(x)


def test_legacy_is_the_graph_api_layers():
    assert nn.Module is maxfx.nn.Module and nn.Linear is maxfx.nn.Linear and nn.Sequential is maxfx.nn.Sequential
    assert set(nn.__all__) <= set(maxfx.nn.__all__)


def test_sequential_children_are_named_by_position():
    names = sorted(Model().state_dict())
    assert names == [f"layers.{i}.{fc}.weight" for i in (0, 1) for fc in ("fc1", "fc2")]


def test_compile_then_init_runs_with_the_registry_weights(rng):
    model = Model()
    # As on the modules page: the weights' values are known (which names them) before the graph is built.
    weights = {
        name: rng.normal(size=tuple(int(d) for d in w.shape)).astype(np.float32)
        for name, w in model.raw_state_dict().items()
    }
    model.load_state_dict(weights)
    with Graph("mlp", input_types=[TensorType(DType.float32, ["batch", 4], CPU)]) as graph:
        graph.output(model(graph.inputs[0].tensor))
    session = InferenceSession()
    compiled = session.compile(graph)
    assert isinstance(compiled, CompiledModel) and sorted(compiled.expected_weights) == sorted(weights)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    ref = x
    for i in (0, 1):
        ref = np.maximum(ref @ weights[f"layers.{i}.fc1.weight"].T, 0) @ weights[f"layers.{i}.fc2.weight"].T
    out = session.init(compiled, weights_registry=weights).execute(x)[0].to_numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    # One CompiledModel, initialized again with other weights.
    zeros = {k: np.zeros_like(v) for k, v in weights.items()}
    np.testing.assert_array_equal(
        session.init(compiled, weights_registry=zeros).execute(x)[0].to_numpy(), np.zeros((3, 4), np.float32)
    )
    with pytest.raises(ValueError, match="layers.0.fc1.weight"):
        session.init(compiled, weights_registry={})
    with pytest.raises(TypeError, match="CompiledModel"):
        session.init(graph, weights_registry=weights)


def test_default_device_and_dtype_helpers_and_defaults_like():
    assert Tensor([1.0]).device == _default_device() and Tensor([1.0]).dtype == _default_dtype(_default_device())
    like = Tensor.zeros([1], dtype=DType.float64)
    with defaults_like(like):
        assert Tensor.ones([2]).dtype == DType.float64
    with defaults_like(like.type):
        assert Tensor.ones([2]).type.dtype == DType.float64
    with pytest.raises(TypeError, match="defaults_like"):
        with defaults_like(3):
            pass


def test_norm_layers_import_from_their_own_modules_and_offset_the_weight():
    """The layers guide subclasses ``max.nn.norm.rms_norm.RMSNorm`` with ``weight_offset=1.0`` (Gemma's ``1 +
    weight``).
    """
    from maxfx.nn.norm.group_norm import GroupNorm
    from maxfx.nn.norm.layer_norm import LayerNorm
    from maxfx.nn.norm.rms_norm import RMSNorm

    assert (RMSNorm, LayerNorm, GroupNorm) == (maxfx.nn.RMSNorm, maxfx.nn.LayerNorm, maxfx.nn.GroupNorm)

    class ScaledRMSNorm(RMSNorm):
        def __init__(self, dim, dtype, eps=1e-6):
            super().__init__(dim=dim, dtype=dtype, eps=eps, weight_offset=1.0)

    layer = ScaledRMSNorm(4, DType.float32)
    assert sorted(layer.state_dict()) == ["weight"]
    w = np.array([0.0, 0.5, -0.5, 1.0], np.float32)
    x = np.array([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.0, 2.0, 0.5]], np.float32)
    with Graph("scaled_rms", input_types=[TensorType(DType.float32, [2, 4], CPU)]) as g:
        g.output(layer(g.inputs[0].tensor))
    model = InferenceSession().load(g, weights_registry={"weight": w})
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * (1.0 + w)
    np.testing.assert_allclose(model.execute(x)[0].to_numpy(), want, rtol=1e-5)
