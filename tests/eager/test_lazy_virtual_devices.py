"""Inside F.lazy(), eager tensors can live on GPUs this machine does not have (MAX's virtual devices).

As in MAX, F.lazy() only records: creating tensors on a virtual device, moving
them there and running ops on them give tensors with the right shapes, dtypes
and devices, checked as the ops are recorded. Only computing values needs the
device, and that raises a clear error. Layers can so be traced for (several)
GPUs on a CPU-only machine, e.g. a tensor-parallel MoE over two of them.
"""

from unittest.mock import MagicMock

import numpy as np
import pytest

from lowering.devices import has_hardware
from maxfx import driver
from maxfx.driver import Accelerator, Device
from maxfx.dtype import DType
from maxfx.experimental import functional as F
from maxfx.experimental.nn.common_layers.moe import MoE, TensorParallelMoE
from maxfx.experimental.sharding import DeviceMesh, Partial, PlacementMapping, Replicated
from maxfx.experimental.tensor import Tensor
from maxfx.graph import DeviceRef

pytestmark = pytest.mark.skipif(
    driver.accelerator_count() > 0, reason="needs a machine without GPUs (virtual GPUs stand in for absent ones)"
)


@pytest.fixture
def two_virtual_gpus(virtual_cuda):
    driver.set_virtual_device_count(2)
    return [Accelerator(0), Accelerator(1)]


def test_has_hardware():
    assert has_hardware(DeviceRef.CPU())
    assert not has_hardware(DeviceRef.GPU(0))


def test_ops_are_recorded_with_types_and_devices(two_virtual_gpus):
    gpu = two_virtual_gpus[0]
    with F.lazy():
        x = Tensor.zeros([4, 8], device=gpu)
        w = Tensor(np.ones((8, 2), np.float32)).to(gpu)  # a realized CPU tensor moved there
        y = F.relu(x * 2 + 1) @ w
        z = y.to(two_virtual_gpus[1]).cast(DType.bfloat16)
    assert [int(d) for d in y.shape] == [4, 2] and y.dtype is DType.float32 and y.device == gpu
    assert z.device == two_virtual_gpus[1] and z.dtype is DType.bfloat16
    assert not y.real and not w.real


def test_shape_and_device_errors_still_surface_when_recorded(two_virtual_gpus):
    gpu0, gpu1 = two_virtual_gpus
    with F.lazy():
        a = Tensor.ones([2, 3], device=gpu0)
        with pytest.raises(ValueError, match="different devices"):
            a + Tensor.ones([2, 3], device=gpu1)
        with pytest.raises(ValueError, match="matmul"):
            a @ Tensor.ones([2, 3], device=gpu0)


def test_computing_values_needs_the_device(two_virtual_gpus):
    with F.lazy():
        y = Tensor.ones([3], device=two_virtual_gpus[0]) * 2
    with pytest.raises(ValueError, match=r"cannot realize a tensor on gpu:0.*F\.lazy\(\)"):
        y.to_numpy()


def test_outside_lazy_a_virtual_device_still_refuses_data(two_virtual_gpus):
    with pytest.raises(RuntimeError, match="virtual cuda"):
        Tensor.zeros([2], device=two_virtual_gpus[0])


def test_a_cpu_computation_beside_recorded_gpu_work_still_runs(two_virtual_gpus):
    with F.lazy():
        Tensor.ones([2], device=two_virtual_gpus[0]) + 1
        host = Tensor([1.0, 2.0]) * 3
    np.testing.assert_array_equal(host.to_numpy(), [3.0, 6.0])


def test_moe_traces_on_a_virtual_gpu(two_virtual_gpus):
    """MAX's own test_moe.py, with virtual GPUs where it patches in mocks."""
    gpu = two_virtual_gpus[0]
    with F.lazy():
        layer = MoE(hidden_dim=64, num_experts=4, num_experts_per_token=2, moe_dim=32).to(gpu)
        assert [int(d) for d in layer.gate_up_proj[0].shape] == [4, 64, 64] and layer.gate_up_proj[0].device == gpu
        out = layer(Tensor.zeros([5, 64], dtype=DType.float32, device=gpu))  # a GPU's default dtype is bfloat16
    assert [int(d) for d in out.shape] == [5, 64] and out.device == gpu


def test_tensor_parallel_moe_traces_over_two_virtual_gpus(two_virtual_gpus):
    with F.lazy():
        mesh = DeviceMesh(tuple(two_virtual_gpus), (2,), ("tp",))
        layer = TensorParallelMoE(hidden_dim=64, num_experts=4, num_experts_per_token=2, moe_dim=32).to(mesh)
        shards = layer.gate_up_proj
        assert [[int(d) for d in s.shape] for s in shards] == [[4, 32, 64]] * 2
        assert [s.device for s in shards] == two_virtual_gpus
        out = layer(Tensor.zeros([5, 64], dtype=DType.float32, device=PlacementMapping(mesh, (Replicated(),))))
    assert [int(d) for d in out.shape] == [5, 64]
    assert out.mapping.mesh == mesh and out.mapping.to_placements() == (Partial(),)


def test_a_stand_in_gpu_device_traces_and_comes_back_from_its_ref():
    """MAX's MoE tests trace on MagicMock GPUs: a DeviceRef made from a device this machine lacks gives that device
    back.
    """
    fake = MagicMock(spec=Device)
    fake.id, fake.label = 7, "gpu"
    ref = DeviceRef.from_device(fake)
    assert ref == DeviceRef.GPU(7) and ref.to_device() is fake
    with F.lazy():
        x = Tensor.zeros([2, 3], dtype=DType.float32, device=fake)
        y = (x + 1).sum(axis=-1)
    assert y.device is fake and [int(d) for d in y.shape] == [2, 1]
    with pytest.raises(ValueError, match="cannot realize a tensor on gpu:7"):
        y.to_numpy()


def test_a_ref_to_a_gpu_nobody_described_still_fails_clearly():
    with pytest.raises(ValueError, match="accelerator"):
        DeviceRef.GPU(5).to_device()
