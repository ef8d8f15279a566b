"""MAX conformance: driver devices, events, pinned buffers and Buffer edge cases; nn layers.

Behaviour MAX's own unit tests (max/tests/tests/driver, nn, kv_cache) check,
asserted here against numpy or MAX's documented semantics. Accelerator-only
paths run on an Accelerator wrapping a JAX CPU device (`fake_gpu`).
"""

from __future__ import annotations

import re
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxfx import driver
from maxfx.driver import CPU, Accelerator, Buffer, DeviceEvent, DevicePinnedBuffer, calculate_virtual_device_count_from_cli
from maxfx.dtype import DType


@pytest.fixture
def fake_gpu():
    return Accelerator._from_jax_device(jax.devices("cpu")[0], 5)


# ---------------------------------------------------------------- devices
def test_device_str_names_the_type_and_repr_stays():
    assert str(CPU()) == "Device(type=cpu,id=0)"
    assert repr(CPU()) == "CPU()"


def test_cpu_stats_report_memory_in_bytes():
    stats = CPU().stats
    with open("/proc/meminfo") as f:
        total_kb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    # sysconf's physical pages and /proc/meminfo's MemTotal agree to within 1%.
    assert abs(stats["total_memory"] - total_kb * 1024) <= 0.01 * total_kb * 1024
    assert 0 < stats["free_memory"] <= stats["total_memory"]
    assert CPU().max_single_alloc_size == stats["total_memory"]


def test_cpu_architecture_name_error_says_what_failed():
    with pytest.raises(ValueError, match="failed to get device architecture name"):
        _ = CPU().architecture_name


def test_driver_version_and_driver_module():
    assert driver.__version__
    assert driver.driver.calculate_virtual_device_count_from_cli is calculate_virtual_device_count_from_cli


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("gpu:0,3", 4), ("gpu:2", 3), ("gpu", 1), ("cpu", 1), ("default", 1), ("", 1)],
)
def test_virtual_device_count(spec, expected):
    assert calculate_virtual_device_count_from_cli(spec) == expected


def test_virtual_device_count_gpu_all_counts_visible_gpus(monkeypatch):
    monkeypatch.setattr(driver.driver, "accelerator_count", lambda: 4)
    assert calculate_virtual_device_count_from_cli("gpu:all") == 4
    monkeypatch.setattr(driver.driver, "accelerator_count", lambda: 0)
    assert calculate_virtual_device_count_from_cli("gpu:all") == 1


@pytest.mark.parametrize("bad", ["gpu:x", "tpu", "gpu:-1"])
def test_virtual_device_count_rejects_bad_values(bad):
    with pytest.raises(ValueError, match="calculate_virtual_device_count_from_cli"):
        calculate_virtual_device_count_from_cli(bad)


# ---------------------------------------------------------------- host functions
def test_host_func_on_cpu_raises():
    with pytest.raises(RuntimeError, match="CUDA/HIP accelerator"):
        getattr(CPU(), "__unsafe_enqueue_py_host_func")(lambda: None)


def test_host_funcs_run_in_order_after_preceding_work(fake_gpu):
    calls: list[tuple[int, bool]] = []
    x = jax.device_put(jnp.ones((256, 256)), fake_gpu.jax_device)
    y = x @ x  # pending work on the device when the callbacks are enqueued
    enqueue = getattr(fake_gpu, "__unsafe_enqueue_py_host_func")
    for i in range(4):
        enqueue(lambda i=i: calls.append((i, y.is_ready())))
    fake_gpu.synchronize()
    assert calls == [(0, True), (1, True), (2, True), (3, True)]
    np.testing.assert_allclose(np.asarray(y)[0, 0], 256.0)


def test_host_func_exception_is_printed_not_raised(fake_gpu, capsys):
    def cb():
        raise RuntimeError("boom")

    getattr(fake_gpu, "__unsafe_enqueue_py_host_func")(cb)
    fake_gpu.synchronize()  # does not raise
    assert "RuntimeError: boom" in capsys.readouterr().err


