"""`initialize` and the process queries: join JAX's multi-process runtime, then ask who this process is.

Every process of a job runs the same program and calls `initialize` before any
other JAX work; JAX's coordination service (run by process 0) then connects
them, and ``jax.devices()`` lists the devices of every process while
``jax.local_devices()`` lists this one's. The arguments are
``jax.distributed.initialize``'s; left out, they come from the environment:
``python -m maxfx.launch`` sets ``MAXFX_COORDINATOR_ADDRESS``,
``MAXFX_NUM_PROCESSES``, ``MAXFX_PROCESS_ID`` and ``MAXFX_DEVICES_PER_PROCESS``;
without those JAX detects Slurm, Open MPI, Cloud TPU and
``JAX_COORDINATOR_ADDRESS`` itself.

On CPU the cross-process collectives are gloo over TCP (set here, so a CPU
job never silently lacks them).

Example:
    >>> from maxfx import distributed
    >>> distributed.process_count() >= 1 and 0 <= distributed.process_index() < distributed.process_count()
    True
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import jax
from jax._src import xla_bridge
from jax._src.distributed import global_state  # JAX keeps the running job's process id and count only here

__all__ = [
    "ENV_COORDINATOR",
    "ENV_DEVICES",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "initialize",
    "is_coordinator",
    "process_count",
    "process_index",
]

ENV_COORDINATOR = "MAXFX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "MAXFX_NUM_PROCESSES"
ENV_PROCESS_ID = "MAXFX_PROCESS_ID"
ENV_DEVICES = "MAXFX_DEVICES_PER_PROCESS"

# (process id, process count) once a one-process initialize ran (JAX keeps no record of that case).
_joined: list[tuple[int, int]] = []


def _env_int(name: str) -> int | None:
    text = os.environ.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"maxfx.distributed.initialize: the environment variable {name}={text!r} is not an integer"
        ) from None


def _gpu_platform_possible() -> bool:
    # local_device_ids only restricts GPUs (JAX turns it into CUDA/ROCm visible devices); skip it where JAX is told to
    # use the CPU alone.
    platforms = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")
    return not platforms or any(p.strip() in ("cuda", "gpu", "rocm") for p in platforms.split(","))


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: int | Sequence[int] | None = None,
    *,
    devices_per_process: int | None = None,
    cpu_collectives: str = "gloo",
    exit_on_error: bool = True,
    **jax_kwargs: Any,
) -> None:
    """Join this process to a multi-process JAX job (``jax.distributed.initialize`` with maxfx's defaults).

    Call it first, before any JAX or maxfx work (which starts JAX's devices
    for this process alone). A second call with the same (or no) arguments
    does nothing. With ``num_processes=1`` only the devices are set: the job is
    an ordinary process (JAX's runtime would send even its own devices'
    collectives through gloo).

    Args:
        coordinator_address: ``"host:port"`` of process 0's coordination service.
        num_processes: how many processes the job has.
        process_id: this process's index, ``0 .. num_processes - 1``.
        local_device_ids: the GPUs this process uses (JAX's argument).
        devices_per_process: CPU devices of this process (``jax_num_cpu_devices``);
            on GPUs, with no ``local_device_ids``, process ``i`` takes GPUs
            ``i*K .. i*K+K-1`` of its host (several processes on one host).
        cpu_collectives: the CPU collectives across processes: ``"gloo"`` or ``"mpi"``.
        exit_on_error: an uncaught exception ends this process at once (status 1,
            after its traceback), instead of Python's normal exit, where JAX's
            shutdown waits for every other process (up to ``shutdown_timeout_seconds``,
            300 s) while they wait for this one in a collective.
        **jax_kwargs: the rest of ``jax.distributed.initialize``'s arguments
            (``heartbeat_timeout_seconds``, ``initialization_timeout``, ...).

    Unset arguments come from ``MAXFX_COORDINATOR_ADDRESS``, ``MAXFX_NUM_PROCESSES``,
    ``MAXFX_PROCESS_ID`` and ``MAXFX_DEVICES_PER_PROCESS`` (what ``python -m
    maxfx.launch`` sets), else from JAX's own cluster detection.

    Raises:
        RuntimeError: JAX already started its devices in this process, or it was
            initialized before with other arguments.
        ValueError: no coordinator could be found, or an environment variable is not a number.

    Example:
        In each process of a two-process job (``python -m maxfx.launch --nproc 2 train.py``
        sets the arguments, so ``initialize()`` alone is enough there)::

            from maxfx import distributed
            distributed.initialize("10.0.0.1:1234", num_processes=2, process_id=int(os.environ["RANK"]))
            mesh = maxfx.make_mesh((jax.device_count(),), ("data",))   # every process's devices
    """
    where = "maxfx.distributed.initialize"
    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR) or None
    num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    devices_per_process = devices_per_process if devices_per_process is not None else _env_int(ENV_DEVICES)
    if _joined or jax.distributed.is_initialized():
        pid, count = _joined[0] if _joined else (global_state.process_id, global_state.num_processes)
        if num_processes not in (None, count) or process_id not in (None, pid):
            raise RuntimeError(
                f"{where}: already initialized as process {pid} of {count}; cannot become process {process_id} of "
                f"{num_processes}"
            )
        return
    if xla_bridge.backends_are_initialized():
        raise RuntimeError(
            f"{where}: JAX already started its devices in this process (some JAX or maxfx work ran first, e.g. "
            "jax.devices() or a Tensor); "
            "call initialize() at the top of the program, before anything else touches JAX"
        )
    if cpu_collectives not in ("gloo", "mpi"):
        raise ValueError(f"{where}: cpu_collectives must be 'gloo' or 'mpi', got {cpu_collectives!r}")
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    if devices_per_process is not None:
        if devices_per_process < 1:
            raise ValueError(f"{where}: devices_per_process must be >= 1, got {devices_per_process}")
        jax.config.update("jax_num_cpu_devices", devices_per_process)
        if local_device_ids is None and process_id is not None and _gpu_platform_possible():
            local_device_ids = list(range(process_id * devices_per_process, (process_id + 1) * devices_per_process))
    if num_processes == 1:
        # A one-process job needs no coordinator, and JAX's runtime, once started, would route even this
        # process's own device collectives through gloo over TCP (a 2-device CPU step: ~20 ms instead of ~1 ms).
        if local_device_ids is not None:
            jax.config.update(
                "jax_cuda_visible_devices",
                ",".join(
                    str(i) for i in ([local_device_ids] if isinstance(local_device_ids, int) else local_device_ids)
                ),
            )
        _joined.append((0, 1))
        return
    try:
        jax.distributed.initialize(coordinator_address, num_processes, process_id, local_device_ids, **jax_kwargs)
        if exit_on_error:
            sys.excepthook = _exit_on_uncaught(sys.excepthook)
    except ValueError as e:
        if coordinator_address is None and "coordinator" in str(e):
            raise ValueError(
                f"{where}: no coordinator address: pass coordinator_address='host:port' (with num_processes and "
                "process_id), "
                f"set {ENV_COORDINATOR}, {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID}, start the program with `python -m "
                "maxfx.launch`, "
                f"or run it under Slurm / Open MPI / Cloud TPU, which JAX detects ({e})"
            ) from e
        raise


def _exit_on_uncaught(previous: Any) -> Any:
    """``sys.excepthook`` that reports the exception as ``previous`` does, then leaves without JAX's shutdown
    barrier.
    """

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        previous(kind, value, tb)
        sys.stderr.write(
            f"maxfx.distributed: process {global_state.process_id} stops on this uncaught {kind.__name__}, "
            "without waiting for the other processes (initialize(exit_on_error=False) keeps JAX's shutdown)\n"
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130 if issubclass(kind, KeyboardInterrupt) else 1)

    return hook


def process_index() -> int:
    """This process's index in the job (0 without `initialize`).

    Example:
        >>> process_index()
        0
    """
    return jax.process_index()


def process_count() -> int:
    """How many processes the job has (1 without `initialize`).

    Example:
        >>> process_count()
        1
    """
    return jax.process_count()


def is_coordinator() -> bool:
    """True on process 0: the one that writes files that only one process should write.

    Example:
        >>> is_coordinator()
        True
    """
    return jax.process_index() == 0
