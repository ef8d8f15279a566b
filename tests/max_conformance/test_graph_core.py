"""maxfx's own tests of graph-core behaviour that MAX's unit tests document
(Graph, Weight and sharding, values, control flow, debug, quantized ops)."""

from __future__ import annotations

import numpy as np
import pytest

from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Dim, Graph, TensorType, TensorValueLike, Weight, ops
from maxfx.graph.type import Shape
from maxfx.graph.value import TensorValue, _is_strong_tensor_value_like
from maxfx.graph.weight import (
    Segment,
    ShardingStrategy,
    col_sharding_strategy,
    head_aware_col_sharding_strategy,
    row_sharding_strategy,
    segmented_sharding_strategy,
    stacked_qkv_sharding_strategy,
)
from tests.graph_run import execute

CPU = DeviceRef.CPU()


# ─── Graph.add_weight / Weight ────────────────────────────────────────────


def test_add_weight_same_object_twice_and_other_weight_of_same_name():
    with Graph("g") as graph:
        w = Weight("w", DType.float32, [2], CPU)
        a, b = graph.add_weight(w), graph.add_weight(w)
        assert a.type == b.type == TensorType(DType.float32, [2], CPU)
        twin = Weight("w", DType.float32, [2], CPU)  # equal type, different object
        with pytest.raises(ValueError, match="already exists"):
            graph.add_weight(twin)
        graph.output(a + b)
    [got] = execute(graph, weights={"w": np.array([1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(got, [2.0, 4.0])


def test_weight_outside_a_graph_is_a_value_error():
    w = Weight("w", DType.float32, [], CPU)
    with pytest.raises(ValueError, match="no parent graph"):
        _ = w * 5
    with pytest.raises(ValueError, match="no parent graph"):
        ops.cast(w, DType.float64)


# ─── sharding strategies ──────────────────────────────────────────────────


def _sharded_outputs(shape, strategy_fn, n, dtype=DType.float32):
    with Graph("shards") as graph:
        w = Weight("w", dtype, shape, CPU)
        graph.output(*[strategy_fn(w, i, n) for i in range(n)])
    data = np.arange(int(np.prod(shape))).reshape(shape).astype(dtype.to_numpy())
    return data, execute(graph, weights={"w": data})


@pytest.mark.parametrize(("rows", "n"), [(10, 3), (12, 4), (7, 4)])
def test_row_sharding_matches_numpy_array_split(rows, n):
    data, shards = _sharded_outputs([rows, 3], row_sharding_strategy, n)
    for got, want in zip(shards, np.array_split(data, n, axis=0), strict=True):
        np.testing.assert_array_equal(got, want)


def test_col_sharding_matches_numpy_array_split():
    data, shards = _sharded_outputs([2, 11], col_sharding_strategy, 4)
    for got, want in zip(shards, np.array_split(data, 4, axis=1), strict=True):
        np.testing.assert_array_equal(got, want)


def test_stacked_qkv_sharding_splits_q_k_v_by_heads():
    num_heads, head_dim, n = 5, 2, 2  # 3 + 2 heads
    hidden = num_heads * head_dim
    data, shards = _sharded_outputs(
        [3 * hidden, 4], lambda w, i, k: stacked_qkv_sharding_strategy(w, i, k, num_heads, head_dim), n
    )
    q, k, v = np.split(data, 3, axis=0)
    bounds = [(0, 3 * head_dim), (3 * head_dim, hidden)]
    for got, (lo, hi) in zip(shards, bounds, strict=True):
        np.testing.assert_array_equal(got, np.concatenate([q[lo:hi], k[lo:hi], v[lo:hi]]))


def test_head_aware_columnwise_keeps_whole_heads():
    data, shards = _sharded_outputs([2, 6], lambda w, i, k: head_aware_col_sharding_strategy(w, i, k, 3, 2), 2)
    np.testing.assert_array_equal(shards[0], data[:, :4])  # 2 heads
    np.testing.assert_array_equal(shards[1], data[:, 4:])  # 1 head


def test_segmented_sharding_mixes_head_aware_and_even_segments():
    segments = (Segment.head_aware(2, 3), Segment.even(4))  # 6 + 4 elements along axis 1
    data, shards = _sharded_outputs(
        [2, 10], lambda w, i, k: segmented_sharding_strategy(w, i, k, axis=1, segments=segments), 2
    )
    np.testing.assert_array_equal(shards[0], np.concatenate([data[:, 0:3], data[:, 6:8]], axis=1))
    np.testing.assert_array_equal(shards[1], np.concatenate([data[:, 3:6], data[:, 8:10]], axis=1))


def test_segmented_sharding_packed_uint8_halves_the_parts():
    # a packed FP4 weight stores two values per uint8: 8 logical columns in 4 bytes
    data, shards = _sharded_outputs(
        [1, 4],
        lambda w, i, k: segmented_sharding_strategy(w, i, k, axis=1, segments=(Segment.even(8),)),
        2,
        DType.uint8,
    )
    np.testing.assert_array_equal(shards[0], data[:, :2])
    np.testing.assert_array_equal(shards[1], data[:, 2:])


def test_segmented_sharding_segments_must_cover_the_axis():
    with Graph("g"):
        w = Weight("w", DType.float32, [1000, 4], CPU)
        with pytest.raises(ValueError, match="segments cover 500"):
            segmented_sharding_strategy(w, 0, 4, axis=0, segments=(Segment.even(500),))


def test_sharding_strategy_kinds_and_axes():
    assert Segment.head_aware(8, 64) == Segment(512, 8) and Segment.even(7).num_heads is None
    row, col, rep = ShardingStrategy.rowwise(2), ShardingStrategy.columnwise(2), ShardingStrategy.replicate(2)
    assert (row.is_rowwise, row.is_colwise, col.is_colwise, rep.is_replicate) == (True, False, True, True)
    hac = ShardingStrategy.head_aware_columnwise(2, 8, 64)
    assert hac.is_head_aware_colwise and not hac.is_colwise and hac.sharded_axis == 1
    assert ShardingStrategy.stacked_qkv(2, 8, 64).is_stacked_qkv
    assert ShardingStrategy.gate_up(2, axis=0).is_gate_up and ShardingStrategy.gate_up(2, axis=0).sharded_axis == 0
    assert [
        s.sharded_axis for s in (ShardingStrategy.tensor_parallel(2), ShardingStrategy.expert_parallel(2), rep)
    ] == [None] * 3
    seg = ShardingStrategy.segmented(2, axis=0, segments=(Segment.even(4),))
    assert seg.is_segmented and not seg.is_gate_up and seg.sharded_axis == 0
    assert ShardingStrategy.stacked_qkv(2, 8, 64) == ShardingStrategy.stacked_qkv(2, 8, 64)


def test_sharding_strategy_call_gives_the_shard():
    with Graph("g") as graph:
        w = Weight("w", DType.float32, [5, 2], CPU)
        strategy = ShardingStrategy.rowwise(2)
        graph.output(strategy(w, 0), strategy(w, 1))
    data = np.arange(10, dtype=np.float32).reshape(5, 2)
    got = execute(graph, weights={"w": data})
    np.testing.assert_array_equal(got[0], data[:3])
    np.testing.assert_array_equal(got[1], data[3:])


def test_custom_shard_function():
    strategy = ShardingStrategy(2, lambda w, i, n: w[i])  # MAX's positional (num_devices, shard)
    assert strategy.kind == "custom" and strategy.sharded_axis is None
    with Graph("g") as graph:
        w = Weight("w", DType.float32, [2, 3], CPU)
        graph.output(strategy(w, 1))
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(execute(graph, weights={"w": data})[0], data[1])


# ─── values ───────────────────────────────────────────────────────────────


def test_strong_tensor_value_like():
    assert _is_strong_tensor_value_like(np.zeros(2))
    assert _is_strong_tensor_value_like(Shape([1, 2]))
    assert not _is_strong_tensor_value_like(1)
    assert not _is_strong_tensor_value_like(BufferType(DType.float32, [2], CPU))
    with Graph("g", input_types=[TensorType(DType.float32, [2], CPU), BufferType(DType.float32, [2], CPU)]) as graph:
        t, b = graph.inputs
        assert _is_strong_tensor_value_like(t) and not _is_strong_tensor_value_like(b)
        with pytest.raises(TypeError):
            TensorValue(BufferType(DType.float32, [2], CPU))
    assert TensorValueLike is not None


def test_tensor_value_is_not_a_container_nor_iterable():
    with Graph("g", input_types=[TensorType(DType.float32, ["a"], CPU)]) as graph:
        (x,) = graph.inputs
        with pytest.raises(TypeError, match="is not a container"):
            _ = 1 in x
        with pytest.raises(TypeError, match="is not iterable"):
            list(x)


# ─── device chains ────────────────────────────────────────────────────────


def test_device_chains_change_after_effects_only():
    from maxfx.graph import _ChainType, _ChainValue

    with Graph("g", input_types=[TensorType(DType.float32, [2], CPU)]) as graph:
        (x,) = graph.inputs
        chain_0 = graph.device_chains[CPU]
        assert isinstance(chain_0, _ChainValue) and chain_0.type == _ChainType()
        _ = x + 1  # no side effect
        assert graph.device_chains[CPU] is chain_0
        x.print("x")
        chain_1 = graph.device_chains[CPU]
        ops.print("message", "label")
        chain_2 = graph.device_chains[CPU]
        assert chain_0 != chain_1 and chain_1 != chain_2
        assert graph.device_chains[DeviceRef.GPU(0)] is graph.device_chains[DeviceRef.GPU(0)]  # no effect on the GPU
        graph.output()


def test_device_chains_map_order_and_copy():
    with Graph("g", input_types=[TensorType(DType.float32, [4], DeviceRef.GPU(0))]) as graph:
        assert list(graph.device_chains) == [CPU]  # the host chain exists from the start
        for d in (DeviceRef.GPU(5), DeviceRef.CPU(2), DeviceRef.GPU(1)):
            _ = graph.device_chains[d]
        assert list(graph.device_chains) == [CPU, DeviceRef.CPU(2), DeviceRef.GPU(1), DeviceRef.GPU(5)]
        text = str(graph.device_chains)
        assert text.index("cpu:0") < text.index("cpu:2") < text.index("gpu:1") < text.index("gpu:5")
        copied = graph.device_chains.copy()
        assert copied[DeviceRef.GPU(1)] is graph.device_chains[DeviceRef.GPU(1)]
        assert DeviceRef.GPU(7) not in graph.device_chains  # membership does not add a chain
        graph.output()


def test_a_failed_cond_or_loop_leaves_the_chain_unchanged():
    with Graph("g", input_types=[TensorType(DType.int32, [], CPU)]) as graph:
        (x,) = graph.inputs
        chain = graph.device_chains[CPU]
        pred = ops.constant(True, DType.bool, device=CPU)

        def fail():
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            ops.cond(pred, None, lambda: None, fail)
        with pytest.raises(RuntimeError, match="boom"):
            ops.while_loop(x, lambda v: v < 10, lambda v: fail())
        assert graph.device_chains[CPU] is chain
        ops.cond(pred, None, lambda: ops.print("then"), lambda: None)  # a cond that prints is an effect
        assert graph.device_chains[CPU] is not chain
        graph.output()


# ─── control flow checks ──────────────────────────────────────────────────


def test_branch_and_body_result_types_raise_type_error():
    with Graph("g", input_types=[TensorType(DType.int32, [], CPU)]) as graph:
        (x,) = graph.inputs
        pred = ops.constant(False, DType.bool, device=CPU)
        with pytest.raises(TypeError, match="Results don't match expected types"):
            ops.cond(
                pred,
                [TensorType(DType.float32, [], CPU)],
                lambda: ops.constant(1.0, DType.float32, CPU),
                lambda: ops.constant(0, DType.int32, CPU),
            )
        with pytest.raises(TypeError, match="Results don't match expected types"):
            ops.while_loop(x, lambda v: v < 10, lambda v: ops.cast(v + 1, DType.float32))
        with pytest.raises(ValueError, match="While loops must have at least one iteration value"):
            ops.while_loop([], lambda: True, lambda: [])
        graph.output()


def test_while_loop_predicate_must_not_print():
    with Graph("g", input_types=[TensorType(DType.int32, [], CPU)]) as graph:
        (x,) = graph.inputs

        def pred(v):
            v.print()
            return v < 10

        with pytest.raises(ValueError, match="Chain mutation detected"):
            ops.while_loop(x, pred, lambda v: v + 1)
        graph.output()


def test_call_takes_inputs_on_several_devices():
    t_cpu, t_gpu = TensorType(DType.float32, [2], CPU), TensorType(DType.float32, [2], DeviceRef.GPU(0))
    with Graph("main", input_types=[t_cpu, t_gpu]) as graph:
        with graph.add_subgraph("sub", input_types=[t_cpu, t_gpu], devices=[DeviceRef.GPU(0)]) as sub:
            assert DeviceRef.GPU(0) in sub.device_chains
            sub.output(sub.inputs[0] * 2)
        [out] = ops.call(sub, *graph.inputs)
        assert out.type == t_cpu
        graph.output(out)


# ─── ops.constant from accelerator data: DevicePlacementPolicy ────────────


class _AcceleratorArray:
    """Stands for a driver Buffer resident on GPU 0 (no GPU on the test machine)."""

    device = DeviceRef.GPU(0)

    def to_numpy(self):
        return np.array([1.0, 2.0], np.float32)


def test_constant_from_accelerator_data_warns_by_default():
    import warnings

    from maxfx.graph import DevicePlacementPolicy

    assert DevicePlacementPolicy("warn") is DevicePlacementPolicy.Warn
    with Graph("g"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c = ops.constant(_AcceleratorArray())
        assert len(caught) == 1 and "ops.constant" in str(caught[0].message)
        assert c.type == TensorType(DType.float32, [2], DeviceRef.GPU(0))  # stays on the data's device


def test_constant_from_accelerator_data_policies():
    import warnings

    from maxfx.graph import DevicePlacementPolicy

    with Graph("strict", strict_device_placement=DevicePlacementPolicy.Error) as graph:
        with pytest.raises(ValueError, match=r"ops\.constant"):
            ops.constant(_AcceleratorArray())
        with graph.add_subgraph("sub") as sub:  # a subgraph inherits the policy
            with pytest.raises(ValueError, match=r"ops\.constant"):
                ops.constant(_AcceleratorArray())
            sub.output()
    with Graph("quiet", strict_device_placement=DevicePlacementPolicy.Ignore):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert ops.constant(_AcceleratorArray(), device=CPU).type == TensorType(DType.float32, [2], CPU)
    with Graph("host"):  # host data never warns
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ops.constant(np.zeros(2, np.float32))


# ─── quantized ops ────────────────────────────────────────────────────────


def test_gguf_qmatmul_builds_like_max_and_checks_blocks_at_compile_time():
    from maxfx.graph.quantization import QuantizationEncoding as QE

    lhs, rhs = TensorType(DType.float32, [5, 3], CPU), TensorType(DType.uint8, [3, 5], CPU)  # MAX's test shapes
    with Graph("q", input_types=[lhs, rhs]) as graph:
        out = ops.qmatmul(QE.Q4_0, None, *graph.inputs)
        assert out.type == TensorType(DType.float32, [5, 3], CPU)  # [..., N]
        graph.output(out)
    with pytest.raises(
        ValueError,
        match=(
            r"qmatmul: rhs row width 5 bytes is not a multiple of the QuantizationEncoding.Q4_0 block size \(18 "
            r"bytes\)"
        ),
    ):
        InferenceSession().load(graph).execute(np.zeros((5, 3), np.float32), np.zeros((3, 5), np.uint8))
    with Graph(
        "q2", input_types=[TensorType(DType.float32, [2, 64], CPU), TensorType(DType.uint8, [3, 18], CPU)]
    ) as graph:
        graph.output(ops.qmatmul(QE.Q4_0, None, *graph.inputs))
    with pytest.raises(ValueError, match=r"qmatmul: lhs last dim 64 must equal K = 32"):
        InferenceSession().load(graph).execute(np.zeros((2, 64), np.float32), np.zeros((3, 18), np.uint8))


def test_dequantize_errors_use_max_wording():
    from maxfx.graph.quantization import QuantizationEncoding as QE

    with Graph(
        "d", input_types=[TensorType(DType.uint8, [1, 1], CPU), TensorType(DType.uint8, [1, "n"], CPU)]
    ) as graph:
        fixed, symbolic = graph.inputs
        with pytest.raises(ValueError, match=r"last dimension \(1\) not divisible by block size \(18\)"):
            ops.dequantize(QE.Q4_0, fixed)
        with pytest.raises(TypeError, match="dequantize only supported with static last dimension"):
            ops.dequantize(QE.Q4_0, symbolic)


# ─── buffers, calls and weight files ──────────────────────────────────────


def test_buffer_load_advances_the_device_chain():
    with Graph("b", input_types=[BufferType(DType.float32, [2], CPU)]) as graph:
        buf = graph.inputs[0].buffer
        chain_0 = graph.device_chains[CPU]
        y = ops.buffer_load(buf)
        chain_1 = graph.device_chains[CPU]
        ops.buffer_store(buf, y * 2)
        assert chain_0 != chain_1 and graph.device_chains[CPU] != chain_1
        graph.output(y)
    data = np.array([1.0, 2.0], np.float32)
    from maxfx.driver import Buffer

    buffer = Buffer.from_numpy(data.copy())
    [out] = InferenceSession().load(graph).execute(buffer)
    np.testing.assert_array_equal(out.to_numpy(), data)  # the load happened before the store
    np.testing.assert_array_equal(buffer.to_numpy(), data * 2)


def test_call_argument_errors_use_max_wording():
    f32, i32 = TensorType(DType.float32, [3], CPU), TensorType(DType.int32, [3], CPU)
    with Graph("main", input_types=[i32]) as graph:
        with graph.add_subgraph("f", input_types=[f32, f32]) as sub:
            sub.output(sub.inputs[0] + sub.inputs[1])
        with pytest.raises(ValueError, match=r"Expected 2 args to call to 'f', got 1"):
            ops.call(sub, graph.inputs[0])
        with pytest.raises(
            ValueError, match=r"argument 0 of subgraph 'f' has the wrong type: must be float32\[3\], got int32\[3\]"
        ):
            ops.call(sub, graph.inputs[0], graph.inputs[0])
        graph.output()


def test_missing_safetensors_weight_names_the_format(tmp_path):
    import safetensors.numpy

    from maxfx.graph.weights import SafetensorWeights

    path = tmp_path / "w.safetensors"
    safetensors.numpy.save_file({"1.a": np.zeros(2, np.float32)}, str(path))
    weights = SafetensorWeights([path])
    with pytest.raises(KeyError, match=r"'0.a' is not a weight in the Safetensor checkpoint. Did you mean '1.a'\?"):
        weights["0"].a.allocate()


# ─── dims and types ───────────────────────────────────────────────────────


def test_dim_validation_follows_max():
    from maxfx.graph import Dim, StaticDim, SymbolicDim, _OpaqueType
    from maxfx.graph.type import OpaqueType

    assert int(StaticDim(2**63 - 1)) == 2**63 - 1
    with pytest.raises(ValueError):
        StaticDim(2**63)
    for bad in ("", "1x", "a-b", "\u00aa", "x y"):  # '\u00aa' is a Python identifier but not MAX's [a-zA-Z_]\\w*
        with pytest.raises(ValueError):
            SymbolicDim(bad)
    assert SymbolicDim("_batch2").name == "_batch2"
    with pytest.raises(TypeError, match="conversions only supported for static dims"):
        int(SymbolicDim("x"))
    with pytest.raises(TypeError, match="conversions only supported for static dims"):
        int(Dim("x") + 1)
    assert str(Dim("x") - 4) and int(Dim(3) - 4) == -1  # negative dims remain as dim algebra
    assert _OpaqueType is OpaqueType


@pytest.mark.parametrize("shape", [[-1], [-1, 2], [3, -7095393036038990704]])
def test_tensor_types_reject_negative_dims(shape):
    with pytest.raises(TypeError, match="dimensions must be non-negative"):
        TensorType(DType.float32, shape, CPU)
    with pytest.raises(TypeError, match="dimensions must be non-negative"):
        BufferType(DType.float32, shape, CPU)


def test_dim_constructors_are_strict_and_keep_their_argument():
    from maxfx.graph import AlgebraicDim, Dim, StaticDim, SymbolicDim

    s, y, a = StaticDim(5), SymbolicDim("batch"), Dim("batch") + 10
    assert StaticDim(s) is s and SymbolicDim(y) is y and AlgebraicDim(a) is a and Dim(s) is s
    assert isinstance(a, AlgebraicDim) and StaticDim(np.int64(4)) == 4
    for cls, bad in (
        (StaticDim, "5"),
        (StaticDim, y),
        (SymbolicDim, 5),
        (SymbolicDim, s),
        (AlgebraicDim, 5),
        (AlgebraicDim, s),
    ):
        with pytest.raises(TypeError, match=rf"{cls.__name__}.__init__ only accepts"):
            cls(bad)


def test_dim_arithmetic_defers_to_tensor_values():
    with Graph("g"):
        tv = ops.constant(np.array(3, np.int64), DType.int64, CPU)
        for result in (Dim(5) + tv, Dim(10) - tv, Dim(2) * tv, Dim(7) // tv):
            assert isinstance(result, TensorValue) and result.dtype == DType.int64
    with pytest.raises(TypeError):
        Dim(5) + 1.5
