"""maxfx.experimental.sharding and the eager common layers (MoE, TensorParallelMoE) against numpy.

The meshes here are simulated (every slot the host CPU): the per-device math
and the layouts are the same as on distinct devices; ``jax_array`` (a
``NamedSharding`` over distinct devices) runs where two accelerators exist.
"""

from __future__ import annotations

import numpy as np
import pytest

from maxfx.driver import CPU
from maxfx.experimental import functional as F
from maxfx.experimental.nn.common_layers.mesh_axis import DP, TP
from maxfx.experimental.nn.common_layers.moe import MoE, TensorParallelMoE
from maxfx.experimental.sharding import (
    DeviceMesh,
    DistributedTensor,
    NamedMapping,
    Partial,
    PlacementMapping,
    ReduceOp,
    Replicated,
    Sharded,
    ShardingError,
    distribute,
    from_shards,
    redistribute,
)
from maxfx.experimental.tensor import Tensor


def _mesh(n: int, name: str = TP) -> DeviceMesh:
    return DeviceMesh((CPU(),) * n, (n,), (name,))


# ─── mesh, placements, mappings ───────────────────────────────────────────


def test_mesh_validation_and_queries():
    mesh = DeviceMesh((CPU(),) * 4, (2, 2), (DP, TP))
    assert (mesh.ndim, mesh.num_devices, mesh.axis_size(TP), mesh.is_simulated) == (2, 4, 2, True)
    assert repr(mesh) == "DeviceMesh(dp=2, tp=2)"
    with pytest.raises(ValueError, match="expects 4 devices, got 3"):
        DeviceMesh((CPU(),) * 3, (2, 2), (DP, TP))
    with pytest.raises(ValueError, match="axis_names must be unique"):
        DeviceMesh((CPU(),) * 2, (1, 2), (TP, TP))
    with pytest.raises(ValueError, match="Unknown axis name"):
        mesh.axis_size("ep")


def test_placements_interned_and_mapping_conversions():
    assert Replicated() is Replicated() and Partial() is Partial(ReduceOp.SUM) and Sharded(1) == Sharded(1)
    mesh = DeviceMesh((CPU(),) * 4, (2, 2), (DP, TP))
    m = PlacementMapping(mesh, (Sharded(0), Partial()))
    named = m.to_named_sharding(2)
    assert named.spec == (DP, None) and named.unreduced == {TP}
    assert named.to_placements() == (Sharded(0), Partial())
    assert NamedMapping(mesh, ((DP, TP), None)).to_placements() == (Sharded(0), Sharded(0))
    with pytest.raises(ValueError, match="one placement per mesh axis"):
        PlacementMapping(mesh, (Replicated(),))


# ─── distributed tensors ─────────────────────────────────────────────────


def test_creation_with_a_mapping_is_sharded_per_device():
    mesh = _mesh(2)
    t = Tensor.full([5, 3], 2.0, device=PlacementMapping(mesh, (Sharded(0),)))
    assert isinstance(t, DistributedTensor) and list(t.shape) == [5, 3]
    assert [list(map(int, s.shape)) for s in t.local_shards] == [[3, 3], [2, 3]]  # balanced, first shards larger
    np.testing.assert_array_equal(t.to_numpy(), np.full([5, 3], 2.0, np.float32))
    p = Tensor.ones([2], device=PlacementMapping(mesh, (Partial(),)))  # partial sums: the value once, zeros elsewhere
    np.testing.assert_array_equal(p.to_numpy(), np.ones(2, np.float32))


@pytest.mark.parametrize(
    "placements",
    [(Sharded(0), Sharded(1)), (Sharded(1), Replicated()), (Sharded(0), Sharded(0)), (Replicated(), Partial())],
)
def test_distribute_assembles_back(placements):
    value = np.arange(24, dtype=np.float32).reshape(4, 6)
    mesh = DeviceMesh((CPU(),) * 4, (2, 2), (DP, TP))
    t = distribute(Tensor(value), PlacementMapping(mesh, placements))
    np.testing.assert_array_equal(t.to_numpy(), value)
    np.testing.assert_array_equal(redistribute(t, mesh).local_shards[3].to_numpy(), value)


def test_shard_contents_follow_the_placements():
    value = np.arange(12, dtype=np.float32).reshape(4, 3)
    t = distribute(Tensor(value), PlacementMapping(_mesh(2), (Sharded(0),)))
    np.testing.assert_array_equal(t.local_shards[0].to_numpy(), value[:2])
    np.testing.assert_array_equal(t.local_shards[1].to_numpy(), value[2:])


def test_partial_reductions():
    shards = [Tensor(np.array([1.0, 5.0], np.float32)), Tensor(np.array([3.0, 2.0], np.float32))]
    for op, want in ((ReduceOp.SUM, [4, 7]), (ReduceOp.MAX, [3, 5]), (ReduceOp.MIN, [1, 2]), (ReduceOp.AVG, [2, 3.5])):
        np.testing.assert_allclose(from_shards(shards, PlacementMapping(_mesh(2), (Partial(op),))).to_numpy(), want)


def test_ops_on_replicated_tensors_run_per_device():
    value = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    t = distribute(Tensor(value), _mesh(2))
    out = F.relu(t) * 2 + 1
    assert isinstance(out, DistributedTensor) and out.mapping.is_fully_replicated
    for s in out.local_shards:
        np.testing.assert_allclose(s.to_numpy(), np.maximum(value, 0) * 2 + 1)


