"""Put host values on shardings that span processes, without a cross-host device transfer.

In a multi-process job (``jax.distributed``) a ``NamedSharding`` over every
process's devices is not *fully addressable*: a process can write only its own
devices. ``jax.device_put`` of an array that already lives on one of them
onto such a sharding is a cross-host transfer, which the CPU and GPU backends
refuse. Each process instead builds its own shards from host data:

- `put_replicated`: the value is the same on every process (weights, a batch
  every process loaded whole); each process slices out its shards
  (``jax.make_array_from_callback``). `check_same_on_every_process` compares
  a checksum of each value across processes first, since a value that
  differs would make the replicas of one global array disagree silently.
- `put_process_local`: each process holds its own slice (its part of the
  batch); together they form the global array
  (``jax.make_array_from_process_local_data``).

On a fully addressable sharding (one process) both are ``jax.device_put``.

Example:
    >>> import jax, numpy as np
    >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    >>> put_replicated(np.ones((2, 3), np.float32), NamedSharding(mesh, P())).shape
    (2, 3)
    >>> global_shape((4, 3), mesh, P("data", None))
    (4, 3)
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lowering.x64 import run, to_device

__all__ = ["check_same_on_every_process", "global_shape", "put_process_local", "put_replicated"]


def _host(value: Any) -> np.ndarray:
    return np.asarray(value)  # a local jax array comes to the host; numpy stays as it is


def put_replicated(value: Any, sharding: NamedSharding) -> jax.Array:
    """``value`` (the same on every process) placed on ``sharding``; each process writes only its own shards."""
    # Already global: a reshard among the same processes' devices is one jitted copy.
    if sharding.is_fully_addressable or (isinstance(value, jax.Array) and not value.is_fully_addressable):
        return to_device(value, sharding)
    host = _host(value)
    # dtype: a process holding none of the shards has no callback result to read it from.
    return run(jax.make_array_from_callback, host.shape, sharding, lambda index: host[index], dtype=host.dtype)


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None or entry is PartitionSpec.UNCONSTRAINED:
        return ()
    return entry if isinstance(entry, tuple) else (entry,)


def global_shape(local_shape: Sequence[int], mesh: Mesh, spec: PartitionSpec) -> tuple[int, ...]:
    """The global shape that this process's ``local_shape`` slice is part of (split dims grow by the processes along
    them).

    A dim split over mesh axes ``A`` is ``prod(sizes of A)`` pieces, of which this
    process holds as many as its devices have distinct coordinates along ``A``.

    Raises:
        ValueError: a split dim of ``local_shape`` is not divisible by the pieces this process holds.
    """
    me = jax.process_index()
    mine = np.vectorize(lambda d: d.process_index == me, otypes=[bool])(mesh.devices)
    positions = np.argwhere(mine)
    names = list(mesh.axis_names)
    out = []
    for dim, size in enumerate(local_shape):
        axes = _axes(spec[dim]) if dim < len(spec) else ()
        if not axes or any(a not in names for a in axes):  # an unknown axis is the caller's to report, with the spec
            out.append(int(size))
            continue
        index = [names.index(a) for a in axes]
        held = len({tuple(p[index]) for p in positions})
        if held == 0 or size % held:
            raise ValueError(
                f"dim {dim} of this process's data (shape {list(local_shape)}) is not divisible by the {held} piece(s) "
                f"of it this process holds on mesh axes {list(axes)}"
            )
        out.append(int(size) // held * math.prod(mesh.shape[a] for a in axes))
    return tuple(out)


def put_process_local(value: Any, sharding: NamedSharding, shape: Sequence[int]) -> jax.Array:
    """The global array of ``shape`` whose part on this process's devices is ``value``."""
    if sharding.is_fully_addressable:
        return to_device(value, sharding)
    return run(jax.make_array_from_process_local_data, sharding, _host(value), tuple(shape))


def _checksum(name: str, host: np.ndarray) -> int:
    # crc32 over dtype, shape and bytes: cheap next to the transfer itself, and one number per value to compare.
    head = f"{host.dtype.str}{list(host.shape)}".encode()
    return zlib.crc32(np.ascontiguousarray(host).view(np.uint8).reshape(-1), zlib.crc32(head))


def check_same_on_every_process(values: Sequence[tuple[str, Any]], where: str) -> None:
    """Raise if any named value differs between processes (one small all-gather of checksums; a collective).

    Raises:
        ValueError: naming the first value that differs and the processes that disagree.
    """
    if jax.process_count() == 1 or not values:
        return
    sums = np.array([_checksum(name, _host(v)) for name, v in values], dtype=np.uint32)
    every = np.asarray(multihost_utils.process_allgather(sums))  # [processes, values]
    for j, (name, _) in enumerate(values):
        column = every[:, j]
        if (column != column[0]).any():
            other = int(np.nonzero(column != column[0])[0][0])
            raise ValueError(
                f"{where}: {name} differs between processes (process 0 and process {other} hold different values). "
                "A value placed replicated or split must be the same on every process: seed its initialization the "
                "same way everywhere "
                "or load it on every process; for per-process data (each process's part of the batch) pass "
                "process_local=True"
            )
