"""One process of a multi-process test job: ``python -m maxfx.launch ... -m tests.distributed.worker OUT TASK...``.

Tasks run in the order given, each writing what the tests check under OUT
(every process its own JSON, ``<task>_<nproc>_<index>.json``; arrays as .npz
written by process 0 only):

- ``train``: 20 Adam steps of the MLP with `make_train_step` on a data-parallel
  mesh and on a 2 x (devices / 2) ``data`` x ``model`` mesh, and a hand-written
  ``maxfx.jit`` step fed optax's own (uncommitted) state; each process gives its
  part of the batch (``process_local=True``) and reads every loss with ``.item()``.
  With several processes it also saves the 2-D run's model and optimizer state
  (``ckpt/``), exports a sharded SGD step and a forward pass whose weights are
  split over the processes (``*.maxfx``), and records what a global Tensor's
  repr, ``to_numpy`` and a differing replicated value say.
- ``restore``: reads ``ckpt/`` into this job's own 2-D mesh (any process count).
- ``reload``: loads the two artifacts and runs them on the checkpoint's values.
- ``die``: data-parallel steps; process 1 raises before step 5 (an uncaught exception),
  while the others are inside it (run last: the launcher then stops the job).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import maxfx
from maxfx import distributed
from maxfx.dtype import DType
from maxfx.experimental import functional as F
from maxfx.experimental.nn import Linear, Module
from maxfx.experimental.sharding import DeviceMesh
from maxfx.experimental.tensor import Tensor
from maxfx.graph import TensorType
from tests.distributed._mlp import LR, NAMES, RULE, STEPS, data, init_params, jax_sgd_step


class MLP(Module):
    def __init__(self):
        self.fc1 = Linear(8, 32)
        self.fc2 = Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def loss_fn(m, x, y):
    d = m(x) - y
    return F.mean(F.reshape(d * d, [-1]), axis=0).squeeze(0)  # MAX reductions keep the dim: flatten, reduce, drop it


def _model() -> MLP:
    model = MLP()
    model.load_state_dict(init_params())
    return model


def _local_batch(mesh) -> tuple[Tensor, Tensor]:
    """This process's rows of the batch: the global batch is split over processes along dim 0."""
    x, y = data()
    me, n = jax.process_index(), jax.process_count()
    rows = len(x) // n
    part = slice(me * rows, (me + 1) * rows)
    return maxfx.shard((Tensor(x[part]), Tensor(y[part])), mesh, P("data", None), process_local=True)