def test_ops_on_sharded_tensors_need_a_redistribution():
    t = distribute(Tensor(np.ones([4, 2], np.float32)), PlacementMapping(_mesh(2), (Sharded(0),)))
    with pytest.raises(ShardingError, match="no sharding rule"):
        F.relu(t)
    with pytest.raises(ValueError, match="no single device"):
        _ = t.device


@pytest.mark.skipif(
    __import__("maxfx.driver", fromlist=["accelerator_count"]).accelerator_count() < 2,
    reason="needs two accelerators (host CPU ids are one driver device)",
)
def test_jax_array_on_distinct_devices():
    import jax

    from maxfx.driver import Accelerator

    mesh = DeviceMesh((Accelerator(0), Accelerator(1)), (2,), (DP,))
    value = np.arange(8, dtype=np.float32).reshape(4, 2)
    arr = distribute(Tensor(value), PlacementMapping(mesh, (Sharded(0),))).jax_array()
    assert arr.sharding.spec == jax.sharding.PartitionSpec(DP, None)
    assert {s.data.shape for s in arr.addressable_shards} == {(2, 2)}
    np.testing.assert_array_equal(np.asarray(arr), value)


def test_jax_array_needs_distinct_devices_and_reduced_values():
    t = distribute(Tensor(np.ones([4, 2], np.float32)), PlacementMapping(_mesh(2), (Sharded(0),)))
    with pytest.raises(ShardingError, match="no NamedSharding"):
        t.jax_array()


# ─── MoE ─────────────────────────────────────────────────────────────────


def _silu(x):
    return x / (1 + np.exp(-x))


def _moe_reference(x, gate_w, experts, k, shared=None, router_first=False):
    """Dense numpy MoE: every token through its top-k experts (by raw router logits)."""
    logits = x @ gate_w.T
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for e in top[t]:
            g, u, d = experts[e]
            w = logits[t, e]
            xin = x[t] * w if router_first else x[t]
            y = (_silu(xin @ g.T) * (xin @ u.T)) @ d.T
            out[t] += y if router_first else w * y
    if shared is not None:
        g, u, d = shared
        out += (_silu(x @ g.T) * (x @ u.T)) @ d.T
    return out


def _weights(moe):
    experts = [
        (e.gate_proj.weight.to_numpy(), e.up_proj.weight.to_numpy(), e.down_proj.weight.to_numpy()) for e in moe.experts
    ]
    shared = None
    if moe.shared_experts is not None:
        m = moe.shared_experts
        shared = (m.gate_proj.weight.to_numpy(), m.up_proj.weight.to_numpy(), m.down_proj.weight.to_numpy())
    return moe.gate.gate_score.weight.to_numpy(), experts, shared


@pytest.mark.parametrize("router_first", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_moe_matches_dense_reference(router_first, shared):
    moe = MoE(
        hidden_dim=8,
        num_experts=4,
        num_experts_per_token=2,
        moe_dim=6,
        has_shared_experts=shared,
        shared_experts_dim=4,
        apply_router_weight_first=router_first,
    )
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    gate_w, experts, shared_w = _weights(moe)
    assert [list(map(int, w.shape)) for w in moe.gate_up_proj] == [[4, 12, 8]]
    assert [list(map(int, w.shape)) for w in moe.down_proj] == [[4, 8, 6]]
    np.testing.assert_allclose(
        moe(Tensor(x)).to_numpy(), _moe_reference(x, gate_w, experts, 2, shared_w, router_first), rtol=1e-4, atol=1e-5
    )


def test_moe_rejects_a_multi_device_mesh_and_bad_input():
    moe = MoE(hidden_dim=8, num_experts=4, num_experts_per_token=2, moe_dim=6)
    with pytest.raises(ValueError, match="TensorParallelMoE"):
        moe.to(_mesh(2))
    with pytest.raises(ValueError, match=r"x must be \[tokens, 8\]"):
        moe(Tensor.ones([3, 5]))


@pytest.mark.parametrize("shared", [False, True])
def test_tensor_parallel_moe_partials_sum_to_the_moe(shared):
    moe = TensorParallelMoE(
        hidden_dim=8, num_experts=4, num_experts_per_token=2, moe_dim=6, has_shared_experts=shared, shared_experts_dim=4
    )
    gate_w, experts, shared_w = _weights(moe)
    mesh = _mesh(2)
    moe.to(mesh)
    assert [list(map(int, w.shape)) for w in moe.gate_up_proj] == [[4, 6, 8]] * 2
    assert [list(map(int, w.shape)) for w in moe.down_proj] == [[4, 8, 3]] * 2
    # Device 1's gate rows are rows 3..5 of every expert's gate projection.
    np.testing.assert_array_equal(moe.gate_up_proj[1].to_numpy()[2, :3], experts[2][0][3:])
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    out = moe(distribute(Tensor(x), mesh))
    assert out.mapping.to_placements() == (Partial(),) and out.mapping.mesh == mesh
    np.testing.assert_allclose(out.to_numpy(), _moe_reference(x, gate_w, experts, 2, shared_w), rtol=1e-4, atol=1e-5)


def test_tensor_parallel_moe_checks_its_mesh():
    moe = TensorParallelMoE(hidden_dim=8, num_experts=4, num_experts_per_token=2, moe_dim=6)
    with pytest.raises(ValueError, match="exactly one device axis"):
        moe.to(DeviceMesh((CPU(),) * 4, (2, 2), (DP, TP)))
    with pytest.raises(ValueError, match="split evenly"):
        moe.to(_mesh(4))
    moe.to(_mesh(2))
    with pytest.raises(ValueError, match="must be replicated"):
        moe(Tensor.ones([3, 8]))
