"""Whether this process can read a jax array's whole value, and the error that says so when it cannot.

In a multi-process job a *global* array is split over the devices of several
processes. A process can read it alone when its own devices hold every part
(replicated, or split only over its own devices); otherwise only an
all-gather (`maxfx.distributed.gather`, which every process calls) gives the
whole value. `describe` says which part this process holds.

Example:
    >>> import jax.numpy as jnp
    >>> readable_here(jnp.ones(3)), describe(jnp.ones(3))
    (True, None)
"""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["NotAddressableError", "check_readable", "describe", "readable_here"]


class NotAddressableError(RuntimeError):
    """A value split over several processes was read where only this process's part is (use
    `maxfx.distributed.gather`).
    """


def _index_key(index: tuple[slice, ...]) -> tuple[Any, ...]:
    return tuple((s.start, s.stop, s.step) for s in index)


def readable_here(array: Any) -> bool:
    """True unless ``array`` is a global jax array whose parts are not all on this process's devices."""
    if not isinstance(array, jax.Array) or isinstance(array, jax.core.Tracer) or array.is_fully_addressable:
        return True
    sharding = array.sharding
    if not sharding.has_addressable_devices:
        return False
    if array.is_fully_replicated:
        return True
    every = {_index_key(i) for i in sharding.devices_indices_map(array.shape).values()}
    mine = {_index_key(i) for i in sharding.addressable_devices_indices_map(array.shape).values()}
    return every == mine


def describe(array: Any) -> str | None:
    """What this process holds of ``array``, e.g. "a global array over 2 processes, split P('data', None) on mesh
    {'data': 2}; this process holds [32, 8] of [64, 8]"; None if readable here.
    """
    if readable_here(array):
        return None
    sharding = array.sharding
    processes = sorted({d.process_index for d in sharding.device_set})
    where = (
        f"a global array over {len(processes)} processes"
        if len(processes) > 1
        else f"an array on process {processes[0]}'s devices"
    )
    split = (
        f", split {sharding.spec} on mesh {dict(sharding.mesh.shape)}"
        if hasattr(sharding, "spec")
        else f", placed by {type(sharding).__name__}"
    )
    mine = [s.index for s in array.addressable_shards]
    if not mine:
        held = "no part of it"
    else:
        # The bounding box of this process's shards: for the usual block splits that is exactly what it holds.
        lo = [min(i[d].start or 0 for i in mine) for d in range(array.ndim)]
        hi = [max(array.shape[d] if i[d].stop is None else i[d].stop for i in mine) for d in range(array.ndim)]
        held = f"{[int(h - l) for l, h in zip(lo, hi)]} of {list(array.shape)}"
    return f"{where}{split}; this process holds {held}"


def check_readable(array: Any, where: str) -> None:
    """Raise `NotAddressableError` naming ``where`` if this process cannot read ``array`` whole.

    Raises:
        NotAddressableError: ``array`` is split over processes; the message says
            what this process holds and how to read the whole value.
    """
    what = describe(array)
    if what is not None:
        raise NotAddressableError(
            f"{where}: the value is {what}, so this process cannot read it alone. "
            "Call maxfx.distributed.gather(value) on every process for the whole value as numpy, "
            "or read this process's part from its jax array's .addressable_shards"
        )
