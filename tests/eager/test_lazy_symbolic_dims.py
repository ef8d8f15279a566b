"""Inside F.lazy(), eager tensors may have named (symbolic) dims, as in MAX.

``Tensor.zeros(["batch", 8])`` inside ``F.lazy()`` is a recorded tensor whose
first dim is ``Dim('batch')``: ops on it are checked by the same rules as in a
graph (so shape errors surface at the call), and computing its values raises,
since ``batch`` has no size. A named dim split over a mesh axis becomes one
fresh name per shard (``batch_dp_0``, ``batch_dp_1``), as MAX mints them.
"""

import numpy as np
import pytest

from lowering.dims import Dim
from lowering.registry import OpError
from maxfx.driver import CPU
from maxfx.experimental import functional as F
from maxfx.experimental.sharding import (
    DeviceMesh,
    PlacementMapping,
    Replicated,
    Sharded,
    from_shards,
    local_shard_shape,
)
from maxfx.experimental.tensor import Tensor


def test_ops_on_named_dims_are_recorded_with_their_shapes():
    with F.lazy():
        x = Tensor.zeros(["batch", 8])
        w = Tensor(np.ones((8, 4), np.float32))
        y = F.relu(x @ w + 1)
        doubled = F.concat([x, x], axis=0)
        flat = x.reshape([-1])
    assert list(x.shape) == [Dim("batch"), Dim(8)]
    assert list(y.shape) == [Dim("batch"), Dim(4)]
    assert list(doubled.shape) == [Dim("batch") * 2, Dim(8)]
    assert list(flat.shape) == [Dim("batch") * 8]
    assert not y.real


def test_shape_errors_surface_when_recorded():
    with F.lazy():
        x = Tensor.zeros(["batch", 8])
        with pytest.raises(ValueError, match=r"add: shapes \[batch, 8\] and \[seq, 8\] cannot be broadcast"):
            x + Tensor.zeros(["seq", 8])
        with pytest.raises(ValueError, match="matmul"):
            x @ Tensor.zeros([4, 2])


def test_computing_values_names_the_symbolic_dim():
    with F.lazy():
        y = (Tensor.ones(["batch", 2]) + 1).sum(axis=-1)
    with pytest.raises(
        OpError, match=r"cannot realize a tensor of shape \[batch, 1\] \(from sum\): dim batch is symbolic.*F.lazy\(\)"
    ):
        y.to_numpy()


def test_named_dims_outside_lazy_are_refused_with_the_way_out():
    with pytest.raises(
        TypeError, match=r"Tensor.zeros: dim 0 of shape \['batch', 8\] is the symbolic dim 'batch'.*F.lazy\(\)"
    ):
        Tensor.zeros(["batch", 8])


def test_random_creation_needs_static_sizes_even_inside_lazy():
    from maxfx.experimental import random

    with (
        F.lazy(),
        pytest.raises(
            TypeError,
            match=(
                r"random.gaussian: dim 0 of shape \['batch', 4\] is the symbolic dim 'batch': random.gaussian needs "
                r"static sizes"
            ),
        ),
    ):
        random.normal(["batch", 4])


def test_a_named_dim_split_over_a_mesh_axis_gets_one_name_per_shard():
    mesh = DeviceMesh((CPU(), CPU()), (2,), ("dp",))
    sharded = PlacementMapping(mesh, (Sharded(0),))
    assert local_shard_shape(["batch", 3], sharded, 0) == [Dim("batch_dp_0"), 3]
    assert local_shard_shape(["batch", 5], sharded, 1) == [Dim("batch_dp_1"), 5]
    assert local_shard_shape([5, "seq"], sharded, 0) == [
        3,
        Dim("seq"),
    ]  # static dims split unevenly, names unsplit stay
    with pytest.raises(ValueError, match="cannot split the algebraic dim"):
        local_shard_shape([Dim("batch") + 1, 3], sharded, 0)
    with F.lazy():
        x = Tensor.zeros(["batch", 8], device=sharded)
        halves = [Tensor.zeros([s.shape[0], 4], device=s.device) for s in x.local_shards]  # a per-shard result
        out = from_shards(halves, sharded)
        replicated = Tensor.zeros(["batch", 8], device=PlacementMapping(mesh, (Replicated(),)))
    assert [list(s.shape) for s in x.local_shards] == [[Dim("batch_dp_0"), Dim(8)], [Dim("batch_dp_1"), Dim(8)]]
    assert list(x.shape) == [Dim("batch_dp_0") + Dim("batch_dp_1"), Dim(8)]
    assert out.shape[0] == x.shape[0] and out.mapping == sharded
    assert list(replicated.shape) == [Dim("batch"), Dim(8)]
