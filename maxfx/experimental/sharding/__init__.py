"""``max.experimental.sharding``: tensors laid out over a mesh of devices.

* `DeviceMesh`: devices on a grid of named axes (``("dp", "tp")``);
  `mesh_context` publishes one for a block, where a `NamedMapping` built
  without a mesh (``NamedMapping.from_spec(spec)``) resolves against it
  (`get_active_mesh` reads it).
* Placements, one per mesh axis: `Replicated`, `Sharded` (a tensor dim is
  split), `Partial` (a pending reduction).
* Mappings: `PlacementMapping` (placements per mesh axis) and `NamedMapping`
  (mesh axes per tensor dim, JAX ``PartitionSpec`` style, with
  ``named_sharding()`` giving the ``jax.sharding.NamedSharding``).
* `TensorLayout` / `BufferLayout`: dtype, global shape and mapping without
  data (MAX's input specs for ``Module.compile``).
* `DistributedTensor`: one eager shard per device; `distribute`,
  `from_shards`, `redistribute`, `assemble`. ``Tensor.zeros(shape,
  device=mapping)`` (and ``ones``/``full``) builds one shard by shard.

The JAX-level helpers ``maxfx.make_mesh`` / ``maxfx.shard`` place single
arrays with ``jax.sharding`` directly; this module keeps MAX's per-device view.

Example:
    >>> from maxfx.driver import CPU
    >>> from maxfx.experimental.tensor import Tensor
    >>> mesh = DeviceMesh((CPU(), CPU()), (2,), ("tp",))
    >>> t = Tensor.ones([4, 2], device=PlacementMapping(mesh, (Sharded(1),)))
    >>> [list(map(int, s.shape)) for s in t.local_shards], list(map(int, t.shape))
    ([[4, 1], [4, 1]], [4, 2])
"""

from maxfx.experimental.sharding._layout import BufferLayout, TensorLayout
from maxfx.experimental.sharding._mappings import (
    ConversionError,
    DeviceMapping,
    NamedMapping,
    PlacementMapping,
    SpecEntry,
    is_fully_replicated,
    local_shard_shape,
    shard_sizes,
)
from maxfx.experimental.sharding._mesh import DeviceMesh, get_active_mesh, mesh_context
from maxfx.experimental.sharding._placements import Partial, Placement, ReduceOp, Replicated, Sharded
from maxfx.experimental.sharding._tensor import (
    DistributedTensor,
    ShardingError,
    as_mapping,
    assemble,
    distribute,
    filled,
    from_shards,
    redistribute,
)

__all__ = [
    "BufferLayout",
    "ConversionError",
    "DeviceMapping",
    "DeviceMesh",
    "DistributedTensor",
    "NamedMapping",
    "Partial",
    "Placement",
    "PlacementMapping",
    "ReduceOp",
    "Replicated",
    "Sharded",
    "ShardingError",
    "SpecEntry",
    "TensorLayout",
    "as_mapping",
    "assemble",
    "distribute",
    "filled",
    "from_shards",
    "get_active_mesh",
    "is_fully_replicated",
    "local_shard_shape",
    "mesh_context",
    "redistribute",
    "shard_sizes",
]
