"""maxfx on JAX's multi-process runtime: jobs of several processes on 127.0.0.1, started by ``maxfx.launch``.

Three jobs run `tests.distributed.worker` (each bounded by the launcher's time limit):

1. 2 processes x 4 CPU devices (through the ``python -m maxfx.launch`` CLI): 20 Adam
   steps of an MLP on a data-parallel mesh (with `make_train_step` and with a
   hand-written `maxfx.jit` step) and on a 2 x 4 ``data`` x ``model`` mesh, each
   process feeding its half of the batch; then a checkpoint and two exports.
2. 1 process x 8 CPU devices: the same training, then the checkpoint restored
   and the artifacts reloaded in this fresh process.
3. 4 processes x 2 CPU devices: the checkpoint restored into a 4-process job,
   then training in which process 1 dies before step 5 (one job for both: every
   job pays a few seconds of JAX start-up per process on this 2-core machine).

Every result is compared with an independent reference: the same training in
plain JAX on this (one-device) pytest process, numpy forward passes, and the
checkpoint's values as the writing job gathered them, bit for bit.
"""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from maxfx import distributed
from tests.distributed._mlp import NAMES, data, jax_reference, jax_sgd_step, numpy_forward

ROOT = Path(__file__).resolve().parents[2]
# The launcher's time limit for one job (about 15 s each here, slower when the machine is busy); a hung job
# fails at this.
JOB_LIMIT_S = 120
RUNS = ("dp", "dp_jit", "dp_tp")


