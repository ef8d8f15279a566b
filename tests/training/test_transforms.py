"""maxfx.jit / grad / value_and_grad / vmap / checkpoint / scan over Tensors and Modules.

References are numpy or the same math written in raw JAX on raw arrays.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import maxfx
from maxfx.dtype import DType
from maxfx.experimental import functional as F
from maxfx.experimental.nn import Linear, Module, module_dataclass
from maxfx.experimental.tensor import Tensor

RNG = np.random.default_rng(0)


def _scalar(t):
    """A rank-0 Tensor from a rank-1 ``[1]`` one (MAX reductions keep the axis)."""
    return F.reshape(t, [])


def _sum_all(t):
    return _scalar(F.sum(F.reshape(t, [-1]), axis=0))


@module_dataclass
class MLP(Module):
    fc1: Linear
    fc2: Linear

    def forward(self, x):
        return self.fc2(F.tanh(self.fc1(x)))


def _mlp():
    return MLP(Linear(3, 5), Linear(5, 2))


def _raw(m: MLP):
    return [(layer.weight.to_numpy(), layer.bias.to_numpy()) for layer in (m.fc1, m.fc2)]


def _jax_mlp(p, x):
    (w1, b1), (w2, b2) = p
    return jnp.tanh(x @ w1.T + b1) @ w2.T + b2


def _loss(m, x, y):
    d = m(x) - y
    return _sum_all(d * d)


# ─── grad / value_and_grad ────────────────────────────────────────────────


def test_grad_of_tensor_function_matches_numpy():
    x = RNG.normal(size=5).astype(np.float32)
    g = maxfx.grad(lambda t: _sum_all(F.sin(t) * t))(Tensor(x))
    assert isinstance(g, Tensor) and g.dtype is DType.float32
    np.testing.assert_allclose(g.to_numpy(), np.cos(x) * x + np.sin(x), rtol=1e-5)


def test_value_and_grad_over_module_matches_raw_jax():
    m = _mlp()
    x, y = RNG.normal(size=(4, 3)).astype(np.float32), RNG.normal(size=(4, 2)).astype(np.float32)
    loss, grads = maxfx.value_and_grad(_loss)(m, Tensor(x), Tensor(y))
    ref_loss, ref_grads = jax.value_and_grad(lambda p: jnp.sum((_jax_mlp(p, x) - y) ** 2))(_raw(m))
    assert isinstance(loss, Tensor) and loss.shape == []
    np.testing.assert_allclose(loss.item(), float(ref_loss), rtol=1e-5)
    assert isinstance(grads, MLP) and grads is not m
    for layer, (gw, gb) in zip((grads.fc1, grads.fc2), ref_grads):
        assert isinstance(layer.weight, Tensor)
        np.testing.assert_allclose(layer.weight.to_numpy(), gw, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(layer.bias.to_numpy(), gb, rtol=1e-4, atol=1e-6)


def test_grad_argnums_and_has_aux():
    a, b = Tensor([1.0, 2.0]), Tensor([3.0, 4.0])
    (ga, gb), aux = maxfx.grad(lambda a, b: (_sum_all(a * b), a + b), argnums=(0, 1), has_aux=True)(a, b)
    assert ga.to_numpy().tolist() == [3.0, 4.0] and gb.to_numpy().tolist() == [1.0, 2.0]
    assert isinstance(aux, Tensor) and aux.to_numpy().tolist() == [4.0, 6.0]
    (value, aux2), g = maxfx.value_and_grad(lambda a: (_sum_all(a), jnp.sum(a)), has_aux=True)(a)
    assert isinstance(value, Tensor) and value.item() == 3.0
    assert isinstance(aux2, Tensor)  # a raw jnp result becomes a Tensor (Tensor input)
    assert g.to_numpy().tolist() == [1.0, 1.0]


def test_grad_of_non_scalar_output_names_dtype_and_shape():
    with pytest.raises(TypeError, match=r"maxfx.grad\(double\).*scalar.*float32, shape \[2\]"):

        def double(x):
            return x * 2

        maxfx.grad(double)(Tensor([1.0, 2.0]))


def test_grad_with_respect_to_integer_tensor_names_the_argument():
    def loss(weights, tokens):
        return _sum_all(weights)

    w, tok = Tensor([1.0]), Tensor([1, 2, 3], dtype=DType.int64)
    with pytest.raises(TypeError, match=r"argument 1 \('tokens'\).*int64, shape \[3\]"):
        maxfx.grad(loss, argnums=1)(w, tok)
    assert maxfx.grad(loss)(w, tok).to_numpy().tolist() == [1.0]  # not differentiated: fine


def test_grad_with_respect_to_module_with_integer_parameter_names_the_path():
    @module_dataclass
    class Lookup(Module):
        table: Tensor
        ids: Tensor

    m = Lookup(Tensor.ones([4, 2]), Tensor([0, 3], dtype=DType.int32))
    with pytest.raises(TypeError, match=r"argument 0 \('m'\) at \.ids.*int32, shape \[2\]"):
        maxfx.grad(lambda m: _sum_all(F.gather(m.table, m.ids, axis=0)))(m)


def test_has_aux_needs_a_pair():
    with pytest.raises(TypeError, match="pair"):
        maxfx.grad(lambda x: _sum_all(x), has_aux=True)(Tensor([1.0]))


# ─── jit ──────────────────────────────────────────────────────────────────


def test_jit_output_rule():
    x = Tensor([1.0, 2.0])

    @maxfx.jit
    def f(x):
        return {"t": x * 2, "raw": jnp.sum(x), "nested": (jnp.ones(2),)}

    out = f(x)
    assert isinstance(out["t"], Tensor) and isinstance(out["raw"], Tensor)
    assert out["raw"].item() == 3.0
    assert isinstance(out["nested"][0], jax.Array)  # nested deeper: left alone
    assert isinstance(maxfx.jit(jnp.sin)(jnp.zeros(2)), jax.Array)  # no Tensor input: acts as jax.jit


def test_jit_keeps_64_bit_types_like_eager():
    x = Tensor([[1.0, 5.0, 2.0]])
    eager = F.argmax(x, axis=-1)
    jitted = maxfx.jit(lambda t: F.argmax(t, axis=-1))(x)
    assert eager.dtype is DType.int64 and jitted.dtype is DType.int64
    assert jitted.to_numpy().tolist() == [[1]]
    ids = Tensor([2**40], dtype=DType.int64)
    assert maxfx.jit(lambda t: t + 1)(ids).to_numpy().tolist() == [2**40 + 1]
    d = Tensor([1.0], dtype=DType.float64)
    assert maxfx.jit(lambda t: t * 3)(d).dtype is DType.float64


def test_jit_static_argnums_and_module_argument():
    m = _mlp()
    x = RNG.normal(size=(2, 3)).astype(np.float32)
    f = maxfx.jit(lambda m, x, scale: m(x) * scale, static_argnums=2)
    np.testing.assert_allclose(
        f(m, Tensor(x), 2.0).to_numpy(), 2 * np.asarray(_jax_mlp(_raw(m), x)), rtol=1e-5, atol=1e-6
    )
    assert "dot_general" in f.lower(m, Tensor(x), 2.0).as_text()


def test_jit_vmap_checkpoint_of_a_module_take_its_weights_as_arguments():
    m = Linear(3, 2)  # fresh: its random weights are still pending in the eager graph
    x = RNG.normal(size=(4, 3)).astype(np.float32)
    f = maxfx.jit(m)
    out = f(Tensor(x))
    assert isinstance(m.weight._var.array, jax.Array) and not isinstance(m.weight._var.array, jax.core.Tracer)
    w, b = m.weight.to_numpy(), m.bias.to_numpy()
    np.testing.assert_allclose(out.to_numpy(), x @ w.T + b, rtol=1e-5, atol=1e-6)
    m.weight = m.weight * 0  # an in-place update is seen: weights are inputs, not baked constants
    np.testing.assert_allclose(f(Tensor(x)).to_numpy(), np.broadcast_to(b, (4, 2)), rtol=1e-6)
    np.testing.assert_allclose(maxfx.vmap(m)(Tensor(x)).to_numpy(), np.broadcast_to(b, (4, 2)), rtol=1e-6)
    g = maxfx.grad(lambda t: _sum_all(maxfx.checkpoint(m)(t)))(Tensor(x))
    np.testing.assert_allclose(g.to_numpy(), np.zeros((4, 3)), atol=0)


def test_pending_tensor_closed_over_by_jax_jit_stays_concrete():
    """Realizing a pending tensor during a jax.jit trace computes it concretely (no leaked tracer)."""
    m = Linear(3, 2)  # pending random weights, closed over (not an argument)
    jax.jit(lambda x: m(x))(Tensor.ones([1, 3]))
    assert not isinstance(m.weight._var.array, jax.core.Tracer), "the eager weight now holds a leaked tracer"


# ─── vmap / checkpoint / scan ─────────────────────────────────────────────


def test_vmap_with_shared_module():
    m = _mlp()
    x = RNG.normal(size=(6, 3)).astype(np.float32)
    per_row = maxfx.vmap(lambda m, row: m(F.unsqueeze(row, 0)), in_axes=(None, 0))(m, Tensor(x))
    assert isinstance(per_row, Tensor) and list(per_row.shape) == [6, 1, 2]
    np.testing.assert_allclose(per_row.to_numpy()[:, 0], np.asarray(_jax_mlp(_raw(m), x)), rtol=1e-5, atol=1e-6)


def test_per_example_gradients_vmap_of_grad():
    w = Tensor([1.0, -2.0])
    xs = RNG.normal(size=(4, 2)).astype(np.float32)
    per_example = maxfx.vmap(maxfx.grad(lambda w, x: _sum_all(w * x) ** 2), in_axes=(None, 0))(w, Tensor(xs))
    expected = 2 * (xs @ np.array([1.0, -2.0]))[:, None] * xs
    np.testing.assert_allclose(per_example.to_numpy(), expected, rtol=1e-5)


def test_checkpoint_gives_same_gradients_and_remats():
    m = _mlp()
    x, y = Tensor(RNG.normal(size=(4, 3)).astype(np.float32)), Tensor(np.zeros((4, 2), np.float32))
    plain = maxfx.grad(_loss)(m, x, y)
    ckpt = maxfx.grad(lambda m, x, y: _loss(maxfx.checkpoint(m), x, y))(m, x, y)
    for (_, a), (_, b) in zip(plain.parameters, ckpt.parameters):
        np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-6)
    assert maxfx.remat is maxfx.checkpoint
    jaxpr = str(
        jax.make_jaxpr(
            jax.grad(lambda a: jnp.sum(maxfx.checkpoint(lambda t: F.tanh(t))(Tensor.from_dlpack(a))._array()))
        )(jnp.ones(2))
    )
    assert "checkpoint" in jaxpr or "remat" in jaxpr


def test_scan_cumulative_sum():
    total, running = maxfx.scan(lambda c, x: (c + x, c + x), Tensor(0.0), Tensor([1.0, 2.0, 3.0]))
    assert isinstance(total, Tensor) and isinstance(running, Tensor)
    assert total.item() == 6.0 and running.to_numpy().tolist() == [1.0, 3.0, 6.0]


def test_scan_carry_may_come_back_as_raw_array():
    total, _ = maxfx.scan(lambda c, x: (jnp.add(c, x), None), Tensor(0.0), Tensor([1.0, 2.0]))
    assert isinstance(total, Tensor) and total.item() == 3.0


def test_scan_over_stacked_layers_equals_sequential():
    layers = [Linear(4, 4) for _ in range(3)]
    stacked = jax.tree.map(lambda *p: jnp.stack(p), *layers)
    assert isinstance(stacked, Linear) and list(stacked.weight.shape) == [3, 4, 4]
    x = Tensor(RNG.normal(size=(2, 4)).astype(np.float32))

    def run(stacked, x):
        out, _ = maxfx.scan(lambda h, layer: (F.tanh(layer(h)), None), x, stacked)
        return out

    expected = x.to_numpy()
    for layer in layers:
        expected = np.tanh(expected @ layer.weight.to_numpy().T + layer.bias.to_numpy())
    np.testing.assert_allclose(run(stacked, x).to_numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(maxfx.jit(run)(stacked, x).to_numpy(), expected, rtol=1e-5, atol=1e-6)
    g = maxfx.grad(lambda s, x: _sum_all(run(s, x)))(stacked, x)
    assert isinstance(g, Linear) and list(g.weight.shape) == [3, 4, 4]


def test_scan_body_must_return_pair():
    with pytest.raises(TypeError, match="pair"):
        maxfx.scan(lambda c, x: c, Tensor(0.0), Tensor([1.0]))


# ─── composition with raw JAX ────────────────────────────────────────────


def test_composes_with_raw_jax_transforms():
    x = Tensor([0.5, -1.0])
    f = lambda t: _sum_all(F.exp(t))  # noqa: E731
    expected = np.exp([0.5, -1.0])
    # Raw jax.grad wants a JAX array output, not a Tensor pytree: jnp.asarray converts explicitly.
    raw = lambda t: jnp.asarray(f(t))  # noqa: E731
    raw_of_jit = lambda t: jnp.asarray(maxfx.jit(f)(t))  # noqa: E731
    for g in (
        jax.jit(maxfx.grad(f)),
        maxfx.jit(jax.grad(raw)),
        jax.grad(raw_of_jit),
        maxfx.jit(maxfx.grad(f)),
        maxfx.grad(maxfx.jit(f)),
    ):
        out = g(x)
        assert isinstance(out, Tensor)
        np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-6)
    batched = maxfx.jit(jax.vmap(lambda t: F.relu(t) * 2))(Tensor([[-1.0, 2.0], [3.0, -4.0]]))
    assert batched.to_numpy().tolist() == [[0.0, 4.0], [6.0, 0.0]]


def test_lax_control_flow_inside_maxfx_jit():
    @maxfx.jit
    def f(x, n):
        y = jax.lax.fori_loop(0, n, lambda i, c: c * 2, x)
        # Operands and carries may be Tensors; predicates must be JAX arrays (jnp.asarray converts).
        y = jax.lax.cond(jnp.asarray(_sum_all(y) > 0), lambda t: t + 1, lambda t: t - 1, y)
        return jax.lax.while_loop(lambda t: jnp.asarray(_sum_all(t) < 100), lambda t: t * 3, y)

    out = f(Tensor([1.0, 2.0]), 3)  # [8, 16] -> [9, 17] -> [27, 51] -> [81, 153]
    assert isinstance(out, Tensor) and out.to_numpy().tolist() == [81.0, 153.0]


def test_module_as_loop_carry():
    m = _mlp()

    @maxfx.jit
    def decay(m):
        return jax.lax.fori_loop(0, 3, lambda i, mod: jax.tree.map(lambda p: p * 0.5, mod), m)

    out = decay(m)
    assert isinstance(out, MLP)
    np.testing.assert_allclose(out.fc1.weight.to_numpy(), m.fc1.weight.to_numpy() / 8, rtol=1e-6)


def test_import_maxfx_does_not_load_transforms():
    import subprocess
    import sys

    code = (
        "import sys, maxfx; assert 'maxfx._transforms' not in sys.modules and 'jax' not in sys.modules; "
        "maxfx.jit; assert 'maxfx._transforms' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


def test_int64_ops_under_plain_jit_do_not_warn():
    # MAX's int64 results are int32 under a user's jax.jit without x64; JAX's
    # per-op truncation warnings must not leak out of maxfx's own code.
    import warnings  # noqa: PLC0415

    x = jnp.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        band = jax.jit(lambda a: F.band_part(a, -1, 0))(x)
        idx = jax.jit(lambda a: F.argmax(a, axis=-1))(x)
    np.testing.assert_array_equal(np.asarray(band), np.tril(np.arange(12, dtype=np.float32).reshape(3, 4)))
    np.testing.assert_array_equal(np.asarray(idx).reshape(-1), [3, 3, 3])
