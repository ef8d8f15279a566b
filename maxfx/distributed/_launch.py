"""`launch`: run one program as N processes of a JAX job on this machine (``python -m maxfx.launch``).

Each process gets the environment `initialize` reads (a free coordinator port
on 127.0.0.1, the process count, its index, the devices per process) and its
output comes back line by line, prefixed ``[i]``. The launcher forwards
SIGINT/SIGTERM to the processes, and when one exits with a non-zero status it
stops the others and returns that status: a job whose process died does not
hang in a collective waiting for it. ``timeout`` bounds the whole job.

Example:
    >>> import sys, tempfile
    >>> script = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    >>> _ = script.write("import os; print('hello from', os.environ['MAXFX_PROCESS_ID'])")
    >>> script.close()
    >>> launch([script.name], nproc=2, timeout=60, stdout=sys.stdout)  # doctest: +SKIP
    [0] hello from 0
    [1] hello from 1
    0
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from maxfx.distributed._runtime import ENV_COORDINATOR, ENV_DEVICES, ENV_NUM_PROCESSES, ENV_PROCESS_ID

__all__ = ["TIMEOUT_STATUS", "free_port", "launch", "main"]

TIMEOUT_STATUS = 124  # what coreutils' `timeout` returns, so shell scripts read it the same way
_GRACE_S = 5.0  # how long a stopped process has between SIGTERM and SIGKILL
_POLL_S = 0.05


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _child_env(
    base: dict[str, str], index: int, nproc: int, address: str, devices_per_process: int | None
) -> dict[str, str]:
    env = dict(base)
    env.update(
        {ENV_COORDINATOR: address, ENV_NUM_PROCESSES: str(nproc), ENV_PROCESS_ID: str(index), "PYTHONUNBUFFERED": "1"}
    )
    if devices_per_process is not None:
        env[ENV_DEVICES] = str(devices_per_process)
        # JAX refuses both ways of setting the CPU device count at once; the launcher's is the one asked for.
        flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", "")).strip()
        if flags:
            env["XLA_FLAGS"] = flags
        else:
            env.pop("XLA_FLAGS", None)
    return env


def _pump(stream: IO[bytes], prefix: str, out: IO[str], lock: threading.Lock) -> None:
    """Copy ``stream`` to ``out`` line by line, each prefixed (one lock: lines of two processes never interleave)."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        with lock:
            out.write(f"{prefix}{line}\n")
            out.flush()
    stream.close()


