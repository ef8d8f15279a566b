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
    np.testing.assert_array_equal(
        model.execute(np.ascontiguousarray(strided))[0].to_numpy(), np.ones((2, 2), np.float32)
    )


def test_init_all_load_all_and_the_compiled_models_repr():
    session = InferenceSession()
    compiled = session.compile(_scale_graph())
    assert repr(compiled) == "CompiledModel()" and not hasattr(compiled, "execute")
    models = session.init_all(compiled, weights_registry={"w": np.full(2, 2.0, np.float32)})
    assert list(models) == ["scale"]
    np.testing.assert_array_equal(models["scale"].execute(np.ones((1, 2), np.float32))[0].to_numpy(), [[2.0, 2.0]])
    loaded = session.load_all(_scale_graph(), weights_registry={"w": np.ones(2, np.float32)})
    assert list(loaded) == ["scale"]


def test_compilation_stats_split_the_phases():
    from maxfx.engine._compilation_stats import collect_compilation_stats
    from maxfx.experimental.nn._compilation_timer import CompilationTimer

    session = InferenceSession()
    with collect_compilation_stats() as stats:
        compiled = session.compile(_scale_graph())
    assert stats.compile_seconds > 0 and stats.init_seconds == 0 and stats.build_seconds == 0 and stats.num_phases == 0
    with collect_compilation_stats() as outer:
        with collect_compilation_stats() as inner:
            session.init(compiled, weights_registry={"w": np.ones(2, np.float32)})
    assert inner.init_seconds > 0 and outer.init_seconds == inner.init_seconds and inner.compile_seconds == 0
    with collect_compilation_stats() as stats:
        with CompilationTimer("scale") as timer:
            graph = _scale_graph()
            timer.mark_build_complete()
            session.load_all(graph, weights_registry={"w": np.ones(2, np.float32)})
    assert stats.num_phases == 1 and stats.build_seconds > 0 and stats.compile_seconds > 0 and stats.init_seconds > 0


def test_types_cast_and_subscript_as_in_max():
    from typing import Any

    from maxfx.graph import Type

    t = TensorType(DType.float32, [2, "n"], DeviceRef.CPU())
    assert t.cast(DType.int64) == TensorType(DType.int64, [2, "n"], DeviceRef.CPU())
    assert Type[Any] is not None  # MAX's annotations subscript Type
