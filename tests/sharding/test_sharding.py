"""maxfx.make_mesh / maxfx.shard: data- and tensor-parallel MLP steps on 8 forced host devices.

The pytest process has already started JAX with one CPU device, so the
multi-device checks run in a child process started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (this file run as a
script); it prints one JSON line of results that the tests below read.
"""

import json
import sys

import numpy as np
import pytest

N_DEVICES = 8


# ─── the child: runs with 8 host devices ───────────────────────────────────


def _mlp_and_data():
    from maxfx.experimental import functional as F
    from maxfx.experimental.nn import Linear, Module
    from maxfx.experimental.tensor import Tensor

    class MLP(Module):
        def __init__(self):
            self.fc1 = Linear(8, 32)
            self.fc2 = Linear(32, 4)

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(x)))

    rng = np.random.default_rng(0)
    model = MLP()
    model.load_state_dict(
        {n: rng.standard_normal([int(d) for d in t.shape]).astype(np.float32) * 0.3 for n, t in model.parameters}
    )
    x = Tensor(rng.standard_normal((64, 8)).astype(np.float32))
    y = Tensor(rng.standard_normal((64, 4)).astype(np.float32))
    return model, x, y


def _train(model, x, y, steps=3):
    """``steps`` SGD-momentum steps with jax.value_and_grad + optax; returns (losses, params by name)."""
    import jax
    import optax

    from maxfx.experimental import functional as F

    def loss_fn(m, x, y):
        d = m(x) - y
        loss = F.mean(F.mean(d * d, axis=-1), axis=0)  # MAX reductions keep the dim: shape [1, 1]
        return jax.tree.leaves(loss)[0].reshape(())  # a Tensor is a pytree of one array; grad wants a scalar array

    opt = optax.sgd(0.05, momentum=0.9)

    @jax.jit
    def step(m, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(m, x, y)
        updates, state = opt.update(grads, state, m)
        return optax.apply_updates(m, updates), state, loss

    state = opt.init(model)
    losses = []
    for _ in range(steps):
        model, state, loss = step(model, state, x, y)
        losses.append(float(loss))
    return losses, model


def _params(model):
    return {n: np.asarray(t._array()) for n, t in model.parameters}


def _child() -> dict:
    import jax
    from jax.sharding import PartitionSpec as P

    import maxfx
    from lowering.devices import jax_device
    from lowering.types import DeviceRef
    from maxfx._sharding import sharding_of

    out: dict = {"n_devices": len(jax.devices())}
    out["device_ref_map"] = all(jax_device(DeviceRef.CPU(i)) == jax.devices("cpu")[i] for i in range(N_DEVICES))

    model, x, y = _mlp_and_data()
    ref_losses, ref_model = _train(model.map_parameters(lambda n, t: t), x, y)
    ref = _params(ref_model)

    def compare(losses, trained):
        got = _params(trained)
        return {
            "loss_close": bool(np.allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)),
            "params_close": all(np.allclose(got[n], ref[n], rtol=1e-5, atol=1e-6) for n in ref),
            "loss_falls": losses[-1] < losses[0],
        }

    # Data parallel: batch split over 8 devices, parameters replicated.
    mesh = maxfx.make_mesh((N_DEVICES,), ("data",))
    dp_model = maxfx.shard(model.map_parameters(lambda n, t: t), mesh)
    xs, ys = maxfx.shard((x, y), mesh, P("data", None))
    dp = compare(*_train(dp_model, xs, ys))
    dp["x_shards"] = sorted({tuple(s.data.shape) for s in jax.tree.leaves(xs)[0].addressable_shards})
    dp["x_devices"] = len(sharding_of(xs).device_set)
    dp["weight_replicated"] = sharding_of(dp_model.fc1.weight).is_fully_replicated
    # Inside jit, shard() constrains a traced value instead of moving it.
    doubled = jax.jit(lambda t: maxfx.shard(t, mesh, P("data")) * 2)(maxfx.shard(x, mesh))
    dp["constrained_devices"] = len(sharding_of(doubled).device_set)
    dp["constrained_ok"] = bool(np.allclose(doubled.to_numpy(), x.to_numpy() * 2))
    out["dp"] = dp

    # Tensor parallel: fc1 column-parallel (weight [out, in] split on out), fc2 row-parallel (split on in).
    mesh = maxfx.make_mesh((N_DEVICES,), ("model",), devices=[DeviceRef.CPU(i) for i in range(N_DEVICES)])
    rule = {"fc1.weight": P("model", None), "fc1.bias": P("model"), "fc2.weight": P(None, "model")}
    tp_model = maxfx.shard(model.map_parameters(lambda n, t: t), mesh, rule)
    # maxfx Tensors are committed to one device; replicate the batch over the mesh.
    tp = compare(*_train(tp_model, *maxfx.shard((x, y), mesh)))
    tp["fc1_shard"] = list(tp_model.fc1.weight._array().addressable_shards[0].data.shape)
    tp["fc2_shard"] = list(tp_model.fc2.weight._array().addressable_shards[0].data.shape)
    tp["fc2_bias_replicated"] = tp_model.fc2.bias._array().sharding.is_fully_replicated
    out["tp"] = tp

    # Both at once on a 2 x 4 mesh.
    mesh = maxfx.make_mesh((2, 4), ("data", "model"))
    both = maxfx.shard(model.map_parameters(lambda n, t: t), mesh, rule)
    out["dp_tp"] = compare(*_train(both, *maxfx.shard((x, y), mesh, P("data"))))

    # Mismatches name the axis and the sizes.
    errors = {}
    for key, fn in {
        "indivisible": lambda: maxfx.shard(
            model.map_parameters(lambda n, t: t), maxfx.make_mesh((8,), ("model",)), {"fc2.weight": P("model", None)}
        ),
        "unknown_axis": lambda: maxfx.shard(x, mesh, P("batch")),
        "too_many_devices": lambda: maxfx.make_mesh((4, 4), ("data", "model")),
    }.items():
        try:
            fn()
            errors[key] = None
        except ValueError as e:
            errors[key] = str(e)
    out["errors"] = errors
    return out


