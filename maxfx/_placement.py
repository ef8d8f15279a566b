"""Where values that have no placement of their own go when they meet placed (possibly sharded) ones.

A jitted program runs on one set of devices. Its arguments are either
*committed* (put on devices on purpose: `maxfx.shard`, ``jax.device_put``, an
earlier jitted result) or *uncommitted* (made by eager ops or by a jitted
function that returns constants, like optax's step counter ``count``).
Committing an uncommitted value to its own device (the default device 0) next
to arrays sharded over a mesh makes JAX refuse the call ("incompatible
devices"); leaving it uncommitted costs a second compile in a training loop,
because the step's own outputs come back committed. `replicated_like` picks the
one placement that fits both: replicated over the devices the committed values
already use, on their mesh.

Example:
    >>> import jax, jax.numpy as jnp
    >>> placed = jax.device_put(jnp.ones(2), jax.devices()[0])
    >>> replicated_like([placed, jnp.zeros(())]).device_set == {jax.devices()[0]}
    True
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from maxfx._global_arrays import put_replicated

__all__ = ["commit_unplaced", "replicated_like"]


def _committed(tree: Any) -> list[jax.Array]:
    return [
        x
        for x in jax.tree_util.tree_leaves(tree)
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and x.committed
    ]


def replicated_like(tree: Any) -> jax.sharding.Sharding | None:
    """A sharding that replicates a value over the devices the committed arrays of ``tree`` use.

    One device → that device. Several → ``NamedSharding(mesh, P())`` on the mesh
    of a committed array that spans all of them (JAX checks the device order
    too, so the mesh is reused rather than rebuilt). None when nothing is
    committed, or when the committed arrays have no such mesh (then JAX is left
    to report or resolve the mix itself).
    """
    committed = _committed(tree)
    if not committed:
        return None
    devices = set().union(*(x.sharding.device_set for x in committed))
    if len(devices) == 1:
        return SingleDeviceSharding(next(iter(devices)))
    for x in committed:
        s = x.sharding
        if isinstance(s, NamedSharding) and s.device_set == devices:
            return NamedSharding(s.mesh, PartitionSpec(), memory_kind=s.memory_kind)
    return None


def commit_unplaced(tree: Any) -> Any:
    """``tree`` with its uncommitted arrays placed as `replicated_like` says (committed ones untouched).

    With nothing committed, each uncommitted array is committed to its own
    device, so a step fed its own (committed) outputs reuses its first compile.
    With committed arrays but no mesh that covers them, uncommitted arrays stay
    as they are: JAX moves them wherever the program runs.
    """
    leaves = jax.tree_util.tree_leaves(tree)
    if not any(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and not x.committed for x in leaves):
        return tree
    target = replicated_like(tree)
    if target is None and _committed(tree):
        return tree

    def place(x: Any) -> Any:
        if not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer) or x.committed:
            return x
        if target is None:
            return jax.device_put(x, next(iter(x.devices())))
        # Over several processes' devices a device_put would be a cross-host transfer; each process writes its own
        # replicas.
        return put_replicated(x, target) if isinstance(target, NamedSharding) else jax.device_put(x, target)

    return jax.tree_util.tree_map(place, tree)
