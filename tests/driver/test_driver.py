"""maxfx.driver: devices, streams, device specs and Tensor/Buffer (API_INVENTORY §4.2).

Accelerator memory is exercised on CPU through `fake_gpu`: an Accelerator
wrapping a JAX CPU device, so every device-storage code path (jax.Array
backing, functional view writes, bitcast views, uploads/downloads) runs here.
"""

import copy
import pickle

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from lowering.devices import accelerators
from lowering.types import DeviceRef
from maxfx import driver
from maxfx.driver import (
    CPU,
    Accelerator,
    Buffer,
    Device,
    DeviceSpec,
    DeviceStream,
    DLPackArray,
    Tensor,
    accelerator_api,
    accelerator_architecture_name,
    accelerator_count,
    devices_exist,
    load_devices,
    scan_available_devices,
)
from maxfx.driver._tensor import as_array
from maxfx.dtype import DType

HAS_GPU = bool(accelerators())
cpu_only = pytest.mark.skipif(HAS_GPU, reason="checks the CPU-only behaviour")


@pytest.fixture(scope="module")
def fake_gpu():
    return Accelerator._from_jax_device(jax.devices("cpu")[0], 7)


def f32(*shape):
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


# ---------------------------------------------------------------- devices
def test_public_names():
    assert set(driver.__all__) >= {
        "Accelerator", "Buffer", "CPU", "DLPackArray", "Device", "DeviceSpec", "DeviceStream", "Tensor",
        "accelerator_api", "accelerator_architecture_name", "accelerator_count", "devices_exist",
        "load_devices", "scan_available_devices",
    }  # fmt: skip
    assert Buffer is Tensor


def test_cpu_device_properties():
    cpu = CPU()
    assert cpu is CPU(-1) and CPU(3) == cpu and CPU(3).id == 0
    assert (cpu.label, cpu.id, cpu.api, cpu.is_host, cpu.is_compatible) == ("cpu", 0, "cpu", True, True)
    assert repr(cpu) == str(cpu) == "CPU()"
    assert cpu.jax_device == jax.devices("cpu")[0]
    assert isinstance(cpu, Device)
    assert Device.cpu() is cpu
    assert isinstance(cpu.stats, dict) and cpu.stats["platform"] == "cpu"
    assert hash(cpu) == hash(CPU())


def test_cpu_architecture_name_raises():
    with pytest.raises(ValueError, match="CPU"):
        CPU().architecture_name


def test_device_is_abstract():
    with pytest.raises(TypeError, match="CPU"):
        Device()


def test_default_stream_and_synchronize():
    cpu = CPU()
    stream = cpu.default_stream
    assert isinstance(stream, DeviceStream) and stream is cpu.default_stream and stream.device is cpu
    pending = jnp.ones((64, 64)) @ jnp.ones((64, 64))
    assert cpu.synchronize() is None
    assert stream.synchronize() is None
    np.testing.assert_allclose(np.asarray(pending), np.full((64, 64), 64.0))


def test_can_access(fake_gpu):
    assert CPU().can_access(CPU())
    assert not CPU().can_access(fake_gpu) and not fake_gpu.can_access(CPU())
    assert fake_gpu.can_access(fake_gpu)
    with pytest.raises(TypeError, match="can_access"):
        CPU().can_access("cpu")


def test_devices_copy_and_pickle_to_themselves():
    assert copy.copy(CPU()) is CPU() and copy.deepcopy(CPU()) is CPU()
    assert pickle.loads(pickle.dumps(CPU())) is CPU()


@cpu_only
def test_accelerator_without_gpu_raises_clearly():
    with pytest.raises(ValueError, match=r"Accelerator\(id=-1\).*0 GPUs"):
        Accelerator()
    with pytest.raises(ValueError, match="0 GPUs"):
        Accelerator(id=1, device_memory_limit=1 << 20)


