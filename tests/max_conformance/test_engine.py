"""MAX's engine behaviours (from MAX's own tests): Model device attributes, max.engine.api, contiguity checks."""

from __future__ import annotations

import numpy as np
import pytest

from maxfx.driver import CPU, Tensor
from maxfx.dtype import DType
from maxfx.engine import InferenceSession, api
from maxfx.graph import DeviceRef, Graph, TensorType, Weight


def _scale_graph() -> Graph:
    with Graph("scale", input_types=[TensorType(DType.float32, ["n", 2], DeviceRef.CPU())]) as g:
        g.output(g.inputs[0].tensor * g.add_weight(Weight("w", DType.float32, [2], DeviceRef.CPU())))
    return g


def test_model_reports_its_input_and_output_devices():
    model = InferenceSession(devices=[CPU()]).load(_scale_graph(), weights_registry={"w": np.ones(2, np.float32)})
    assert model.input_devices == [CPU()] and model.output_devices == [CPU()] and model.devices == [CPU()]
    x = Tensor.from_numpy(np.arange(4, dtype=np.float32).reshape(2, 2)).to(model.input_devices[0])
    np.testing.assert_array_equal(model.execute(x)[0].to_numpy(), np.arange(4).reshape(2, 2))


def test_engine_api_module_is_the_engine():
    assert api.InferenceSession is InferenceSession
    assert set(api.__all__) >= {"InferenceSession", "Model", "TensorSpec"}


def test_strided_weights_and_inputs_are_refused():
    session = InferenceSession()
    strided = np.ones((2, 4), np.float32)[:, ::2]
    assert not strided.flags.c_contiguous
    with pytest.raises(ValueError, match="non-contiguous tensors"):
        session.load(_scale_graph(), weights_registry={"w": np.ones(4, np.float32)[::2]})
    model = session.load(_scale_graph(), weights_registry={"w": np.ones(2, np.float32)})
    with pytest.raises(ValueError, match="non-contiguous tensors"):
        model.execute(strided)
    np.testing.assert_array_equal(model.execute(np.ascontiguousarray(strided))[0].to_numpy(), np.ones((2, 2), np.float32))
