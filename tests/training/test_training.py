"""Training maxfx Modules with optax through maxfx.optim (functional train steps)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import maxfx
from maxfx import optim
from maxfx.dtype import DType
from maxfx.examples import char_transformer as ct
from maxfx.experimental import functional as F
from maxfx.experimental.nn import Linear, Module, module_dataclass
from maxfx.experimental.tensor import Tensor


@module_dataclass
class MLP(Module):
    fc1: Linear
    fc2: Linear

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.tanh(self.fc1(x)))


def mse(model: MLP, x: Tensor, y: Tensor) -> Tensor:
    d = model(x) - y
    return F.reshape(F.mean(F.reshape(d * d, [-1]), axis=0), [])


def _regression(n: int = 256, seed: int = 0):
    """y = sin(x @ a) + 0.5 * x1 * x2: smooth, nonlinear, noise free."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 4)).astype(np.float32)
    a = np.array([1.5, -2.0, 0.5, 1.0], np.float32)
    y = (np.sin(x @ a) + 0.5 * x[:, 1] * x[:, 2])[:, None].astype(np.float32)
    return Tensor(x), Tensor(y)


def test_sgd_step_matches_hand_computed_update():
    """One SGD step equals params - lr * grad, with the gradient written in raw JAX on raw arrays."""
    model = MLP(Linear(4, 8), Linear(8, 1))
    x, y = _regression(16)
    raw = [(layer.weight.to_numpy(), layer.bias.to_numpy()) for layer in (model.fc1, model.fc2)]

    def jax_loss(p):
        (w1, b1), (w2, b2) = p
        return jnp.mean((jnp.tanh(x.to_numpy() @ w1.T + b1) @ w2.T + b2 - y.to_numpy()) ** 2)

    ref_grads = jax.grad(jax_loss)(raw)
    opt = optax.sgd(0.1)
    new, _, loss = optim.make_train_step(mse, opt)(model, optim.init(opt, model), x, y)
    assert isinstance(new, MLP) and new is not model and isinstance(loss, Tensor)
    np.testing.assert_allclose(loss.item(), float(jax_loss(raw)), rtol=1e-5)
    for layer, old, (gw, gb) in zip((new.fc1, new.fc2), raw, ref_grads):
        np.testing.assert_allclose(layer.weight.to_numpy(), old[0] - 0.1 * np.asarray(gw), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(layer.bias.to_numpy(), old[1] - 0.1 * np.asarray(gb), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model.fc1.weight.to_numpy(), raw[0][0])  # the old model is untouched


def test_mlp_regression_loss_falls_below_threshold():
    """Adam on the synthetic regression: MSE below 0.01 within 300 full-batch steps (the target's variance is ~0.5)."""
    maxfx.experimental.random.seed(0)
    model = MLP(Linear(4, 32), Linear(32, 1))
    x, y = _regression()
    opt = optax.adam(1e-2)
    state = optim.init(opt, model)
    step = optim.make_train_step(mse, opt)
    first = mse(model, x, y).item()
    for _ in range(300):
        model, state, loss = step(model, state, x, y)
    assert first > 0.1
    assert loss.item() < 0.01, f"MSE {loss.item():.4f} after 300 steps (start {first:.4f})"
    assert step.jitted._cache_size() == 1  # the loop reuses one compiled step


def test_char_transformer_learns_the_text():
    """The tiny transformer: mean loss of the last 10 of 150 steps below 0.7 nats (uniform guessing is ln 19 ≈ 2.9).

    After a word's first letter the text is deterministic, so only ~ln(8) nats per word stay
    unpredictable (≈ 0.4 per character): reaching 0.7 needs the model to use its context.
    """
    run = ct.train(steps=150, layers=1, seq=16, seed=0)
    assert len(run.losses) == 150
    assert math.isclose(run.losses[0], math.log(len(run.vocab)), rel_tol=0.1)
    tail = sum(run.losses[-10:]) / 10
    assert tail < 0.7, f"loss {tail:.3f} after 150 steps"
    completion = ct.generate(run, "tensor ", n=12)
    assert completion.startswith("tensor ") and any(w in completion[7:] for w in ct.WORDS)


def test_loss_fn_matches_numpy_cross_entropy():
    model = ct.CharTransformer(vocab_size=7, dim=8, heads=2, layers=1, max_len=5)
    rng = np.random.default_rng(1)
    tokens, targets = rng.integers(0, 7, size=(2, 5)), rng.integers(0, 7, size=(2, 5))
    logits = model(Tensor(tokens)).to_numpy().astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    expected = -np.take_along_axis(logp, targets[..., None], -1).mean()
    np.testing.assert_allclose(ct.loss_fn(model, Tensor(tokens), Tensor(targets)).item(), expected, rtol=1e-5)


def test_attention_is_causal():
    """Changing a later token never changes earlier positions' logits."""
    model = ct.CharTransformer(vocab_size=5, dim=8, heads=2, layers=1, max_len=6)
    a = np.array([[1, 2, 3, 4, 0, 1]])
    b = a.copy()
    b[0, 4:] = [3, 3]
    la, lb = model(Tensor(a)).to_numpy(), model(Tensor(b)).to_numpy()
    np.testing.assert_allclose(la[:, :4], lb[:, :4], rtol=1e-6)
    assert not np.allclose(la[:, 4:], lb[:, 4:])


def test_donated_step_and_aux():
    model = MLP(Linear(4, 8), Linear(8, 1))
    x, y = _regression(16)
    opt = optax.sgd(0.05)

    def loss_with_aux(m, x, y):
        out = m(x)
        d = out - y
        return F.reshape(F.mean(F.reshape(d * d, [-1]), axis=0), []), out

    step = optim.make_train_step(loss_with_aux, opt, has_aux=True, donate=True)
    new, state, (loss, out) = step(model, optim.init(opt, model), x, y)
    assert isinstance(loss, Tensor) and list(out.shape) == [16, 1]
    new2, _, (loss2, _) = step(new, state, x, y)
    assert loss2.item() < loss.item()


def test_errors_name_the_problem():
    @module_dataclass
    class WithIds(Module):
        w: Tensor
        ids: Tensor

    with pytest.raises(TypeError, match=r"parameter \.ids has dtype int64, shape \[2\]"):
        optim.init(optax.sgd(0.1), WithIds(Tensor.ones([2]), Tensor([0, 1], dtype=DType.int64)))
    with pytest.raises(TypeError, match="optax GradientTransformation"):
        optim.make_train_step(mse, "adam")
    with pytest.raises(TypeError, match="optax GradientTransformation"):
        optim.init(0.1, MLP(Linear(2, 2), Linear(2, 1)))
