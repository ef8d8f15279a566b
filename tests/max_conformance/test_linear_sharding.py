"""Linear / Weight sharding and StackedLinear as MAX defines them, checked against numpy.

Each sharded layer is built, loaded through the engine from the *unsharded*
weights (the engine slices each shard) and its per-device outputs are compared
with numpy's slices and products of the same arrays.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from maxfx import nn
from maxfx.driver import Tensor
from maxfx.dtype import DType
from maxfx.engine import InferenceSession
from maxfx.graph import BufferType, DeviceRef, Graph, ShardingStrategy, TensorType
from maxfx.graph.weight import Segment, Weight, head_aware_col_sharding_strategy, row_sharding_strategy
from maxfx.nn.quant_config import (
    InputScaleSpec,
    QuantConfig,
    QuantFormat,
    ScaleGranularity,
    ScaleOrigin,
    WeightScaleSpec,
)
from maxfx.nn.stacked_linear import StackedLinear
from tests.graph_run import run_graph

CPU = DeviceRef.CPU()
F8 = DType.float8_e4m3fn.to_numpy()


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def _ranges(total, n):
    """numpy-side reference of MAX's uneven split: the first ``total % n`` parts get one more."""
    base, rem = divmod(total, n)
    sizes = [base + (i < rem) for i in range(n)]
    starts = np.cumsum([0, *sizes[:-1]])
    return [(int(s), int(s + k)) for s, k in zip(starts, sizes)]


def _quant(weight_gran, input_gran, origin, **kw):
    return QuantConfig(
        format=QuantFormat.FBGEMM_FP8,
        weight_scale=WeightScaleSpec(dtype=DType.float32, granularity=weight_gran, **kw),
        input_scale=InputScaleSpec(dtype=DType.float32, granularity=input_gran, origin=origin),
        mlp_quantized_layers=set(),
        attn_quantized_layers=set(),
    )


