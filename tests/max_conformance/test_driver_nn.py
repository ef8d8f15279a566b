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
from maxfx.driver import (
    CPU,
    Accelerator,
    Buffer,
    DeviceEvent,
    DevicePinnedBuffer,
    calculate_virtual_device_count_from_cli,
)
from maxfx.dtype import DType


@pytest.fixture
def fake_gpu():
    return Accelerator._from_jax_device(jax.devices("cpu")[0], 5)


# ---------------------------------------------------------------- devices
def test_device_str_is_the_documented_repr():
    # Seed 001 documents print(model.device) -> CPU(); MAX 26.x's test wants "cpu" in str(CPU()): the docs win.
    assert str(CPU()) == repr(CPU()) == "CPU()"


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
    with pytest.raises(
        ValueError, match=r"from_dlpack only accepts contiguous arrays. First call np.ascontiguousarray"
    ):
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


# ---------------------------------------------------------------- nn: activations, layer package, kv params, heads
def test_activation_function_from_name():
    from functools import partial

    from maxfx.graph import ops
    from maxfx.nn.activation import activation_function_from_name

    for name in ("silu", "gelu", "relu", "tanh", "sigmoid"):
        assert activation_function_from_name(name) is getattr(ops, name)
    gelu_tanh = activation_function_from_name("gelu_tanh")
    assert (
        isinstance(gelu_tanh, partial) and gelu_tanh.func is ops.gelu and gelu_tanh.keywords == {"approximate": "tanh"}
    )
    with pytest.raises(ValueError, match="Unrecognized activation function name"):
        activation_function_from_name("swish7")


def test_gelu_tanh_activation_matches_the_tanh_formula():
    from maxfx.experimental.tensor import Tensor
    from maxfx.nn.activation import activation_function_from_name

    x = np.linspace(-3, 3, 7, dtype=np.float32)
    got = np.asarray(activation_function_from_name("gelu_tanh")(Tensor(x)))
    expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_nn_layer_is_a_package_with_layer_module():
    from maxfx import nn
    from maxfx.nn.layer.layer import LayerList, Module

    assert Module is nn.Module and LayerList is nn.LayerList


@pytest.mark.parametrize(
    ("heads", "devices", "expected"),
    [(8, 4, [2, 2, 2, 2]), (7, 4, [2, 2, 2, 1]), (2, 4, [1, 1, 0, 0]), (16, 1, [16]), (30, 4, [8, 8, 7, 7])],
)
def test_num_heads_for_device(heads, devices, expected):
    from maxfx.nn.attention import num_heads_for_device

    got = [num_heads_for_device(num_heads=heads, device_idx=i, num_devices=devices) for i in range(devices)]
    assert got == expected and sum(got) == heads
    with pytest.raises(ValueError, match="device_idx"):
        num_heads_for_device(num_heads=heads, device_idx=devices, num_devices=devices)


def test_mha_and_mla_kv_cache_params():
    from maxfx.graph import DeviceRef
    from maxfx.nn.kv_cache import KVCacheParams, MHAKVCacheParams, MLAKVCacheParams

    gpus = [DeviceRef.GPU(0), DeviceRef.GPU(1)]
    p = MHAKVCacheParams(DType.bfloat16, head_dim=64, num_layers=3, devices=gpus, n_kv_heads=8)
    assert isinstance(p, KVCacheParams)
    assert (p.n_devices, p.num_layers, p.page_size, p.n_kv_heads, p.n_kv_heads_per_device, p.kv_dim) == (
        2,
        3,
        128,
        8,
        4,
        2,
    )
    assert p.blocks_shape(total_num_pages=10) == [10, 2, 3, 128, 4, 64]
    with pytest.raises(ValueError, match="do not split evenly"):
        MHAKVCacheParams(DType.float32, head_dim=8, num_layers=1, devices=gpus, n_kv_heads=3)
    with pytest.raises(ValueError, match="at least one device"):
        MHAKVCacheParams(DType.float32, head_dim=8, num_layers=1, devices=[], n_kv_heads=2)
    m = MLAKVCacheParams(DType.float32, head_dim=576, num_layers=2, devices=gpus, num_q_heads=16, page_size=64)
    assert (m.is_mla, m.kv_dim, m.n_kv_heads_per_device, m.num_q_heads, m.page_size) == (True, 1, 1, 16, 64)


