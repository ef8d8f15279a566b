"""Sharded training through maxfx's own transforms: `maxfx.optim.make_train_step`, `maxfx.jit`, `maxfx.value_and_grad`.

An MLP trains for 20 Adam steps on 8 forced host devices, data parallel
(batch split over ``data``) and on a 2 x 4 ``data`` x ``model`` mesh (batch
split, fc1 column-parallel, fc2 row-parallel). Each run must equal the same
training on one device at 1e-5 and leave every parameter and optimizer-state
array sharded as it was placed. The reference is the same math written with
plain ``jax.jit`` + ``jax.value_and_grad`` on one device, so maxfx's placement
logic is not checked against itself.

Like tests/sharding/test_sharding.py, the pytest process already runs JAX on one CPU
device, so the 8-device work runs in a child process (this file run as a
script with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``) that
prints one JSON line.
"""

import json
import sys

import numpy as np
import pytest

N_DEVICES = 8
STEPS = 20
RULE = {"fc1.weight": ("model", None), "fc1.bias": ("model",), "fc2.weight": (None, "model")}


# ─── the child: runs with 8 host devices ───────────────────────────────────


def _setup():
    from maxfx.experimental import functional as F
    from maxfx.experimental.nn import Linear, Module
    from maxfx.experimental.tensor import Tensor

    class MLP(Module):
        def __init__(self):
            self.fc1 = Linear(8, 32)
            self.fc2 = Linear(32, 4)

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(x)))

    def loss_fn(m, x, y):
        d = m(x) - y
        return F.mean(F.reshape(d * d, [-1]), axis=0).squeeze(
            0
        )  # MAX reductions keep the dim: flatten, reduce, drop it

    rng = np.random.default_rng(0)
    model = MLP()
    model.load_state_dict(
        {n: rng.standard_normal([int(d) for d in t.shape]).astype(np.float32) * 0.3 for n, t in model.parameters}
    )
    x = Tensor(rng.standard_normal((64, 8)).astype(np.float32))
    y = Tensor(rng.standard_normal((64, 4)).astype(np.float32))
    return model, loss_fn, x, y


def _params(model):
    return {n: np.asarray(t._array()) for n, t in model.parameters}


def _reference(params, x, y, opt):
    """The same MLP and loss in plain jax.numpy, trained with jax.jit on one device."""
    import jax
    import jax.numpy as jnp
    import optax

    def loss(p, x, y):
        h = jnp.maximum(x @ p["fc1.weight"].T + p["fc1.bias"], 0)
        return jnp.mean((h @ p["fc2.weight"].T + p["fc2.bias"] - y) ** 2)

    @jax.jit
    def step(p, s, x, y):
        value, g = jax.value_and_grad(loss)(p, x, y)
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s, value

    dev = jax.devices()[0]
    p = jax.device_put({n: jnp.asarray(v) for n, v in params.items()}, dev)
    x, y = jax.device_put((jnp.asarray(x), jnp.asarray(y)), dev)
    s, losses = opt.init(p), []
    for _ in range(STEPS):
        p, s, value = step(p, s, x, y)
        losses.append(float(value))
    return losses, {n: np.asarray(v) for n, v in p.items()}