def test_host_func_returns_before_the_callback_runs(fake_gpu):
    started, release = threading.Event(), threading.Event()

    def blocker():
        started.set()
        release.wait(5)

    enqueue = getattr(fake_gpu, "__unsafe_enqueue_py_host_func")
    enqueue(blocker)
    ran = []
    enqueue(lambda: ran.append(1))
    assert started.wait(5)
    assert ran == []  # the second callback waits for the first (FIFO), the host did not
    release.set()
    fake_gpu.synchronize()
    assert ran == [1]


# ---------------------------------------------------------------- events
@pytest.mark.parametrize("on_gpu", [False, True])
def test_event_str_and_readiness(on_gpu, fake_gpu):
    device = fake_gpu if on_gpu else CPU()
    e1, e2 = DeviceEvent(device), DeviceEvent(device)
    assert re.fullmatch(rf"{device.api}\[{device.id}\]:event@0x[0-9a-f]+", str(e1))
    assert repr(e1) == str(e1) and str(e1) != str(e2)
    assert e1.is_ready()  # never recorded
    device.default_stream.record_event(e1)
    e1.synchronize()
    assert e1.is_ready()
    assert isinstance(device.default_stream.record_event(), DeviceEvent)


def test_event_waits_for_recorded_work(fake_gpu):
    x = jax.device_put(jnp.ones((512, 512)), fake_gpu.jax_device)
    y = x @ x @ x
    event = fake_gpu.default_stream.record_event()
    event.synchronize()
    assert y.is_ready()


def test_event_elapsed_time(fake_gpu):
    stream = fake_gpu.default_stream
    start, end = DeviceEvent(fake_gpu, enable_timing=True), DeviceEvent(fake_gpu, enable_timing=True)
    stream.record_event(start)
    time.sleep(0.05)
    stream.record_event(end)
    end.synchronize()
    ms = start.elapsed_time(end)
    assert isinstance(ms, float)
    assert 40.0 <= ms < 5000.0


def test_event_elapsed_time_needs_timing(fake_gpu):
    start, end = DeviceEvent(fake_gpu), DeviceEvent(fake_gpu)
    fake_gpu.default_stream.record_event(start)
    fake_gpu.default_stream.record_event(end)
    with pytest.raises(RuntimeError, match="enable_timing"):
        start.elapsed_time(end)
    unrecorded = DeviceEvent(fake_gpu, enable_timing=True)
    with pytest.raises(RuntimeError, match="not been recorded"):
        unrecorded.elapsed_time(unrecorded)


def test_record_event_of_another_device_raises(fake_gpu):
    with pytest.raises(ValueError, match="belongs to"):
        CPU().default_stream.record_event(DeviceEvent(fake_gpu))


# ---------------------------------------------------------------- pinned buffers
def test_pinned_buffer_requires_an_accelerator():
    with pytest.raises(ValueError, match="DevicePinnedBuffer requires a non-host device"):
        DevicePinnedBuffer(dtype=DType.float32, shape=[10], device=CPU())
    with pytest.raises(ValueError, match="DevicePinnedBuffer requires a non-host device"):
        DevicePinnedBuffer.zeros(shape=[4, 2], dtype=DType.float64, device=CPU())


def test_pinned_buffer_round_trip(fake_gpu):
    buf = DevicePinnedBuffer(dtype=DType.float32, shape=[100], device=fake_gpu)
    assert isinstance(buf, Buffer) and buf.pinned and not buf.device.is_host
    buf.to_numpy()[:] = np.arange(100, dtype=np.float32)
    on_gpu = buf.to(fake_gpu)
    assert on_gpu is not buf and not on_gpu._is_host_memory
    back = DevicePinnedBuffer(dtype=DType.float32, shape=[100], device=fake_gpu)
    back.inplace_copy_from(on_gpu)
    np.testing.assert_array_equal(back.to_numpy(), np.arange(100, dtype=np.float32))
    zeros = DevicePinnedBuffer.zeros(shape=[5, 3], dtype=DType.int32, device=fake_gpu)
    assert isinstance(zeros, DevicePinnedBuffer) and zeros.pinned
    np.testing.assert_array_equal(zeros.to_numpy(), np.zeros((5, 3), np.int32))