@pytest.mark.parametrize("n", [2, 4])
def test_attention_tp_shard_splits_heads_with_mha_params(n):
    from maxfx.graph import DeviceRef, ShardingStrategy
    from maxfx.nn.attention.attention_with_rope import AttentionWithRope
    from maxfx.nn.kv_cache import MHAKVCacheParams
    from maxfx.nn.rotary_embedding import RotaryEmbedding

    rope = RotaryEmbedding(dim=256, n_heads=8, theta=10000.0, max_seq_len=64, head_dim=32)
    kv = MHAKVCacheParams(DType.float32, head_dim=32, num_layers=1, devices=[DeviceRef.GPU(0)], n_kv_heads=4)
    attn = AttentionWithRope(
        rope=rope, num_attention_heads=8, num_key_value_heads=4, hidden_size=256, kv_params=kv, dtype=DType.float32
    )
    attn.sharding_strategy = ShardingStrategy.tensor_parallel(n)
    devices = [DeviceRef.GPU(i) for i in range(n)]
    shards = attn.shard(devices)
    assert [(s.n_heads, s.num_key_value_heads) for s in shards] == [(8 // n, 4 // n)] * n
    assert shards[0].kv_params.n_devices == n and shards[0].kv_params.n_kv_heads_per_device == 4 // n


# ---------------------------------------------------------------- nn.Module state dicts
def _one_weight_module(shape):
    from maxfx import nn
    from maxfx.graph import DeviceRef, Weight

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = Weight("weight", DType.float32, shape, DeviceRef.CPU())

        def __call__(self):
            return self.weight

    return M()


def test_state_dict_auto_initializes_zero_buffers():
    sd = _one_weight_module([3, 2]).state_dict()
    assert isinstance(sd["weight"], Buffer)
    np.testing.assert_array_equal(sd["weight"].to_numpy(), np.zeros((3, 2), np.float32))


def test_load_state_dict_symbolic_dims_accept_any_size():
    from maxfx.graph import SymbolicDim

    m = _one_weight_module([1024, SymbolicDim("batch"), 4])
    value = np.arange(1024 * 5 * 4, dtype=np.float32).reshape(1024, 5, 4)
    m.load_state_dict({"weight": value})
    np.testing.assert_array_equal(np.asarray(m.state_dict()["weight"]), value)
    with pytest.raises(ValueError, match="dimension 0 mismatch: expected 1024, got 512"):
        m.load_state_dict({"weight": np.zeros((512, 5, 4), np.float32)})
    with pytest.raises(ValueError, match="shape rank mismatch"):
        m.load_state_dict({"weight": np.zeros((1024, 5), np.float32)})
    with pytest.raises(ValueError, match="dtype mismatch: expected float32, got float64"):
        m.load_state_dict({"weight": np.zeros((1024, 5, 4), np.float64)})
    with pytest.raises(ValueError, match="symbolic shape"):
        _one_weight_module([SymbolicDim("n")]).state_dict()


def test_load_state_dict_unaligned_and_key_errors():
    m = _one_weight_module([10])
    raw = np.array([15, *np.arange(10, dtype=np.float32).view(np.uint8).tolist()], np.uint8)
    unaligned = raw[1:].view(np.float32)
    assert not unaligned.flags.aligned
    with pytest.raises(ValueError, match="Found unaligned weight"):
        m.load_state_dict({"weight": unaligned})
    m.load_state_dict({"weight": unaligned}, weight_alignment=1)
    np.testing.assert_array_equal(np.asarray(m.state_dict()["weight"]), np.arange(10, dtype=np.float32))
    with pytest.raises(ValueError, match="Missing required weights"):
        m.load_state_dict({})
    with pytest.raises(ValueError, match="Unexpected keys in state_dict"):
        m.load_state_dict({"weight": np.zeros(10, np.float32), "extra": np.zeros(1, np.float32)})


# ---------------------------------------------------------------- parallel layers' validation
def test_column_parallel_linear_validation_messages():
    from maxfx.graph import DeviceRef, Weight
    from maxfx.nn.linear import ColumnParallelLinear

    with pytest.raises(ValueError, match="ColumnParallelLinear requires a non-empty devices argument"):
        ColumnParallelLinear(in_dim=16, out_dim=32, dtype=DType.float32, devices=[])
    tied = Weight("tied_weight", DType.float32, (32, 16), DeviceRef.CPU())
    for extra in ({"has_bias": True}, {"quant_config": {}}):
        with pytest.raises(ValueError, match="float8 and bias are both unsupported by ColumnParallelLinear currently"):
            ColumnParallelLinear(
                in_dim=16, out_dim=32, dtype=DType.float32, devices=[DeviceRef.CPU()], tied_weight=tied, **extra
            )
    lin = ColumnParallelLinear(
        in_dim=16, out_dim=32, dtype=DType.float32, devices=[DeviceRef.CPU(0), DeviceRef.CPU(1)], tied_weight=tied
    )
    assert lin.weight is tied


def test_conv2d_sharding_messages():
    from maxfx.graph import DeviceRef, ShardingStrategy
    from maxfx.nn.conv import Conv2d

    conv = Conv2d(in_channels=3, out_channels=4, kernel_size=3, dtype=DType.float32, device=DeviceRef.CPU())
    with pytest.raises(ValueError, match="no sharding strategy"):
        conv.shard([DeviceRef.CPU()])
    with pytest.raises(ValueError, match="only replicate is supported"):
        conv.sharding_strategy = ShardingStrategy.rowwise(num_devices=2)


# ---------------------------------------------------------------- forward_sequential_layers
@pytest.mark.parametrize("groups", [None, [], [[0, 1, 2]], [[1, 2]]])
def test_forward_sequential_layers_runs_each_layer_with_its_weights(groups):
    from maxfx import nn
    from maxfx.engine import InferenceSession
    from maxfx.graph import DeviceRef, Graph, TensorType, Weight, ops
    from maxfx.nn.transformer import forward_sequential_layers

    class ScaleShift(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = Weight("scale", DType.float32, [4], DeviceRef.CPU())

        def __call__(self, idx, xs):
            return [x * self.scale + ops.cast(idx, DType.float32) for x in xs]

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = [ScaleShift() for _ in range(3)]

    model = Stack()
    scales = {f"layers.{i}.scale": np.full(4, i + 2.0, np.float32) for i in range(3)}
    model.load_state_dict(scales)
    seen = []
    with Graph("g", input_types=[TensorType(DType.float32, [4], DeviceRef.CPU())]) as g:
        out = forward_sequential_layers(
            list(model.layers),
            inputs_for_layer=lambda i, h: [ops.constant(i, DType.uint32, device=DeviceRef.CPU()), h],
            weight_prefix_for_layer=lambda i: f"layers.{i}.",
            subgraph_layer_groups=groups,
            initial_hidden_states=[g.inputs[0].tensor],
            on_layer_output=lambda i, h: seen.append((i, len(h))),
        )
        g.output(*out)
    assert seen == [(0, 1), (1, 1), (2, 1)]
    x = np.arange(4, dtype=np.float32)
    result = InferenceSession().load(g, weights_registry=model.state_dict()).execute(x)[0].to_numpy()
    expected = x
    for i in range(3):
        expected = expected * (i + 2.0) + i
    np.testing.assert_allclose(result, expected)


def test_forward_sequential_layers_rejects_bad_groups():
    from maxfx.nn.transformer import forward_sequential_layers

    with pytest.raises(ValueError, match="names layer 3"):
        forward_sequential_layers(
            [object()] * 2,
            inputs_for_layer=lambda i, h: [h],
            weight_prefix_for_layer=str,
            subgraph_layer_groups=[[3]],
            initial_hidden_states=[],
        )
    with pytest.raises(ValueError, match="appears in subgraph groups 0 and 1"):
        forward_sequential_layers(
            [object()] * 2,
            inputs_for_layer=lambda i, h: [h],
            weight_prefix_for_layer=str,
            subgraph_layer_groups=[[0], [0, 1]],
            initial_hidden_states=[],
        )


# ---------------------------------------------------------------- tensor-parallel attention
def _tp_attention(stacked):
    from maxfx.graph import DeviceRef
    from maxfx.nn.attention import TensorParallelAttentionWithRope
    from maxfx.nn.kv_cache import MHAKVCacheParams
    from maxfx.nn.rotary_embedding import RotaryEmbedding

    cpu = DeviceRef.CPU()
    rope = RotaryEmbedding(dim=8, n_heads=4, theta=10000.0, max_seq_len=16, head_dim=2)
    kv = MHAKVCacheParams(DType.float32, head_dim=2, num_layers=1, devices=[cpu], n_kv_heads=2, page_size=4)
    return TensorParallelAttentionWithRope(
        rope=rope,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=8,
        kv_params=kv,
        devices=[cpu, cpu],
        stacked_qkv=stacked,
    )


def test_tp_attention_call_validates_per_device_inputs():
    from maxfx.graph import DeviceRef, Graph, ops

    attn = _tp_attention(stacked=False)
    with Graph("g", input_types=[]):
        x = ops.constant(0.0, DType.float32, device=DeviceRef.CPU())
        f = attn.rope.freqs_cis
        with pytest.raises(ValueError, match="Expected 2 input_row_offsets, got 1"):
            attn(0, [x, x], None, [None, None], freqs_cis=[f, f], input_row_offsets=[x])
        with pytest.raises(TypeError, match="All elements in input_row_offsets must be TensorValue instances"):
            attn(0, [x, x], None, [None, None], freqs_cis=[f, f], input_row_offsets=[x, "not-a-tensor-value"])


def test_common_layers_activation_names_and_values():
    from functools import partial

    from maxfx.experimental import functional as F
    from maxfx.experimental.nn.common_layers.activation import activation_function_from_name
    from maxfx.experimental.tensor import Tensor

    assert activation_function_from_name("swish") is F.silu and activation_function_from_name("sigmoid") is F.sigmoid
    for name, mode in (("gelu_tanh", "tanh"), ("gelu_quick", "quick"), ("quick_gelu", "quick")):
        fn = activation_function_from_name(name)
        assert isinstance(fn, partial) and fn.func is F.gelu and fn.keywords == {"approximate": mode}
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    got = np.asarray(activation_function_from_name("quick_gelu")(Tensor(x)))
    np.testing.assert_allclose(got, x / (1 + np.exp(-1.702 * x)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="Unrecognized activation function name"):
        activation_function_from_name("nonexistent")


def test_quant_config_is_a_float8_config_with_max_265_names():
    from maxfx import nn
    from maxfx.nn.float8_config import Float8Config, Float8InputScaleSpec
    from maxfx.nn.quant_config import (
        InputScaleSpec,
        QuantConfig,
        QuantFormat,
        ScaleGranularity,
        ScaleOrigin,
        WeightScaleSpec,
    )

    assert InputScaleSpec is Float8InputScaleSpec and nn.QuantConfig is QuantConfig
    cfg = QuantConfig(
        format=QuantFormat.BLOCKSCALED_FP8,
        weight_scale=WeightScaleSpec(dtype=DType.float32, granularity=ScaleGranularity.BLOCK, block_size=(128, 128)),
        input_scale=InputScaleSpec(
            dtype=DType.float32, granularity=ScaleGranularity.BLOCK, block_size=(1, 128), origin=ScaleOrigin.DYNAMIC
        ),
        mlp_quantized_layers={1},
        attn_quantized_layers=set(),
    )
    assert isinstance(cfg, Float8Config) and cfg.is_dynamic and cfg.weight_scale.block_size == (128, 128)
    assert cfg.mlp_quantized_layers == {1} and cfg.mlp_in_float8 == {1} and cfg.quant_method == "blockscaled-fp8"
    with pytest.raises(ValueError):
        QuantConfig(cfg.input_scale, cfg.weight_scale, format="int3")
