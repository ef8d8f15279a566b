"""`gather` and `barrier`: read a value that spans processes, and wait for every process.

A jax array sharded over the devices of several processes is *global*: each
process holds only its own shards, so ``np.asarray`` (and a Tensor's
``to_numpy``/``item``/``repr``) can read it only where it is replicated.
`gather` collects the whole value on every process (a collective: every
process must call it, in the same order).

Example:
    >>> import numpy as np
    >>> from maxfx.experimental.tensor import Tensor
    >>> gather(Tensor([1.0, 2.0])).tolist()
    [1.0, 2.0]
    >>> gather({"w": np.ones(2)})["w"].tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from lowering.x64 import run
from maxfx._addressable import readable_here
from maxfx.experimental._tensor import Tensor

__all__ = ["barrier", "gather", "is_global"]


def is_global(x: Any) -> bool:
    """True for a Tensor or jax array with shards on devices of other processes (this process cannot read it alone).

    Example:
        >>> import jax.numpy as jnp
        >>> is_global(jnp.ones(2))
        False
    """
    array = x._array() if isinstance(x, Tensor) else x
    return isinstance(array, jax.Array) and not isinstance(array, jax.core.Tracer) and not array.is_fully_addressable


def _host(leaf: Any) -> Any:
    array = leaf._array() if isinstance(leaf, Tensor) else leaf
    if isinstance(array, jax.core.Tracer):
        raise TypeError(
            "maxfx.distributed.gather: got a traced value; gather reads concrete values (call it outside jit)"
        )
    return array


def gather(tree: Any) -> Any:
    """The whole value of each Tensor/array leaf of ``tree``, as numpy, on every process.

    Leaves that this process can read alone (local arrays, replicated global
    ones, numpy) are copied without communication; global leaves sharded
    over several processes are all-gathered (every process must call
    `gather` with the same tree).

    Example:
        >>> import jax.numpy as jnp
        >>> gather([jnp.arange(3)])[0].tolist()
        [0, 1, 2]
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda v: isinstance(v, Tensor))
    arrays = [_host(v) for v in leaves]
    split = [i for i, a in enumerate(arrays) if not readable_here(a)]
    out: list[Any] = [
        None if i in split else np.asarray(a) for i, a in enumerate(arrays)
    ]  # what this process holds whole is read here
    if split:
        # run: int64/float64 leaves keep their width through the all-gather
        gathered = run(multihost_utils.process_allgather, [arrays[i] for i in split], tiled=True)
        for i, value in zip(split, gathered):
            out[i] = np.asarray(value)
    return jax.tree_util.tree_unflatten(treedef, out)


def barrier(name: str = "maxfx.distributed.barrier") -> None:
    """Wait until every process reaches a barrier of this ``name`` (returns at once in a one-process job).

    Example:
        >>> barrier("after-checkpoint")
    """
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