@cpu_only
def test_device_queries_on_cpu_only_machine():
    assert accelerator_count() == 0
    assert accelerator_api() == "cpu"
    with pytest.raises(ValueError, match="CPU"):
        accelerator_architecture_name()
    assert scan_available_devices() == [DeviceSpec.cpu()]
    assert devices_exist([DeviceSpec.cpu(), DeviceSpec.cpu(0)])
    assert not devices_exist([DeviceSpec.accelerator(0)])
    assert load_devices([DeviceSpec.cpu()]) == [CPU()]
    with pytest.raises(ValueError, match="accelerator 0 was requested.*0 accelerator"):
        load_devices([DeviceSpec.accelerator()])
    with pytest.raises(TypeError, match="DeviceSpec"):
        load_devices([CPU()])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_accelerator_on_gpu():
    gpu = Accelerator(device_memory_limit=1 << 30)
    assert gpu is Accelerator(0) is Accelerator(id=0, device_memory_limit=1 << 20)
    assert gpu.device_memory_limit == 1 << 30  # the first construction wins
    assert repr(gpu) == "Accelerator(id=0)" and gpu.label == "gpu" and not gpu.is_host
    assert gpu.api in ("cuda", "hip") and accelerator_api() == gpu.api
    assert gpu.architecture_name.startswith(("sm_", "gfx")) and accelerator_architecture_name() == gpu.architecture_name
    assert accelerator_count() == len(accelerators())
    assert scan_available_devices() == [DeviceSpec.accelerator(i) for i in range(accelerator_count())]
    assert load_devices([DeviceSpec.accelerator(0)]) == [gpu]
    t = Tensor.from_numpy(f32(2, 3)).to(gpu)
    assert not t.is_host and t.device == gpu
    np.testing.assert_array_equal(t.to(CPU()).to_numpy(), f32(2, 3))
    with pytest.raises(ValueError, match="accelerator"):
        Accelerator(accelerator_count())


def test_fake_accelerator_properties(fake_gpu):
    assert (fake_gpu.label, fake_gpu.id, fake_gpu.is_host) == ("gpu", 7, False)
    assert repr(fake_gpu) == "Accelerator(id=7)" and fake_gpu.api == "cuda"
    with pytest.raises(ValueError, match="compute capability"):
        fake_gpu.architecture_name
    assert fake_gpu != CPU() and fake_gpu.default_stream.device is fake_gpu


def test_device_spec():
    assert DeviceSpec(3) == DeviceSpec(3, "cpu")
    assert DeviceSpec.cpu() == DeviceSpec(-1, "cpu")
    assert DeviceSpec.accelerator() == DeviceSpec(0, "gpu")
    assert DeviceSpec.accelerator(2).device_type == "gpu" and DeviceSpec.accelerator(2).id == 2
    assert len({DeviceSpec.cpu(), DeviceSpec.cpu()}) == 1
    with pytest.raises(ValueError, match="device_type"):
        DeviceSpec(0, "tpu")
    with pytest.raises(ValueError, match=">= 0"):
        DeviceSpec(-1, "gpu")


def test_device_stream(fake_gpu):
    stream = DeviceStream(CPU())
    assert stream.device is CPU() and stream is not CPU().default_stream
    assert repr(stream) == "DeviceStream(device=CPU())"
    assert stream.wait_for(CPU().default_stream) is None
    assert stream.wait_for(CPU()) is None
    assert stream.wait_for(DeviceStream(fake_gpu)) is None
    with pytest.raises(TypeError, match="wait_for"):
        stream.wait_for(3)
    with pytest.raises(TypeError, match="DeviceStream"):
        DeviceStream("cpu")


def test_dlpack_array_protocol():
    assert isinstance(np.zeros(2), DLPackArray)
    assert isinstance(jnp.zeros(2), DLPackArray)
    assert isinstance(Tensor.zeros((2,), DType.float32), DLPackArray)
    assert not isinstance([1, 2], DLPackArray)


def test_device_ref_resolution(fake_gpu):
    assert DeviceRef.CPU().to_device() is CPU()
    assert DeviceRef.from_device(CPU()) == DeviceRef.CPU()
    assert DeviceRef.from_device(fake_gpu) == DeviceRef.GPU(7)
    if not HAS_GPU:
        with pytest.raises(ValueError, match="0 GPUs"):
            DeviceRef.GPU(0).to_device()


