"""The MLP, data and plain-JAX reference shared by the multi-process workers and the tests.

Weights and data come from a seeded numpy generator, so every process of a
job (and the pytest process that computes the reference) builds the same
values without talking to the others. Importing JAX starts no devices, so
the workers import this before ``maxfx.distributed.initialize()``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

STEPS = 20
LR = 1e-2
BATCH = 64
# fc1 column-parallel, fc2 row-parallel over "model" (Linear.weight is [out, in]).
RULE = {"fc1.weight": ("model", None), "fc1.bias": ("model",), "fc2.weight": (None, "model")}
NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def init_params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = {"fc1.weight": (32, 8), "fc1.bias": (32,), "fc2.weight": (4, 32), "fc2.bias": (4,)}
    return {n: (rng.standard_normal(s) * 0.3).astype(np.float32) for n, s in shapes.items()}


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal((BATCH, 8)).astype(np.float32), rng.standard_normal((BATCH, 4)).astype(np.float32)


def jax_loss(p, x, y):
    """The MLP's mean squared error in plain jax.numpy (``p`` maps NAMES to arrays)."""
    h = jnp.maximum(x @ p["fc1.weight"].T + p["fc1.bias"], 0)
    return jnp.mean((h @ p["fc2.weight"].T + p["fc2.bias"] - y) ** 2)


def jax_reference() -> tuple[list[float], dict[str, np.ndarray]]:
    """STEPS Adam steps of plain ``jax.jit`` + ``jax.value_and_grad`` on one device: the losses and final parameters."""
    opt = optax.adam(LR)

    @jax.jit
    def step(p, s, x, y):
        value, g = jax.value_and_grad(jax_loss)(p, x, y)
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s, value

    dev = jax.devices()[0]
    p = jax.device_put(init_params(), dev)
    x, y = jax.device_put(data(), dev)
    s, losses = opt.init(p), []
    for _ in range(STEPS):
        p, s, value = step(p, s, x, y)
        losses.append(float(value))
    return losses, {n: np.asarray(v) for n, v in p.items()}


SGD_LR = 0.1


def jax_sgd_step(w1, b1, w2, b2, x, y):
    """One SGD step in plain JAX: ``(loss, *new parameters)`` in NAMES order (the step the tests export)."""
    p = dict(zip(NAMES, (w1, b1, w2, b2)))
    value, g = jax.value_and_grad(jax_loss)(p, x, y)
    return (value, *[p[k] - SGD_LR * g[k] for k in NAMES])


def numpy_forward(params: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    h = np.maximum(x @ params["fc1.weight"].T + params["fc1.bias"], 0)
    return h @ params["fc2.weight"].T + params["fc2.bias"]