def _child() -> dict:
    import jax
    import optax
    from jax.sharding import PartitionSpec as P

    import maxfx
    from maxfx._sharding import sharding_of

    model, loss_fn, x, y = _setup()
    opt = optax.adam(1e-2)
    ref_losses, ref = _reference(_params(model), x.to_numpy(), y.to_numpy(), opt)
    out: dict = {"n_devices": len(jax.devices()), "ref_loss_falls": ref_losses[-1] < ref_losses[0] * 0.8}

    def run(mesh, rule, batch_spec, *, how):
        m = maxfx.shard(
            model.map_parameters(lambda n, t: t), mesh, {k: P(*v) for k, v in rule.items()} if rule else None
        )
        placed = {n: sharding_of(t) for n, t in m.parameters}
        xs, ys = maxfx.shard((x, y), mesh, batch_spec)
        if how == "make_train_step":
            step = maxfx.optim.make_train_step(loss_fn, opt)
            state = maxfx.optim.init(opt, m)
        else:  # the same step written by hand under @maxfx.jit, fed optax's own (uncommitted) init state

            @maxfx.jit
            def step(m, s, x, y):
                value, grads = maxfx.value_and_grad(loss_fn)(m, x, y)
                updates, s = opt.update(grads, s, m)
                return optax.apply_updates(m, updates), s, value

            state = opt.init(m)
        state_placed = [sharding_of(leaf) for leaf in jax.tree.leaves(state)]
        losses = []
        for _ in range(STEPS):
            m, state, loss = step(m, state, xs, ys)
            losses.append(loss.item())
        got = _params(m)
        after = {n: sharding_of(t) for n, t in m.parameters}
        state_leaves = jax.tree.leaves(state)
        result = {
            "loss_close": bool(np.allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)),
            "params_close": all(np.allclose(got[n], ref[n], rtol=1e-5, atol=1e-5) for n in ref),
            "max_param_diff": max(float(np.max(np.abs(got[n] - ref[n]))) for n in ref),
            # arrays left sharded as placed: the same mesh and the same split, after 20 steps
            "params_as_placed": all(after[n].is_equivalent_to(placed[n], got[n].ndim) for n in placed),
            "params_on_all_devices": all(len(after[n].device_set) == N_DEVICES for n in after),
            "state_on_mesh": all(len(sharding_of(leaf).device_set) == N_DEVICES for leaf in state_leaves),
            "fc1_weight_shard": list(m.fc1.weight._array().addressable_shards[0].data.shape),
            "compiles": step.jitted._cache_size(),
        }
        if how == "make_train_step":  # maxfx.optim.init places Adam's mu/nu like the parameters they follow
            mu = state[0].mu
            result["init_state_like_params"] = all(
                s is not None and len(s.device_set) == N_DEVICES for s in state_placed
            )
            result["mu_as_placed"] = all(
                sharding_of(t).is_equivalent_to(placed[n], got[n].ndim) for n, t in mu.parameters
            )
        return result

    dp_mesh = maxfx.make_mesh((N_DEVICES,), ("data",))
    grid = maxfx.make_mesh((2, 4), ("data", "model"))
    out["dp"] = run(dp_mesh, None, P("data", None), how="make_train_step")
    out["dp_tp"] = run(grid, RULE, P("data", None), how="make_train_step")
    out["dp_tp_jit"] = run(grid, RULE, P("data", None), how="jit")

    # maxfx.value_and_grad on sharded inputs, outside any jit: gradients keep the parameters' splits.
    m = maxfx.shard(model.map_parameters(lambda n, t: t), grid, {k: P(*v) for k, v in RULE.items()})
    value, grads = maxfx.value_and_grad(loss_fn)(m, *maxfx.shard((x, y), grid, P("data", None)))
    out["vg"] = {
        "value_close": bool(np.isclose(value.item(), ref_losses[0], rtol=1e-5)),
        "grads_as_placed": all(
            sharding_of(g).is_equivalent_to(sharding_of(p), len(g.shape))
            for (_, g), (_, p) in zip(grads.parameters, m.parameters)
        ),
    }
    return out


if __name__ == "__main__":
    print(json.dumps(_child()))
    sys.exit(0)


# ─── the tests (main pytest process) ─────────────────────────────────────────


@pytest.fixture(scope="module")
def child():
    from tests.forced_devices import run_with_forced_devices  # noqa: PLC0415 - this file also runs as the child script, where tests/ is not a package on sys.path

    out = run_with_forced_devices(__file__, N_DEVICES, timeout=600)
    assert out["n_devices"] == N_DEVICES and out["ref_loss_falls"]
    return out