# ---------------------------------------------------------------- tensor construction
def test_constructor_overloads():
    t = Tensor(DType.float32, [2, 3])
    assert (t.shape, t.dtype, t.device, t.rank, t.num_elements, t.element_size) == (
        (2, 3),
        DType.float32,
        CPU(),
        2,
        6,
        4,
    )
    assert t.is_host and not t.pinned and t.is_contiguous and t.stream is CPU().default_stream
    assert t.to_numpy().dtype == np.float32 and t.to_numpy().flags.writeable
    assert Tensor(shape=[2, 3], dtype=DType.bfloat16).to_numpy().dtype == ml_dtypes.bfloat16
    assert Tensor([4], DType.int8).shape == (4,)  # positional order swapped
    stream = DeviceStream(CPU())
    assert Tensor(DType.int32, (2,), stream).stream is stream
    assert Tensor(DType.int32, (2,), stream=stream).stream is stream
    assert Tensor(DType.float32, (), CPU(), pinned=True).pinned


def test_constructor_from_array_copies():
    a = f32(2, 2)
    t = Tensor(a, CPU())
    np.testing.assert_array_equal(t.to_numpy(), a)
    assert not np.shares_memory(t.to_numpy(), a)
    assert Tensor(shape=a, device=CPU()).shape == (2, 2)


def test_constructor_errors():
    with pytest.raises(TypeError, match="DType"):
        Tensor("float33", [2])
    with pytest.raises(ValueError, match=">= 0"):
        Tensor(DType.float32, [2, -1])
    with pytest.raises(TypeError, match="sequence of ints"):
        Tensor(DType.float32, [2.5])
    with pytest.raises(TypeError, match="Tensor"):
        Tensor(DType.float32)
    with pytest.raises(TypeError, match="Device"):
        Tensor(DType.float32, [2], device="cpu")


def test_zeros_and_scalar():
    z = Tensor.zeros((2, 3), DType.int64, device=CPU())
    np.testing.assert_array_equal(z.to_numpy(), np.zeros((2, 3), np.int64))
    assert Tensor.zeros([2], DType.float32, DeviceRef.CPU()).device is CPU()
    s = Tensor.scalar(2.5, DType.float32)
    assert (s.shape, s.rank, s.num_elements, s.item()) == ((), 0, 1, 2.5)
    assert Tensor.scalar(True, DType.bool).item() is True
    with pytest.raises(ValueError, match="int8"):
        Tensor.scalar(300, DType.int8)
    with pytest.raises(ValueError, match="single value"):
        Tensor.scalar([1, 2], DType.int32)


def test_from_numpy_shares_memory():
    a = f32(2, 3)
    t = Tensor.from_numpy(a)
    assert t.to_numpy() is a or np.shares_memory(t.to_numpy(), a)
    t[0, 0] = 42.0
    assert a[0, 0] == 42.0
    a[1, 2] = -1.0
    assert t[1, 2].item() == -1.0
    assert Tensor.from_numpy(np.float32(3)).item() == 3.0


@pytest.mark.parametrize("make", [lambda a: a[:, ::2], lambda a: a[::-1], lambda a: a.T])
def test_from_numpy_copies_strided_arrays(make):
    src = make(f32(4, 4))
    t = Tensor.from_numpy(src)
    assert t.is_contiguous and not np.shares_memory(t.to_numpy(), src)
    np.testing.assert_array_equal(t.to_numpy(), src)


def test_from_numpy_errors():
    with pytest.raises(TypeError, match="numpy array"):
        Tensor.from_numpy([1, 2])
    with pytest.raises(ValueError, match="complex64"):
        Tensor.from_numpy(np.zeros(2, np.complex64))


# ---------------------------------------------------------------- item / indexing / views
def test_item_types_and_errors():
    assert Tensor.from_numpy(np.array(3, np.int32)).item() == 3 and isinstance(
        Tensor.scalar(3, DType.int32).item(), int
    )
    assert isinstance(Tensor.scalar(1.5, DType.bfloat16).item(), float)
    assert Tensor.scalar(1.5, DType.bfloat16).item() == 1.5
    with pytest.raises(ValueError, match=r"tensor with 6 items but expected only 1 \(shape \(2, 3\)\)"):
        Tensor.from_numpy(f32(2, 3)).item()


