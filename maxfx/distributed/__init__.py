"""``maxfx.distributed``: maxfx on JAX's multi-process runtime (several processes, one or many hosts).

Every process runs the same program: `initialize` first, then the usual maxfx
code over a mesh of every process's devices (``maxfx.make_mesh`` defaults to
``jax.devices()``, which after `initialize` lists them all). ``maxfx.shard``
places weights (the same on every process) and, with ``process_local=True``,
each process's own slice of the batch; ``make_train_step``, ``maxfx.jit``,
``maxfx.save``/``restore`` and ``maxfx.export`` work on the global arrays.
``python -m maxfx.launch --nproc N script.py`` runs a job on one machine.

Example:
    >>> from maxfx import distributed
    >>> distributed.process_count(), distributed.is_coordinator()
    (1, True)
"""

from __future__ import annotations

from maxfx._addressable import NotAddressableError
from maxfx.distributed._gather import barrier, gather, is_global
from maxfx.distributed._launch import TIMEOUT_STATUS, free_port, launch
from maxfx.distributed._runtime import initialize, is_coordinator, process_count, process_index

__all__ = [
    "NotAddressableError",
    "TIMEOUT_STATUS",
    "barrier",
    "free_port",
    "gather",
    "initialize",
    "is_coordinator",
    "is_global",
    "launch",
    "process_count",
    "process_index",
]