def _status(returncode: int) -> int:
    """A Popen return code as a shell exit status (killed by signal N → 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _signal_all(procs: Sequence[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)  # the process and whatever it started (each child leads its own group)
            except ProcessLookupError:
                pass


def _stop(procs: Sequence[subprocess.Popen]) -> None:
    """SIGTERM the processes still running, SIGKILL those that outlive the grace period."""
    _signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    _signal_all(procs, signal.SIGKILL)
    for p in procs:
        p.wait()


def launch(
    command: Sequence[str],
    *,
    nproc: int,
    devices_per_process: int | None = None,
    timeout: float | None = None,
    module: bool = False,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """Run ``python command...`` as ``nproc`` processes of one job on 127.0.0.1; return the job's exit status.

    Args:
        command: the script and its arguments (``["train.py", "--steps", "20"]``),
            or with ``module=True`` a module name and its arguments.
        nproc: how many processes.
        devices_per_process: CPU devices per process (and GPUs per process on a GPU host).
        timeout: seconds for the whole job; past it every process is stopped and
            the status is 124.
        module: run ``python -m command[0]``.
        env: the processes' environment (default: this one's).
        python: the interpreter.
        stdout, stderr: where the prefixed output goes (default: this process's).

    Returns:
        0 when every process exits 0; else the first non-zero status (a
        process killed by signal N counts as 128 + N), after the others are stopped.

    Raises:
        ValueError: ``nproc`` or ``devices_per_process`` below 1, or an empty command.
    """
    if nproc < 1:
        raise ValueError(f"maxfx.launch: nproc must be >= 1, got {nproc}")
    if devices_per_process is not None and devices_per_process < 1:
        raise ValueError(f"maxfx.launch: devices_per_process must be >= 1, got {devices_per_process}")
    if not command:
        raise ValueError("maxfx.launch: no program to run")
    out, err = stdout or sys.stdout, stderr or sys.stderr
    address = f"127.0.0.1:{free_port()}"
    argv = [python, "-m", *command] if module else [python, *command]
    base = dict(os.environ if env is None else env)
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    # Exits in the order they happen: when one process's death makes the others fail too, the one named is the cause
    # (polling them in index order named whichever had the lowest index).
    exits: queue.Queue[tuple[int, int]] = queue.Queue()

    def note(text: str) -> None:
        with lock:
            err.write(f"maxfx.launch: {text}\n")
            err.flush()

    received: list[int] = []
    previous = {}

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        _signal_all(procs, signum)

    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:  # signal handlers can only be set there; a launch from a worker thread leaves them alone
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, forward)
    try:
        for i in range(nproc):
            p = subprocess.Popen(
                argv,
                env=_child_env(base, i, nproc, address, devices_per_process),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            procs.append(p)
            for stream, target in ((p.stdout, out), (p.stderr, err)):
                t = threading.Thread(target=_pump, args=(stream, f"[{i}] ", target, lock), daemon=True)
                t.start()
                pumps.append(t)
            threading.Thread(target=lambda i=i, p=p: exits.put((i, p.wait())), daemon=True).start()
        deadline = None if timeout is None else time.monotonic() + timeout
        status = 0
        ended = 0
        while True:
            try:
                ended_one = exits.get(timeout=_POLL_S)
            except queue.Empty:
                ended_one = None
            if received:  # checked after the wait: a forwarded signal's exits are the signal's, not failures
                note(f"received signal {received[0]}; stopping all {nproc} processes")
                status = 128 + received[0]
                break
            if deadline is not None and time.monotonic() > deadline:
                note(f"time limit of {timeout:g} s reached; stopping all {nproc} processes")
                status = TIMEOUT_STATUS
                break
            if ended_one is None:
                continue
            i, code = ended_one
            ended += 1
            if code != 0:
                running = sum(p.returncode is None for p in procs)
                how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
                note(f"process {i} {how}; stopping the {running} other running process(es)")
                status = _status(code)
                break
            if ended == nproc:
                break
    finally:
        _stop(procs)
        for t in pumps:
            t.join(timeout=_GRACE_S)
        if in_main_thread:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m maxfx.launch --nproc N [--devices-per-process K] [--timeout S] (script.py | -m module) args...``."""
    parser = argparse.ArgumentParser(
        prog="python -m maxfx.launch",
        description=(
            "Run a program as N processes of one JAX job on this machine (coordinator on 127.0.0.1). The "
            "program calls maxfx.distributed.initialize() first."
        ),
    )
    parser.add_argument("--nproc", type=int, required=True, help="number of processes")
    parser.add_argument(
        "--devices-per-process", type=int, default=None, help="CPU devices per process (GPUs per process on a GPU host)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds for the whole job; then every process is stopped (status 124)",
    )
    parser.add_argument("-m", dest="module", action="store_true", help="run the program as a module (python -m)")
    parser.add_argument("program", help="the script (or with -m the module) to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the program's arguments")
    ns = parser.parse_args(argv)
    if ns.nproc < 1 or (ns.devices_per_process is not None and ns.devices_per_process < 1):
        parser.error(f"--nproc and --devices-per-process must be >= 1, got {ns.nproc} and {ns.devices_per_process}")
    return launch(
        [ns.program, *ns.args],
        nproc=ns.nproc,
        devices_per_process=ns.devices_per_process,
        timeout=ns.timeout,
        module=ns.module,
    )