if __name__ == "__main__":
    print(json.dumps(_child()))
    sys.exit(0)


# ─── the tests (main pytest process) ─────────────────────────────────────────


@pytest.fixture(scope="module")
def child():
    from tests.forced_devices import run_with_forced_devices  # noqa: PLC0415 - this file also runs as the child script, where tests/ is not a package on sys.path

    return run_with_forced_devices(__file__, N_DEVICES, timeout=300)


def test_forced_host_devices_map_to_device_refs(child):
    assert child["n_devices"] == N_DEVICES
    assert child["device_ref_map"]


def test_data_parallel_step_matches_one_device(child):
    dp = child["dp"]
    assert dp["x_devices"] == N_DEVICES and dp["x_shards"] == [[64 // N_DEVICES, 8]]
    assert dp["weight_replicated"]
    assert dp["constrained_devices"] == N_DEVICES and dp["constrained_ok"]
    assert dp["loss_close"] and dp["params_close"] and dp["loss_falls"]


def test_tensor_parallel_step_matches_one_device(child):
    tp = child["tp"]
    assert tp["fc1_shard"] == [32 // N_DEVICES, 8]  # column-parallel: output rows split
    assert tp["fc2_shard"] == [4, 32 // N_DEVICES]  # row-parallel: input columns split
    assert tp["fc2_bias_replicated"]
    assert tp["loss_close"] and tp["params_close"] and tp["loss_falls"]


def test_data_and_tensor_parallel_2x4(child):
    assert child["dp_tp"]["loss_close"] and child["dp_tp"]["params_close"]


def test_mismatch_errors_name_axis_and_sizes(child):
    e = child["errors"]
    assert (
        "dim 0 of size 4" in e["indivisible"]
        and "'model' (size 8)" in e["indivisible"]
        and "fc2.weight" in e["indivisible"]
    )
    assert "'batch'" in e["unknown_axis"] and "'data': 2" in e["unknown_axis"]
    assert "need 16 devices, but 8" in e["too_many_devices"]


# One-device checks run in this process.


def test_single_device_mesh_and_rank_errors():
    from jax.sharding import PartitionSpec as P

    import maxfx
    from maxfx.experimental.nn import Linear
    from maxfx.experimental.tensor import Tensor

    mesh = maxfx.make_mesh((1,), ("data",))
    t = maxfx.shard(Tensor(np.arange(6, dtype=np.float32).reshape(3, 2)), mesh, P("data"))
    np.testing.assert_array_equal(t.to_numpy(), np.arange(6).reshape(3, 2))
    with pytest.raises(ValueError, match=r"rank 2 .* names 3 dims"):
        maxfx.shard(t, mesh, P("data", None, None))
    with pytest.raises(ValueError, match=r"uses mesh axis 'data' for more than one dim"):
        maxfx.shard(t, mesh, P("data", "data"))
    with pytest.raises(ValueError, match=r"pattern\(s\) \['fc9.\*'\] match no parameter"):
        maxfx.shard(Linear(2, 2), mesh, {"fc9.*": P()})
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        maxfx.shard(t, "data", P())
    with pytest.raises(ValueError, match="axis names must be distinct"):
        maxfx.make_mesh((1, 1), ("a", "a"))
