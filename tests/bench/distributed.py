"""Multi-process benchmark: a data-parallel train step on 2 processes x 1 device against 1 process x 2 devices.

Both run the same SPMD program over 2 CPU devices of this machine (an MLP,
``maxfx.optim.make_train_step`` with Adam, the batch split over ``data``, the
weights replicated). With one process the gradient all-reduce stays inside
XLA's CPU runtime; with two it crosses processes through gloo over TCP on
127.0.0.1 (`maxfx.distributed`, jobs started by `maxfx.distributed.launch`).
The difference is what the collective costs over loopback, for

- ``small``: the 8-32-4 MLP of tests/distributed (420 parameters: latency);
- ``medium``: 512-2048-512 (2.1 M parameters, 8.4 MB of float32 gradients per step).

Each job times single steps (each waited on with ``.item()`` of the loss, which
every process reads) after a warm-up and reports the median; the two
configurations alternate job by job, ``--rounds`` times, and the table gives the
median over rounds and the ratio. The machine is shared, so read ratios, not
absolute times. Both configurations must reach the same loss (1e-5).

Run: ``.venv/bin/python -m tests.bench.distributed [--quick]``.
Results: a table on stdout and tests/bench/results/distributed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import maxfx
from maxfx import distributed
from maxfx.experimental import functional as F
from maxfx.experimental.nn import Linear, Module
from maxfx.experimental.tensor import Tensor
from tests.bench._timing import fmt_time, machine, save

SIZES = {"small": (8, 32, 4), "medium": (512, 2048, 512)}
BATCH = 128
CONFIGS = {"2 processes x 1 device": (2, 1), "1 process x 2 devices": (1, 2)}


class MLP(Module):
    def __init__(self, d_in: int, d_hidden: int, d_out: int):
        self.fc1 = Linear(d_in, d_hidden)
        self.fc2 = Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def loss_fn(m, x, y):
    d = m(x) - y
    return F.mean(F.reshape(d * d, [-1]), axis=0).squeeze(0)


def worker(out: str, size: str, warmup: int, steps: int) -> None:
    """One process of a timing job: the data-parallel step over every process's devices."""
    distributed.initialize()
    d_in, d_hidden, d_out = SIZES[size]
    rng = np.random.default_rng(0)
    model = MLP(d_in, d_hidden, d_out)
    model.load_state_dict(
        {n: (rng.standard_normal([int(d) for d in t.shape]) * 0.05).astype(np.float32) for n, t in model.parameters}
    )
    x = rng.standard_normal((BATCH, d_in)).astype(np.float32)
    y = rng.standard_normal((BATCH, d_out)).astype(np.float32)
    mesh = maxfx.make_mesh((jax.device_count(),), ("data",))
    rows = BATCH // jax.process_count()
    part = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    xs, ys = maxfx.shard((Tensor(x[part]), Tensor(y[part])), mesh, P("data", None), process_local=True)
    m = maxfx.shard(model, mesh)
    opt = optax.adam(1e-3)
    step = maxfx.optim.make_train_step(loss_fn, opt)
    state = maxfx.optim.init(opt, m)
    times, loss = [], None
    for i in range(warmup + steps):
        start = time.perf_counter()
        m, state, loss = step(m, state, xs, ys)
        value = loss.item()  # waits for the step; the loss is replicated, so every process reads it
        if i >= warmup:
            times.append(time.perf_counter() - start)
    if distributed.is_coordinator():
        Path(out).write_text(
            json.dumps(
                {
                    "median_s": statistics.median(times),
                    "last_loss": value,
                    "parameters": sum(int(np.prod([int(d) for d in t.shape])) for _, t in m.parameters),
                }
            )
        )


def _job(nproc: int, devices: int, size: str, warmup: int, steps: int, folder: Path) -> dict:
    out = folder / f"{size}_{nproc}x{devices}.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("XLA_FLAGS", None)
    command = [
        "tests.bench.distributed",
        "--worker",
        str(out),
        "--size",
        size,
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
    ]
    status = distributed.launch(command, nproc=nproc, devices_per_process=devices, timeout=600, module=True, env=env)
    if status != 0:
        raise RuntimeError(f"the {nproc} x {devices} {size} job failed with status {status}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps and one round (smoke run)")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two configurations")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--size", default="small", choices=sorted(SIZES), help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=50, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.size, args.warmup, args.steps)
        return {}
    rounds, warmup, steps = (1, 3, 10) if args.quick else (args.rounds, 5, 50)
    results: dict = {"machine": machine(), "batch": BATCH, "rounds": rounds, "steps_per_job": steps}
    with tempfile.TemporaryDirectory() as tmp:
        for size in SIZES:
            runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
            for _ in range(rounds):
                for name, (nproc, devices) in CONFIGS.items():
                    runs[name].append(_job(nproc, devices, size, warmup, steps, Path(tmp)))
            losses = [r["last_loss"] for rs in runs.values() for r in rs]
            np.testing.assert_allclose(
                losses, losses[0], rtol=1e-5
            )  # one program, the same numbers, however it is split
            medians = {name: statistics.median(r["median_s"] for r in rs) for name, rs in runs.items()}
            two, one = medians["2 processes x 1 device"], medians["1 process x 2 devices"]
            results[size] = {
                "parameters": runs["1 process x 2 devices"][0]["parameters"],
                "step_s": medians,
                "ratio": two / one,
                "overhead_s": two - one,
            }
    print(
        f"\nData-parallel Adam step, batch {BATCH} split over 2 CPU devices, float32 ({os.cpu_count()} cores, shared "
        "machine)"
    )
    print(f"  {'model':<36}{'2 processes x 1 device':>24}{'1 process x 2 devices':>24}{'ratio':>8}{'overhead':>14}")
    for size in SIZES:
        r = results[size]
        label = f"{size} {'-'.join(map(str, SIZES[size]))} ({r['parameters']:,} p)"
        print(
            f"  {label:<36}{fmt_time(r['step_s']['2 processes x 1 device']):>24}"
            f"{fmt_time(r['step_s']['1 process x 2 devices']):>24}{r['ratio']:>8.2f}{fmt_time(r['overhead_s']):>14}"
        )
    print(f"\nwritten {save('distributed', results)}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