def test_slicing_makes_views_sharing_memory():
    a = f32(4, 6)
    t = Tensor.from_numpy(a)
    v = t[1:3, ::2]
    assert v.shape == (2, 3) and not v.is_contiguous
    np.testing.assert_array_equal(v.to_numpy(), a[1:3, ::2])
    v[0, 1] = 100.0
    assert a[1, 2] == 100.0 and t[1, 2].item() == 100.0
    assert t[1:3].is_contiguous and t[2].is_contiguous and t[2].shape == (6,)
    assert t[1, 2].shape == () and t[-1, -1].item() == 23.0
    assert t[..., 1].shape == (4,) and t[None, 0].shape == (1, 6)


def test_negative_steps_are_non_contiguous_views():
    a = f32(5)
    t = Tensor.from_numpy(a)
    r = t[::-1]
    assert not r.is_contiguous and r.shape == (5,)
    np.testing.assert_array_equal(r.to_numpy(), a[::-1])
    r[0] = -7.0
    assert a[4] == -7.0
    assert not t[::-2].is_contiguous
    c = r.contiguous()
    assert c.is_contiguous
    np.testing.assert_array_equal(c.to_numpy(), a[::-1])
    assert not np.shares_memory(c.to_numpy(), a)


def test_view_of_view_and_setitem_in_view():
    a = f32(4, 4)
    t = Tensor.from_numpy(a)
    vv = t[1:][:, 2:][::2]
    np.testing.assert_array_equal(vv.to_numpy(), a[1:][:, 2:][::2])
    vv[1, 0] = 9.0
    assert a[3, 2] == 9.0


def test_indexing_errors():
    t = Tensor.from_numpy(f32(2, 3))
    with pytest.raises(IndexError, match=r"shape \(2, 3\)"):
        t[2]
    with pytest.raises(IndexError):
        t[0, 0, 0]
    with pytest.raises(TypeError, match="basic indexing"):
        t[[0, 1]]
    with pytest.raises(TypeError, match="basic indexing"):
        t[np.array([True, False])]


def test_setitem():
    t = Tensor.zeros((2, 3), DType.int32)
    t[1, 2] = 5
    t[0, :] = 1  # broadcast over a row (a bare t[0] = 1 is an element write missing an index, as in MAX)
    t[:, 0] = Tensor.from_numpy(np.array([7, 8], np.int32))
    np.testing.assert_array_equal(t.to_numpy(), [[7, 1, 1], [8, 0, 5]])
    with pytest.raises(ValueError, match=r"shape \(4,\).*\(3,\)"):
        t[0] = np.arange(4)
    with pytest.raises(IndexError):
        t[5, 0] = 1


def test_len():
    assert len(Tensor.zeros((3, 2), DType.float32)) == 3
    with pytest.raises(TypeError):
        len(Tensor.scalar(1, DType.float32))


def test_view_reinterprets_bytes_sharing_memory():
    a = np.array([[1.0, 2.0], [3.0, -0.0]], np.float32)
    t = Tensor.from_numpy(a)
    u8 = t.view(DType.uint8)
    assert u8.shape == (2, 8) and u8.dtype is DType.uint8
    np.testing.assert_array_equal(u8.to_numpy(), a.view(np.uint8))
    u8[1, 7] = 0x80 ^ 0x80  # clear the sign bit of -0.0 -> 0.0
    assert np.signbit(a[1, 1]) == np.False_
    i32 = t.view(DType.int32, [4])
    np.testing.assert_array_equal(i32.to_numpy(), a.reshape(-1).view(np.int32))
    i32[0] = 0
    assert a[0, 0] == 0.0
    back = u8.view(DType.float32)
    assert back.shape == (2, 2)
    assert t.view(DType.bfloat16).shape == (2, 4)
    flags = Tensor.from_numpy(np.array([0, 1, 1], np.uint8)).view(DType.bool)
    assert flags.to_numpy().tolist() == [False, True, True]
    assert Tensor.scalar(1.0, DType.float32).view(DType.int32).item() == np.float32(1.0).view(np.int32)