def test_uneven_rowwise_linear_shards_match_numpy(rng):
    w = rng.normal(size=(11, 5)).astype(np.float32)
    b = rng.normal(size=11).astype(np.float32)
    x = rng.normal(size=(3, 5)).astype(np.float32)
    lin = nn.Linear(5, 11, DType.float32, CPU, has_bias=True)
    lin.sharding_strategy = ShardingStrategy.rowwise(4)
    assert lin.sharding_strategy == lin.weight.sharding_strategy == ShardingStrategy.rowwise(4)
    shards = lin.shard([CPU] * 4)
    assert [(s.out_dim, int(s.weight.shape[0]), int(s.bias.shape[0])) for s in shards] == [
        (3, 3, 3),
        (3, 3, 3),
        (3, 3, 3),
        (2, 2, 2),
    ]
    outs = run_graph(lambda v: [s(v) for s in shards], x, weights={"weight": w, "bias": b})
    for out, (lo, hi) in zip(outs, _ranges(11, 4)):
        np.testing.assert_allclose(out, x @ w[lo:hi].T + b[lo:hi], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("strategy", [ShardingStrategy.columnwise(3), ShardingStrategy.head_aware_columnwise(3, 4, 2)])
def test_column_split_partial_sums_add_the_bias_once(rng, strategy):
    w = rng.normal(size=(6, 8)).astype(np.float32)
    b = rng.normal(size=6).astype(np.float32)
    x = rng.normal(size=(2, 8)).astype(np.float32)
    lin = nn.Linear(8, 6, DType.float32, CPU, has_bias=True)
    lin.sharding_strategy = strategy
    shards = lin.shard([CPU] * 3)
    assert [s.bias is not None for s in shards] == [True, False, False]
    outs = run_graph(
        lambda v: [
            s(v[:, lo : lo + s.in_dim]) for s, lo in zip(shards, np.cumsum([0] + [s.in_dim for s in shards[:-1]]))
        ],
        x,
        weights={"weight": w, "bias": b},
    )
    # columnwise: 8 columns -> 3, 3, 2; head-aware: 4 heads of 2 -> 2, 1, 1 heads = 4, 2, 2 columns
    widths = [3, 3, 2] if strategy.is_colwise else [4, 2, 2]
    assert [s.in_dim for s in shards] == widths
    np.testing.assert_allclose(sum(outs), x @ w.T + b, rtol=1e-5, atol=1e-5)


def test_weight_shard_stacked_qkv_and_segmented_slices(rng):
    heads, head_dim, n = 3, 2, 2
    data = rng.normal(size=(3 * heads * head_dim, 4)).astype(np.float32)
    qkv = Weight(
        "qkv", DType.float32, list(data.shape), CPU, sharding_strategy=ShardingStrategy.stacked_qkv(n, heads, head_dim)
    )
    seg = Weight(
        "seg",
        DType.float32,
        [4, 10],
        CPU,
        sharding_strategy=ShardingStrategy.segmented(n, 1, [Segment.even(3), Segment.head_aware(7, 1)]),
    )
    seg_data = rng.normal(size=(4, 10)).astype(np.float32)
    shards = qkv.shard([CPU] * n) + seg.shard([CPU] * n)
    outs = run_graph(
        lambda v: [s * 1.0 for s in shards], np.zeros((1,), np.float32), weights={"qkv": data, "seg": seg_data}
    )
    block = heads * head_dim
    for i, out in enumerate(outs[:n]):
        (lo, hi) = _ranges(heads, n)[i]
        rows = np.concatenate([data[p * block + lo * head_dim : p * block + hi * head_dim] for p in range(3)])
        np.testing.assert_array_equal(out, rows)
    for i, out in enumerate(outs[n:]):
        (a, b), (c, d) = _ranges(3, n)[i], _ranges(7, n)[i]
        np.testing.assert_array_equal(out, np.concatenate([seg_data[:, a:b], seg_data[:, 3 + c : 3 + d]], axis=1))


def test_max_style_strategies_and_custom_functions(rng):
    assert ShardingStrategy(2, shard=row_sharding_strategy).is_rowwise
    s = ShardingStrategy(2, shard=partial(head_aware_col_sharding_strategy, num_heads=3, head_dim=4))
    assert s.is_head_aware_colwise and (s.num_heads, s.head_dim, s.sharded_axis) == (3, 4, 1)
    # A custom function is applied in the graph to the host weight (here: every other row).
    data = rng.normal(size=(6, 3)).astype(np.float32)
    w = Weight("w", DType.float32, [6, 3], CPU, sharding_strategy=ShardingStrategy(2, shard=lambda wt, i, n: wt[i::n]))
    shards = w.shard([CPU, CPU])
    outs = run_graph(lambda v: [sh * 1.0 for sh in shards], np.zeros((1,), np.float32), weights={"w": data})
    np.testing.assert_array_equal(outs[0], data[0::2])
    np.testing.assert_array_equal(outs[1], data[1::2])


def test_float8_rowwise_linear_shards_match_numpy(rng):
    cfg = _quant(ScaleGranularity.ROWWISE, ScaleGranularity.TENSOR, ScaleOrigin.STATIC)
    lin = nn.Linear(8, 6, DType.float8_e4m3fn, CPU, quant_config=cfg)
    assert lin.weight.dtype is DType.float8_e4m3fn and lin.quant_config is cfg
    lin.sharding_strategy = ShardingStrategy.rowwise(2)
    assert lin.weight_scale.sharding_strategy.is_rowwise
    shards = lin.shard([CPU, CPU])
    assert all(s.input_scale is lin.input_scale for s in shards)
    w = rng.normal(size=(6, 8)).astype(F8)
    ws = rng.uniform(0.5, 2, size=(6, 1)).astype(np.float32)
    s_in = np.float32(0.05)
    x = rng.normal(size=(3, 8)).astype(np.float32)
    outs = run_graph(
        lambda v: [s(v) for s in shards], x, weights={"weight": w, "weight_scale": ws, "input_scale": s_in}
    )
    xq = np.clip(x / s_in, -448, 448).astype(F8).astype(np.float32) * s_in
    ref = xq @ (w.astype(np.float32) * ws).T
    np.testing.assert_allclose(np.concatenate(outs, -1), ref, rtol=1e-4, atol=1e-4)


def test_float8_scale_strategies_follow_the_weight():
    block = QuantConfig(
        format=QuantFormat.BLOCKSCALED_FP8,
        weight_scale=WeightScaleSpec(dtype=DType.float32, granularity=ScaleGranularity.BLOCK, block_size=(4, 4)),
        input_scale=InputScaleSpec(
            dtype=DType.float32, granularity=ScaleGranularity.BLOCK, block_size=(1, 4), origin=ScaleOrigin.DYNAMIC
        ),
    )
    lin = nn.Linear(16, 8, DType.float8_e4m3fn, CPU, quant_config=block)
    lin.sharding_strategy = ShardingStrategy.rowwise(2)
    assert [[int(d) for d in s.weight_scale.shape] for s in lin.shard([CPU, CPU])] == [[1, 4], [1, 4]]
    with pytest.raises(ValueError, match=r"not divisible by the number of devices \(3\)"):
        lin.sharding_strategy = ShardingStrategy.rowwise(3)
    lin.sharding_strategy = ShardingStrategy.head_aware_columnwise(2, 2, 8)  # heads of 8 columns = 2 blocks
    assert lin.weight_scale.sharding_strategy.is_head_aware_colwise and lin.weight_scale.sharding_strategy.head_dim == 2
    row = nn.Linear(
        16,
        8,
        DType.float8_e4m3fn,
        CPU,
        quant_config=_quant(ScaleGranularity.ROWWISE, ScaleGranularity.TENSOR, ScaleOrigin.DYNAMIC),
    )
    row.sharding_strategy = ShardingStrategy.columnwise(2)
    assert row.weight_scale.sharding_strategy.is_replicate
    with pytest.raises(ValueError, match="no sharding strategy"):
        nn.Linear(4, 4, DType.float32, CPU).shard([CPU])


@pytest.mark.parametrize("stacked", [True, False])
def test_stacked_linear_matches_numpy(rng, stacked):
    sl = StackedLinear(6, [4, 2, 2], ["q_proj", "k_proj", "v_proj"], DType.float32, CPU, stacked=stacked, has_bias=True)
    ws = [rng.normal(size=(d, 6)).astype(np.float32) for d in (4, 2, 2)]
    bs = [rng.normal(size=d).astype(np.float32) for d in (4, 2, 2)]
    if stacked:
        state = {"weight": np.concatenate(ws), "bias": np.concatenate(bs)}
    else:
        state = {
            f"{n}.{k}": v
            for n, w, b in zip(("q_proj", "k_proj", "v_proj"), ws, bs)
            for k, v in (("weight", w), ("bias", b))
        }
    assert sorted(sl.raw_state_dict()) == sorted(state)
    sl.load_state_dict(state)
    x = rng.normal(size=(3, 6)).astype(np.float32)
    (out,) = run_graph(lambda v: [sl(v)], x, weights=sl.state_dict())
    np.testing.assert_allclose(out, x @ np.concatenate(ws).T + np.concatenate(bs), rtol=1e-5, atol=1e-5)


def test_stacked_linear_rowwise_shards_and_float8_static(rng):
    sl = StackedLinear(6, [4, 2], ["a", "b"], DType.float32, CPU, has_bias=True)
    sl.sharding_strategy = ShardingStrategy.rowwise(2)
    shards = sl.shard([CPU, CPU])
    assert sorted(sl.raw_state_dict()) == [
        "a.bias",
        "a.weight",
        "b.bias",
        "b.weight",
    ]  # shards follow names given after sharding
    assert [s._out_dims for s in shards] == [[2, 1], [2, 1]] and all(s._has_bias for s in shards)
    wa, wb = rng.normal(size=(4, 6)).astype(np.float32), rng.normal(size=(2, 6)).astype(np.float32)
    ba, bb = rng.normal(size=4).astype(np.float32), rng.normal(size=2).astype(np.float32)
    x = rng.normal(size=(2, 6)).astype(np.float32)
    outs = run_graph(
        lambda v: [s(v) for s in shards], x, weights={"a.weight": wa, "a.bias": ba, "b.weight": wb, "b.bias": bb}
    )
    for i, out in enumerate(outs):
        w = np.concatenate([wa[2 * i : 2 * i + 2], wb[i : i + 1]])
        b = np.concatenate([ba[2 * i : 2 * i + 2], bb[i : i + 1]])
        np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-5, atol=1e-5)
    # Static per-tensor float8: each projection is dequantized with its scale and requantized under the largest.
    cfg = _quant(ScaleGranularity.TENSOR, ScaleGranularity.TENSOR, ScaleOrigin.STATIC)
    q = StackedLinear(8, [4, 4], ["a", "b"], DType.float8_e4m3fn, CPU, quant_config=cfg)
    q.raw_state_dict()  # qualifies the children's weight names (a.weight, ...)
    wa, wb = (rng.normal(size=(4, 8)).astype(F8) for _ in range(2))
    sa, sb, s_in = np.float32(0.5), np.float32(2.0), np.float32(0.05)
    x = rng.normal(size=(2, 8)).astype(np.float32)
    reg = {
        "a.weight": wa,
        "a.weight_scale": sa,
        "a.input_scale": s_in,
        "b.weight": wb,
        "b.weight_scale": sb,
        "b.input_scale": s_in,
    }
    (out,) = run_graph(lambda v: [q(v)], x, weights=reg)
    scale = max(sa, sb)
    wq = (np.concatenate([wa.astype(np.float32) * sa, wb.astype(np.float32) * sb]) / scale).astype(F8).astype(
        np.float32
    ) * scale
    xq = np.clip(x / s_in, -448, 448).astype(F8).astype(np.float32) * s_in
    np.testing.assert_allclose(out, xq @ wq.T, rtol=1e-4, atol=1e-4)