def _env() -> dict[str, str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    return env


def _job(out: Path, nproc: int, devices: int, *tasks: str) -> tuple[int, str, str, float]:
    """Run the worker's ``tasks`` as one job; (status, stdout, stderr, seconds)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    status = distributed.launch(
        ["tests.distributed.worker", str(out), *tasks],
        nproc=nproc,
        devices_per_process=devices,
        timeout=JOB_LIMIT_S,
        module=True,
        env=_env(),
        stdout=stdout,
        stderr=stderr,
    )
    return status, stdout.getvalue(), stderr.getvalue(), time.perf_counter() - start


def _ok(status: int, stdout: str, stderr: str) -> None:
    assert status == 0, f"job failed with status {status}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-6000:]}"


def _results(out: Path, task: str, nproc: int) -> list[dict]:
    return [json.loads((out / f"{task}_{nproc}_{i}.json").read_text()) for i in range(nproc)]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """The folder the jobs share: the 2-process job's checkpoint and artifacts, every process's results."""
    folder = tmp_path_factory.mktemp("multiprocess")
    cli = [
        sys.executable,
        "-m",
        "maxfx.launch",
        "--nproc",
        "2",
        "--devices-per-process",
        "4",
        "--timeout",
        str(JOB_LIMIT_S),
    ]
    proc = subprocess.run(
        [*cli, "-m", "tests.distributed.worker", str(folder), "train"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=JOB_LIMIT_S + 30,
    )
    _ok(proc.returncode, proc.stdout, proc.stderr)
    assert "[0] train done" in proc.stdout and "[1] train done" in proc.stdout  # each line prefixed with its process
    return folder


@pytest.fixture(scope="module")
def one_process(out):
    _ok(*_job(out, 1, 8, "train", "restore", "reload")[:3])
    return _results(out, "train", 1)[0]


@pytest.fixture(scope="module")
def reference():
    return jax_reference()


def test_two_processes_train_like_one_process_and_plain_jax(out, one_process, reference):
    ref_losses, ref_params = reference
    two = _results(out, "train", 2)
    assert [(r["devices"], r["local_devices"], r["process"]) for r in two] == [(8, 4, 0), (8, 4, 1)]
    assert (one_process["devices"], one_process["local_devices"]) == (8, 8)
    assert ref_losses[-1] < ref_losses[0] * 0.8  # it trains
    for run in RUNS:
        for r in [*two, one_process]:
            got = r[run]
            np.testing.assert_allclose(got["losses"], ref_losses, rtol=1e-5, atol=1e-6, err_msg=run)
            for n in NAMES:
                np.testing.assert_allclose(
                    np.asarray(got["params"][n]), ref_params[n], rtol=1e-5, atol=1e-5, err_msg=f"{run} {n}"
                )
            assert got["compiles"] == 1, run  # the step's outputs feed it back without a second compile
            assert got["params_span_all"] and got["state_span_all"], (
                run
            )  # parameters and Adam state stay on all 8 devices
        # Both processes read the same loss (.item() of the replicated value) and gather the same parameters.
        assert two[0][run]["losses"] == two[1][run]["losses"], run
        assert two[0][run]["params"] == two[1][run]["params"], run
        np.testing.assert_allclose(two[0][run]["losses"], one_process[run]["losses"], rtol=1e-5, atol=1e-6, err_msg=run)


def test_a_global_tensor_says_what_this_process_can_read(out):
    r = _results(out, "train", 2)[0]
    # The batch's rows are split over both processes: repr says so instead of failing, to_numpy names the way out.
    assert r["split_is_global"]
    assert "a global array over 2 processes" in r["split_repr"] and "holds [32, 8] of [64, 8]" in r["split_repr"], r[
        "split_repr"
    ]
    assert r["split_to_numpy"].startswith(
        "NotAddressableError: Tensor.to_numpy: the value is a global array over 2 processes"
    ), r["split_to_numpy"]
    assert "maxfx.distributed.gather" in r["split_to_numpy"]
    # A value on process 1's devices only: process 1 reads it, process 0 is told it holds no part of it.
    assert r["remote_item"].startswith(
        "NotAddressableError: Tensor.item: the value is an array on process 1's devices"
    ), r["remote_item"]
    assert (
        "this process holds no part of it" in r["remote_item"]
        and "this process holds no part of it" in r["remote_repr"]
    )
    assert (
        _results(out, "train", 2)[1]["remote_item"] == "no error"
        and "<" not in _results(out, "train", 2)[1]["remote_repr"].split(": ", 1)[1]
    )
    # Weights placed whole must be the same everywhere: a model initialized differently per process is refused, by name.
    assert r["differs"].startswith(
        "ValueError: shard: parameter 'weight' differs between processes (process 0 and process 1"
    ), r["differs"]


def _saved(out: Path, name: str) -> dict[str, np.ndarray]:
    with np.load(out / name) as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def four_processes(out):
    """The 4 x 2 job: restore, then the training that process 1 leaves; (status, stdout, stderr, unix time the job
    ended).
    """
    status, stdout, stderr, _ = _job(out, 4, 2, "restore", "die")
    return status, stdout, stderr, time.time()


def test_checkpoint_from_two_processes_restores_into_one_and_four(out, one_process, four_processes):
    written = _saved(out, "ckpt_ref.npz")
    assert (
        len(written) == 13 and "['opt'][0].mu.fc1.weight" in written
    )  # 4 parameters, Adam's step count, mu and nu of each
    for nproc in (1, 4):
        back = _saved(out, f"restored_{nproc}.npz")
        assert sorted(back) == sorted(written), nproc
        for k, v in written.items():
            assert back[k].dtype == v.dtype and np.array_equal(back[k], v), (nproc, k)
        assert all(r["leaves"] == 13 and r["span_all"] for r in _results(out, "restore", nproc)), (
            nproc
        )  # read into the new job's own mesh


def test_exported_sharded_step_reloads_in_one_fresh_process(out, one_process):
    reloaded = _saved(out, "reloaded.npz")
    info = _results(out, "reload", 1)[0]
    params = _saved(out, "model_ref.npz")
    x, y = data()
    want = [np.asarray(v) for v in jax_sgd_step(*[params[n] for n in NAMES], x, y)]  # plain JAX, one device
    for i, w in enumerate(want):
        np.testing.assert_allclose(reloaded[f"arr_{i}"], w, rtol=1e-5, atol=1e-6, err_msg=f"output {i}")
    # Exported with their shardings over both processes' devices, they run on this process's 8 arranged the same way.
    assert info["devices"] == {"step": 8, "fwd": 8, "fwd_graph": 1}
    np.testing.assert_allclose(reloaded["fwd"], numpy_forward(params, x[:5]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(reloaded["fwd_graph"], numpy_forward(params, x[:7]), rtol=1e-5, atol=1e-5)
    assert np.array_equal(
        reloaded["fwd_weight"], params["fc1.weight"]
    )  # the weight split over the processes was stored whole


def test_a_process_that_dies_mid_training_stops_the_job(four_processes):
    status, stdout, stderr, ended = four_processes
    assert status == 1, (status, stdout[-2000:], stderr[-3000:])
    # Process 1 finished step 4 with the others, which therefore printed step 3's loss before it (step 4's line may be
    # cut off).
    assert "[1] process 1 fails before step 5" in stdout and all(f"[{i}] step 3 loss" in stdout for i in (0, 2, 3))
    assert "finished all steps" not in stdout  # the others were inside step 5's collective: stopped, not left hanging
    # Its traceback, then it leaves at once: Python's normal exit would wait in JAX's shutdown for the others (300 s).
    assert "[1] RuntimeError: process 1 fails on purpose" in stderr
    assert (
        "[1] maxfx.distributed: process 1 stops on this uncaught RuntimeError, without waiting for the other processes"
        in stderr
    )
    # Named as the cause even when the others fail at once on its closed connections (how many of them were still
    # running by then is timing).
    notes = [line for line in stderr.splitlines() if line.startswith("maxfx.launch")]
    assert re.search(
        r"maxfx\.launch: process 1 exited with status 1; stopping the [0-3] other running process", stderr
    ), notes
    died = float(stdout.split("[1] process 1 fails before step 5 at unix time ")[1].split()[0])
    assert ended - died < 15, (
        ended - died
    )  # the launcher's grace period is 5 s; no collective or shutdown timeout is waited for


# ─── the launcher alone (no JAX in the processes) ─────────────────────────────


def _script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(text)
    return str(path)


def test_launch_prefixes_output_sets_the_environment_and_returns_the_first_failure(tmp_path):
    # Processes 0 and 1 print, mark that they did, and sleep; process 2 waits for both marks, then fails.
    script = _script(
        tmp_path,
        "import os, sys, time\n"
        "i = int(os.environ['MAXFX_PROCESS_ID'])\n"
        "print('hello', i, os.environ['MAXFX_NUM_PROCESSES'], "
        "os.environ['MAXFX_COORDINATOR_ADDRESS'].startswith('127.0.0.1:'), os.environ['MAXFX_DEVICES_PER_PROCESS'], "
        "sys.argv[1:], flush=True)\n"
        "print('to stderr', file=sys.stderr, flush=True)\n"
        f"mark = lambda j: os.path.join({str(tmp_path)!r}, f'{{j}}.printed')\n"
        "if i < 2:\n"
        "    open(mark(i), 'w').close()\n"
        "    time.sleep(30)\n"
        "while not (os.path.exists(mark(0)) and os.path.exists(mark(1))):\n"
        "    time.sleep(0.02)\n"
        "time.sleep(0.2)\n"  # the launcher's readers copy the lines already written
        "sys.exit(5)\n",
    )
    stdout, stderr = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    status = distributed.launch(
        [script, "--flag", "x"], nproc=3, devices_per_process=2, timeout=30, stdout=stdout, stderr=stderr
    )
    assert status == 5
    assert time.perf_counter() - start < 20  # the sleeping processes were stopped, not waited for
    lines = sorted(stdout.getvalue().splitlines())
    assert lines == [f"[{i}] hello {i} 3 True 2 ['--flag', 'x']" for i in range(3)]
    assert sorted(line for line in stderr.getvalue().splitlines() if "to stderr" in line) == [
        f"[{i}] to stderr" for i in range(3)
    ]
    assert "maxfx.launch: process 2 exited with status 5; stopping the 2 other running process(es)" in stderr.getvalue()


def test_launch_time_limit_stops_every_process(tmp_path):
    script = _script(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    stderr = io.StringIO()
    start = time.perf_counter()
    status = distributed.launch([script], nproc=2, timeout=1.5, stdout=io.StringIO(), stderr=stderr)
    assert status == distributed.TIMEOUT_STATUS == 124
    assert time.perf_counter() - start < 15
    assert "time limit of 1.5 s reached; stopping all 2 processes" in stderr.getvalue()


def test_launch_forwards_sigterm_and_stops_the_processes(tmp_path):
    script = _script(
        tmp_path,
        f"import os, time\nopen(os.path.join({str(tmp_path)!r}, os.environ['MAXFX_PROCESS_ID'] + '.pid'), "
        "'w').write(str(os.getpid()))\ntime.sleep(60)\n",
    )
    launcher = subprocess.Popen(
        [sys.executable, "-m", "maxfx.launch", "--nproc", "2", "--timeout", "30", script],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while (
            not all((tmp_path / f"{i}.pid").exists() and (tmp_path / f"{i}.pid").read_text() for i in range(2))
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        pids = [int((tmp_path / f"{i}.pid").read_text()) for i in range(2)]
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=20)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM, err
    assert "received signal 15; stopping all 2 processes" in err
    for pid in pids:  # both children are gone (reaped by the launcher), not left sleeping
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_launch_rejects_bad_counts():
    with pytest.raises(ValueError, match="nproc must be >= 1"):
        distributed.launch(["x.py"], nproc=0)
    with pytest.raises(ValueError, match="devices_per_process must be >= 1"):
        distributed.launch(["x.py"], nproc=1, devices_per_process=0)


# ─── initialize ──────────────────────────────────────────────────────────────


def test_initialize_in_one_process_and_again(one_process):
    # The 1 x 8 job: only the devices were set; a second call is a no-op, another job's settings an error.
    assert one_process["runtime_started"] is False
    assert one_process["other_job"] == (
        "RuntimeError: maxfx.distributed.initialize: already initialized as process 0 of 1; "
        "cannot become process 1 of 2"
    )


def test_initialize_without_a_coordinator_or_after_jax_started():
    # A fresh interpreter: JAX starts its devices once per process, and the first call must come before that.
    env = {
        k: v
        for k, v in _env().items()
        if not k.startswith(("MAXFX_", "SLURM_", "OMPI_")) and k != "JAX_COORDINATOR_ADDRESS"
    }
    code = (
        "import jax\n"
        "from maxfx import distributed\n"
        "try:\n"
        "    distributed.initialize(cluster_detection_method='deactivate')\n"
        "except ValueError as e:\n"
        "    print('no coordinator:', e)\n"
        "jax.devices()\n"
        "try:\n"
        "    distributed.initialize('127.0.0.1:1', num_processes=2, process_id=0)\n"
        "except RuntimeError as e:\n"
        "    print('after start:', e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "no coordinator: maxfx.distributed.initialize: no coordinator address: pass coordinator_address='host:port'"
        in proc.stdout
    ), proc.stdout
    assert "python -m maxfx.launch" in proc.stdout and "MAXFX_COORDINATOR_ADDRESS" in proc.stdout
    assert (
        "after start: maxfx.distributed.initialize: JAX already started its devices in this process" in proc.stdout
    ), proc.stdout
    assert "call initialize() at the top of the program" in proc.stdout