def _check(run):
    assert run["loss_close"] and run["params_close"], run
    assert run["params_as_placed"] and run["params_on_all_devices"], run
    assert run["state_on_mesh"], run
    assert run["compiles"] == 1, run  # the step's outputs feed it back without a second compile


def test_data_parallel_make_train_step_matches_one_device(child):
    _check(child["dp"])
    assert child["dp"]["fc1_weight_shard"] == [32, 8]  # replicated
    assert child["dp"]["init_state_like_params"] and child["dp"]["mu_as_placed"]


def test_2x4_mesh_make_train_step_matches_one_device(child):
    _check(child["dp_tp"])
    assert child["dp_tp"]["fc1_weight_shard"] == [32 // 4, 8]  # column-parallel over 'model'
    assert child["dp_tp"]["init_state_like_params"] and child["dp_tp"]["mu_as_placed"]


def test_maxfx_jit_step_with_optax_init_state(child):
    # optax.adam(...).init returns its step count uncommitted on device 0; maxfx.jit replicates it on the mesh.
    _check(child["dp_tp_jit"])


def test_value_and_grad_keeps_shardings(child):
    assert child["vg"]["value_close"] and child["vg"]["grads_as_placed"]


# One-device checks run in this process.


@pytest.mark.parametrize(
    ("fn", "arg", "hint"),
    [
        (
            "vector",
            "tensor",
            r"maxfx\.losses\.reduce_mean\(loss\).*F\.mean\(F\.reshape\(loss, \[-1\]\), axis=0\)\.squeeze\(0\)",
        ),
        ("kept_dim", "tensor", r"F\.reshape\(loss, \[\]\)"),
        ("vector", "array", r"jnp\.mean\(x\)"),
    ],
)
def test_grad_error_hint_gives_a_scalar(fn, arg, hint):
    """The suggested fix, applied, must actually make the gradient work (`.mean()` alone keeps the dim)."""
    import jax.numpy as jnp

    import maxfx
    from maxfx.experimental import functional as F
    from maxfx.experimental.tensor import Tensor

    x = Tensor([1.0, 2.0]) if arg == "tensor" else jnp.asarray([1.0, 2.0])
    f = {"vector": lambda t: t * t, "kept_dim": lambda t: (t * t).sum(axis=0)}[fn]
    with pytest.raises(TypeError, match=hint):
        maxfx.grad(f)(x)
    fixed = {
        "vector": (lambda t: maxfx.losses.reduce_mean(t * t)) if arg == "tensor" else (lambda t: jnp.mean(t * t)),
        "kept_dim": lambda t: F.reshape((t * t).sum(axis=0), []),
    }[fn]
    g = maxfx.grad(fixed)(x)
    if fn == "vector" and arg == "tensor":  # the by-hand form the hint also names
        np.testing.assert_allclose(
            maxfx.grad(lambda t: F.mean(F.reshape(t * t, [-1]), axis=0).squeeze(0))(x).to_numpy(), [1.0, 2.0]
        )
    want = np.array([1.0, 2.0]) if fn == "vector" else np.array([2.0, 4.0])
    np.testing.assert_allclose(np.asarray(g.to_numpy() if hasattr(g, "to_numpy") else g), want)


def test_one_device_state_is_committed_with_the_model():
    """Without a mesh, maxfx.optim.init still commits the state beside the model: one compile for the loop."""
    import jax
    import optax

    import maxfx

    model, loss_fn, x, y = _setup()
    opt = optax.sgd(0.1, momentum=0.9)
    state = maxfx.optim.init(opt, model)
    assert all(leaf.committed for leaf in jax.tree.leaves(state))
    step = maxfx.optim.make_train_step(loss_fn, opt)
    for _ in range(3):
        model, state, loss = step(model, state, x, y)
    assert step.jitted._cache_size() == 1