# ---------------------------------------------------------------- Buffer edge cases
def test_setitem_element_needs_one_index_per_axis():
    t = Buffer(DType.int32, (3, 4, 5))
    with pytest.raises(ValueError, match="needs 3 indices"):
        t[2, 2] = 2
    with pytest.raises(ValueError, match="needs 3 indices"):
        t[2, 2, 2, 2] = 2
    with pytest.raises(IndexError):
        t[5, 2, 2] = 23
    t[1, 2, 3] = 9
    assert t.to_numpy()[1, 2, 3] == 9
    s = Buffer.scalar(5, DType.int32)
    s[0] = 8  # MAX lets [0] address a scalar
    assert s.item() == 8


def test_setitem_row_with_array_still_works():
    t = Buffer.from_numpy(np.zeros((2, 3), np.float32))
    t[1] = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_array_equal(t.to_numpy(), [[0, 0, 0], [1, 2, 3]])


@pytest.mark.parametrize("shape", [(), (1,), (1, 1), (1, 1, 1)])
def test_item_of_single_element_tensors(shape):
    t = Buffer.from_numpy(np.full(shape, 3.25, np.float32))
    assert t.item() == 3.25


def test_item_of_many_elements_raises():
    with pytest.raises(ValueError, match="calling `item` on a tensor with 2 items but expected only 1"):
        Buffer(DType.int32, (2,)).item()


def test_from_dlpack_rejects_non_contiguous_numpy():
    arr = np.arange(4).reshape(2, 2).T
    with pytest.raises(ValueError, match=r"from_dlpack only accepts contiguous arrays. First call np.ascontiguousarray"):
        Buffer.from_dlpack(arr)
    # from_numpy keeps copying strided arrays
    np.testing.assert_array_equal(Buffer.from_numpy(arr).to_numpy(), arr)


def test_from_dlpack_rejects_non_contiguous_dlpack_objects():
    class Strided:
        """A DLPack producer (numpy underneath) that is not a numpy array."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    with pytest.raises(ValueError, match="from_dlpack only accepts contiguous tensors"):
        Buffer.from_dlpack(Strided(np.arange(12, dtype=np.float32).reshape(3, 4).T))
    ok = Buffer.from_dlpack(Strided(np.arange(12, dtype=np.float32).reshape(3, 4)))
    np.testing.assert_array_equal(ok.to_numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))


@pytest.mark.parametrize("on_gpu", [False, True])
def test_aligned(on_gpu, fake_gpu):
    t = Buffer.zeros((8,), DType.int32, fake_gpu if on_gpu else CPU())
    assert t._aligned() and t._aligned(DType.int32.align)
    u8 = t.view(DType.uint8)
    assert u8[1]._aligned()  # uint8 alignment is 1
    assert not u8[1]._aligned(DType.int32.align)
    assert u8[4]._aligned(DType.int32.align)
    assert not u8[1:5].view(DType.int32)._aligned()


def test_unaligned_view_reads_and_copies_correctly():
    expected = np.array([1005, 2510, 1325], np.int32)
    t8 = Buffer.from_numpy(np.array([15, *expected.view(np.uint8).tolist()], np.uint8))
    t32 = t8[1:].view(DType.int32)
    assert not t32._aligned()
    assert t32[0].item() == 1005
    c = t32.copy()
    assert c._aligned()
    np.testing.assert_array_equal(c.to_numpy(), expected)


def test_inplace_copy_from_itself_is_a_noop_even_when_strided():
    base = Buffer.from_numpy(np.arange(90, dtype=np.int32).reshape(3, 10, 3))
    view = base[:, 0, :]
    assert not view.is_contiguous
    view.inplace_copy_from(view)
    np.testing.assert_array_equal(base.to_numpy(), np.arange(90, dtype=np.int32).reshape(3, 10, 3))
    with pytest.raises(ValueError, match="not contiguous"):
        Buffer(DType.int32, (3, 3)).inplace_copy_from(view)
