"""Training-step benchmark: maxfx.value_and_grad + optax against raw JAX + optax, one process.

The MLP 1024-4096-4096-1024 of the Module benchmark (tests/bench/modules.py),
batch 64, float32, MSE loss, Adam. One full step (forward, backward, optimizer
update, new parameters) is timed for

- maxfx: the Module through ``maxfx.optim.make_train_step`` (``maxfx.jit`` of
  ``maxfx.value_and_grad`` + ``optimizer.update`` + ``optax.apply_updates``,
  the Module going in and a new Module coming out);
- raw JAX: the same math on a list of ``(w, b)`` arrays under ``jax.jit``,

from identical weights, interleaved call by call; medians and their ratio
(target ≤ 1.10).

Run: ``make bench`` or ``.venv/bin/python -m tests.bench.transforms [--quick]``.
Results: a table on stdout and tests/bench/results/transforms.json.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxfx import functional as F
from maxfx import optim
from maxfx.experimental.nn import Linear
from maxfx.experimental.tensor import Tensor
from tests.bench._timing import fmt_time, interleaved, machine, save
from tests.bench.modules import MLP, _jax_mlp


def maxfx_loss(model: MLP, x: Tensor, y: Tensor) -> Tensor:
    d = model(x) - y
    return F.reshape(F.mean(F.reshape(d * d, [-1]), axis=0), [])


def jax_loss(params, x, y):
    return jnp.mean((_jax_mlp(params, x) - y) ** 2)


def _jax_step(optimizer):
    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(jax_loss)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def train_step(repeats: int, warmup: int) -> dict:
    model = MLP(fc1=Linear(1024, 4096), fc2=Linear(4096, 4096), fc3=Linear(4096, 1024))
    params = [
        (jnp.asarray(layer.weight.to_numpy()), jnp.asarray(layer.bias.to_numpy()))
        for layer in (model.fc1, model.fc2, model.fc3)
    ]
    rng = np.random.default_rng(0)
    x_np = rng.normal(size=(64, 1024)).astype(np.float32)
    y_np = rng.normal(size=(64, 1024)).astype(np.float32)
    x_t, y_t = Tensor(x_np), Tensor(y_np)
    x_j, y_j = jnp.asarray(x_np), jnp.asarray(y_np)
    optimizer = optax.adam(1e-4)

    mx_step = optim.make_train_step(maxfx_loss, optimizer)
    jx_step = _jax_step(optimizer)
    state = {"mx": (model, optim.init(optimizer, model)), "jx": (params, optimizer.init(params))}

    def run_maxfx():
        m, s, loss = mx_step(*state["mx"], x_t, y_t)
        state["mx"] = (m, s)
        return jax.block_until_ready(loss._array())

    def run_jax():
        p, s, loss = jx_step(*state["jx"], x_j, y_j)
        state["jx"] = (p, s)
        return jax.block_until_ready(loss)

    # Same weights, same data, same optimizer: the two trajectories agree.
    first = [float(run_maxfx()), float(run_jax())]
    np.testing.assert_allclose(first[0], first[1], rtol=1e-4)
    times = interleaved({"maxfx": run_maxfx, "jax": run_jax}, repeats=repeats, warmup=warmup)
    last = [float(run_maxfx()), float(run_jax())]
    np.testing.assert_allclose(last[0], last[1], rtol=1e-3)
    ratio = times["maxfx"] / times["jax"]
    print("\nTraining step: MLP 1024-4096-4096-1024, batch 64, float32, Adam (forward + backward + update)")
    print(
        f"  maxfx.value_and_grad + optax {fmt_time(times['maxfx'])}   raw JAX + optax {fmt_time(times['jax'])}   ratio "
        f"{ratio:.3f} (target ≤ 1.10)"
    )
    print(f"  loss {first[0]:.4f} → {last[0]:.4f} (maxfx) / {last[1]:.4f} (JAX)")
    return {"step_s": times, "ratio": ratio, "loss_first": first, "loss_last": last, "repeats": repeats}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    args = parser.parse_args(argv)
    results = {"machine": machine(), "mlp_train_step": train_step(5 if args.quick else 30, 2 if args.quick else 5)}
    print(f"\nwritten {save('transforms', results)}")
    return results


if __name__ == "__main__":
    main()