def _grid():
    return maxfx.make_mesh((2, jax.device_count() // 2), ("data", "model"))


_START = time.perf_counter()


def _mark(what: str) -> None:
    """A timestamped line in the job's log: where a slow or hung job spent its time."""
    print(f"{what} at {time.perf_counter() - _START:.1f} s", flush=True)


def _write(out: Path, task: str, result: dict) -> None:
    name = f"{task}_{jax.process_count()}_{jax.process_index()}.json"
    (out / name).write_text(json.dumps(result))


def _train(mesh, rule, how: str) -> tuple[dict, MLP, object]:
    m = maxfx.shard(_model(), mesh, {k: P(*v) for k, v in rule.items()} if rule else None)
    xs, ys = _local_batch(mesh)
    opt = optax.adam(LR)
    if how == "make_train_step":
        step = maxfx.optim.make_train_step(loss_fn, opt)
        state = maxfx.optim.init(opt, m)
    else:  # by hand under maxfx.jit, fed optax's own state: its uncommitted step count is replicated over the
        # processes' mesh

        @maxfx.jit
        def step(m, s, x, y):
            value, grads = maxfx.value_and_grad(loss_fn)(m, x, y)
            updates, s = opt.update(grads, s, m)
            return optax.apply_updates(m, updates), s, value

        state = opt.init(m)
    losses = []
    for _ in range(STEPS):
        m, state, loss = step(m, state, xs, ys)
        losses.append(loss.item())  # the loss is replicated: every process reads it
    params = distributed.gather({n: t for n, t in m.parameters})
    result = {
        "losses": losses,
        "params": {n: v.tolist() for n, v in params.items()},
        "compiles": step.jitted._cache_size(),
        "params_span_all": all(len(t._array().sharding.device_set) == jax.device_count() for _, t in m.parameters),
        "state_span_all": all(len(leaf.sharding.device_set) == jax.device_count() for leaf in jax.tree.leaves(state)),
    }
    return result, m, state


def _error(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test reads the type and message
        return f"{type(e).__name__}: {e}"
    return "no error"


def task_train(out: Path) -> None:
    n = jax.process_count()
    result: dict = {
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "process": jax.process_index(),
    }
    dp_mesh = maxfx.make_mesh((jax.device_count(),), ("data",))
    result["dp"], _, _ = _train(dp_mesh, None, "make_train_step")
    _mark("data-parallel make_train_step")
    result["dp_jit"], _, _ = _train(dp_mesh, None, "jit")
    _mark("data-parallel maxfx.jit")
    # The 2-D mesh through MAX's DeviceMesh: its jax Mesh is the same grid of every process's devices.
    grid = DeviceMesh.from_jax(_grid()).jax_mesh()
    result["dp_tp"], m, state = _train(grid, RULE, "make_train_step")
    _mark("2-D make_train_step")
    if n == 1:  # a one-process job is an ordinary process: JAX's distributed runtime is not started
        result["runtime_started"] = jax.distributed.is_initialized()
        distributed.initialize()  # the same job again: nothing to do
        result["other_job"] = _error(lambda: distributed.initialize(num_processes=2, process_id=1))
    if n > 1:
        xs, _ = _local_batch(dp_mesh)
        result["split_repr"] = repr(xs)
        result["split_to_numpy"] = _error(xs.to_numpy)
        result["split_is_global"] = distributed.is_global(xs)
        # A one-element value that lives only on process 1's devices: process 0 can neither print it nor read its
        # .item().
        theirs = maxfx.make_mesh(
            (jax.local_device_count(),), ("data",), devices=[d for d in jax.devices() if d.process_index == 1]
        )
        remote = maxfx.shard(Tensor(np.array([2.5], np.float32)), theirs)
        result["remote_repr"], result["remote_item"] = repr(remote), _error(lambda: print("item", remote.item()))
        differs = Linear(2, 2)
        differs.load_state_dict(
            {"weight": np.full((2, 2), float(jax.process_index()), np.float32), "bias": np.zeros(2, np.float32)}
        )
        result["differs"] = _error(lambda: maxfx.shard(differs, dp_mesh))
        tree = {"model": m, "opt": state}
        maxfx.save(out / "ckpt", tree, overwrite=True)
        _mark("checkpoint saved")
        saved, params = (
            _named(tree),
            distributed.gather({n: t for n, t in m.parameters}),
        )  # collectives: every process takes part
        if distributed.is_coordinator():
            np.savez(out / "ckpt_ref.npz", **saved)
            np.savez(out / "model_ref.npz", **params)
        _export(out, grid, m)
        _mark("exported")
    _write(out, "train", result)


def _export(out: Path, grid, m: MLP) -> None:
    """A sharded SGD step (inputs split over the job's mesh) and a forward pass whose fc1 weight is split over the
    processes.
    """
    S = lambda *spec: NamedSharding(grid, P(*spec))  # noqa: E731
    f32 = lambda *shape: TensorType(DType.float32, list(shape))  # noqa: E731
    step = maxfx.export(
        maxfx.jit(jax_sgd_step),
        f32(32, 8),
        f32(32),
        f32(4, 32),
        f32(4),
        f32(64, 8),
        f32(64, 4),
        in_shardings=[
            S(*RULE["fc1.weight"]),
            S(*RULE["fc1.bias"]),
            S(*RULE["fc2.weight"]),
            S(),
            S("data", None),
            S("data", None),
        ],
    )
    fwd_model = maxfx.shard(m.map_parameters(lambda n, t: t), grid, {"fc1.weight": P(("data", "model"), None)})
    fwd = maxfx.export(maxfx.jit(lambda x: fwd_model(x)), f32(5, 8))  # traced by JAX: the weights keep their split
    fwd_graph = maxfx.export(
        lambda x: fwd_model(x), f32("batch", 8)
    )  # traced into a maxfx graph, which runs on one device
    if distributed.is_coordinator():
        step.save(out / "step.maxfx")
        fwd.save(out / "fwd.maxfx")
        fwd_graph.save(out / "fwd_graph.maxfx")


def _named(tree) -> dict[str, np.ndarray]:
    """Every leaf of ``tree`` by its key path, read whole (an all-gather where a leaf is split over processes)."""
    paths = [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda v: isinstance(v, Tensor))[0]
    ]
    return dict(zip(paths, distributed.gather(jax.tree.leaves(tree))))


def _like() -> dict:
    """A tree built like the saved one, on this job's own 2-D mesh: restore reads into its shardings."""
    m = maxfx.shard(_model(), _grid(), {k: P(*v) for k, v in RULE.items()})
    return {"model": m, "opt": maxfx.optim.init(optax.adam(LR), m)}


def task_restore(out: Path) -> None:
    back = maxfx.restore(out / "ckpt", _like())
    leaves = jax.tree.leaves(back)
    values = _named(back)
    if distributed.is_coordinator():
        np.savez(out / f"restored_{jax.process_count()}.npz", **values)
    _write(
        out,
        "restore",
        {"leaves": len(leaves), "span_all": all(len(a.sharding.device_set) == jax.device_count() for a in leaves)},
    )


def task_reload(out: Path) -> None:
    by_name = np.load(out / "model_ref.npz")
    x, y = data()
    step = maxfx.load_exported(out / "step.maxfx")
    outs = step(*[by_name[n] for n in NAMES], x, y)
    fwd = maxfx.load_exported(out / "fwd.maxfx")
    fwd_graph = maxfx.load_exported(out / "fwd_graph.maxfx")
    np.savez(
        out / "reloaded.npz",
        *[o.to_numpy() for o in outs],
        fwd=fwd(x[:5]).to_numpy(),
        fwd_graph=fwd_graph(x[:7]).to_numpy(),
        fwd_weight=fwd.weights["fwd_model.fc1.weight"],
    )
    _write(
        out,
        "reload",
        {
            "devices": {"step": step.nr_devices, "fwd": fwd.nr_devices, "fwd_graph": fwd_graph.nr_devices},
            "fwd_weights": sorted(fwd.weights),
        },
    )


def task_die(out: Path) -> None:
    mesh = maxfx.make_mesh((jax.device_count(),), ("data",))
    m = maxfx.shard(_model(), mesh)
    xs, ys = _local_batch(mesh)
    opt = optax.adam(LR)
    step = maxfx.optim.make_train_step(loss_fn, opt)
    state = maxfx.optim.init(opt, m)
    for i in range(STEPS):
        if i == 5 and jax.process_index() == 1:
            print(f"process 1 fails before step 5 at unix time {time.time():.3f}", flush=True)
            raise RuntimeError("process 1 fails on purpose")
        m, state, loss = step(m, state, xs, ys)
        print(f"step {i} loss {loss.item():.6f}", flush=True)
    print("finished all steps", flush=True)


TASKS = {"train": task_train, "restore": task_restore, "reload": task_reload, "die": task_die}


def main(argv: list[str]) -> None:
    out, tasks = Path(argv[0]), argv[1:]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise SystemExit(f"worker: tasks must be some of {sorted(TASKS)}, got {tasks}")
    distributed.initialize()
    _mark(f"process {jax.process_index()} of {jax.process_count()} initialized")
    for task in tasks:
        TASKS[task](out)
        _mark(f"{task} done")


if __name__ == "__main__":
    main(sys.argv[1:])