def test_view_errors():
    t = Tensor.from_numpy(np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="cannot deduce"):
        t.view(DType.int32)
    with pytest.raises(ValueError, match="needs 8 bytes"):
        t.view(DType.int32, [2])
    with pytest.raises(ValueError, match="rank-0"):
        Tensor.scalar(1, DType.int16).view(DType.int32)
    strided = Tensor.from_numpy(np.zeros((4, 4), np.float32))[:, ::2]
    with pytest.raises(ValueError, match="non-contiguous"):
        strided.view(DType.uint8)


# ---------------------------------------------------------------- copies, transfers, inplace
def test_copy_contiguous_and_to():
    a = f32(2, 3)
    t = Tensor.from_numpy(a)
    c = t.copy()
    c[0, 0] = 50.0
    assert a[0, 0] == 0.0 and c.device is CPU()
    np.testing.assert_array_equal(t.copy(CPU()).to_numpy(), a)
    stream = DeviceStream(CPU())
    cs = t.copy(stream)
    assert cs.stream is stream and not np.shares_memory(cs.to_numpy(), a)
    assert t.to(CPU()) is t
    assert t.to([CPU(), CPU()]) == [t, t]
    ts = t.to(stream)
    assert ts.stream is stream and np.shares_memory(ts.to_numpy(), a)
    assert [x.stream for x in t.to([stream, stream])] == [stream, stream]


def test_inplace_copy_from():
    dst = Tensor.zeros((2, 3), DType.float32)
    dst.inplace_copy_from(Tensor.from_numpy(f32(6)))
    np.testing.assert_array_equal(dst.to_numpy(), f32(2, 3))
    dst.inplace_copy_from(np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(dst.to_numpy(), np.ones((2, 3)))
    with pytest.raises(ValueError, match="dtype mismatch.*float32.*int32"):
        dst.inplace_copy_from(Tensor.zeros((6,), DType.int32))
    with pytest.raises(ValueError, match=r"size mismatch.*\(2, 3\).*\(5,\)"):
        dst.inplace_copy_from(Tensor.zeros((5,), DType.float32))
    with pytest.raises(ValueError, match="source.*not contiguous"):
        dst.inplace_copy_from(Tensor.from_numpy(f32(2, 6))[:, ::2])
    with pytest.raises(ValueError, match="destination.*not contiguous"):
        Tensor.from_numpy(f32(2, 6))[:, ::2].inplace_copy_from(dst)


def test_mmap_round_trip(tmp_path):
    path = tmp_path / "weights.bin"
    data = f32(3, 4)
    data.tofile(path)
    t = Tensor.mmap(path, DType.float32, (3, 4))
    np.testing.assert_array_equal(t.to_numpy(), data)
    t[0, 0] = 99.0  # copy-on-write mode: the file keeps its bytes
    assert t[0, 0].item() == 99.0 and np.fromfile(path, np.float32)[0] == 0.0

    ro = Tensor.mmap(str(path), DType.float32, 4, mode="r", offset=4 * 4)
    np.testing.assert_array_equal(ro.to_numpy(), data[1])
    assert not ro.to_numpy().flags.writeable
    ro[0] = -1.0  # read-only map: the tensor copies itself first
    assert ro[0].item() == -1.0 and np.fromfile(path, np.float32)[4] == 4.0

    rw = Tensor.mmap(path, DType.float32, [3, 4], mode="r+")
    rw[2, 3] = 123.0
    rw.to_numpy().flush()
    assert np.fromfile(path, np.float32)[-1] == 123.0


# ---------------------------------------------------------------- numpy / DLPack interop
def test_to_numpy_and_array_protocol_share_memory():
    a = f32(3)
    t = Tensor.from_numpy(a)
    assert np.shares_memory(t.to_numpy(), a) and np.shares_memory(np.asarray(t), a)
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    assert not np.shares_memory(np.array(t, copy=True), a)


def test_dlpack_round_trips():
    a = f32(2, 3)
    t = Tensor.from_numpy(a)
    assert t.__dlpack_device__() == (1, 0)
    back = np.from_dlpack(t)
    assert np.shares_memory(back, a)
    np.testing.assert_array_equal(np.asarray(jax.dlpack.from_dlpack(t)), a)
    assert np.shares_memory(Tensor.from_dlpack(a).to_numpy(), a)
    independent = Tensor.from_dlpack(a, copy=True)
    independent[0, 0] = 5.0
    assert a[0, 0] == 0.0
    assert Tensor.from_dlpack(t) is t
    assert Tensor.from_dlpack(t, copy=True).to_numpy() is not a
    np.testing.assert_array_equal(Tensor.from_dlpack(jnp.arange(4)).to_numpy(), np.arange(4))
    np.testing.assert_array_equal(np.from_dlpack(t[:, 1:]), a[:, 1:])


def test_dlpack_generic_producer_is_zero_copy():
    class Producer:  # any third-party DLPack object (torch, cupy, ...)
        def __init__(self, arr):
            self.arr = arr

        def __dlpack__(self, **kwargs):
            return self.arr.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    a = f32(4)
    t = Tensor.from_dlpack(Producer(a))
    t[1] = 10.0
    assert a[1] == 10.0
    assert as_array(Producer(a))[1] == 10.0
    with pytest.raises(TypeError, match="__dlpack__"):
        Tensor.from_dlpack([1, 2, 3])


def test_bfloat16_dlpack_goes_through_jax():
    a = np.array([1.5, -2.0, 3.0], ml_dtypes.bfloat16)
    t = Tensor.from_numpy(a)
    j = jax.dlpack.from_dlpack(t)
    assert j.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(j), a)
    u = Tensor.from_dlpack(jnp.array([0.5, 1.0], jnp.bfloat16))
    assert u.dtype is DType.bfloat16 and u.to_numpy().tolist() == [0.5, 1.0]