def test_omitted_attribute_names_collide_with_a_clear_error():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv_proj = StackedLinear(4, [2, 2], ["q_proj", "k_proj"], DType.float32, CPU)
            self.q_proj = nn.Linear(4, 2, DType.float32, CPU)

    with pytest.raises(
        ValueError,
        match=r"Duplicate weight FQN 'q_proj\.weight'.*'qkv_proj\.q_proj' and 'q_proj'.*_omit_module_attr_name",
    ):
        Model().raw_state_dict()
    with pytest.raises(ValueError, match="clip_weight"):
        StackedLinear(4, [2, 2], ["a", "b"], DType.float32, CPU, stacked=True, clip_weight=1.0)


def test_column_parallel_linear_uneven_out_dim_allgathers_the_full_output(rng):
    devices = [DeviceRef.CPU(0), DeviceRef.CPU(1)]
    layer = nn.ColumnParallelLinear(4, 5, DType.float32, devices, has_bias=True)
    assert [s.out_dim for s in layer.distributed_linear_layers] == [3, 2]
    w, b = rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=5).astype(np.float32)
    x = rng.normal(size=(2, 4)).astype(np.float32)
    signal_types = [BufferType(DType.uint8, [8], d) for d in devices]
    with Graph("cpl", input_types=[TensorType(DType.float32, [2, 4], CPU), *signal_types]) as g:
        g.output(*layer(g.inputs[0].tensor, [s.buffer for s in g.inputs[1:]]))
    signals = [Tensor.from_numpy(np.zeros(8, np.uint8)) for _ in devices]
    outs = InferenceSession().load(g, weights_registry={"weight": w, "bias": b}).execute(x, *signals)
    for out in outs:
        np.testing.assert_allclose(out.to_numpy(), x @ w.T + b, rtol=1e-5, atol=1e-5)
