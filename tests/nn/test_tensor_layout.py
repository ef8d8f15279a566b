"""MAX's `TensorLayout` / `BufferLayout` (max.experimental.sharding): dtype, global shape and mapping as an input spec.

The compiled-module numbers are checked against numpy; the layout's fields and
placements against what Modular's API reference documents for the class.
"""

import doctest
import importlib

import numpy as np
import pytest

from lowering.dims import Dim
from maxfx.driver import CPU
from maxfx.dtype import DType
from maxfx.experimental import functional as F
from maxfx.experimental.nn import Linear
from maxfx.experimental.sharding import (
    BufferLayout,
    DeviceMapping,
    DeviceMesh,
    PlacementMapping,
    Replicated,
    Sharded,
    TensorLayout,
)
from maxfx.experimental.tensor import Tensor, defaults
from maxfx.graph import BufferType, DeviceRef, TensorType


def _two_device_mesh() -> DeviceMesh:
    return DeviceMesh((CPU(), CPU()), (2,), ("dp",))


def test_fields_follow_maxs_reference():
    mapping = PlacementMapping(_two_device_mesh(), (Sharded(0),))
    layout = TensorLayout(DType.bfloat16, ["batch", 8], mapping)
    assert isinstance(layout, DeviceMapping)  # rules can return a layout where a mapping is expected
    assert layout.dtype is DType.bfloat16 and list(layout.shape) == [Dim("batch"), Dim(8)] and layout.rank == 2
    assert layout.mapping is mapping and layout.mesh is mapping.mesh
    assert layout.to_placements() == (Sharded(0),) and not layout.is_fully_replicated and layout.is_fully_resolved
    assert layout.to_named_sharding().spec == ("dp", None)
    assert layout.local_shape(1) == [Dim("batch_dp_1"), 8]
    assert (
        layout == TensorLayout(DType.bfloat16, ["batch", 8], mapping)
        and len({layout, TensorLayout(DType.bfloat16, ["batch", 8], mapping)}) == 1
    )
    assert layout != TensorLayout(DType.float32, ["batch", 8], mapping)


def test_a_device_or_a_mesh_is_replicated():
    on_cpu = TensorLayout(DType.float32, [3], CPU())
    assert on_cpu.mesh.num_devices == 1 and on_cpu.is_fully_replicated
    assert on_cpu.to_type() == TensorType(DType.float32, [3], DeviceRef.CPU())
    assert TensorLayout(DType.float32, [3], _two_device_mesh()).to_placements() == (Replicated(),)
    assert BufferLayout(DType.int32, [4], CPU()).to_type() == BufferType(DType.int32, [4], DeviceRef.CPU())


def test_bad_layouts_are_refused_with_what_is_expected():
    with pytest.raises(TypeError, match="TensorLayout: dtype must be a DType, got str"):
        TensorLayout("float32", [3], CPU())
    with pytest.raises(TypeError, match="TensorLayout: expected a Device, DeviceMesh or DeviceMapping, got str"):
        TensorLayout(DType.float32, [3], "cpu")
    with pytest.raises(ValueError, match=r"Sharded\(axis=1\) is out of range for the rank-1 shape"):
        TensorLayout(DType.float32, [3], PlacementMapping(_two_device_mesh(), (Sharded(1),)))
    with pytest.raises(ValueError, match="a graph input lives on one device, but this layout spans 2 devices"):
        TensorLayout(DType.float32, [3], _two_device_mesh()).to_type()


def test_module_compile_takes_a_layout_as_in_the_api_reference():
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    with F.lazy():
        model = Linear(2, 3)
    dtype, device = defaults()
    compiled = model.compile(
        TensorLayout(dtype, ["batch", 2], device), weights={"weight": Tensor(w), "bias": Tensor(b)}
    )
    for batch in (4, 7):
        x = rng.standard_normal((batch, 2)).astype(np.float32)
        np.testing.assert_allclose(compiled(Tensor(x)).to_numpy(), x @ w.T + b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="spans 2 devices"):
        Linear(2, 3).compile(TensorLayout(DType.float32, ["batch", 2], _two_device_mesh()))


@pytest.mark.parametrize("module", ["maxfx.experimental.sharding._layout", "maxfx.experimental.sharding._mappings"])
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