# ---------------------------------------------------------------- engine interface
def test_from_array_wraps_jax_without_copy_and_copies_on_write():
    x = jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)
    t = Tensor._from_array(x)
    assert t.device is CPU() and t.shape == (2, 3) and t.dtype is DType.float32
    assert t._jax_input() is x
    view = t[1]
    arr = t.to_numpy()
    assert not arr.flags.writeable and arr.ctypes.data == x.unsafe_buffer_pointer()
    t[1, 0] = -5.0  # copy-on-write: the XLA buffer is untouched
    assert float(x[1, 0]) == 3.0 and t[1, 0].item() == -5.0
    assert view[0].item() == -5.0  # views taken before the write see it
    assert isinstance(t._jax_input(), np.ndarray)
    view[2] = 8.0
    assert t.to_numpy()[1, 2] == 8.0


def test_from_array_numpy_and_tensor():
    a = f32(3)
    assert Tensor._from_array(a).to_numpy() is a
    t = Tensor.from_numpy(a)
    assert Tensor._from_array(t) is t
    assert Tensor._from_array(np.float32(2)).item() == 2.0
    with pytest.raises(ValueError, match="_from_array"):
        Tensor._from_array(jnp.zeros(2, jnp.complex64))


def test_lazy_view_chain_then_inplace_copy():
    t = Tensor._from_array(jnp.zeros((2, 2), jnp.float32))
    u8 = t.view(DType.uint8)
    t.inplace_copy_from(Tensor.from_numpy(np.full((2, 2), 1.0, np.float32)))
    np.testing.assert_array_equal(u8.to_numpy(), np.full((2, 2), 1.0, np.float32).view(np.uint8))


def test_assign_keeps_user_aliasing_for_writable_memory():
    a = np.zeros((2, 2), np.float32)
    t = Tensor.from_numpy(a)
    t._assign(jnp.ones((2, 2), jnp.float32))
    np.testing.assert_array_equal(a, np.ones((2, 2)))
    lazy = Tensor._from_array(jnp.zeros(3, jnp.int32))
    new = jnp.arange(3, dtype=jnp.int32)
    lazy._assign(new)
    assert lazy._jax_input() is new  # read-only memory is swapped, not copied
    view = Tensor.from_numpy(np.zeros(4, np.float32))[1:3]
    view._assign(np.array([1.0, 2.0], np.float32))
    assert view.to_numpy().tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"shape \(2, 2\).*float32.*\(3,\)"):
        t._assign(np.zeros(3, np.float32))


def test_as_array():
    a = f32(3)
    assert as_array(Tensor.from_numpy(a)) is a
    x = jnp.ones(2)
    assert as_array(x) is x and as_array(a) is a
    assert as_array(2.5).dtype == np.float64 and as_array(np.int8(3)).dtype == np.int8
    np.testing.assert_array_equal(as_array([[1, 2]]), [[1, 2]])
    with pytest.raises(TypeError, match="as_array"):
        as_array(object())


# ---------------------------------------------------------------- python protocol
def test_repr_pickle_and_copies():
    t = Tensor.from_numpy(f32(2, 3))
    assert repr(t) == "Tensor(dtype=float32, shape=(2, 3), device=CPU())"
    r = pickle.loads(pickle.dumps(t[:, 1:]))
    np.testing.assert_array_equal(r.to_numpy(), f32(2, 3)[:, 1:])
    deep = copy.deepcopy(t)
    deep[0, 0] = 7.0
    assert t[0, 0].item() == 0.0
    shallow = copy.copy(t)
    shallow[0, 0] = 7.0
    assert t[0, 0].item() == 7.0


# ---------------------------------------------------------------- accelerator memory (emulated)
def test_accelerator_tensor_basics(fake_gpu):
    t = Tensor(DType.float32, (2, 3), fake_gpu)
    assert not t.is_host and t.device is fake_gpu and t.stream is fake_gpu.default_stream
    assert isinstance(t._jax_input(), jax.Array)
    np.testing.assert_array_equal(t.to(CPU()).to_numpy(), np.zeros((2, 3)))  # XLA buffers start zeroed
    with pytest.raises(RuntimeError, match=r"\.to\(CPU\(\)\)"):
        t.to_numpy()
    with pytest.raises(RuntimeError, match="to_numpy"):
        np.asarray(t)
    z = Tensor.zeros((2,), DType.int64, fake_gpu)
    assert z._jax_input().dtype == np.int64  # 64-bit kept without global x64
    s = Tensor.scalar(3, DType.int32, fake_gpu)
    assert not s.is_host and s.item() == 3


def test_accelerator_transfers_and_views(fake_gpu):
    a = f32(4, 4)
    g = Tensor.from_numpy(a).to(fake_gpu)
    assert g.device is fake_gpu and g.to(fake_gpu) is g and g.is_contiguous
    back = g.to(CPU())
    np.testing.assert_array_equal(back.to_numpy(), a)
    assert back.to_numpy().flags.writeable
    v = g[1:3, ::-1]
    assert not v.is_contiguous and v.shape == (2, 4)
    np.testing.assert_array_equal(v.to(CPU()).to_numpy(), a[1:3, ::-1])
    v[0, 0] = 100.0  # write through a device view reaches the parent
    assert g[1, 3].item() == 100.0
    g[0, :] = -1.0
    np.testing.assert_array_equal(g.to(CPU()).to_numpy()[0], [-1.0] * 4)
    assert v[1, 1].item() == a[2, 2]
    c = v.contiguous()
    assert c.is_contiguous and not c.is_host
    np.testing.assert_array_equal(c.to(CPU()).to_numpy(), np.asarray(v.copy(CPU())))


def test_accelerator_dtype_views(fake_gpu):
    a = np.array([[1.0, -2.0], [0.5, 4.0]], np.float32)
    g = Tensor.from_numpy(a).copy(fake_gpu)
    u8 = g.view(DType.uint8)
    np.testing.assert_array_equal(u8.to(CPU()).to_numpy(), a.view(np.uint8))
    i32 = g.view(DType.int32, [4])
    np.testing.assert_array_equal(i32.to(CPU()).to_numpy(), a.reshape(-1).view(np.int32))
    i32[3] = int(np.float32(8.0).view(np.int32))  # write through a bitcast view
    assert g[1, 1].item() == 8.0
    a[1, 1] = 8.0
    bf = g.view(DType.bfloat16)
    np.testing.assert_array_equal(bf.to(CPU()).to_numpy(), a.view(ml_dtypes.bfloat16))
    with pytest.raises(ValueError, match="float4"):
        Tensor.zeros((2,), DType.uint8, fake_gpu).view(DType.float4_e2m1fn)


def test_accelerator_inplace_assign_and_dlpack(fake_gpu):
    g = Tensor.zeros((2, 2), DType.float32, fake_gpu)
    g.inplace_copy_from(Tensor.from_numpy(f32(4)))
    np.testing.assert_array_equal(g.to(CPU()).to_numpy(), f32(2, 2))
    g._assign(jnp.ones((2, 2), jnp.float32))
    np.testing.assert_array_equal(g.to(CPU()).to_numpy(), np.ones((2, 2)))
    row = g[1]
    row._assign(np.array([5.0, 6.0], np.float32))
    np.testing.assert_array_equal(g.to(CPU()).to_numpy(), [[1, 1], [5, 6]])
    host = Tensor.zeros((2, 2), DType.float32)
    host.inplace_copy_from(g)
    np.testing.assert_array_equal(host.to_numpy(), [[1, 1], [5, 6]])
    assert g.__dlpack_device__() == (1, 0)  # the emulated GPU is a CPU JAX device
    np.testing.assert_array_equal(np.from_dlpack(g), [[1, 1], [5, 6]])
    assert repr(g) == "Tensor(dtype=float32, shape=(2, 2), device=Accelerator(id=7))"


def test_pinned_host_memory_for_accelerator(fake_gpu):
    p = Tensor(DType.float32, (3,), fake_gpu, pinned=True)
    assert p.pinned and not p.is_host
    p.to_numpy()[:] = [1.0, 2.0, 3.0]  # pinned memory is host-readable and writable
    up = p.to(fake_gpu)
    assert up is not p and not up.pinned and isinstance(up._jax_input(), jax.Array)
    np.testing.assert_array_equal(up.to(CPU()).to_numpy(), [1.0, 2.0, 3.0])
    zp = Tensor.zeros((2,), DType.int32, fake_gpu, pinned=True)
    assert zp.pinned and zp.to_numpy().tolist() == [0, 0]


def test_setitem_of_a_float_past_the_dtype_range_stores_inf_without_a_warning():
    """bfloat16 tops out near 3.4e38: writing 1e308 stores +inf (IEEE rounding, as torch's
    conversion does), silently; pytest turns a warning from maxfx's frames into an error."""
    b = driver.Buffer(DType.bfloat16, (2,))
    b[0] = 1e308
    b[1] = -1e308
    got = b.to_numpy().astype(np.float32)
    assert np.isposinf(got[0]) and np.isneginf(got[1])


def test_calculate_virtual_device_count_follows_the_published_page():
    """``max.driver.calculate_virtual_device_count(*device_spec_lists)``: max GPU id + 1 over all lists, or 1."""
    spec = driver.DeviceSpec
    assert (
        driver.calculate_virtual_device_count(
            [spec.accelerator(0), spec.accelerator(3)], [spec.accelerator(5), spec.cpu()]
        )
        == 6
    )
    assert driver.calculate_virtual_device_count([spec.cpu()]) == 1
    assert driver.calculate_virtual_device_count() == 1
    assert driver.calculate_virtual_device_count([spec.accelerator(0)]) == 1
    with pytest.raises(TypeError, match="expected lists of DeviceSpec, got str"):
        driver.calculate_virtual_device_count(["gpu:0"])


def test_enable_all_peer_access_returns_none_and_keeps_devices_usable():
    assert driver.enable_all_peer_access() is None
    assert driver.CPU().label == "cpu"
